"""Governance: scoped, expiring grants with approval per job; dataset uses; party failure reports.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24 01:40:00

Only adds: three nullable or defaulted columns on ``grants``, one on ``participants``, and the
``dataset_uses`` table (filled for sessions submitted from now on; sessions stored before the
upgrade have no rows there, so a revocation does not find them; their owners resume them again
only through the grant checks of ``job resume``).
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the columns and the table."""
    with op.batch_alter_table("grants") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("job_id", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("approval", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("participants") as batch:
        batch.add_column(sa.Column("failure", sa.JSON(), nullable=False, server_default="{}"))
    op.create_table(
        "dataset_uses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("dataset", sa.String(length=64), nullable=False),
        sa.Column("developer", sa.String(length=64), nullable=False),
        sa.Column("pipeline", sa.JSON(), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("approval_needed", sa.Boolean(), nullable=False),
        sa.Column("approved_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("session_id", "owner", "dataset", name="uq_dataset_uses_session_dataset"),
    )


def downgrade() -> None:
    """Drop what upgrade added (tests of the migration only: it loses the governance rows)."""
    op.drop_table("dataset_uses")
    with op.batch_alter_table("participants") as batch:
        batch.drop_column("failure")
    with op.batch_alter_table("grants") as batch:
        batch.drop_column("approval")
        batch.drop_column("job_id")
        batch.drop_column("expires_at")
