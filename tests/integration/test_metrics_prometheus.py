"""A real Prometheus server (Debian's) scrapes a running federation and reads its round count back.

The aggregator and three party processes serve ``/metrics`` (``--metrics``, ``CONFIDE_METRICS``);
the parties hold after their last round until the test has read, through PromQL, that each
completed every round, so the figure is not a race against the job's end.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest

from tests.fixtures.faults import with_faults
from tests.fixtures.federation import run_local
from tests.integration.conftest import make_spec

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="Debian's prometheus is not installed here (make test installs it: ensure-prometheus.sh)"
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _query(port: int, expression: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = json.loads(reply.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def _value(port: int, expression: str) -> float | None:
    result = _query(port, expression)
    return float(result[0]["value"][1]) if result else None


def _eventually(port: int, expression: str, holds, timeout: float = 60.0) -> float | None:
    """The expression's value once ``holds(value)``: scrapes of the five targets are spread over the
    interval (and one may time out on a busy host), so a figure can lag another by a scrape."""
    deadline = time.monotonic() + timeout
    while not holds(value := _value(port, expression)):
        assert time.monotonic() < deadline, f"{expression} stayed at {value}"
        time.sleep(0.5)
    return value


def test_prometheus_scrapes_the_aggregator_and_every_party_and_reads_the_rounds_back(tmp_path):
    rounds = 4
    spec = make_spec(job_id="metrics", rounds=rounds, protection={"mode": "secagg"})
    ports = {name: _free_port() for name in ["aggregator", *spec.parties]}
    web = _free_port()
    targets = ", ".join(f'"127.0.0.1:{port}"' for port in ports.values())
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        f"scrape_configs: [{{job_name: confide, static_configs: [{{targets: [{targets}]}}]}}]\n"
    )
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}"]
        + [f"--web.listen-address=127.0.0.1:{web}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    released = tmp_path / "released"
    outcome: dict = {}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{web}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.2)
        env = {
            party: {
                **with_faults(hold_round=rounds, hold_until=released),
                "CONFIDE_METRICS": f"127.0.0.1:{ports[party]}",
            }
            for party in spec.parties
        }

        def job() -> None:
            try:
                outcome["report"] = run_local(
                    spec,
                    tmp_path / "run",
                    progress=False,
                    echo=lambda *_: None,
                    party_env=env,
                    aggregator_args=["--metrics", f"127.0.0.1:{ports['aggregator']}"],
                )
            except Exception as error:  # noqa: BLE001 - reported by the main thread
                outcome["error"] = error

        thread = threading.Thread(target=job, daemon=True)
        thread.start()
        # Every party completed every round, read from the scraped series while they hold.
        deadline = time.monotonic() + 180
        # last_over_time: a scrape that a busy host let time out leaves the series stale for a moment
        completed = 'sum(last_over_time(confide_rounds_total{job="confide", role="party", outcome="completed"}[1m]))'
        while _value(web, completed) != 3 * rounds:
            assert "error" not in outcome, outcome.get("error")
            assert time.monotonic() < deadline, f"Prometheus read {_value(web, completed)} party rounds"
            time.sleep(0.5)
        aggregator = 'sum(last_over_time(confide_rounds_total{role="aggregator", outcome="completed"}[1m]))'
        _eventually(web, aggregator, lambda v: v is not None and v >= rounds)
        _eventually(web, "count(max_over_time(up[1m]) == 1)", lambda v: v == 4)
        _eventually(web, 'count(last_over_time(confide_protection_mode{mode="secagg"}[1m]) == 1)', lambda v: v == 3)
        sent = 'sum(last_over_time(confide_bytes_total{role="party", direction="sent"}[1m]))'
        _eventually(web, sent, lambda v: v is not None and v > 0)
        queue = 'count(last_over_time(confide_aggregator_queue{queue="open_rounds"}[1m]))'
        _eventually(web, queue, lambda v: v == 1)
        phases = _query(web, 'count by (phase) (last_over_time(confide_round_seconds_count{role="party"}[1m]))')
        assert {r["metric"]["phase"] for r in phases} >= {"train", "upload", "wait", "crypto", "round"}
    finally:
        released.touch()
        if "thread" in locals():
            thread.join(180)
        server.terminate()
        server.wait(30)
        log.close()
    assert "error" not in outcome, outcome.get("error")
    assert [r["round"] for r in outcome["report"]["rounds"]] == list(range(1, rounds + 1))
