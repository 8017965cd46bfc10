"""Fixtures of the controller tests: a store on SQLite and on a real PostgreSQL, and a small federation.

Every test that takes ``store_url`` (or ``store`` / ``controller`` / ``fed``) runs twice: on a
fresh SQLite file and on a fresh database of a PostgreSQL server that this suite starts itself
(tests/postgres.py). Without the PostgreSQL binaries the PostgreSQL runs fail, telling to run
``make test``; ``CONFIDE_SKIP_POSTGRES=1`` skips them instead.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from confide.controller.service import Caller, Controller
from confide.controller.store import Base, open_store

_TESTS = str(Path(__file__).resolve().parents[2])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from postgres import INSTALL_HINT, PostgresNotInstalled, start_postgres  # noqa: E402

STORES = ["sqlite", "postgresql"]

PARTIES = ("hospital-a", "hospital-b")
DEV = Caller("dev", "developer")
OTHER_DEV = Caller("eve", "developer")
ADMIN = Caller("runner", "admin")
AGG = Caller("aggregator", "service")
SCHEMA = [{"name": "age", "dtype": "float"}, {"name": "bmi", "dtype": "float"}, {"name": "diagnosis", "dtype": "int"}]


def party(name: str) -> Caller:
    return Caller(name, "party")


def dataset(name: str = "records", *, rows: int = 100, schema: list | None = None, **extra) -> dict:
    return {"name": name, "schema": list(SCHEMA if schema is None else schema), "rows": rows, **extra}


def job(parties=PARTIES, *, dataset_name: str = "records", label: str = "diagnosis", **extra) -> dict:
    """A job specification provisioning data as FL_Data."""
    return {
        "job_id": "job-1",
        "rounds": 10,
        "fl_data": {"label": label, "participants": {p: {"dataset": dataset_name} for p in parties}},
        "protection": {"mode": "plain"},
        **extra,
    }


# ---------------------------------------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server for the whole run, started on first use."""
    if os.environ.get("CONFIDE_SKIP_POSTGRES") == "1":
        pytest.skip("CONFIDE_SKIP_POSTGRES=1: the PostgreSQL store tests are skipped")
    missing = None
    try:
        server = start_postgres()
    except PostgresNotInstalled as error:
        missing = str(error)
    if missing is not None:
        pytest.fail(
            f"{missing}\nThe store tests need a real PostgreSQL: {INSTALL_HINT}, "
            "or set CONFIDE_SKIP_POSTGRES=1 to skip them.",
            pytrace=False,
        )
    yield server
    server.stop()


def make_store_url(kind: str, request: pytest.FixtureRequest, directory: Path):
    """A URL of a fresh, empty database of ``kind`` plus its cleanup."""
    if kind == "sqlite":
        return f"sqlite:///{directory / 'controller.db'}", lambda: None
    server = request.getfixturevalue("postgres_server")
    url = server.create_database()
    return url, lambda: server.drop_database(url)


@pytest.fixture(params=STORES)
def store_kind(request) -> str:
    """``sqlite`` or ``postgresql``: every store test runs on both."""
    return request.param


@pytest.fixture
def store_url(store_kind, request, tmp_path):
    """A fresh empty database: a SQLite file, or a new database on the test PostgreSQL server."""
    url, cleanup = make_store_url(store_kind, request, tmp_path)
    yield url
    cleanup()


@pytest.fixture(scope="session")
def _migrated_postgres(postgres_server):
    """One PostgreSQL database at Alembic head, emptied before each test that uses ``store``.

    Emptying (TRUNCATE ... RESTART IDENTITY) is ~30x faster than creating and migrating a new
    database per test and leaves the same state; tests of the migration itself use ``store_url``.
    """
    url = postgres_server.create_database("store")
    open_store(url).close()
    yield url
    postgres_server.drop_database(url)


def _empty(url: str) -> None:
    import psycopg

    tables = ", ".join(sorted(Base.metadata.tables))
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SET lock_timeout = '10s'")
        connection.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")


@pytest.fixture(scope="session")
def _migrated_sqlite(tmp_path_factory) -> Path:
    """A SQLite file at Alembic head with no rows, migrated once; each ``store`` test gets a copy.

    Copying is ~5x faster than migrating a new file per test; ``open_store`` still checks the
    copy's revision as the controller would. Tests of the migration itself use ``store_url``.
    """
    template = tmp_path_factory.mktemp("sqlite-template") / "controller.db"
    open_store(f"sqlite:///{template}").close()
    return template


@pytest.fixture
def store(store_kind, request, tmp_path):
    """An open store at Alembic head with no rows (opened the way the controller opens it)."""
    if store_kind == "sqlite":
        database = tmp_path / "controller.db"
        shutil.copyfile(request.getfixturevalue("_migrated_sqlite"), database)
        url = f"sqlite:///{database}"
    else:
        url = request.getfixturevalue("_migrated_postgres")
        _empty(url)
    opened = open_store(url)
    yield opened
    opened.close()


@pytest.fixture
def controller(store) -> Controller:
    return Controller(store)


# ---------------------------------------------------------------------------------------------- federation


class Federation:
    """Registers parties, the aggregator and grants on a Controller, the way agents and owners would."""

    def __init__(self, controller: Controller) -> None:
        self.c = controller

    def register_party(self, name: str, datasets: list[dict] | None = None) -> dict:
        items = [dataset()] if datasets is None else datasets
        return self.c.register(party(name), address=None, datasets=items, cert_sha256="0" * 64)

    def register_aggregator(self, name: str = "aggregator") -> dict:
        return self.c.register(Caller(name, "service"), address="127.0.0.1:7000", datasets=[], cert_sha256="1" * 64)

    def grant(self, owner: str, developer: str = DEV.name, dataset_name: str = "records") -> dict:
        return self.c.grant(party(owner), dataset=dataset_name, developer=developer)

    def setup(self, parties=PARTIES, *, grant: bool = True) -> None:
        self.register_aggregator()
        for name in parties:
            self.register_party(name)
            if grant:
                self.grant(name)

    def submit(self, spec: dict | None = None, caller: Caller = DEV) -> str:
        return self.c.submit(caller, spec or job())["session"]


@pytest.fixture
def fed(controller) -> Federation:
    return Federation(controller)
