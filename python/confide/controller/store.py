"""The controller's store: parties, dataset metadata, grants, audit, sessions and their logs.

SQLAlchemy 2 over SQLite (a file, the default: nothing to install or run) or PostgreSQL (by URL,
``postgresql+psycopg://user@host/db``). The schema belongs to Alembic (``migrations/``): opening a
store upgrades it to the newest revision inside a transaction, so an upgrade never drops data and
a failed one leaves the old schema in place.

Durability: SQLite runs in write-ahead-log mode with ``synchronous=FULL`` (a committed
transaction survives a crash of the process or the machine); PostgreSQL has its own WAL. Every
controller operation that writes more than one row is one transaction, so a session log entry is
either fully stored or not at all, and a controller killed mid-operation loses nothing that was
acknowledged. A heartbeat that reports nothing (one agent's last-seen time at most, and reads)
runs its statements in autocommit mode (``Store.autocommit``): no BEGIN and COMMIT round trips.

PostgreSQL connections are pooled; one that sat in the pool for over ``PING_IDLE_S`` seconds is
pinged before use and replaced if the server went away (a restart), the same protection as
SQLAlchemy's ``pool_pre_ping`` without a round trip on every checkout of a busy pool.

Rows never hold training records: datasets are described by name, schema, row count and owner.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from confide.errors import InvalidParameterError

__all__ = [
    "Account",
    "ApiToken",
    "AuditEvent",
    "Base",
    "Dataset",
    "DatasetUse",
    "Grant",
    "JobSession",
    "Participant",
    "Party",
    "SessionEntry",
    "SignInAttempt",
    "Store",
    "WebSession",
    "open_store",
    "utcnow",
]

MIGRATIONS = Path(__file__).with_name("migrations")


def utcnow() -> datetime:
    """Timezone-aware now (stored as UTC)."""
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    """Declarative base of the controller's tables."""

    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Party(Base):
    """A registered identity: a party (data owner), a service (aggregator) or a developer."""

    __tablename__ = "parties"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    address: Mapped[str | None] = mapped_column(String(255), nullable=True)
    cert_sha256: Mapped[str] = mapped_column(String(64))
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    #: When the certificate it registered with expires, and the Confide version it runs.
    cert_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    version: Mapped[str | None] = mapped_column(String(32), nullable=True)


class Dataset(Base):
    """Metadata a party published about one of its datasets (never its rows)."""

    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("owner", "name", name="uq_datasets_owner_name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), ForeignKey("parties.name"))
    name: Mapped[str] = mapped_column(String(64))
    columns: Mapped[list[Any]] = mapped_column(JSON)
    rows: Mapped[int] = mapped_column(BigInteger)
    description: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(64), default="")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Grant(Base):
    """A data owner's permission for a developer to use one of its datasets in jobs."""

    __tablename__ = "grants"
    __table_args__ = (UniqueConstraint("dataset_id", "developer", name="uq_grants_dataset_developer"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(Integer, ForeignKey("datasets.id"))
    developer: Mapped[str] = mapped_column(String(64))
    granted_by: Mapped[str] = mapped_column(String(64))
    granted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: The grant lapses at this time (None: until revoked).
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    #: Only jobs with this job id may use the dataset (None: any job of the developer).
    job_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    #: Every session that would use the dataset waits for the owner's approval.
    approval: Mapped[bool] = mapped_column(Boolean, default=False)


class AuditEvent(Base):
    """One decision or change, in order: who, what, on what, allowed or denied, and why."""

    __tablename__ = "audit"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    actor: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(255))
    decision: Mapped[str] = mapped_column(String(16))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)


