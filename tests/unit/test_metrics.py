"""confide.metrics: the /metrics listener, its refusals, the bounded families, the dashboard's queries."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from confide import metrics
from confide.errors import InvalidParameterError, ServerStartError

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "confide.json"


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def test_the_listener_serves_every_family_and_what_a_round_counted():
    port = metrics.serve("127.0.0.1:0")
    metrics.ROUNDS.labels("party", "completed").inc()
    metrics.ROUND_SECONDS.labels("party", "train").observe(0.3)
    metrics.watch(lambda: {"open_rounds": 2}, "confide_test_queue", "a gauge read at scrape time")
    text = _scrape(port)
    assert re.search(r'^confide_rounds_total\{outcome="completed",role="party"\} [1-9]', text, re.M), text
    assert 'confide_round_seconds_bucket{le="0.5",phase="train",role="party"}' in text
    assert 'confide_test_queue{queue="open_rounds"} 2.0' in text
    assert "process_resident_memory_bytes" in text  # prometheus_client's process collector
    # A gauge whose object is gone (a controller whose store was dropped) fails no scrape.
    metrics.watch(lambda: 1 / 0, "confide_test_queue", "a gauge that cannot be read")
    text = _scrape(port)
    assert "confide_rounds_total" in text and 'confide_test_queue{queue="open_rounds"}' not in text


def test_a_port_in_use_or_a_malformed_address_is_refused_naming_the_field():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerStartError, match=rf"--metrics 127.0.0.1:{port}: .*port is in use"):
            metrics.serve(f"127.0.0.1:{port}")
        with pytest.raises(ServerStartError, match=rf"^CONFIDE_METRICS 127.0.0.1:{port}"):
            metrics.serve(f"127.0.0.1:{port}", field="CONFIDE_METRICS")
    for bad in ("9100", "127.0.0.1:", "127.0.0.1:99999", "host:port"):
        with pytest.raises(InvalidParameterError, match="--metrics must be HOST:PORT"):
            metrics.serve(bad)


def test_the_aggregator_does_not_start_on_a_metrics_port_in_use(tmp_path):
    from confide.transport.certs import init_federation

    init_federation(tmp_path / "certs", parties=["a"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "confide", "aggregator", "--certs", str(tmp_path / "certs"), "--listen",
             "127.0.0.1:0", "--metrics", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode != 0
    assert f"--metrics 127.0.0.1:{port}: cannot listen for metrics (the port is in use)" in done.stderr


def _exposed_names() -> set[str]:
    """Sample names the registry can expose: a counter's _total, a histogram's _bucket/_sum/_count."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
    names = set()
    for family in REGISTRY.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def test_every_dashboard_query_names_a_metric_that_exists():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    expressions = [target["expr"] for panel in panels for target in panel.get("targets", [])]
    assert len(expressions) >= 8
    # metric names, once the label lists of aggregations (by (...)) and selectors ({...}) are gone
    bare = [re.sub(r"\b(by|without)\s*\([^)]*\)|\{[^}]*\}", "", expr) for expr in expressions]
    used = {name for expr in bare for name in re.findall(r"\b(confide_[a-z_]+|process_[a-z_]+|up)\b", expr)}
    exposed = _exposed_names() | {
        "up",
        metrics.AGGREGATOR_QUEUE,
        metrics.CONTROLLER_QUEUE,
    }  # registered by a node, a controller
    assert used and used <= exposed, f"the dashboard queries metrics nobody exposes: {sorted(used - exposed)}"
    families = {f.name for f in REGISTRY.collect() if f.name.startswith("confide_")} - {"confide_test_queue"}
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in used}
    assert families <= shown, f"families without a panel: {sorted(families - shown)}"


def test_an_agent_counts_its_heartbeats_sent_and_failed(tmp_path):
    from confide.agent.follower import Agent
    from confide.errors import TransportUnavailableError

    class Controller:
        down = False

        def sync(self, reports):
            if self.down:
                raise TransportUnavailableError("controller away")
            return {"instructions": []}

    def count(outcome: str) -> float:
        return REGISTRY.get_sample_value("confide_heartbeats_total", {"role": "agent", "outcome": outcome}) or 0.0

    controller = Controller()
    agent = Agent(controller, worker=None, workdir=tmp_path)
    sent, failed = count("sent"), count("failed")
    rounds = REGISTRY.get_sample_value("confide_rounds_total", {"role": "party", "outcome": "completed"}) or 0.0
    # a session's two new rounds travel in this heartbeat: the agent counts them (its party is its child)
    agent._reports = lambda: [{"session": "s", "metrics": [{"round": 1, "seconds": 0.5}, {"round": 2, "seconds": 0.4}]}]
    agent.step()
    assert REGISTRY.get_sample_value("confide_rounds_total", {"role": "party", "outcome": "completed"}) == rounds + 2
    controller.down = True
    with pytest.raises(TransportUnavailableError):
        agent.step()
    assert (count("sent") - sent, count("failed") - failed) == (1.0, 1.0)
