"""A throw-away PostgreSQL server for tests: its own cluster in a temp dir, TCP on 127.0.0.1 only.

Usage::

    server = start_postgres()          # initdb + pg_ctl start (about 1-2 s)
    url = server.create_database()     # "postgresql://postgres@127.0.0.1:PORT/t_<random>"
    ...
    server.drop_database(url)
    server.stop()                      # pg_ctl stop + remove the cluster

The binaries come from ``/usr/lib/postgresql/<version>/bin`` (``scripts/ensure-postgres.sh``
installs them; ``make test`` runs it). PostgreSQL refuses to run as root, so as root every
server command runs as the ``postgres`` OS user (``runuser -u postgres``) on a data directory
chowned to it; otherwise the commands run as the current user. Authentication is ``trust`` and
the server listens on a free port of 127.0.0.1 only (no Unix socket); ``fsync`` stays on.

Shared by tests/unit/controller and tests/integration; it imports nothing from Confide.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "PostgresNotInstalled",
    "PostgresServer",
    "find_bin_dir",
    "start_postgres",
]

#: The hint every "not installed" message carries.
INSTALL_HINT = "run `make test` (it installs PostgreSQL via scripts/ensure-postgres.sh)"
OS_USER = "postgres"


class PostgresNotInstalled(RuntimeError):
    """No PostgreSQL server binaries (initdb, pg_ctl, postgres) were found."""


def _version_key(path: str) -> tuple:
    version = Path(path).parent.name
    return tuple(int(part) if part.isdigit() else 0 for part in re.split(r"[.]", version))


def find_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding initdb, pg_ctl and postgres (or None).

    ``CONFIDE_PG_BIN`` overrides the search (a directory with the same three programs).
    """
    override = os.environ.get("CONFIDE_PG_BIN")
    candidates = [override] if override else sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key)[::-1]
    for candidate in candidates:
        directory = Path(candidate)
        if all(os.access(directory / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return directory
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class PostgresServer:
    """A running throw-away cluster; ``url`` connects as the superuser to database ``postgres``."""

    bin_dir: Path
    root: Path
    port: int
    as_root: bool
    _stopped: bool = field(default=False, repr=False)

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory."""
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        """The server's log."""
        return self.root / "server.log"

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres``."""
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        """The URL of ``database`` on this server."""
        return f"postgresql://{OS_USER}@127.0.0.1:{self.port}/{database}"

    # ------------------------------------------------------------------ databases

    def _admin(self):
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=self.port, user=OS_USER, dbname="postgres", autocommit=True, connect_timeout=10
        )

    def create_database(self, prefix: str = "t") -> str:
        """A new empty database with a unique name; returns its URL."""
        name = f"{prefix}_{secrets.token_hex(6)}"
        with self._admin() as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    def drop_database(self, url_or_name: str) -> None:
        """Drop a database made by :meth:`create_database` (open connections are terminated)."""
        name = url_or_name.rsplit("/", 1)[-1]
        if not re.fullmatch(r"[a-z0-9_]+", name) or name == "postgres":
            raise ValueError(f"refusing to drop database {name!r}")
        with self._admin() as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its directory; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if (self.data_dir / "postmaster.pid").exists():
                _run(self, "pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "30", check=False)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server log (for error messages)."""
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _run(server: PostgresServer, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    command = [str(server.bin_dir / tool), *args]
    if server.as_root:
        command = ["runuser", "-u", OS_USER, "--", *command]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    environment.update({"LC_ALL": "C", "LANG": "C"})
    result = subprocess.run(
        command, cwd=server.root, env=environment, capture_output=True, text=True, timeout=120, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed with exit code {result.returncode}:\n{result.stdout}\n{result.stderr}\n"
            f"server log:\n{server.log_tail()}"
        )
    return result


def _wait_ready(server: PostgresServer, timeout_s: float) -> None:
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(
                host="127.0.0.1", port=server.port, user=OS_USER, dbname="postgres", connect_timeout=2
            ) as connection:
                connection.execute("SELECT 1")
            return
        except psycopg.OperationalError as error:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"PostgreSQL on port {server.port} not ready after {timeout_s} s: {error}\n{server.log_tail()}"
                ) from None
            time.sleep(0.05)


def start_postgres(*, timeout_s: float = 60.0, attempts: int = 3) -> PostgresServer:
    """Create a cluster in a fresh temp dir and start it on a free port of 127.0.0.1.

    Raises
    ------
    PostgresNotInstalled
        No initdb/pg_ctl/postgres under ``/usr/lib/postgresql/*/bin``.
    RuntimeError
        initdb or the server failed (the message holds their output and the server log).
    """
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise PostgresNotInstalled(
            f"PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: {INSTALL_HINT}"
        )
    as_root = os.geteuid() == 0
    if as_root:
        try:
            account = pwd.getpwnam(OS_USER)
        except KeyError:
            raise PostgresNotInstalled(
                f"running as root but there is no {OS_USER!r} OS user to run PostgreSQL as: {INSTALL_HINT}"
            ) from None
    root = Path(tempfile.mkdtemp(prefix="confide-pg-"))
    if as_root:
        os.chown(root, account.pw_uid, account.pw_gid)
    server = PostgresServer(bin_dir=bin_dir, root=root, port=0, as_root=as_root)
    try:
        _run(
            server,
            "initdb",
            "-D",
            str(server.data_dir),
            "-U",
            OS_USER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        )
        settings = (
            "\n# confide test server\n"
            "listen_addresses = '127.0.0.1'\n"
            "unix_socket_directories = ''\n"
            "fsync = on\n"
            "max_connections = 200\n"
            "shared_buffers = 32MB\n"
        )
        with open(server.data_dir / "postgresql.conf", "a") as conf:
            conf.write(settings)
        last_error: Exception | None = None
        for _ in range(attempts):
            server.port = _free_port()
            started = _run(
                server,
                "pg_ctl",
                "start",
                "-D",
                str(server.data_dir),
                "-l",
                str(server.log_file),
                "-w",
                "-t",
                str(int(timeout_s)),
                "-o",
                f"-p {server.port}",
                check=False,
            )
            if started.returncode == 0:
                _wait_ready(server, timeout_s)
                atexit.register(server.stop)
                return server
            # Most likely someone took the port between probing and binding: try another.
            last_error = RuntimeError(f"pg_ctl start failed:\n{started.stdout}{started.stderr}\n{server.log_tail()}")
        raise last_error  # type: ignore[misc]
    except BaseException:
        server.stop()
        raise
