"""nothing on trust: wrong admin tokens counted by client address, console sessions that can be ended, and a
count on an audit row that identical ignored reports add to

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import procurd.db.types

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UTC_DATETIME = procurd.db.types.UtcDateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("audit_log") as batch_op:
        batch_op.add_column(sa.Column("count", sa.Integer(), server_default=sa.text("1"), nullable=False))
        batch_op.add_column(sa.Column("last_at", UTC_DATETIME, nullable=True))
    op.create_table(
        "auth_failures",
        sa.Column("address", sa.String(length=64), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("first_at", UTC_DATETIME, nullable=False),
        sa.Column("last_at", UTC_DATETIME, nullable=False),
        sa.Column("blocked_until_ms", sa.BigInteger(), nullable=True),
        sa.Column("alerted", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("address", name=op.f("pk_auth_failures")),
    )
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("expires_epoch", sa.BigInteger(), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_console_sessions")),
    )


def downgrade() -> None:
    op.drop_table("console_sessions")
    op.drop_table("auth_failures")
    with op.batch_alter_table("audit_log") as batch_op:
        batch_op.drop_column("last_at")
        batch_op.drop_column("count")
