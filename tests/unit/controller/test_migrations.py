"""The schema belongs to Alembic: opening a store migrates it to head, and the models agree with it."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, inspect, select

from confide.controller import store as store_module
from confide.controller.service import Controller
from confide.controller.store import Base, Dataset, Party, open_store
from confide.errors import InvalidParameterError

from .conftest import Federation

TABLES = {
    "alembic_version",
    "audit",
    "parties",
    "datasets",
    "dataset_uses",
    "grants",
    "sessions",
    "session_entries",
    "participants",
    "accounts",
    "api_tokens",
    "web_sessions",
    "sign_in_attempts",
}
HEAD = "0003"


def test_open_creates_every_table_at_head(store_url):
    opened = open_store(store_url)
    try:
        assert store_module.current_revision(opened.engine) == HEAD
        assert set(inspect(opened.engine).get_table_names()) == TABLES
        assert opened.dialect == store_url.split(":")[0]
    finally:
        opened.close()


def test_reopening_is_a_no_op_and_keeps_rows(store_url):
    first = open_store(store_url)
    try:
        Federation(Controller(first)).setup()
    finally:
        first.close()
    second = open_store(store_url)
    try:
        assert store_module.current_revision(second.engine) == HEAD
        with second.transaction() as db:
            assert db.scalar(select(func.count()).select_from(Party)) == 3
            assert db.scalar(select(func.count()).select_from(Dataset)) == 2
        # An explicit upgrade to head again changes nothing either.
        store_module.upgrade(second.engine)
        assert store_module.current_revision(second.engine) == HEAD
        with second.transaction() as db:
            assert db.scalar(select(func.count()).select_from(Party)) == 3
    finally:
        second.close()


def test_models_and_migration_agree(store):
    with store.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        differences = compare_metadata(context, Base.metadata)
    assert differences == []


def test_without_migrate_nothing_is_created(store_url):
    opened = open_store(store_url, migrate=False)
    try:
        assert store_module.current_revision(opened.engine) is None
        assert inspect(opened.engine).get_table_names() == []
    finally:
        opened.close()


@pytest.mark.parametrize("url", ["mysql://root@localhost/db", "not a url://x"])
def test_unsupported_or_bad_urls_are_refused(url):
    with pytest.raises(InvalidParameterError, match="database url"):
        open_store(url)


def test_plain_path_means_sqlite(tmp_path):
    opened = open_store(str(tmp_path / "sub" / "c.db"))
    try:
        assert opened.dialect == "sqlite"
        assert (tmp_path / "sub" / "c.db").exists()
        with opened.engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
    finally:
        opened.close()


def test_upgrading_a_0001_store_keeps_its_grants_and_sessions(store_url):
    """A store made before the governance revision: its rows survive, and new columns take defaults."""
    from datetime import datetime, timezone

    from sqlalchemy import text

    from confide.controller.service import Caller

    opened = open_store(store_url, migrate=False)
    try:
        store_module.upgrade(opened.engine, "0001")
        now = datetime.now(timezone.utc)
        with opened.engine.begin() as db:  # rows as the 0001 schema holds them (the models are newer)
            db.execute(
                text(
                    "INSERT INTO parties (id, name, role, cert_sha256, registered_at, last_seen_at) "
                    "VALUES (1, 'hospital-a', 'party', '', :now, :now)"
                ),
                {"now": now},
            )
            db.execute(
                text(
                    "INSERT INTO datasets (id, owner, name, columns, rows, description, source, updated_at) "
                    "VALUES (1, 'hospital-a', 'records', '[]', 10, '', '', :now)"
                ),
                {"now": now},
            )
            db.execute(
                text(
                    "INSERT INTO grants (id, dataset_id, developer, granted_by, granted_at) "
                    "VALUES (1, 1, 'dev', 'hospital-a', :now)"
                ),
                {"now": now},
            )
    finally:
        opened.close()
    upgraded = open_store(store_url)
    try:
        assert store_module.current_revision(upgraded.engine) == HEAD
        rows = Controller(upgraded).grants(Caller("runner", "admin"))
        assert [(r["dataset"], r["developer"]) for r in rows] == [("hospital-a/records", "dev")]
        assert rows[0]["active"] and rows[0]["approval"] is False and rows[0]["expires_at"] is None
    finally:
        upgraded.close()
