"""The vocabulary of procurement: states, reasons, the procurement record, events and decisions.

A :class:`Procurement` is one order item bought as one upstream order. Everything that happens to it is an
event; the pure :func:`procurd.core.machine.decide` turns the record and one event into a
:class:`Decision`: the record as it is to be stored, the audit entry, and the effects the store carries out
in the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class State(StrEnum):
    """Where one procurement (one order item, one upstream order) stands."""

    QUEUED = "queued"  # waiting for a worker to submit it upstream
    SUBMITTED = "submitted"  # the upstream holds a live order; waiting for delivery
    DELIVERED = "delivered"  # delivered, fulfillment stored
    CANCELED = "canceled"  # canceled upstream-first, or never sent and canceled locally
    EXCEPTION = "exception"  # needs a person: retry or resolve
    RESOLVED = "resolved"  # closed by a person


class Source(StrEnum):
    """Who caused a state change (recorded in the audit trail)."""

    INTAKE = "intake"
    WORKER = "worker"
    CALLBACK = "callback"
    POLL = "poll"
    ADMIN = "admin"
    RECONCILE = "reconcile"
    DOWNSTREAM = "downstream"  # a downstream site, through the provider's API


class Reason(StrEnum):
    """Exception reasons procurd itself assigns; upstream business and auth codes are used as given."""

    PRICE_ABOVE_LIMIT = "price_above_limit"
    PAYMENT_FAILED = "payment_failed"
    MAX_ATTEMPTS_EXCEEDED = "max_attempts_exceeded"
    UPSTREAM_CANCELED = "upstream_canceled"
    UPSTREAM_REFUNDED = "upstream_refunded"
    CONFLICTING_CALLBACK = "conflicting_callback"
    STALE = "stale"
    UPSTREAM_ORDER_MISSING = "upstream_order_missing"
    AMOUNT_MISMATCH = "amount_mismatch"
    NO_SOURCE_AVAILABLE = "no_source_available"
    # A purchase was sent and nobody can tell whether the upstream made it (a lost answer, an HTML page, a
    # text that proves nothing): money may have moved; it is never sent again by itself.
    OUTCOME_UNKNOWN = "outcome_unknown"
    # The upstream made and charged the order but delivered nothing usable (a sold-out notice, too few
    # lines of goods): a person settles it with the upstream.
    NOT_DELIVERED = "not_delivered"


# Exceptions where money may have moved without goods: a person settles them with the upstream; retrying
# would buy again, so a retry is refused (resolve them instead).
SETTLE_WITH_UPSTREAM = frozenset({Reason.OUTCOME_UNKNOWN, Reason.NOT_DELIVERED})


# An upstream refuses a source with these before any money moved: an offer moves on to its next source
# (``price_above_limit``: the price asked right before the purchase, by a protocol without a price guard).
FAILOVER_CODES = frozenset(
    {"sku_unavailable", "product_unavailable", "insufficient_stock", Reason.PRICE_ABOVE_LIMIT.value}
)


# Upstream order statuses: seed 000 part 3, and what real sites report besides. The one list every part that
# reads or answers them uses (the state machine, the wire, the sandbox); a dialect without them maps to them.
ORDER_STATUSES = (
    "pending_payment",
    "paid",
    "fulfilling",
    "partially_delivered",
    "delivered",
    "completed",
    "canceled",
    "refunded",
    "partially_refunded",
)
COMPLETED_STATUS = "completed"  # the last status of a delivered order
DELIVERED_STATUSES = frozenset({"delivered", COMPLETED_STATUS})
CANCELED_STATUS = "canceled"
REFUNDED_STATUSES = frozenset({"refunded", "partially_refunded"})

# Exceptions that an upstream report of a live or delivered order can heal: procurd did not know the order
# existed (its answer was lost) or stopped waiting for it.
HEALABLE_REASONS = frozenset({Reason.MAX_ATTEMPTS_EXCEEDED, Reason.STALE, Reason.UPSTREAM_ORDER_MISSING})


@dataclass(frozen=True, slots=True)
class SourceRef:
    """One source of an offer as a procurement took it: an upstream SKU and the most a unit of it may cost
    there (``None``: no limit), fixed when the order was accepted."""

    upstream: str
    sku_id: int
    limit: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Procurement:
    """One procurement as stored (``procurements`` row)."""

    id: int
    order_no: str
    position: int
    upstream: str
    sku_id: int
    product_id: int | None
    quantity: int
    manual_form_data: Mapping[str, Any] | None
    max_unit_price: str | None
    unit_price: str | None
    fulfillment_type: str | None
    trace_id: str | None
    downstream_order_no: str
    # Every number it was bought under, the first first; the last one is ``downstream_order_no``.
    downstream_order_nos: tuple[str, ...]
    # The upstream canceled the order under ``downstream_order_no``: a retry needs a new number.
    number_canceled: bool = False
    state: State
    upstream_status: str | None = None
    upstream_order_id: int | None = None
    upstream_order_no: str | None = None
    amount: str | None = None
    currency: str | None = None
    attempts: int = 0
    last_error_code: str | None = None
    last_error_message: str | None = None
    exception_reason: str | None = None
    fulfillment: Mapping[str, Any] | None = None
    # True from the moment a submission may have reached the upstream until an answer proves that no
    # upstream order exists under the current number: such a procurement is never canceled locally.
    upstream_may_exist: bool = False
    next_attempt_at: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    next_poll_at: datetime | None = None
    poll_interval_seconds: float | None = None
    submitted_at: datetime | None = None
    delivered_at: datetime | None = None
    resolution_note: str | None = None
    # The most a unit may cost at the current source (max_unit_price, or the selling price converted back).
    unit_limit: str | None = None
    # An item bought through an offer: its code, its sources in priority order (the current one at
    # source_position), and every move from one source to the next.
    offer_code: str | None = None
    sources: tuple[SourceRef, ...] = ()
    source_position: int = 0
    failovers: tuple[Mapping[str, Any], ...] = ()
    created_at: datetime
    updated_at: datetime
    # The selling price known at intake (a unit, in ``sell_currency``) and the exchange rate of the pricing
    # rule that brings it back to the upstream's currency: what the charts set the upstream amount against.
    sell_price: str | None = None
    sell_currency: str | None = None
    sell_rate: str | None = None

    @property
    def submission_in_flight(self) -> bool:
        return self.state is State.QUEUED and self.lease_owner is not None

    @property
    def under_way(self) -> bool:
        """The upstream holds, or may hold, a live order for it: submitted, or a request whose answer never
        came, or an order recorded that the upstream has not canceled. Not while it waits to be sent, nor
        after a refusal that proves nothing was bought (``payment_failed``, ``insufficient_stock`` ...)."""
        return self.state is State.SUBMITTED or self.upstream_may_exist

    @property
    def holds_fulfillment(self) -> bool:
        return self.fulfillment is not None and self.state in (State.DELIVERED, State.RESOLVED)


@dataclass(frozen=True, slots=True, kw_only=True)
class MirroredSku:
    """What intake knows of a SKU and its product from the mirror."""

    id: int
    product_id: int
    price_amount: str
    fulfillment_type: str
    sku_active: bool = True
    sku_removed: bool = False
    product_known: bool = True
    product_active: bool = True
    product_removed: bool = False
    manual_form_schema: Any = None
    category_id: int | None = None
    sell_price: str | None = None
    sell_currency: str | None = None
    stock_status: str | None = None
    stock_quantity: int | None = None
    price_held: bool = False  # its selling price is held after a cost rise (kept at its old value)

    def stock_problem(self, quantity: int) -> tuple[str, str] | None:
        """``(code, message)`` when the mirror says the SKU cannot supply ``quantity`` units."""
        if self.stock_status == "out_of_stock" or (
            self.stock_quantity is not None and 0 <= self.stock_quantity < quantity
        ):
            have = "none" if not self.stock_quantity or self.stock_quantity < 0 else str(self.stock_quantity)
            return "out_of_stock", f"SKU {self.id} has {have} in stock, {quantity} wanted"
        return None

    def problem(self, manual_form_data: Mapping[str, Any] | None) -> tuple[str, str] | None:
        """``(code, message)`` when an item of this SKU cannot be bought as asked, else ``None``."""
        if self.sku_removed or not self.sku_active:
            return "sku_inactive", f"SKU {self.id} is not active upstream"
        if not self.product_known:
            return "product_not_found", f"the product of SKU {self.id} is not in the mirrored catalogue"
        if self.product_removed or not self.product_active:
            return "product_inactive", f"product {self.product_id} is not active upstream"
        if self.fulfillment_type == "manual":
            missing = unfilled_form(self.manual_form_schema, manual_form_data)
            if missing == []:
                return (
                    "manual_form_data_required",
                    f"product {self.product_id} is manual: manual_form_data is required",
                )
            if missing:
                return (
                    "manual_form_data_invalid",
                    f"product {self.product_id} is manual: manual_form_data lacks required "
                    + ", ".join(repr(key) for key in missing),
                )
        return None


def unfilled_form(schema: Any, manual_form_data: Mapping[str, Any] | None) -> list[str] | None:
    """What an order of a manual product leaves out of the buyer's form (``schema``, the product's
    ``manual_form_schema``): ``None`` when nothing, ``[]`` when the form itself is missing, else the keys of
    the required fields it leaves blank.

    Seed 000 requires ``manual_form_data`` for a manual product (an object), and says nothing of its
    contents: a form whose schema requires nothing (goods with no buyer inputs) may be sent empty (``{}``);
    an empty form where the schema requires fields is a missing form, as is no form at all."""
    required = required_form_fields(schema)
    if manual_form_data is None or (not manual_form_data and required):
        return []
    missing = [key for key in required if _blank(manual_form_data.get(key))]
    return missing or None


def required_form_fields(schema: Any) -> list[str]:
    """The keys a manual product's form marks required (its schema lists fields with key and required)."""
    fields = schema.get("fields") if isinstance(schema, Mapping) else schema
    if not isinstance(fields, list):
        return []
    return [
        str(field["key"])
        for field in fields
        if isinstance(field, Mapping) and field.get("required") is True and field.get("key") is not None
    ]


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


