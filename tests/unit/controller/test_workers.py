"""``confide controller --workers N``: refused on SQLite, and N processes on PostgreSQL serving one port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from confide.agent.client import ControllerClient
from confide.controller.server import check_workers, serve
from confide.errors import InvalidParameterError
from confide.transport.certs import init_federation

from .conftest import dataset, job

PARTY_NAMES = [f"hospital-{i}" for i in range(6)]


@pytest.mark.parametrize("database", ["controller.db", "sqlite:///tmp/controller.db"])
def test_several_workers_are_refused_on_sqlite_naming_the_option(database):
    with pytest.raises(InvalidParameterError, match="--workers 2 needs .*PostgreSQL"):
        check_workers(database, 2)
    check_workers(database, 1)


@pytest.mark.parametrize("workers", [0, -1, 65, True, 2.0])
def test_a_worker_count_out_of_range_is_refused(workers):
    with pytest.raises(InvalidParameterError, match=r"--workers must be an integer in \[1, 64\]"):
        check_workers("postgresql://u@127.0.0.1:5432/db", workers)


def test_several_workers_on_postgresql_are_accepted():
    check_workers("postgresql://u@127.0.0.1:5432/db", 4)


def test_serve_refuses_before_opening_anything(tmp_path):
    with pytest.raises(InvalidParameterError, match="--workers 3"):
        serve(certs_dir=tmp_path, name="controller", database=str(tmp_path / "c.db"), address="127.0.0.1:0", workers=3)
    assert not (tmp_path / "c.db").exists()


def test_the_command_refuses_workers_on_sqlite_with_a_clear_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "confide", "controller", "--certs", str(tmp_path), "--db", str(tmp_path / "c.db")]
        + ["--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--workers 2 needs a store that takes concurrent writers" in done.stderr + done.stdout


def _workers(pid: int) -> list[int]:
    """The worker processes of the controller ``pid`` (not multiprocessing's resource tracker)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    children = [int(p) for p in path.read_text().split()] if path.exists() else []
    return [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_workers_on_postgresql_serve_one_port(tmp_path, postgres_server):
    certs = tmp_path / "certs"
    init_federation(certs, parties=PARTY_NAMES, services=["aggregator", "controller"], developers=["dev"])
    url = postgres_server.create_database()
    port_file = tmp_path / "port"
    log = open(tmp_path / "controller.log", "wb")  # noqa: SIM115 - owned by the child
    process = subprocess.Popen(
        [sys.executable, "-m", "confide", "controller", "--certs", str(certs), "--db", url]
        + ["--listen", "127.0.0.1:0", "--port-file", str(port_file), "--workers", "2"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    clients: list[ControllerClient] = []
    try:
        deadline = time.monotonic() + 90
        while not port_file.exists():
            assert process.poll() is None, (tmp_path / "controller.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the controller did not start"
            time.sleep(0.1)
        workers = _workers(process.pid)
        assert len(workers) == 2, workers
        base = f"https://127.0.0.1:{port_file.read_text().strip()}"
        # One connection per identity: the kernel spreads them over the workers.
        clients = [ControllerClient(base, certs_dir=certs, name=name) for name in [*PARTY_NAMES, "aggregator", "dev"]]
        by_name = {c.name: c for c in clients}
        by_name["aggregator"].register(address="127.0.0.1:7000")
        for name in PARTY_NAMES:
            by_name[name].register(datasets=[dataset()])
            by_name[name].grant("records", "dev")
            assert by_name[name].sync([]) == {"instructions": []}
        token = by_name["dev"].submit(job(PARTY_NAMES[:2]))["session"]
        assert by_name["aggregator"].sync([])["instructions"][0]["session"] == token
        seen = {p["name"]: p for p in by_name["dev"].parties()}
        assert all(seen[name]["online"] for name in [*PARTY_NAMES, "aggregator"])
        assert process.poll() is None
    finally:
        for client in clients:
            client.close()
        os.killpg(process.pid, signal.SIGTERM)
        code = process.wait(30)
        postgres_server.drop_database(url)
    assert code == 0, (tmp_path / "controller.log").read_text()[-3000:]
    assert all(not Path(f"/proc/{w}").exists() for w in workers)
