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
import subprocess
import sys
import time
from pathlib import Path

from confide.errors import ConfideError

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
        self.processes: list[subprocess.Popen | None] = [None] * nodes
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
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        port_files = []
        for k in range(self.nodes):
            state = self.workdir / f"node-{k}"
            state.mkdir(parents=True, exist_ok=True)
            port_file = self.workdir / f"node-{k}.port"
            port_file.unlink(missing_ok=True)
            port_files.append(port_file)
            command = [
                sys.executable,
                "-m",
                "confide",
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
            ]
            with open(self.workdir / "logs" / f"node-{k}.log", "ab") as log:
                self.processes[k] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        for k, port_file in enumerate(port_files):
            while not port_file.exists() or not port_file.read_text().strip():
                process = self.processes[k]
                if process is not None and process.poll() is not None:
                    self.stop()
                    raise ConfideError(f"aggregator node {k} exited with {process.returncode} (see its log)")
                if time.monotonic() > deadline:
                    self.stop()
                    raise ConfideError(f"aggregator node {k} did not start within {timeout:g} s")
                time.sleep(0.05)
            self.ports[k] = int(port_file.read_text())
        return self.addresses

    def kill(self, node: int) -> None:
        """Kill one node at once (fault injection: no goodbye, like a crashed machine)."""
        process = self.processes[node]
        if process is not None:
            process.kill()
            process.wait()

    def alive(self) -> list[int]:
        """Nodes whose process still runs."""
        return [k for k, p in enumerate(self.processes) if p is not None and p.poll() is None]

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after 5 s)."""
        for process in self.processes:
            if process is not None and process.poll() is None:
                process.terminate()
        for process in self.processes:
            if process is None:
                continue
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
