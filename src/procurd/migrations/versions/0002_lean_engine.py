"""the lean engine: numbers on the procurement, claims by upstream; selling prices and pass kinds in the mirror

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("procurements") as batch_op:
        batch_op.add_column(sa.Column("downstream_order_nos", JSON_DOCUMENT, nullable=True))
        batch_op.add_column(
            sa.Column("number_canceled", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.drop_column("version")
        batch_op.drop_index("ix_procurements_due")
        batch_op.drop_index("ix_procurements_poll")
        batch_op.create_index("ix_procurements_due", ["upstream", "state", "next_attempt_at"], unique=False)
        batch_op.create_index("ix_procurements_poll", ["upstream", "state", "next_poll_at"], unique=False)

    connection = op.get_bind()
    numbers = connection.execute(
        sa.text(
            "SELECT procurement_id, downstream_order_no, upstream_canceled FROM procurement_numbers "
            "ORDER BY procurement_id, created_at, downstream_order_no"
        )
    ).all()
    by_procurement: dict[int, list[tuple[str, bool]]] = {}
    for procurement_id, number, canceled in numbers:
        by_procurement.setdefault(procurement_id, []).append((number, bool(canceled)))
    current = {
        row.id: row.downstream_order_no
        for row in connection.execute(sa.text("SELECT id, downstream_order_no FROM procurements")).all()
    }
    procurements = sa.table(
        "procurements",
        sa.column("id", sa.BigInteger()),
        sa.column("downstream_order_nos", JSON_DOCUMENT),
        sa.column("number_canceled", sa.Boolean()),
    )
    for procurement_id, number in current.items():
        used = by_procurement.get(procurement_id, [(number, False)])
        canceled = any(used_number == number and flag for used_number, flag in used)
        connection.execute(
            sa.update(procurements)
            .where(procurements.c.id == procurement_id)
            .values(downstream_order_nos=[n for n, _ in used], number_canceled=canceled)
        )

    with op.batch_alter_table("procurements") as batch_op:
        batch_op.alter_column("downstream_order_nos", existing_type=JSON_DOCUMENT, nullable=False)
    with op.batch_alter_table("procurement_numbers") as batch_op:
        batch_op.drop_column("upstream_canceled")

    _upgrade_catalogue()


def _upgrade_catalogue() -> None:
    with op.batch_alter_table("mirror_products") as batch_op:
        batch_op.add_column(sa.Column("sell_price", sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column("sell_currency", sa.String(length=16), nullable=True))
    with op.batch_alter_table("mirror_skus") as batch_op:
        batch_op.add_column(sa.Column("sell_price", sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column("sell_currency", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("price_held_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("held_cost", sa.String(length=40), nullable=True))
        batch_op.create_index(
            "ix_mirror_skus_held",
            ["upstream", "price_held_at"],
            unique=False,
            sqlite_where=sa.text("price_held_at IS NOT NULL"),
            postgresql_where=sa.text("price_held_at IS NOT NULL"),
        )
    with op.batch_alter_table("sync_runs") as batch_op:
        batch_op.add_column(sa.Column("kind", sa.String(length=16), nullable=False, server_default="full"))
        batch_op.add_column(sa.Column("updated_after", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(
            sa.Column("ignored_updated_after", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("restored", sa.Integer(), nullable=False, server_default="0"))


def _downgrade_catalogue() -> None:
    with op.batch_alter_table("sync_runs") as batch_op:
        batch_op.drop_column("restored")
        batch_op.drop_column("ignored_updated_after")
        batch_op.drop_column("updated_after")
        batch_op.drop_column("kind")
    with op.batch_alter_table("mirror_skus") as batch_op:
        batch_op.drop_index("ix_mirror_skus_held")
        batch_op.drop_column("held_cost")
        batch_op.drop_column("price_held_at")
        batch_op.drop_column("sell_currency")
        batch_op.drop_column("sell_price")
    with op.batch_alter_table("mirror_products") as batch_op:
        batch_op.drop_column("sell_currency")
        batch_op.drop_column("sell_price")


def downgrade() -> None:
    _downgrade_catalogue()
    with op.batch_alter_table("procurement_numbers") as batch_op:
        batch_op.add_column(
            sa.Column("upstream_canceled", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("procurements") as batch_op:
        batch_op.drop_index("ix_procurements_due")
        batch_op.drop_index("ix_procurements_poll")
        batch_op.create_index("ix_procurements_due", ["state", "next_attempt_at"], unique=False)
        batch_op.create_index("ix_procurements_poll", ["state", "next_poll_at"], unique=False)
        batch_op.add_column(sa.Column("version", sa.Integer(), nullable=False, server_default="1"))
        batch_op.drop_column("number_canceled")
        batch_op.drop_column("downstream_order_nos")
