"""A whole deployment on one machine: controller, aggregator and party agents as OS processes.

Used by ``make demo`` and the integration tests. Each process is what it would be across sites:
the controller serves HTTPS with mutual TLS over its store, the aggregator follows the
controller and serves gRPC, every party agent holds a catalog of its own datasets (a shard of
the embedded breast cancer data) and starts party processes when the controller says so.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from confide.agent.client import ControllerClient
from confide.errors import ConfideError, TransportUnavailableError
from confide.local.processes import Processes
from confide.transport.certs import init_federation

__all__ = ["LocalDeployment"]


@dataclass
class LocalDeployment:
    """Processes of a local deployment under ``workdir``; ``database`` defaults to SQLite there."""

    workdir: Path
    parties: list[str] = field(default_factory=lambda: ["hospital-a", "hospital-b", "hospital-c"])
    developers: list[str] = field(default_factory=lambda: ["alice", "bob"])
    database: str | None = None
    catalog: dict | None = None
    #: Per-party catalogs (wins over ``catalog`` for the parties it names).
    catalogs: dict[str, dict] = field(default_factory=dict)
    controller_port: int = 0
    aggregator_port: int = 0
    #: Serve the web console too (on ``console_port``, kept across controller restarts).
    console: bool = False
    console_port: int = 0
    #: Seconds without a heartbeat before the controller shows a party or aggregator down.
    alive_s: float = 30.0
    #: Lines of each run's party.log the agents share with the controller (0: none).
    share_log_lines: int = 0
    #: Parties whose agents consent to their own metrics going to a job's MLflow server.
    share_metrics_with_tracking: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        # Each child leads its own process group: killing an agent also kills its party processes.
        self.children = Processes(self.workdir / "logs", env=self.extra_env, new_session=True)

    @property
    def certs(self) -> Path:
        """The federation's certificates."""
        return self.workdir / "certs"

    @property
    def url(self) -> str:
        """The controller's URL."""
        return f"https://127.0.0.1:{self.controller_port}"

    @property
    def console_url(self) -> str:
        """The web console's URL (with ``console=True``)."""
        return f"https://127.0.0.1:{self.console_port}"

    @property
    def database_url(self) -> str:
        """The controller's store."""
        return self.database or f"sqlite:///{(self.workdir / 'controller.db').resolve()}"

    def add_console_user(self, name: str, role: str, password: str, *, party: str | None = None) -> None:
        """Create a console account with ``confide console user add`` (on the controller's store)."""
        command = [sys.executable, "-m", "confide", "console", "user", "add", name, "--role", role]
        command += ["--db", self.database_url]
        command += ["--password-stdin"] + (["--party", party] if party else [])
        done = subprocess.run(command, input=password + "\n", capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise ConfideError(f"confide console user add {name} failed: {done.stderr.strip()}")

    def prepare(self) -> None:
        """Certificates (kept if present) and one catalog per party."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        if not (self.certs / "ca.crt").exists():
            init_federation(
                self.certs,
                parties=self.parties,
                services=["controller", "aggregator"],
                admins=["runner"],
                developers=self.developers,
            )
        for index, party in enumerate(self.parties):
            path = self.catalog_path(party)
            path.parent.mkdir(parents=True, exist_ok=True)
            catalog = (
                self.catalogs.get(party)
                or self.catalog
                or {
                    "datasets": {
                        "breast-cancer": {
                            "source": "breast_cancer",
                            "shard": index,
                            "of": len(self.parties),
                            "split": "iid",
                            "description": f"{party}'s share of the Wisconsin diagnostic breast cancer records",
                        }
                    }
                }
            )
            path.write_text(yaml.safe_dump(catalog))

    def catalog_path(self, party: str) -> Path:
        """Where a party's catalog lives (on its own machine, in a real deployment)."""
        return self.workdir / "parties" / party / "catalog.yaml"

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        # A fresh process table after kill_all: names are reused by restarts.
        return self.children.spawn(name, command)

    def start_controller(self) -> None:
        """Start (or restart, on the same port) the controller; waits until it answers."""
        port_file = self.workdir / "controller.port"
        port_file.unlink(missing_ok=True)
        console_file = self.workdir / "console.port"
        console_file.unlink(missing_ok=True)
        command = [
            "controller",
            "--certs",
            str(self.certs),
            "--db",
            self.database_url,
            "--listen",
            f"127.0.0.1:{self.controller_port}",
            "--port-file",
            str(port_file),
            "--alive",
            str(self.alive_s),
        ]
        if self.console:
            command += ["--console", f"127.0.0.1:{self.console_port}", "--console-port-file", str(console_file)]
        self._spawn("controller", command)
        self.controller_port = self.children.wait_port("controller", port_file, 60)
        if self.console:
            self.console_port = self.children.wait_port("controller", console_file, 60)
        self.wait_healthy()

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Wait until the controller answers."""
        deadline = time.monotonic() + timeout_s
        with self.client("runner") as client:
            while True:
                try:
                    client.request("GET", "/v1/health")
                    return
                except TransportUnavailableError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def start_aggregator(self) -> None:
        """Start the aggregator (state kept, same port on a restart), following the controller."""
        port_file = self.workdir / "aggregator.port"
        port_file.unlink(missing_ok=True)
        self._spawn(
            "aggregator",
            [
                "aggregator",
                "--port-file",
                str(port_file),
                "--listen",
                f"127.0.0.1:{self.aggregator_port}",
                "--certs",
                str(self.certs),
                "--state",
                str(self.workdir / "aggregator-state"),
                "--controller",
                self.url,
            ],
        )
        self.aggregator_port = self.children.wait_port("aggregator", port_file, 60)

    def start_agent(self, party: str) -> None:
        """Start one party's agent."""
        self._spawn(
            f"agent-{party}",
            [
                "agent",
                "--controller",
                self.url,
                "--certs",
                str(self.certs),
                "--name",
                party,
                "--workdir",
                str(self.workdir / "parties" / party),
                "--datasets",
                str(self.catalog_path(party)),
                "--interval",
                "0.5",
                "--share-log-lines",
                str(self.share_log_lines),
                *(["--share-metrics-with-tracking"] if party in self.share_metrics_with_tracking else []),
            ],
        )

    def start(self) -> None:
        """Controller, aggregator and every agent; waits until all registered.

        A process that fails to start stops the others before the error is raised, so a caller
        whose ``start()`` failed has nothing left running.
        """
        self.prepare()
        started = time.monotonic()
        try:
            self.start_controller()
            self.start_aggregator()
            for party in self.parties:
                self.start_agent(party)
            self.wait_registered(since=started)
        except BaseException:
            self.stop()
            raise

    def wait_registered(self, timeout_s: float = 60.0, since: float | None = None) -> None:
        """Wait until the aggregator and every party are registered and online (heard of after ``since``)."""
        deadline = time.monotonic() + timeout_s
        wanted = {"aggregator", *self.parties}
        with self.client("runner") as client:
            while True:
                fresh = None if since is None else time.monotonic() - since
                online = {
                    p["name"] for p in client.parties() if p["online"] and (fresh is None or p["last_seen_s"] < fresh)
                }
                if wanted <= online:
                    return
                if time.monotonic() > deadline:
                    raise ConfideError(f"not registered after {timeout_s:g} s: {sorted(wanted - online)}")
                self._check_alive()
                time.sleep(0.2)

    def client(self, name: str) -> ControllerClient:
        """A controller client acting as ``name``."""
        return ControllerClient(self.url, certs_dir=self.certs, name=name)

    def grant_all(self, developer: str, dataset: str = "breast-cancer") -> None:
        """Every party grants ``developer`` the use of its ``dataset``."""
        for party in self.parties:
            with self.client(party) as client:
                client.grant(dataset, developer)

    def wait_session(
        self,
        token: str,
        owner: str,
        *,
        states=("completed", "failed", "refused", "cancelled", "revoked"),
        timeout_s=300.0,
    ) -> dict:
        """Poll a session until it reaches one of ``states``."""
        deadline = time.monotonic() + timeout_s
        with self.client(owner) as client:
            while True:
                status = client.status(token)
                if status["state"] in states:
                    return status
                if time.monotonic() > deadline:
                    raise ConfideError(f"session {token} is {status['state']} after {timeout_s:g} s: {status}")
                time.sleep(0.3)

    def kill_all(self) -> None:
        """SIGKILL every process group (children of agents included)."""
        self.children.kill_all()
        self.children.children.clear()

    def stop(self) -> None:
        """SIGTERM everything, then SIGKILL what is left."""
        self.children.stop(grace_s=10.0)
        self.kill_all()

    def _check_alive(self) -> None:
        for name, code in self.children.exited().items():
            raise ConfideError(f"{name} exited with code {code}:\n{self.children.tail(name, 40)}")
