"""An aggregator cluster: N aggregator processes started by one command (``confide cluster``).

Every node is an ordinary ``confide aggregator`` process with its own state directory. Routing
needs no coordinator: parties split each round's slices into shares with
:mod:`confide.transport.routing` (consecutive slices of a layer round-robin over the nodes,
the same index always on the same node) and push each share to the node serving it. Every node
also runs the relay; the parties send their envelopes to the first live node (node 0 while it
lives) and subscribe to every live node, so an envelope reaches its recipients whichever live
node carries it.

Any node may be lost. The parties notice at once (its delivery stream breaks and it refuses a new
one, or it refuses a push or an envelope); each pushes the lost node's share, from the slices it
keeps of its last two rounds, to the next live node, so a share the node had delivered in part,
or to some parties only, completes there. If the lost node relayed, the relay moves to the next
live node, the same one for every party, and each party re-sends its envelopes of the open rounds
there. A restarted node (:meth:`Cluster.restart`, same port) is re-admitted at a round boundary:
the parties probe lost nodes before each round, and the node names the round from which it serves
again (the round after the first probe), so every party routes the same way in every round.
The job fails only when every node is lost.
"""

from __future__ import annotations

import os
import subprocess
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
        port_files = [self._spawn(k) for k in range(self.nodes)]
        deadline = time.monotonic() + timeout
        try:
            for k, port_file in enumerate(port_files):
                self.ports[k] = self.children.wait_port(f"node-{k}", port_file, max(0.1, deadline - time.monotonic()))
        except ConfideError as error:
            self.stop()
            raise ConfideError(f"aggregator {error}") from None
        return self.addresses

    def _spawn(self, node: int) -> Path:
        """Start one node process (on its known port, if it had one); returns its port file."""
        state = self.workdir / f"node-{node}"
        state.mkdir(parents=True, exist_ok=True)
        port_file = self.workdir / f"node-{node}.port"
        port_file.unlink(missing_ok=True)
        self.children.spawn(
            f"node-{node}",
            [
                "aggregator",
                "--listen",
                f"{self.host}:{self.ports[node]}",
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
        return port_file

    def restart(self, node: int, timeout: float = 60.0) -> str:
        """Start a node that was lost again, on the same port and state; returns its address once it listens.

        The parties re-admit it at the next round boundary (they probe lost nodes between rounds).
        """
        process = self.children.children.get(f"node-{node}")
        if process is not None and process.poll() is None:
            raise ConfideError(f"aggregator node {node} still runs (pid {process.pid})")
        port_file = self._spawn(node)
        try:
            self.ports[node] = self.children.wait_port(f"node-{node}", port_file, timeout)
        except ConfideError as error:
            raise type(error)(f"aggregator {error}") from None
        return self.addresses[node]

    def kill(self, node: int) -> None:
        """Kill one node at once (fault injection: no goodbye, like a crashed machine)."""
        self.children.kill(f"node-{node}")

    def processes(self) -> dict[int, subprocess.Popen]:
        """The latest process of every node started so far (dead ones included)."""
        found = {k: self.children.children.get(f"node-{k}") for k in range(self.nodes)}
        return {k: process for k, process in found.items() if process is not None}

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
