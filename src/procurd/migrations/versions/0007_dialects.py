"""dialects: what each upstream's answers showed of the dialect it speaks, and which offered products were
ever listed (a downstream asking include_inactive is shown those no longer on sale)

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-27 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import procurd.db.types

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

UTC_DATETIME = procurd.db.types.UtcDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "upstream_dialects",
        sa.Column("upstream", sa.String(length=64), nullable=False),
        sa.Column("includes_inactive", sa.Boolean(), nullable=True),
        sa.Column("page_size_asked", sa.Integer(), nullable=True),
        sa.Column("page_size", sa.Integer(), nullable=True),
        sa.Column("listing_at", UTC_DATETIME, nullable=True),
        sa.Column("limiter_status", sa.Integer(), nullable=True),
        sa.Column("limiter_at", UTC_DATETIME, nullable=True),
        sa.Column("inactive_detail", sa.String(length=8), nullable=True),
        sa.Column("inactive_detail_at", UTC_DATETIME, nullable=True),
        sa.Column("clock_offset_seconds", sa.Float(), nullable=True),
        sa.Column("updated_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("upstream", name=op.f("pk_upstream_dialects")),
    )
    with op.batch_alter_table("provider_products") as batch_op:
        batch_op.add_column(
            sa.Column("listed_once", sa.Boolean(), server_default=sa.text("false"), nullable=False)
        )
        batch_op.create_index("ix_provider_products_listed_once", ["listed_once", "id"], unique=False)
    # Which products were listed before this version cannot be told: every product the offered catalogue
    # holds counts as listed once (a downstream asking include_inactive sees those not on sale as inactive).
    op.execute(sa.text("UPDATE provider_products SET listed_once = true"))


def downgrade() -> None:
    with op.batch_alter_table("provider_products") as batch_op:
        batch_op.drop_index("ix_provider_products_listed_once")
        batch_op.drop_column("listed_once")
    op.drop_table("upstream_dialects")
