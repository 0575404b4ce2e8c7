"""upstream_choices: the SKU ids procurd gives the orderable choices of an upstream that numbers none
(an acg-faka supplier: commodity, variant and add-on options), stable and never reused

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 14:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import procurd.db.types

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "upstream_choices",
        sa.Column("upstream", sa.String(length=64), nullable=False),
        sa.Column("sku_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("choice_key", sa.Text(), nullable=False),
        sa.Column("product_id", sa.BigInteger(), nullable=False),
        sa.Column("code", sa.String(length=255), nullable=False),
        sa.Column("race", sa.Text(), nullable=True),
        sa.Column(
            "options",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("first_seen_at", procurd.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("upstream", "sku_id", name=op.f("pk_upstream_choices")),
        sa.UniqueConstraint("upstream", "choice_key", name="uq_upstream_choices_key"),
    )


def downgrade() -> None:
    op.drop_table("upstream_choices")
