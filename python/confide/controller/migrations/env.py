"""Alembic environment: runs on the connection the controller hands over (see store.upgrade)."""

from alembic import context
from sqlalchemy import create_engine

from confide.controller.store import Base

target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
    with engine.begin() as owned:
        _run(owned)
