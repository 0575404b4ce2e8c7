"""the lean engine: numbers on the procurement, claims by upstream; selling prices and pass kinds in the mirror

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import procurd.db.types

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
UTC_DATETIME = procurd.db.types.UtcDateTime(timezone=True)


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

    op.create_table(
        "alerts",
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(128), nullable=False),
        sa.Column("upstream", sa.String(64), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("first_at", UTC_DATETIME, nullable=False),
        sa.Column("last_at", UTC_DATETIME, nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("unsent", sa.Integer(), nullable=False),
        sa.Column("sent_at", UTC_DATETIME, nullable=True),
        sa.Column("send_due_at", UTC_DATETIME, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", UTC_DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_alerts")),
    )
    op.create_index("ix_alerts_send_due", "alerts", ["send_due_at"])
    op.create_index("ix_alerts_last_at", "alerts", ["last_at"])
    op.create_table(
        "instances",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(32), nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=False),
        sa.Column("heartbeat_at", UTC_DATETIME, nullable=False),
        sa.Column("stopped_at", UTC_DATETIME, nullable=True),
        sa.Column("down_at", UTC_DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instances")),
    )
    op.create_table(
        "reconcile_runs",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("upstream", sa.String(64), nullable=True),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=False),
        sa.Column("finished_at", UTC_DATETIME, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("checked", sa.Integer(), nullable=False),
        sa.Column("mismatches", sa.Integer(), nullable=False),
        sa.Column("repaired", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reconcile_runs")),
    )
    op.create_index("ix_reconcile_runs_started", "reconcile_runs", ["started_at"])
    op.create_table(
        "reconcile_findings",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("procurement_id", sa.BigInteger(), nullable=False),
        sa.Column("order_no", sa.String(64), nullable=False),
        sa.Column("upstream", sa.String(64), nullable=False),
        sa.Column("downstream_order_no", sa.String(96), nullable=False),
        sa.Column("upstream_order_id", sa.BigInteger(), nullable=True),
        sa.Column("field", sa.String(32), nullable=False),
        sa.Column("local_value", sa.Text(), nullable=True),
        sa.Column("upstream_value", sa.Text(), nullable=True),
        sa.Column("repair", sa.String(64), nullable=True),
        sa.Column("found_at", UTC_DATETIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["reconcile_runs.id"], name=op.f("fk_reconcile_findings_run_id_reconcile_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reconcile_findings")),
    )
    op.create_index("ix_reconcile_findings_run", "reconcile_findings", ["run_id"])
    op.create_table(
        "rate_budgets",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("upstream", sa.String(64), nullable=False),
        sa.Column("next_slot_at", UTC_DATETIME, nullable=False),
        sa.Column("paused_until", UTC_DATETIME, nullable=False),
        sa.Column("granted", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_rate_budgets")),
    )
    op.create_table(
        "rate_demand",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("instance", sa.String(128), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("expires_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("key", "instance", name=op.f("pk_rate_demand")),
    )

    _upgrade_catalogue()
    _upgrade_offers()


def _upgrade_offers() -> None:
    with op.batch_alter_table("procurements") as batch_op:
        batch_op.add_column(sa.Column("unit_limit", sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column("offer_code", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("sources", JSON_DOCUMENT, nullable=True))
        batch_op.add_column(sa.Column("source_position", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("failovers", JSON_DOCUMENT, nullable=True))
    # An item accepted before limits were kept on their own is limited by what it asked for.
    op.execute("UPDATE procurements SET unit_limit = max_unit_price")
    op.create_table(
        "offers",
        sa.Column("code", sa.String(64), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("updated_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("code", name=op.f("pk_offers")),
    )
    op.create_table(
        "offer_sources",
        sa.Column("code", sa.String(64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("upstream", sa.String(64), nullable=False),
        sa.Column("sku_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["code"], ["offers.code"], name=op.f("fk_offer_sources_code_offers"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("code", "position", name=op.f("pk_offer_sources")),
        sa.UniqueConstraint("code", "upstream", "sku_id", name="uq_offer_sources_sku"),
    )
    op.create_index("ix_offer_sources_sku", "offer_sources", ["upstream", "sku_id"])


def _downgrade_offers() -> None:
    op.drop_index("ix_offer_sources_sku", table_name="offer_sources")
    op.drop_table("offer_sources")
    op.drop_table("offers")
    with op.batch_alter_table("procurements") as batch_op:
        batch_op.drop_column("failovers")
        batch_op.drop_column("source_position")
        batch_op.drop_column("sources")
        batch_op.drop_column("offer_code")
        batch_op.drop_column("unit_limit")


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
    op.drop_table("rate_demand")
    op.drop_table("rate_budgets")
    _downgrade_offers()
    _downgrade_catalogue()
    op.drop_index("ix_reconcile_findings_run", table_name="reconcile_findings")
    op.drop_table("reconcile_findings")
    op.drop_index("ix_reconcile_runs_started", table_name="reconcile_runs")
    op.drop_table("reconcile_runs")
    op.drop_table("instances")
    op.drop_index("ix_alerts_last_at", table_name="alerts")
    op.drop_index("ix_alerts_send_due", table_name="alerts")
    op.drop_table("alerts")
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
