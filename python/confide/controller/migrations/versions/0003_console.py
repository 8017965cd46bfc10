"""The web console: accounts, API tokens, browser sessions, sign-in attempts; per-round metrics.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 18:00:00

Only adds: four tables of the console (``confide.web.accounts``) and three defaulted JSON columns on
``participants`` (the per-round metrics, the protection report and, where the party shares it, the tail of its
log, as an agent relays them) and two nullable
columns on ``parties`` (certificate expiry, software version: the federation page), so a store
upgraded from 0002 keeps every session, grant and audit row.
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the tables and the columns."""
    op.create_table(
        "accounts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("party", sa.String(length=64), nullable=True),
        sa.Column("password_hash", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", name="uq_accounts_name"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account", sa.String(length=64), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("label", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_sha256", name="uq_api_tokens_digest"),
    )
    op.create_table(
        "web_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account", sa.String(length=64), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("csrf", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_sha256", name="uq_web_sessions_digest"),
    )
    op.create_table(
        "sign_in_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_sign_in_attempts_name_at", "sign_in_attempts", ["name", "at"])
    op.create_index("ix_sign_in_attempts_address_at", "sign_in_attempts", ["address", "at"])
    with op.batch_alter_table("parties") as batch:
        batch.add_column(sa.Column("cert_expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("version", sa.String(length=32), nullable=True))
    with op.batch_alter_table("participants") as batch:
        batch.add_column(sa.Column("metrics", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(sa.Column("protection", sa.JSON(), nullable=False, server_default="{}"))
        batch.add_column(sa.Column("log_tail", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    """Drop what upgrade added (tests of the migration only: accounts and metrics are lost)."""
    with op.batch_alter_table("participants") as batch:
        batch.drop_column("log_tail")
        batch.drop_column("protection")
        batch.drop_column("metrics")
    with op.batch_alter_table("parties") as batch:
        batch.drop_column("version")
        batch.drop_column("cert_expires_at")
    op.drop_index("ix_sign_in_attempts_address_at", "sign_in_attempts")
    op.drop_index("ix_sign_in_attempts_name_at", "sign_in_attempts")
    op.drop_table("sign_in_attempts")
    op.drop_table("web_sessions")
    op.drop_table("api_tokens")
    op.drop_table("accounts")
