"""The rows that code above the storage reads, as frozen records: what the stores return and what the
operations, the listeners and the command line show. :mod:`procurd.db` builds them; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# --- instances --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    """A daemon on the database: its heartbeat, and how it ended (stopped cleanly, or found down)."""

    id: str
    host: str
    pid: int
    version: str
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None = None
    down_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Survey:
    """What a look for vanished instances found: the instances it marked down, and the oldest heartbeat
    among those still alive (the next that could turn stale)."""

    down: list[Instance]
    oldest_heartbeat: datetime | None


# --- upstreams --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamHealth:
    """An upstream's last ping, pending authentication error and callback counts."""

    upstream: str
    last_ping_at: datetime | None = None
    last_ping_ok: bool | None = None
    last_ping_error: str | None = None
    site_name: str | None = None
    protocol_version: str | None = None
    balance: str | None = None
    currency: str | None = None
    member_level: Mapping[str, Any] | None = None
    latency_ms: int | None = None
    auth_error_code: str | None = None
    auth_error_at: datetime | None = None
    callbacks_accepted: int = 0
    callbacks_rejected: int = 0
    updated_at: datetime | None = None


# --- reconciliation ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileRun:
    id: int
    upstream: str | None
    trigger: str
    started_at: datetime
    finished_at: datetime | None
    status: str
    checked: int
    mismatches: int
    repaired: int
    errors: int
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """Where procurd and the upstream disagree about one procurement, and what was repaired."""

    procurement_id: int
    order_no: str
    upstream: str
    downstream_order_no: str
    upstream_order_id: int | None
    field: str
    local_value: str | None
    upstream_value: str | None
    repair: str | None
    found_at: datetime
    run_id: int = 0


# --- orders, offers and their trail -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OrderSummary:
    """An order as a list of orders shows it."""

    order_no: str
    status: str
    exception: bool
    created_at: datetime
    updated_at: datetime
    items: int


@dataclass(frozen=True, slots=True)
class NumberRow:
    """A downstream order number: whose it is, and (once retired) the upstream order it named."""

    upstream: str
    downstream_order_no: str
    procurement_id: int
    order_no: str
    upstream_order_id: int | None


@dataclass(frozen=True, slots=True)
class AuditRow:
    """An entry of an order's audit trail."""

    order_no: str
    procurement_id: int | None
    at: datetime
    source: str
    event: str
    old_state: str | None
    new_state: str | None
    detail: Mapping[str, Any] | None
    count: int = 1  # identical ignored reports counted on one entry
    last_at: datetime | None = None  # when the latest of them came (None while there is one)


@dataclass(frozen=True, slots=True)
class Offer:
    """A storefront SKU code and its upstream SKUs in priority order."""

    code: str
    sources: tuple[tuple[str, int], ...]  # (upstream, sku_id), the first first
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A storefront event waiting to be told."""

    id: int
    event_id: str
    order_no: str
    event: str
    payload: Mapping[str, Any]
    attempts: int


# --- the catalogue as the console browses it --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CatalogSlice:
    """One page of products, each with its SKUs."""

    total: int
    products: list[dict[str, Any]]
    skus: dict[tuple[str, int], list[dict[str, Any]]]


# --- retention --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch of a table's pruning."""

    deleted: int
    last_key: int | None  # where the next batch starts (None: the table is done)


# --- the provider's wallets and callbacks ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    id: int
    account_id: int
    amount_cents: int
    kind: str
    order_id: int | None
    note: str | None
    balance_after_cents: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class CallbackDue:
    """A provider order whose status is to be told to its downstream site, claimed by one dispatcher."""

    order_id: int
    account_id: int
    status: str
    attempts: int
    first_attempt_at: datetime | None
    attempt_id: int | None = None  # the try this claim recorded as in flight, in the delivery log


# A try is in the delivery log from the claim that starts it ("in flight"), so that a crash before its
# answer leaves it there; the instance that finds the claim dead marks it "outcome unknown".
IN_FLIGHT = "in flight: no answer yet"
UNKNOWN = "outcome unknown: "


def unknown_outcome(why: str) -> str:
    """The delivery log's message for a try whose answer never came back (the downstream may have it)."""
    return f"{UNKNOWN}{why}; sent again"


@dataclass(frozen=True, slots=True)
class SettledTry:
    """A try of telling ``status`` to the downstream of order ``order_id``, and what follows from it
    (``attempt_id``: its row in the delivery log, recorded in flight by its claim; ``None`` for a replay)."""

    order_id: int
    status: str
    http_status: int | None
    message: str | None
    delivered: bool
    gave_up: bool
    error: str | None
    next_attempt_at: datetime | None
    attempt_id: int | None = None


@dataclass(frozen=True, slots=True)
class CallbackState:
    order_id: int
    account_id: int
    status: str
    pending: bool
    attempts: int
    first_attempt_at: datetime | None
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    given_up_at: datetime | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class CallbackAttempt:
    at: datetime
    status: str
    http_status: int | None
    ok: bool
    message: str | None
    replay: bool

    @property
    def outcome(self) -> str:
        """``ok``, ``failed``, ``in_flight`` (no answer yet) or ``unknown`` (the instance sending it stopped
        before its answer: the downstream may have been told)."""
        if self.ok:
            return "ok"
        if self.http_status is None and self.message == IN_FLIGHT:
            return "in_flight"
        if self.http_status is None and (self.message or "").startswith(UNKNOWN):
            return "unknown"
        return "failed"


@dataclass(frozen=True, slots=True)
class ListedChoice:
    """A choice a catalogue pass listed: its key, its commodity's id and what a trade names it by."""

    key: str
    product_id: int
    code: str
    race: str | None
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class UpstreamChoice:
    """An orderable choice of an upstream that has no SKU ids of its own (acg-faka: a commodity, a variant and
    one option per add-on group), and the SKU id procurd gave it: stable, never reused."""

    upstream: str
    key: str  # the choice's stable name (protocol.acgfaka.goods.choice_key)
    sku_id: int
    product_id: int
    code: str
    race: str | None
    options: tuple[tuple[str, str], ...]
    first_seen_at: datetime


@dataclass(frozen=True, slots=True)
class MirroredProduct:
    """What a purchase reads of a product's mirror row besides its SKU: the buyer inputs' form (with the
    texts an upstream refuses a value with) and the fields its protocol keeps under ``extra``."""

    upstream: str
    id: int
    manual_form_schema: Any = None
    extra: Mapping[str, Any] | None = None
