"""An aggregator cluster: N aggregator processes started by one command (``confide cluster``).

Every node is an ordinary ``confide aggregator`` process with its own state directory. Routing
needs no coordinator: parties split each round's slices into shares with
:mod:`confide.transport.routing` (consecutive slices of a layer round-robin over the nodes,
the same index always on the same node) and push each share to the node serving it. Node 0 also
relays the parties' envelopes. A node lost mid-round is noticed by the parties (its streams
break and do not come back within their grace period); they push its share to the next live
node from their retained copies, and the round completes there. Losing node 0 fails the job
with a clear error (the relay lives there).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from confide.errors import ConfideError
from confide.local.processes import Processes

__all__ = ["Cluster"]


class Cluster:
    """Starts, watches and stops the node processes of one aggregator cluster.

    Parameters
    ----------
    nodes : int
        Number of aggregator processes (1..64).
    certs : path
        Federation certificate directory; every node serves the ``name`` identity.
    workdir : path
        Per-node state (``node-<k>/``), port files and logs.
    host : str
        Interface to listen on.
    extra_args : list of str
        Passed to every ``confide aggregator`` (timeouts, workers).
    """

    def __init__(
        self,
        nodes: int,
        certs: str | os.PathLike,
        workdir: str | os.PathLike,
        *,
        host: str = "127.0.0.1",
        name: str = "aggregator",
        extra_args: list[str] | None = None,
    ) -> None:
        if not 1 <= nodes <= 64:
            raise ConfideError(f"nodes must be in [1, 64], got {nodes}")
        self.nodes = nodes
        self.certs = Path(certs)
        self.workdir = Path(workdir)
        self.host = host
        self.name = name
        self.extra_args = list(extra_args or [])
        self.children = Processes(self.workdir / "logs")
        self.ports: list[int] = [0] * nodes

    @property
    def addresses(self) -> list[str]:
        """host:port of every node, node 0 first."""
        return [f"{self.host}:{port}" for port in self.ports]

    @property
    def target(self) -> str:
        """What parties pass as ``--aggregator``."""
        return ",".join(self.addresses)

    def start(self, timeout: float = 60.0) -> list[str]:
        """Start every node; returns their addresses once all listen."""
        port_files = []
        for k in range(self.nodes):
            state = self.workdir / f"node-{k}"
            state.mkdir(parents=True, exist_ok=True)
            port_file = self.workdir / f"node-{k}.port"
            port_file.unlink(missing_ok=True)
            port_files.append(port_file)
            self.children.spawn(
                f"node-{k}",
                [
                    "aggregator",
                    "--listen",
                    f"{self.host}:{self.ports[k]}",
                    "--certs",
                    str(self.certs),
                    "--name",
                    self.name,
                    "--state",
                    str(state),
                    "--port-file",
                    str(port_file),
                    *self.extra_args,
                ],
            )
        deadline = time.monotonic() + timeout
        try:
            for k, port_file in enumerate(port_files):
                self.ports[k] = self.children.wait_port(f"node-{k}", port_file, max(0.1, deadline - time.monotonic()))
        except ConfideError as error:
            self.stop()
            raise ConfideError(f"aggregator {error}") from None
        return self.addresses

    def kill(self, node: int) -> None:
        """Kill one node at once (fault injection: no goodbye, like a crashed machine)."""
        self.children.kill(f"node-{node}")

    def alive(self) -> list[int]:
        """Nodes whose process still runs."""
        gone = self.children.exited()
        return [k for k in range(self.nodes) if f"node-{k}" in self.children.children and f"node-{k}" not in gone]

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after 5 s)."""
        self.children.stop(grace_s=5.0)

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