# --- events ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admit:
    """A paid order item is taken in (the procurement's first event).

    A SKU item has one source; an offer's item has its sources in priority order, and ``mirror`` holds what
    the mirror knows of each of them (the first that can be bought is taken).
    """

    order_no: str
    position: int
    quantity: int
    manual_form_data: Mapping[str, Any] | None
    max_unit_price: str | None
    trace_id: str | None
    downstream_order_no: str
    sources: tuple[SourceRef, ...]
    mirror: Mapping[tuple[str, int], MirroredSku]
    offer_code: str | None = None
    # The selling price known at intake: a unit, its currency and the pricing rule's exchange rate.
    sell: tuple[str, str | None, str | None] | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """A submitter takes a due procurement for ``lease_seconds`` before it calls the upstream.

    ``mirror`` is what the mirror knows now of the procurement's sources: the cost is checked against the
    limit at every attempt, and an offer moves past a source that cannot be bought.
    """

    owner: str
    lease_seconds: float
    mirror: Mapping[tuple[str, int], MirroredSku] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClaimAbandoned:
    """The instance that holds the claim (a submission's, or a poll's) is gone (it stopped beating): the
    claim may be taken at once."""

    instance: str


@dataclass(frozen=True, slots=True)
class SubmitAccepted:
    """The upstream answered the order creation with ``ok: true``."""

    owner: str
    order_id: int
    order_no: str
    status: str
    amount: str | None
    currency: str | None
    # The goods, when the purchase delivered in its answer (acg-faka's card goods): delivered at once.
    fulfillment: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SubmitRejected:
    """An answer that ends the submission without a live order to wait for.

    ``kind`` is ``payment_failed`` (the upstream created the order and canceled it at once), ``business`` or
    ``auth`` (a definite refusal: no order exists under the number because of this request), ``not_delivered``
    (the upstream made and charged the order, ``order_id``, but delivered nothing usable) or
    ``outcome_unknown`` (nobody can tell whether the upstream made it; ``details`` is what is known).
    """

    owner: str
    kind: str
    code: str
    message: str
    order_id: int | None = None
    order_no: str | None = None
    status: str | None = None
    amount: str | None = None
    currency: str | None = None
    details: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SubmitUnavailable:
    """No usable answer (network, timeout, 5xx, malformed answer, rate limited): the outcome is unknown."""

    owner: str
    code: str
    message: str
    rate_limited: bool = False
    retry_after: float | None = None
    request_sent: bool = True  # False when no connection could be opened: nothing reached the upstream


