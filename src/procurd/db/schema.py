"""The database schema: the mirror a storefront reads, and procurd's own bookkeeping.

Tables are SQLAlchemy Core objects; the storage modules (``procurd.db.*_store``) hold every statement.
Amounts are exact decimal text, never floats. Datetimes are aware UTC.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

import procurd.db.provider_schema  # noqa: F401  (the provider role's tables, on the same metadata)
from procurd.core.rollup import VALUE_COLUMNS as ROLLUP_COLUMNS
from procurd.db.metadata import NAMING_CONVENTION as NAMING_CONVENTION
from procurd.db.metadata import metadata as metadata
from procurd.db.types import JsonDocument, Money, UtcDateTime

# --- the mirror ------------------------------------------------------------------------------------------
# Each row is keyed by (upstream, id). Every field of seed 000's Category / Product / SKU is a column of the
# same name; fields an upstream adds beyond the seed are kept in ``extra``. ``content_hash`` is a digest of
# the upstream's fields so a sync can skip unchanged rows without comparing every column.


def _mirror_columns() -> list[Column[object]]:
    return [
        Column("synced_at", UtcDateTime(), nullable=False),
        Column("removed_at", UtcDateTime(), nullable=True),
        Column("extra", JsonDocument, nullable=True),
        Column("content_hash", String(32), nullable=False),
    ]


mirror_categories = Table(
    "mirror_categories",
    metadata,
    Column("upstream", String(64), primary_key=True),
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("parent_id", BigInteger, nullable=False),
    Column("slug", String(255), nullable=False),
    Column("name", JsonDocument, nullable=False),
    Column("icon", Text, nullable=False),
    Column("sort_order", Integer, nullable=False),
    Column("is_active", Boolean, nullable=False),
    *_mirror_columns(),
)

mirror_products = Table(
    "mirror_products",
    metadata,
    Column("upstream", String(64), primary_key=True),
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("slug", String(255), nullable=False),
    Column("title", JsonDocument, nullable=False),
    Column("description", JsonDocument, nullable=True),
    Column("content", JsonDocument, nullable=True),
    Column("seo_meta", JsonDocument, nullable=True),
    Column("images", JsonDocument, nullable=False),
    Column("tags", JsonDocument, nullable=False),
    Column("price_amount", Money(), nullable=False),
    Column("original_price", Money(), nullable=True),
    Column("member_price", Money(), nullable=True),
    Column("fulfillment_type", String(16), nullable=False),
    Column("manual_form_schema", JsonDocument, nullable=True),
    Column("is_active", Boolean, nullable=False),
    Column("category_id", BigInteger, nullable=False),
    Column("created_at", String(64), nullable=True),
    Column("updated_at", String(64), nullable=True),
    *_mirror_columns(),
    # The cheapest live priced SKU's selling price (procurd's own, from [pricing]; not upstream fields).
    Column("sell_price", Money(), nullable=True),
    Column("sell_currency", String(16), nullable=True),
)

mirror_skus = Table(
    "mirror_skus",
    metadata,
    Column("upstream", String(64), primary_key=True),
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("product_id", BigInteger, nullable=False),
    Column("sku_code", String(255), nullable=False),
    Column("spec_values", JsonDocument, nullable=True),
    Column("price_amount", Money(), nullable=False),
    Column("original_price", Money(), nullable=True),
    Column("member_price", Money(), nullable=True),
    Column("stock_status", String(16), nullable=False),
    Column("stock_quantity", BigInteger, nullable=False),
    Column("is_active", Boolean, nullable=False),
    *_mirror_columns(),
    # The selling price from [pricing] (procurd's own); while price_held_at is set it keeps its old value.
    Column("sell_price", Money(), nullable=True),
    Column("sell_currency", String(16), nullable=True),
    Column("price_held_at", UtcDateTime(), nullable=True),
    Column("held_cost", Money(), nullable=True),
    Index("ix_mirror_skus_product", "upstream", "product_id"),
    # ix_mirror_skus_held: declared by ddl_metadata() below.
)

mirror_changes = Table(
    "mirror_changes",
    metadata,
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("upstream", String(64), nullable=False),
    Column("entity", String(16), nullable=False),  # category | product | sku
    Column("entity_id", BigInteger, nullable=False),
    Column("kind", String(16), nullable=False),  # added | changed | removed | restored
    Column("field", String(64), nullable=True),
    Column("old_value", Text, nullable=True),
    Column("new_value", Text, nullable=True),
    Column("changed_at", UtcDateTime(), nullable=False),
    Column("sync_run_id", BigInteger, nullable=True),
    Index("ix_mirror_changes_entity", "upstream", "entity", "entity_id"),
    Index("ix_mirror_changes_changed_at", "changed_at"),
)

sync_runs = Table(
    "sync_runs",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("upstream", String(64), nullable=False),
    Column("started_at", UtcDateTime(), nullable=False),
    Column("finished_at", UtcDateTime(), nullable=True),
    Column("status", String(16), nullable=False),  # running | ok | failed | suspicious | skipped
    Column("kind", String(16), nullable=False, default="full"),  # full | incremental
    Column("updated_after", UtcDateTime(), nullable=True),  # what an incremental pass asked for
    Column("ignored_updated_after", Boolean, nullable=False, default=False),
    Column("pages", Integer, nullable=False, default=0),
    Column("categories", Integer, nullable=False, default=0),
    Column("products", Integer, nullable=False, default=0),
    Column("skus", Integer, nullable=False, default=0),
    Column("added", Integer, nullable=False, default=0),
    Column("restored", Integer, nullable=False, default=0),
    Column("changed", Integer, nullable=False, default=0),
    Column("removed", Integer, nullable=False, default=0),
    Column("rows_written", Integer, nullable=False, default=0),
    Column("violations", JsonDocument, nullable=True),
    Column("error", Text, nullable=True),
    Index("ix_sync_runs_upstream_started", "upstream", "started_at"),
)

# --- coordination and health ------------------------------------------------------------------------------

leases = Table(
    "leases",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("holder", String(128), nullable=False),
    Column("expires_at", UtcDateTime(), nullable=False),
    Column("acquired_at", UtcDateTime(), nullable=False),
)

# One request budget per upstream API key, shared by every instance on the database (PostgreSQL).
rate_budgets = Table(
    "rate_budgets",
    metadata,
    Column("key", String(64), primary_key=True),  # digest of the upstream's API root and key
    Column("upstream", String(64), nullable=False),  # the name it is configured under, for people
    Column("next_slot_at", UtcDateTime(), nullable=False),  # the earliest start of the next request
    Column("paused_until", UtcDateTime(), nullable=False),  # after a rate-limit answer
    Column("granted", BigInteger, nullable=False),  # requests allowed so far
)

# The best priority each instance has waiting for a budget's next request, while it waits.
rate_demand = Table(
    "rate_demand",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("instance", String(128), primary_key=True),
    Column("priority", Integer, nullable=False),
    Column("expires_at", UtcDateTime(), nullable=False),
)

upstream_health = Table(
    "upstream_health",
    metadata,
    Column("upstream", String(64), primary_key=True),
    Column("last_ping_at", UtcDateTime(), nullable=True),
    Column("last_ping_ok", Boolean, nullable=True),
    Column("last_ping_error", Text, nullable=True),
    Column("site_name", String(255), nullable=True),
    Column("protocol_version", String(32), nullable=True),
    Column("balance", Money(), nullable=True),
    Column("currency", String(16), nullable=True),
    Column("member_level", JsonDocument, nullable=True),
    Column("latency_ms", Integer, nullable=True),
    Column("auth_error_code", String(64), nullable=True),
    Column("auth_error_at", UtcDateTime(), nullable=True),
    Column("callbacks_accepted", BigInteger, nullable=False, default=0),
    Column("callbacks_rejected", BigInteger, nullable=False, default=0),
    Column("updated_at", UtcDateTime(), nullable=False),
)

# What each upstream's answers showed of the dialect it speaks (seed 000, or Dujiao-Next since 2026): learned
# by catalogue passes, pings, probes and any request over its limit; each with when it was last seen.
upstream_dialects = Table(
    "upstream_dialects",
    metadata,
    Column("upstream", String(64), primary_key=True),
    # Whether its listing, asked include_inactive=true, answered includes_inactive: true.
    Column("includes_inactive", Boolean, nullable=True),
    Column("page_size_asked", Integer, nullable=True),
    Column("page_size", Integer, nullable=True),  # the page size it answered to that
    Column("listing_at", UtcDateTime(), nullable=True),
    Column("limiter_status", Integer, nullable=True),  # the HTTP status of its answer over the limit
    Column("limiter_at", UtcDateTime(), nullable=True),
    Column("inactive_detail", String(8), nullable=True),  # "404" or "200": an inactive product's detail
    Column("inactive_detail_at", UtcDateTime(), nullable=True),
    Column("clock_offset_seconds", Float, nullable=True),  # this machine ahead of it, at the last ping
    Column("updated_at", UtcDateTime(), nullable=False),
)

# The SKU ids procurd gives the orderable choices of an upstream that numbers none (acg-faka): one per choice
# key, per upstream, from max + 1, never deleted (a choice seen again gets its id back, none is reused).
upstream_choices = Table(
    "upstream_choices",
    metadata,
    Column("upstream", String(64), primary_key=True),
    Column("sku_id", BigInteger, primary_key=True, autoincrement=False),
    Column("choice_key", Text, nullable=False),
    Column("product_id", BigInteger, nullable=False),
    Column("code", String(255), nullable=False),
    Column("race", Text, nullable=True),
    Column("options", JsonDocument, nullable=False),
    Column("first_seen_at", UtcDateTime(), nullable=False),
    UniqueConstraint("upstream", "choice_key", name="uq_upstream_choices_key"),
)

upstream_trades = Table(
    "upstream_trades",
    metadata,
    # One purchase at an upstream whose protocol cannot look a purchase up by procurd's number (acg-faka),
    # written before it is sent: a try whose answer never came is known on the next, and never sent again.
    Column("upstream", String(64), primary_key=True),
    Column("request_no", String(32), primary_key=True),
    Column("downstream_order_no", String(128), nullable=False),
    Column("code", String(255), nullable=False),
    Column("quantity", Integer, nullable=False),
    # sending (no answer yet), delivered, pending (a notice: goods by hand later), not_delivered,
    # refused (nothing bought), unknown (nobody can tell)
    Column("state", String(16), nullable=False),
    Column("trade_no", String(32), nullable=True),
    Column("amount", String(32), nullable=True),
    Column("balance_before", String(32), nullable=True),
    Column("notice", Text, nullable=True),  # the text a pending order answered (a notice, not goods)
    Column("sent_at", UtcDateTime(), nullable=False),
    Column("answered_at", UtcDateTime(), nullable=True),
    Index("ix_upstream_trades_trade_no", "upstream", "trade_no"),
)

# --- procurement ------------------------------------------------------------------------------------------

orders = Table(
    "orders",
    metadata,
    Column("order_no", String(64), primary_key=True),
    Column("trace_id", String(128), nullable=True),
    Column("fingerprint", String(64), nullable=False),  # sha256 of the canonical request body
    Column("request", JsonDocument, nullable=False),
    Column("status", String(32), nullable=False),
    Column("exception", Boolean, nullable=False, default=False),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    # Taken in from a downstream site (the provider role): ``provider_orders`` has it under this order_no.
    Column("provider", Boolean, nullable=False, default=False, server_default=text("false")),
)

procurements = Table(
    "procurements",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("order_no", String(64), ForeignKey("orders.order_no"), nullable=False),
    Column("position", Integer, nullable=False),
    Column("upstream", String(64), nullable=False),
    Column("sku_id", BigInteger, nullable=False),
    Column("product_id", BigInteger, nullable=True),
    Column("quantity", Integer, nullable=False),
    Column("manual_form_data", JsonDocument, nullable=True),
    Column("max_unit_price", Money(), nullable=True),
    Column("unit_price", Money(), nullable=True),
    Column("fulfillment_type", String(16), nullable=True),
    Column("trace_id", String(128), nullable=True),
    Column("downstream_order_no", String(96), nullable=False),
    # Every number the procurement was bought under, the first first (the last is downstream_order_no).
    Column("downstream_order_nos", JsonDocument, nullable=False),
    # The upstream canceled the order under downstream_order_no: a retry needs a new number.
    Column("number_canceled", Boolean, nullable=False, default=False),
    Column("state", String(16), nullable=False),
    Column("upstream_status", String(32), nullable=True),
    Column("upstream_order_id", BigInteger, nullable=True),
    Column("upstream_order_no", String(96), nullable=True),
    Column("amount", Money(), nullable=True),
    Column("currency", String(16), nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("last_error_code", String(64), nullable=True),
    Column("last_error_message", Text, nullable=True),
    Column("exception_reason", String(64), nullable=True),
    Column("fulfillment", JsonDocument, nullable=True),
    # True from the moment a submission may have reached the upstream until an answer proves no upstream
    # order exists under the current number: such a procurement is never canceled locally.
    Column("upstream_may_exist", Boolean, nullable=False, default=False),
    Column("next_attempt_at", UtcDateTime(), nullable=True),
    Column("lease_owner", String(128), nullable=True),
    Column("lease_expires_at", UtcDateTime(), nullable=True),
    Column("next_poll_at", UtcDateTime(), nullable=True),
    Column("poll_interval_seconds", Float, nullable=True),
    Column("submitted_at", UtcDateTime(), nullable=True),
    Column("delivered_at", UtcDateTime(), nullable=True),
    Column("resolution_note", Text, nullable=True),
    # The most a unit may cost at the current source: max_unit_price, or the selling price converted back.
    Column("unit_limit", Money(), nullable=True),
    # An offer's item: the offer, its sources as taken at intake ([{upstream, sku_id, limit}]), the one in
    # use, and every move from one to the next ([{upstream, sku_id, reason, ...}]).
    Column("offer_code", String(64), nullable=True),
    Column("sources", JsonDocument, nullable=True),
    Column("source_position", Integer, nullable=False, default=0),
    Column("failovers", JsonDocument, nullable=True),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    # The selling price known at intake (a unit, in sell_currency; from [pricing], or what a downstream site
    # was charged) and the pricing rule's exchange rate that brings it back to the upstream's currency.
    Column("sell_price", Money(), nullable=True),
    Column("sell_currency", String(16), nullable=True),
    Column("sell_rate", Money(), nullable=True),
    UniqueConstraint("order_no", "position", name="uq_procurements_order_position"),
    Index("ix_procurements_due", "upstream", "state", "next_attempt_at"),
    Index("ix_procurements_poll", "upstream", "state", "next_poll_at"),
    Index("ix_procurements_upstream_order", "upstream", "upstream_order_id"),
)

# The hourly rollup of procurements (procurd.core.rollup), written by the state path in the transaction of
# each change: per upstream and hour, the procurements taken in by their state now, the upstream amounts of
# those submitted (integer millionths) with their selling prices, and the deliveries by time to delivery.
# account_id 0 is every order of the upstream, another a downstream account's share (the provider role);
# currency "" holds counts; each writing instance adds to rows of its own, so no instance waits for another.
procurement_hours = Table(
    "procurement_hours",
    metadata,
    Column("upstream", String(64), primary_key=True),
    Column("account_id", BigInteger, primary_key=True, autoincrement=False),
    Column("hour", UtcDateTime(), primary_key=True),
    Column("currency", String(16), primary_key=True),
    Column("writer", String(128), primary_key=True),
    *(Column(name, BigInteger, nullable=False, default=0) for name in ROLLUP_COLUMNS),
)

# The wallet at each upstream, hour by hour: the last balance a ping (or an answer that refreshed it) showed.
upstream_balances = Table(
    "upstream_balances",
    metadata,
    Column("upstream", String(64), primary_key=True),
    Column("hour", UtcDateTime(), primary_key=True),
    Column("balance", Money(), nullable=False),
    Column("currency", String(16), nullable=True),
    Column("at", UtcDateTime(), nullable=False),
)

offers = Table(
    "offers",
    metadata,
    Column("code", String(64), primary_key=True),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
)

# An offer's upstream SKUs in priority order (position 0 first).
offer_sources = Table(
    "offer_sources",
    metadata,
    Column("code", String(64), ForeignKey("offers.code", ondelete="CASCADE"), primary_key=True),
    Column("position", Integer, primary_key=True),
    Column("upstream", String(64), nullable=False),
    Column("sku_id", BigInteger, nullable=False),
    UniqueConstraint("code", "upstream", "sku_id", name="uq_offer_sources_sku"),
    Index("ix_offer_sources_sku", "upstream", "sku_id"),
)

procurement_numbers = Table(
    "procurement_numbers",
    metadata,
    Column("upstream", String(64), primary_key=True),
    Column("downstream_order_no", String(96), primary_key=True),
    Column("procurement_id", BigInteger, ForeignKey("procurements.id"), nullable=False),
    # Set once the number is no longer the procurement's current one: reports about it must name this order.
    Column("upstream_order_id", BigInteger, nullable=True),
    Column("created_at", UtcDateTime(), nullable=False),
    Index("ix_procurement_numbers_procurement", "procurement_id"),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("order_no", String(64), nullable=False),
    Column("procurement_id", BigInteger, nullable=True),
    Column("at", UtcDateTime(), nullable=False),
    Column("source", String(16), nullable=False),  # intake | worker | callback | poll | admin
    Column("event", String(64), nullable=False),
    Column("old_state", String(16), nullable=True),
    Column("new_state", String(16), nullable=True),
    Column("detail", JsonDocument, nullable=True),
    # An ignored report identical to the row before it on the procurement counts here instead of adding a row;
    # last_at is when the latest of them came (null while there is one).
    Column("count", Integer, nullable=False, default=1, server_default=text("1")),
    Column("last_at", UtcDateTime(), nullable=True),
    Index("ix_audit_log_order", "order_no", "id"),
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("order_no", String(64), nullable=False),
    Column("event", String(64), nullable=False),
    Column("payload", JsonDocument, nullable=False),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", UtcDateTime(), nullable=False),
    Column("delivered_at", UtcDateTime(), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("lease_owner", String(128), nullable=True),
    Column("lease_expires_at", UtcDateTime(), nullable=True),
    Index("ix_outbox_pending", "delivered_at", "next_attempt_at"),
    Index("ix_outbox_order", "order_no", "id"),
)

# --- alerts, instances, reconciliation --------------------------------------------------------------------

alerts = Table(
    "alerts",
    metadata,
    Column("key", String(200), primary_key=True),  # kind:subject
    Column("kind", String(32), nullable=False),
    Column("subject", String(128), nullable=False),
    Column("upstream", String(64), nullable=True),
    Column("message", Text, nullable=False),
    Column("first_at", UtcDateTime(), nullable=False),
    Column("last_at", UtcDateTime(), nullable=False),
    Column("count", Integer, nullable=False),
    Column("unsent", Integer, nullable=False),
    Column("sent_at", UtcDateTime(), nullable=True),
    Column("send_due_at", UtcDateTime(), nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("error", Text, nullable=True),
    Column("lease_owner", String(128), nullable=True),
    Column("lease_expires_at", UtcDateTime(), nullable=True),
    Index("ix_alerts_send_due", "send_due_at"),
    Index("ix_alerts_last_at", "last_at"),
)

instances = Table(
    "instances",
    metadata,
    Column("id", String(128), primary_key=True),  # host:pid
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", String(32), nullable=False),
    Column("started_at", UtcDateTime(), nullable=False),
    Column("heartbeat_at", UtcDateTime(), nullable=False),
    Column("stopped_at", UtcDateTime(), nullable=True),  # a clean shutdown
    Column("down_at", UtcDateTime(), nullable=True),  # found gone without one
)

reconcile_runs = Table(
    "reconcile_runs",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("upstream", String(64), nullable=True),  # null: every upstream
    Column("trigger", String(16), nullable=False),  # scheduled | daily | manual (callback | poll: late goods)
    Column("started_at", UtcDateTime(), nullable=False),
    Column("finished_at", UtcDateTime(), nullable=True),
    Column("status", String(16), nullable=False),  # running | ok | failed
    Column("checked", Integer, nullable=False, default=0),
    Column("mismatches", Integer, nullable=False, default=0),
    Column("repaired", Integer, nullable=False, default=0),
    Column("errors", Integer, nullable=False, default=0),
    Column("error", Text, nullable=True),
    Index("ix_reconcile_runs_started", "started_at"),
)

reconcile_findings = Table(
    "reconcile_findings",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("run_id", BigInteger, ForeignKey("reconcile_runs.id"), nullable=False),
    Column("procurement_id", BigInteger, nullable=False),
    Column("order_no", String(64), nullable=False),
    Column("upstream", String(64), nullable=False),
    Column("downstream_order_no", String(96), nullable=False),
    Column("upstream_order_id", BigInteger, nullable=True),
    Column("field", String(32), nullable=False),  # status | amount | currency | order
    Column("local_value", Text, nullable=True),
    Column("upstream_value", Text, nullable=True),
    Column("repair", String(64), nullable=True),  # what the repair did (the decision), null when not repaired
    Column("found_at", UtcDateTime(), nullable=False),
    Index("ix_reconcile_findings_run", "run_id"),
)


# --- signing in to the admin listener -------------------------------------------------------------------

# Wrong admin tokens (console sign-in and bearer) by client address, shared by every instance: after a few,
# each further try waits longer (procurd.core.throttle). Forgotten once quiet for a while.
auth_failures = Table(
    "auth_failures",
    metadata,
    Column("address", String(64), primary_key=True),
    Column("failures", Integer, nullable=False),
    Column("first_at", UtcDateTime(), nullable=False),
    Column("last_at", UtcDateTime(), nullable=False),
    Column("blocked_until_ms", BigInteger, nullable=True),  # Unix milliseconds (read by a glance)
    Column("alerted", Boolean, nullable=False),  # this burst raised its admin_auth_failures alert
)

# Signed-in console sessions: a cookie is good only while its row is here (signing out deletes it).
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("id", String(64), primary_key=True),  # SHA-256 of the cookie's session id, in hex
    Column("created_at", UtcDateTime(), nullable=False),
    Column("expires_epoch", BigInteger, nullable=False),  # Unix seconds, the cookie's own (read by a glance)
    Column("address", String(64), nullable=True),  # the client address it was signed in from
)


def ddl_metadata() -> MetaData:
    """The schema with its partial indexes, for DDL: the migrations and the check that they match.

    A partial index names each dialect's ``*_where`` option, and naming PostgreSQL's imports that dialect's
    module (2 MB); no statement the daemon runs needs the index object, so it is added only here.
    """
    if not any(index.name == "ix_mirror_skus_held" for index in mirror_skus.indexes):
        # Only held SKUs are indexed: the index costs nothing on the rows a sync inserts.
        Index(
            "ix_mirror_skus_held",
            mirror_skus.c.upstream,
            mirror_skus.c.price_held_at,
            sqlite_where=text("price_held_at IS NOT NULL"),
            postgresql_where=text("price_held_at IS NOT NULL"),
        )
    return metadata
