"""upstream_trades: each purchase at an upstream whose protocol cannot look one up by procurd's number
(acg-faka), written before it is sent, so that a try whose answer never came is never sent again by itself,
and a manual order's first notice is kept to tell its goods from it

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import procurd.db.types

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "upstream_trades",
        sa.Column("upstream", sa.String(length=64), nullable=False),
        sa.Column("request_no", sa.String(length=32), nullable=False),
        sa.Column("downstream_order_no", sa.String(length=128), nullable=False),
        sa.Column("code", sa.String(length=255), nullable=False),
        sa.Column("quantity", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("trade_no", sa.String(length=32), nullable=True),
        sa.Column("amount", sa.String(length=32), nullable=True),
        sa.Column("balance_before", sa.String(length=32), nullable=True),
        sa.Column("notice", sa.Text(), nullable=True),
        sa.Column("sent_at", procurd.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.Column("answered_at", procurd.db.types.UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("upstream", "request_no", name=op.f("pk_upstream_trades")),
    )
    op.create_index("ix_upstream_trades_trade_no", "upstream_trades", ["upstream", "trade_no"])


def downgrade() -> None:
    op.drop_index("ix_upstream_trades_trade_no", table_name="upstream_trades")
    op.drop_table("upstream_trades")