@dataclass(frozen=True, slots=True)
class UpstreamReport:
    """The upstream's word on an order, from a callback or a poll (one code path for both).

    ``number`` is the downstream order number the report is about; ``None`` means the current one.
    """

    order_id: int
    status: str
    order_no: str | None = None
    fulfillment: Mapping[str, Any] | None = None
    amount: str | None = None
    currency: str | None = None
    refunded_amount: str | None = None
    polled: bool = False  # from a fallback poll: an unchanged answer backs the next poll off
    number: str | None = None
    # The upstream's own answer to ``GET /orders/{order_id}`` confirmed this order under this number: only
    # such a report may name an upstream order that procurd has not recorded for the procurement.
    verified: bool = False


@dataclass(frozen=True, slots=True)
class Reconciled:
    """Reconciliation read the upstream's order and found it disagrees with the procurement: apply it.

    Beyond what a poll would do, an amount or currency that differs from the one recorded is an exception
    ``amount_mismatch``, and an order refunded or canceled upstream after its delivery here is an exception
    ``upstream_refunded`` (real upstreams send no callback for either).
    """

    report: UpstreamReport


@dataclass(frozen=True, slots=True)
class ClaimRefused:
    """An upstream's report named an upstream order procurd had not recorded for the procurement, and the
    upstream, asked, did not confirm it: nothing changes but the audit trail (``callback_unverified``)."""

    order_id: int
    status: str
    reason: str


