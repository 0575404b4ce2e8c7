"""the provider role: accounts with wallets and a ledger, orders from downstream sites and their callbacks,
the offered catalogue and its ids

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import procurd.db.types

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
UTC_DATETIME = procurd.db.types.UtcDateTime(timezone=True)
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("orders") as batch_op:
        batch_op.add_column(
            sa.Column("provider", sa.Boolean(), nullable=False, server_default=sa.text("false"))
        )
    op.create_table(
        "provider_accounts",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("api_key", sa.String(length=64), nullable=False),
        sa.Column("api_secret", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("level", sa.String(length=64), nullable=True),
        sa.Column("balance_cents", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("updated_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_provider_accounts")),
        sa.UniqueConstraint("api_key", name=op.f("uq_provider_accounts_api_key")),
        sa.UniqueConstraint("name", name=op.f("uq_provider_accounts_name")),
    )
    op.create_table(
        "provider_ledger",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("account_id", sa.BigInteger(), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("order_id", sa.BigInteger(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("balance_after_cents", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["provider_accounts.id"],
            name=op.f("fk_provider_ledger_account_id_provider_accounts"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_provider_ledger")),
    )
    op.create_index("ix_provider_ledger_account", "provider_ledger", ["account_id", "id"], unique=False)
    op.create_table(
        "provider_orders",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("order_no", sa.String(length=64), nullable=False),
        sa.Column("account_id", sa.BigInteger(), nullable=False),
        sa.Column("downstream_order_no", sa.String(length=128), nullable=True),
        sa.Column("trace_id", sa.String(length=128), nullable=True),
        sa.Column("callback_url", sa.Text(), nullable=True),
        sa.Column("upstream", sa.String(length=64), nullable=False),
        sa.Column("product_id", sa.BigInteger(), nullable=False),
        sa.Column("sku_id", sa.BigInteger(), nullable=False),
        sa.Column("upstream_sku_id", sa.BigInteger(), nullable=False),
        sa.Column("title", JSON_DOCUMENT, nullable=True),
        sa.Column("fulfillment_type", sa.String(length=16), nullable=False),
        sa.Column("quantity", sa.Integer(), nullable=False),
        sa.Column("unit_price", sa.String(length=40), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("fulfillment", JSON_DOCUMENT, nullable=True),
        sa.Column("refunded_cents", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("updated_at", UTC_DATETIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["provider_accounts.id"],
            name=op.f("fk_provider_orders_account_id_provider_accounts"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_provider_orders")),
        sa.UniqueConstraint("account_id", "downstream_order_no", name="uq_provider_orders_downstream"),
        sa.UniqueConstraint("order_no", name=op.f("uq_provider_orders_order_no")),
    )
    op.create_index("ix_provider_orders_account", "provider_orders", ["account_id", "id"], unique=False)
    op.create_table(
        "provider_callbacks",
        sa.Column("order_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("account_id", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("pending", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("first_attempt_at", UTC_DATETIME, nullable=True),
        sa.Column("next_attempt_at", UTC_DATETIME, nullable=True),
        sa.Column("delivered_at", UTC_DATETIME, nullable=True),
        sa.Column("given_up_at", UTC_DATETIME, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column("lease_expires_at", UTC_DATETIME, nullable=True),
        sa.Column("updated_at", UTC_DATETIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["order_id"],
            ["provider_orders.id"],
            name=op.f("fk_provider_callbacks_order_id_provider_orders"),
        ),
        sa.PrimaryKeyConstraint("order_id", name=op.f("pk_provider_callbacks")),
    )
    op.create_index(
        "ix_provider_callbacks_due", "provider_callbacks", ["pending", "next_attempt_at"], unique=False
    )
    op.create_table(
        "provider_callback_attempts",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("order_id", sa.BigInteger(), nullable=False),
        sa.Column("at", UTC_DATETIME, nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("replay", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_provider_callback_attempts")),
    )
    op.create_index(
        "ix_provider_callback_attempts_order", "provider_callback_attempts", ["order_id", "id"], unique=False
    )
    op.create_table(
        "provider_ids",
        sa.Column("entity", sa.String(length=16), nullable=False),
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("upstream", sa.String(length=64), nullable=False),
        sa.Column("upstream_id", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("entity", "id", name=op.f("pk_provider_ids")),
        sa.UniqueConstraint("entity", "upstream", "upstream_id", name="uq_provider_ids_source"),
    )
    op.create_table(
        "provider_products",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("upstream", sa.String(length=64), nullable=False),
        sa.Column("upstream_id", sa.BigInteger(), nullable=False),
        sa.Column("category_id", sa.BigInteger(), nullable=False),
        sa.Column("listed", sa.Boolean(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("floors", JSON_DOCUMENT, nullable=True),
        sa.Column("digest", sa.String(length=32), nullable=False),
        sa.Column("updated_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_provider_products")),
    )
    op.create_index("ix_provider_products_listed", "provider_products", ["listed", "id"], unique=False)
    op.create_table(
        "provider_state",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_provider_state")),
    )


def downgrade() -> None:
    op.drop_table("provider_state")
    op.drop_index("ix_provider_products_listed", table_name="provider_products")
    op.drop_table("provider_products")
    op.drop_table("provider_ids")
    op.drop_index("ix_provider_callback_attempts_order", table_name="provider_callback_attempts")
    op.drop_table("provider_callback_attempts")
    op.drop_index("ix_provider_callbacks_due", table_name="provider_callbacks")
    op.drop_table("provider_callbacks")
    op.drop_index("ix_provider_orders_account", table_name="provider_orders")
    op.drop_table("provider_orders")
    op.drop_index("ix_provider_ledger_account", table_name="provider_ledger")
    op.drop_table("provider_ledger")
    op.drop_table("provider_accounts")
    with op.batch_alter_table("orders") as batch_op:
        batch_op.drop_column("provider")
