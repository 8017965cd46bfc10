"""Prometheus metrics of a Confide process, on its own ``/metrics`` listener (docs/operations.md, "Monitoring").

Every long-lived role (controller, aggregator node, party, agent) serves the families below where
they apply, through the maintained ``prometheus_client`` (its exposition, its process collector),
when started with ``--metrics HOST:PORT`` or ``CONFIDE_METRICS=HOST:PORT``; without either
nothing listens. The listener is plain HTTP apart from the federation's mutual TLS: it carries
counts and durations only, so bind it to loopback or the monitoring network.

Labels are bounded by construction: a role, a protection mode (the registry's fixed set), an
outcome, a phase, a direction, a decision, a queue. No job id, party name, dataset or value of a
dataset ever becomes a label, so a federation's series count does not grow with its jobs.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterable

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from confide.errors import InvalidParameterError, ServerStartError

__all__ = [
    "AGGREGATOR_QUEUE",
    "CONTROLLER_QUEUE",
    "BYTES",
    "CRYPTO_SECONDS",
    "DROPOUTS",
    "GRANT_DECISIONS",
    "HEARTBEATS",
    "PROTECTION_MODE",
    "RESTARTS",
    "RETRIES",
    "ROUNDS",
    "ROUND_SECONDS",
    "VARIABLE",
    "serve",
    "serve_from",
    "watch",
]

#: The environment variable naming the metrics listener (the ``--metrics`` flag wins).
VARIABLE = "CONFIDE_METRICS"

#: The gauges an aggregator node serves of what it holds now (registered by ``confide aggregator``).
AGGREGATOR_QUEUE = "confide_aggregator_queue"
CONTROLLER_QUEUE = "confide_controller_queue"

#: Round phases of a party (RoundReport fields) and the aggregator's whole attempt.
PHASES = ("train", "agree", "encode", "upload", "wait", "decode", "crypto", "iteration", "round")

ROUNDS = Counter("confide_rounds", "Round attempts by how they ended", ["role", "outcome"])
ROUND_SECONDS = Histogram(
    "confide_round_seconds",
    "Seconds of a round by phase (party: train, agree, encode, upload, wait, decode, crypto, iteration, round)",
    ["role", "phase"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, float("inf")),
)
BYTES = Counter("confide_bytes", "Bytes of rounds on the wire", ["role", "direction"])
CRYPTO_SECONDS = Counter("confide_crypto_seconds", "Seconds spent protecting and unprotecting updates", ["mode"])
PROTECTION_MODE = Gauge("confide_protection_mode", "1 for the protection mode this process runs", ["mode"])
DROPOUTS = Counter("confide_dropouts", "Participants dropped from a round attempt", ["role", "how"])
RETRIES = Counter("confide_round_retries", "Round attempts beyond the first", ["role"])
RESTARTS = Counter("confide_restarts", "Processes a supervisor started again", ["process_role"])
HEARTBEATS = Counter("confide_heartbeats", "Agent heartbeats (agent: sent; controller: received)", ["role", "outcome"])
GRANT_DECISIONS = Counter("confide_grant_decisions", "Data-access decisions on a dataset of a request", ["decision"])


class _Watched(Collector):
    """Gauges read from a live object at scrape time (queue depths, open rounds): nothing to keep in step."""

    def __init__(self, read: Callable[[], dict[str, float]], name: str, documentation: str, label: str) -> None:
        self._read, self._name, self._documentation, self._label = read, name, documentation, label

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(self._name, self._documentation, labels=[self._label])
        try:
            values = self._read()
        except Exception as error:  # noqa: BLE001 - a gauge that cannot be read (its store is away) fails no scrape
            logging.getLogger("confide.metrics").debug("%s not read: %s", self._name, error)
            values = {}
        for key, value in values.items():
            family.add_metric([key], float(value))
        yield family


_WATCHED: dict[str, _Watched] = {}


def watch(read: Callable[[], dict[str, float]], name: str, documentation: str, label: str = "queue") -> None:
    """Serve the gauges ``read()`` returns (label value -> number) under ``name``, read at every scrape.

    Watching a name again replaces what was watched under it: a process serves one live object per
    name (a test that starts several controllers in one process watches the newest).
    """
    if name in _WATCHED:
        REGISTRY.unregister(_WATCHED.pop(name))
    _WATCHED[name] = _Watched(read, name, documentation, label)
    REGISTRY.register(_WATCHED[name])


def serve(address: str, *, field: str = "--metrics") -> int:
    """Listen for scrapes on ``address`` (``host:port``; port 0 picks one); returns the port.

    An address in use or malformed is refused naming ``field``: the process does not start
    without the metrics it was asked for.
    """
    host, _, port_text = address.rpartition(":")
    if not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise InvalidParameterError(f"{field} must be HOST:PORT with a port in [0, 65535], got {address!r}")
    try:
        server, _thread = start_http_server(int(port_text), addr=host.strip("[]"))
    except OSError as error:
        why = "the port is in use" if error.errno == errno.EADDRINUSE else error.strerror or str(error)
        raise ServerStartError(f"{field} {address}: cannot listen for metrics ({why})") from None
    return int(server.server_port)


def serve_from(flag: str | None) -> int | None:
    """:func:`serve` on ``--metrics`` if given, else on ``CONFIDE_METRICS`` if set; the port, or None."""
    if flag:
        return serve(flag)
    variable = os.environ.get(VARIABLE)
    return serve(variable, field=VARIABLE) if variable else None