@dataclass(frozen=True, slots=True)
class PollClaim:
    """Poller ``owner`` takes a due poll; the next one is pushed ``hold_seconds`` out until the answer
    comes (or until ``owner``'s instance is found gone)."""

    hold_seconds: float
    owner: str


@dataclass(frozen=True, slots=True)
class PollFailed:
    """A fallback poll got no usable answer; ``not_found`` when the upstream says the order does not exist."""

    code: str
    message: str
    not_found: bool = False


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The order was not delivered within ``poll_give_up_seconds``."""

    waited_seconds: float


@dataclass(frozen=True, slots=True)
class Retry:
    """A person sends the procurement again. ``nothing_bought``: for an exception ``outcome_unknown``, the
    person checked the upstream and found nothing bought (the purchase is then sent again under the same
    number)."""

    note: str | None = None
    nothing_bought: bool = False


@dataclass(frozen=True, slots=True)
class Resolve:
    """A person closes the exception by hand."""

    note: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """The order is being canceled: locally (never sent) or after the upstream confirmed the cancel."""

    upstream_confirmed: bool


Event = (
    Admit
    | Claim
    | ClaimAbandoned
    | SubmitAccepted
    | SubmitRejected
    | SubmitUnavailable
    | UpstreamReport
    | Reconciled
    | ClaimRefused
    | PollClaim
    | PollFailed
    | GiveUp
    | Retry
    | Resolve
    | Cancel
)


# --- what a decision asks of the store, besides writing the record ---------------------------------------


@dataclass(frozen=True, slots=True)
class NumberAdded:
    """A downstream order number to register for this procurement (unique per upstream, forever).

    ``again`` is set when the procurement may have registered it with that upstream before (an offer that
    returns to a source it left): registering it again is then no change.
    """

    number: str
    again: bool = False


@dataclass(frozen=True, slots=True)
class NumberRetired:
    """The number is no longer used; reports about it must still name ``upstream_order_id``."""

    number: str
    upstream_order_id: int | None


@dataclass(frozen=True, slots=True)
class ExceptionOpened:
    """The procurement became an exception: a person has to look at it."""

    reason: str
    code: str | None
    message: str | None


@dataclass(frozen=True, slots=True)
class GoodsAfterResolution:
    """Goods the upstream delivered for a procurement a person had resolved: recorded with it (it stays
    resolved) and a finding for the person (``reconcile_mismatch``)."""

    status: str


Effect = NumberAdded | NumberRetired | ExceptionOpened | GoodsAfterResolution


@dataclass(frozen=True, slots=True)
class Decision:
    """What one event does to one procurement.

    ``procurement`` is the record as it is to be stored (the same object when nothing changes). ``event``
    and ``detail`` are the audit entry, written when ``audited``: every state change, and facts recorded
    without being applied, such as a late status.
    """

    procurement: Procurement
    event: str
    detail: Mapping[str, Any] = field(default_factory=dict)
    audited: bool = True
    effects: tuple[Effect, ...] = ()


class NotAllowed(Exception):
    """An action that does not apply to the procurement's state; nothing is written."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
