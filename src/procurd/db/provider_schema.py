"""The provider role's tables: procurd as the upstream of other sites (accounts, their wallets' ledger, the
orders they place, the callbacks to them, the offered catalogue). Defined on procurd's one metadata;
:mod:`procurd.db.schema` imports this module, so every table is known wherever the schema is.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from procurd.db.metadata import metadata
from procurd.db.types import JsonDocument, Money, UtcDateTime

# --- the provider role: procurd as the upstream of other sites -------------------------------------------
# Amounts of wallets are integer cents (exact and comparable in SQL); prices are decimal text as elsewhere.

provider_accounts = Table(
    "provider_accounts",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("api_key", String(64), nullable=False, unique=True),
    Column("api_secret", String(128), nullable=False),  # HMAC needs it as it is: never logged or shown again
    Column("status", String(16), nullable=False),  # active | disabled
    Column("level", String(64), nullable=True),  # the slug of a [[provider.levels]] block
    Column("balance_cents", BigInteger, nullable=False),
    Column("currency", String(16), nullable=False),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
)

# An account's previous API secrets after a rotation, each still verifying signatures until ``valid_until``
# (the overlap that lets its downstream switch), with the requests signed with it counted.
provider_old_secrets = Table(
    "provider_old_secrets",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("account_id", BigInteger, ForeignKey("provider_accounts.id"), nullable=False),
    Column("api_secret", String(128), nullable=False),  # as provider_accounts.api_secret: never shown again
    Column("replaced_at", UtcDateTime(), nullable=False),
    Column("valid_until", UtcDateTime(), nullable=False),
    Column("requests", BigInteger, nullable=False),  # requests whose signature this secret verified
    Column("last_used_at", UtcDateTime(), nullable=True),
    Index("ix_provider_old_secrets_account", "account_id", "valid_until"),
)

# Every movement of a wallet, with the balance it left.
provider_ledger = Table(
    "provider_ledger",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("account_id", BigInteger, ForeignKey("provider_accounts.id"), nullable=False),
    Column("amount_cents", BigInteger, nullable=False),  # positive in, negative out
    Column("kind", String(16), nullable=False),  # topup | debit | order | refund
    Column("order_id", BigInteger, nullable=True),  # the provider order an order or refund row is for
    Column("note", Text, nullable=True),
    Column("balance_after_cents", BigInteger, nullable=False),
    Column("created_at", UtcDateTime(), nullable=False),
    Index("ix_provider_ledger_account", "account_id", "id"),
    Index("ix_provider_ledger_account_at", "account_id", "created_at"),  # the wallet's chart
)

# Orders received from downstream sites; ``order_no`` is also the local order that procures each.
provider_orders = Table(
    "provider_orders",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("order_no", String(64), nullable=False, unique=True),
    Column("account_id", BigInteger, ForeignKey("provider_accounts.id"), nullable=False),
    Column("downstream_order_no", String(128), nullable=True),
    Column("trace_id", String(128), nullable=True),
    Column("callback_url", Text, nullable=True),
    Column("upstream", String(64), nullable=False),
    Column("product_id", BigInteger, nullable=False),  # the offered ids the downstream ordered
    Column("sku_id", BigInteger, nullable=False),
    Column("upstream_sku_id", BigInteger, nullable=False),
    Column("title", JsonDocument, nullable=True),
    Column("fulfillment_type", String(16), nullable=False),
    Column("quantity", Integer, nullable=False),
    Column("unit_price", Money(), nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
    Column("currency", String(16), nullable=False),
    Column("status", String(32), nullable=False),
    Column("fulfillment", JsonDocument, nullable=True),
    Column("refunded_cents", BigInteger, nullable=False),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    UniqueConstraint("account_id", "downstream_order_no", name="uq_provider_orders_downstream"),
    Index("ix_provider_orders_account", "account_id", "id"),
)

# The status each provider order has yet to tell its downstream site: one row per order, the latest status.
provider_callbacks = Table(
    "provider_callbacks",
    metadata,
    Column("order_id", BigInteger, ForeignKey("provider_orders.id"), primary_key=True, autoincrement=False),
    Column("account_id", BigInteger, nullable=False),
    Column("status", String(32), nullable=False),  # the status to tell
    Column("pending", Boolean, nullable=False),
    Column("attempts", Integer, nullable=False),  # of this status
    Column("first_attempt_at", UtcDateTime(), nullable=True),  # of this status
    Column("next_attempt_at", UtcDateTime(), nullable=True),
    Column("delivered_at", UtcDateTime(), nullable=True),
    Column("given_up_at", UtcDateTime(), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("lease_owner", String(128), nullable=True),
    Column("lease_expires_at", UtcDateTime(), nullable=True),
    Column("updated_at", UtcDateTime(), nullable=False),
    Index("ix_provider_callbacks_due", "pending", "next_attempt_at"),
)

# Each try of a callback: the order's delivery log.
provider_callback_attempts = Table(
    "provider_callback_attempts",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("order_id", BigInteger, nullable=False),
    Column("at", UtcDateTime(), nullable=False),
    Column("status", String(32), nullable=False),  # the status it told
    Column("http_status", Integer, nullable=True),
    Column("ok", Boolean, nullable=False),
    Column("message", Text, nullable=True),  # the answer's message, or why there was none (truncated)
    Column("replay", Boolean, nullable=False),
    Index("ix_provider_callback_attempts_order", "order_id", "id"),
)

# The ids the provider shows for each mirrored category, product and SKU: kept forever, never reused.
provider_ids = Table(
    "provider_ids",
    metadata,
    Column("entity", String(16), primary_key=True),  # category | product | sku
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("upstream", String(64), nullable=False),
    Column("upstream_id", BigInteger, nullable=False),
    UniqueConstraint("entity", "upstream", "upstream_id", name="uq_provider_ids_source"),
)

# The offered catalogue, one row per product ever offered: its document as GET /products shows it (base
# prices), and since when it reads so (``updated_at`` moves whenever the document changes).
provider_products = Table(
    "provider_products",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("upstream", String(64), nullable=False),
    Column("upstream_id", BigInteger, nullable=False),
    Column("category_id", BigInteger, nullable=False),
    Column("listed", Boolean, nullable=False),  # active, not removed, with an offered SKU
    # Listed at some time: shown (inactive once no longer listed) to a downstream asking include_inactive.
    Column("listed_once", Boolean, nullable=False, server_default=text("false")),
    Column("document", Text, nullable=False),
    # Per offered SKU id, the least it may sell for (its cost through the pricing rule): where a tier stops.
    Column("floors", JsonDocument, nullable=True),
    Column("digest", String(32), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    Index("ix_provider_products_listed", "listed", "id"),
    Index("ix_provider_products_listed_once", "listed_once", "id"),
)

# How far the offered catalogue follows the mirror: the last mirror change it took in.
provider_state = Table(
    "provider_state",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("value", BigInteger, nullable=False),
)