class JobSession(Base):
    """A job as a stateful session: its token, owner, state, current run and log head."""

    __tablename__ = "sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token: Mapped[str] = mapped_column(String(64), unique=True)
    job_id: Mapped[str] = mapped_column(String(128))
    owner: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    run: Mapped[int] = mapped_column(Integer, default=0)
    resume_round: Mapped[int] = mapped_column(Integer, default=0)
    head_seq: Mapped[int] = mapped_column(Integer, default=0)
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SessionEntry(Base):
    """One committed entry of a session's log (append-only; ``seq`` counts from 1)."""

    __tablename__ = "session_entries"
    __table_args__ = (UniqueConstraint("session_id", "seq", name="uq_session_entries_seq"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[int] = mapped_column(Integer, ForeignKey("sessions.id"))
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    note: Mapped[str] = mapped_column(Text, default="")
    #: The full job specification in force after this entry.
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    #: Per-recipient execution configuration (parties and aggregator), routing policy included.
    configs: Mapped[dict[str, Any]] = mapped_column(JSON)
    #: Per-recipient delta from the previous entry's configuration (what is pushed).
    deltas: Mapped[dict[str, Any]] = mapped_column(JSON)
    #: Checkpoint recorded by this entry: {"round", "run", "root", "leaves"} (or empty).
    checkpoint: Mapped[dict[str, Any]] = mapped_column(JSON)


class Participant(Base):
    """What one recipient (party or aggregator) of a session has applied and reported."""

    __tablename__ = "participants"
    __table_args__ = (UniqueConstraint("session_id", "name", name="uq_participants_session_name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[int] = mapped_column(Integer, ForeignKey("sessions.id"))
    name: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    applied_seq: Mapped[int] = mapped_column(Integer, default=0)
    run: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    round: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str] = mapped_column(Text, default="")
    #: Checkpoint manifests reported in the current run, by round: {"12": [{"name","sha256","size"}...]}.
    checkpoints: Mapped[dict[str, Any]] = mapped_column(JSON)
    #: Hashes reported for a resume verification: {"run": N, "files": [...]}.
    verification: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any]] = mapped_column(JSON)
    #: A party's structured failure report (step, dataset, columns, error class, message, hint;
    #: never values), or empty.
    failure: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: Per-round metrics the recipient reported (compact rows, one per round, oldest first).
    metrics: Mapped[list[Any]] = mapped_column(JSON, default=list)
    #: The protection that actually ran, as the party's own report states it.
    protection: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: The last lines of the party's log, where the party chose to share them (else empty).
    log_tail: Mapped[list[Any]] = mapped_column(JSON, default=list)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class DatasetUse(Base):
    """One session's use of one dataset: what its owner sees, what a revocation stops.

    Written when a session is submitted or tuned; ``approved_at`` is set by the owner where its
    grant asks for approval per job (``approval_needed``), and the session waits until then.
    """

    __tablename__ = "dataset_uses"
    __table_args__ = (UniqueConstraint("session_id", "owner", "dataset", name="uq_dataset_uses_session_dataset"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[int] = mapped_column(Integer, ForeignKey("sessions.id"))
    owner: Mapped[str] = mapped_column(String(64))
    dataset: Mapped[str] = mapped_column(String(64))
    developer: Mapped[str] = mapped_column(String(64))
    #: The FL_Data steps run on the dataset, by name and operation (what the owner is shown).
    pipeline: Mapped[list[Any]] = mapped_column(JSON)
    since: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    approval_needed: Mapped[bool] = mapped_column(Boolean, default=False)
    approved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Account(Base):
    """A person who signs in to the web console (``confide.web.accounts``).

    ``role``: ``developer`` (acts as the developer identity of the same name), ``owner`` (a
    party's administrator: acts as the party named in ``party``) or ``admin``. The password is
    stored only as an argon2id hash.
    """

    __tablename__ = "accounts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    party: Mapped[str | None] = mapped_column(String(64), nullable=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    disabled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class ApiToken(Base):
    """A bearer token for scripts, acting as one account; only its SHA-256 is stored."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account: Mapped[str] = mapped_column(String(64))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    label: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class WebSession(Base):
    """A signed-in browser: the cookie's SHA-256, its CSRF token, idle and absolute expiry."""

    __tablename__ = "web_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account: Mapped[str] = mapped_column(String(64))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class SignInAttempt(Base):
    """One sign-in attempt, counted by the console's rate limit (per name and per address)."""

    __tablename__ = "sign_in_attempts"
    __table_args__ = (
        Index("ix_sign_in_attempts_name_at", "name", "at"),
        Index("ix_sign_in_attempts_address_at", "address", "at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    address: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ok: Mapped[bool] = mapped_column(Boolean)


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()
    # The driver's own transaction control (Python's "legacy" mode) is off: it sends BEGIN only
    # before the first INSERT/UPDATE/DELETE, so a transaction's reads saw whatever was committed
    # meanwhile and its writes were judged on them. _sqlite_begin starts every transaction.
    dbapi_connection.isolation_level = None


def _sqlite_begin(connection: Connection) -> None:
    """BEGIN IMMEDIATE: a transaction takes SQLite's one write lock when it starts.

    What PostgreSQL's row locks give the controller, for a store that has one writer at a time:
    a transaction sees one state of the store from its first read to its commit (a heartbeat that
    read a session before a resume cannot apply its report to the resumed run), and none fails
    half-way for a snapshot another writer made stale (a deferred BEGIN upgrading to a writer
    gets SQLITE_BUSY at once, without the busy timeout). Readers in WAL mode are not blocked;
    autocommit connections (heartbeats without reports, the reserved reader) send no BEGIN.
    """
    if connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        return
    # Returning from AUTOCOMMIT, SQLAlchemy put the driver back in its legacy mode: off again.
    connection.connection.dbapi_connection.isolation_level = None
    connection.exec_driver_sql("BEGIN IMMEDIATE")


#: A pooled PostgreSQL connection unused for this long (seconds) is pinged before it is handed out.
PING_IDLE_S = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """Ping a connection that sat in the pool over PING_IDLE_S; replace it if the server went away.

    ``pool_pre_ping`` pings on every checkout: one more round trip per heartbeat (~10% of the
    controller's time on it, py-spy). A connection used within the last second has just
    answered; one that idled longer is checked, so a restarted server costs no failed request.
    """

    def idle_from_now(_dbapi_connection, record, *_args) -> None:
        record.info["idle_since"] = time.monotonic()

    def checkout(dbapi_connection, record, _proxy) -> None:
        if time.monotonic() - record.info.get("idle_since", 0.0) < PING_IDLE_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            raise DisconnectionError(str(error)) from error  # the pool discards it and connects anew
        if not alive:
            raise DisconnectionError("the connection did not answer a ping")

    event.listen(engine, "connect", idle_from_now)
    event.listen(engine, "checkin", idle_from_now)
    event.listen(engine, "checkout", checkout)


class Store:
    """An engine plus a session factory; ``transaction()`` is the unit of every operation."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._reader: Connection | None = None  # reader(): opened on first use
        self._reader_lock = threading.Lock()

    @property
    def url(self) -> str:
        """The database URL without its password."""
        return self.engine.url.render_as_string(hide_password=True)

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back (nothing stored) on error."""
        with self._sessions() as session, session.begin():
            yield session

    @contextmanager
    def autocommit(self) -> Iterator[Session]:
        """A session whose every statement commits on its own (no BEGIN/COMMIT round trips).

        Only for work that writes at most one row in one statement and otherwise reads, where
        each read standing alone is correct (PostgreSQL's READ COMMITTED gives each statement
        its own snapshot inside a transaction too): an agent's heartbeat without reports.
        """
        with self.engine.connect() as connection:
            with self._sessions(bind=connection.execution_options(isolation_level="AUTOCOMMIT")) as session:
                yield session

    @contextmanager
    def reader(self) -> Iterator[Connection | None]:
        """The store's one reserved connection (autocommit), or None while another thread uses it.

        For short reads on the API's event loop, which must never wait for the pool (its
        connections may all be held by writers in worker threads). The connection is opened on
        first use and replaced after a database error (a restarted server, say).
        """
        if not self._reader_lock.acquire(blocking=False):
            yield None
            return
        try:
            if self._reader is None or self._reader.invalidated or self._reader.closed:
                self._reader = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                yield self._reader
            except DBAPIError:
                reader, self._reader = self._reader, None
                with suppress(Exception):  # already broken: closing is best effort
                    reader.invalidate()
                    reader.close()
                raise
        finally:
            self._reader_lock.release()

    def close(self) -> None:
        """Release every pooled connection."""
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        self.engine.dispose()


def database_url(value: str) -> str:
    """A SQLAlchemy URL from a URL or a plain file path (which means SQLite)."""
    if "://" not in value:
        return f"sqlite:///{Path(value).expanduser().resolve()}"
    if value.startswith("postgresql://"):
        return "postgresql+psycopg://" + value[len("postgresql://") :]
    return value


def open_store(url: str, *, migrate: bool = True) -> Store:
    """Open (and by default create or upgrade) the store at ``url``.

    Parameters
    ----------
    url : str
        ``sqlite:///path/to/controller.db``, a plain path (SQLite), or
        ``postgresql://user@host:port/database``.
    migrate : bool
        Upgrade the schema to the newest Alembic revision first (in one transaction).
    """
    try:
        parsed = make_url(database_url(url))
    except Exception as error:  # noqa: BLE001 - SQLAlchemy raises several types for a bad URL
        raise InvalidParameterError(f"database url {url!r} is not valid: {error}") from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise InvalidParameterError(f"database url must be sqlite or postgresql, got {parsed.get_backend_name()!r}")
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
    else:
        # Kept open: 30 (the API's worker threads reach that under load). An overflow connection
        # is closed when returned and the next one opened anew (a PostgreSQL backend process
        # each time): with 10 kept, bursts of heartbeats kept opening and closing connections.
        engine = create_engine(parsed, pool_size=30, max_overflow=10)
        _ping_when_idle(engine)
    if migrate:
        try:
            upgrade(engine)
        except OperationalError as error:
            engine.dispose()
            reason = str(error.orig).splitlines()[0] if error.orig is not None else str(error)
            raise InvalidParameterError(
                f"database {parsed.render_as_string(hide_password=True)!r} cannot be opened: {reason}"
            ) from None
    return Store(engine)


def _alembic_config(engine: Engine):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (Alembic), in one transaction."""
    from alembic import command

    config = _alembic_config(engine)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at (None before the first upgrade)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
