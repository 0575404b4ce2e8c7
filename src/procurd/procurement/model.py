"""The vocabulary of procurement: states, exception reasons, sources, and what the state machine sees."""

from __future__ import annotations

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


TERMINAL_STATES = frozenset({State.DELIVERED, State.CANCELED, State.RESOLVED})


class Source(StrEnum):
    """Who caused a state change (recorded in the audit trail)."""

    INTAKE = "intake"
    WORKER = "worker"
    CALLBACK = "callback"
    POLL = "poll"
    ADMIN = "admin"


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


# Upstream statuses (seed 000 part 3, plus what real sites report).
COMPLETED_STATUS = "completed"  # the last status of a delivered order
DELIVERED_STATUSES = frozenset({"delivered", COMPLETED_STATUS})
CANCELED_STATUS = "canceled"
REFUNDED_STATUSES = frozenset({"refunded", "partially_refunded"})

# Exceptions that an upstream report of a live or delivered order can heal: procurd did not know the order
# existed (its answer was lost) or stopped waiting for it.
HEALABLE_REASONS = frozenset({Reason.MAX_ATTEMPTS_EXCEEDED, Reason.STALE, Reason.UPSTREAM_ORDER_MISSING})


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the state machine needs to know about one procurement."""

    state: State
    downstream_order_no: str
    attempts: int
    upstream_may_exist: bool
    number_canceled_upstream: bool  # the upstream canceled the order under the current number
    upstream_order_id: int | None = None
    upstream_order_no: str | None = None
    upstream_status: str | None = None
    amount: str | None = None
    exception_reason: str | None = None
    lease_owner: str | None = None
    fulfillment: dict[str, Any] | None = None
    submitted_at: datetime | None = None
    poll_interval_seconds: float | None = None
    numbers_used: int = 1  # how many downstream order numbers this procurement has had


# --- events ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubmitAccepted:
    """The upstream answered the order creation with ``ok: true``."""

    worker: str
    order_id: int
    order_no: str
    status: str
    amount: str | None
    currency: str | None


@dataclass(frozen=True, slots=True)
class SubmitRejected:
    """A definite refusal: no order exists under the number because of this request (or it was canceled).

    ``kind`` is ``payment_failed`` (the upstream created the order and canceled it at once), ``business`` or
    ``auth``.
    """

    worker: str
    kind: str
    code: str
    message: str
    order_id: int | None = None
    order_no: str | None = None
    status: str | None = None


@dataclass(frozen=True, slots=True)
class SubmitUnavailable:
    """No usable answer (network, timeout, 5xx, malformed answer, rate limited): the outcome is unknown."""

    worker: str
    code: str
    message: str
    rate_limited: bool = False
    retry_after: float | None = None
    request_sent: bool = True  # False when no connection could be opened: nothing reached the upstream


@dataclass(frozen=True, slots=True)
class UpstreamReport:
    """The upstream's word on an order, from a callback or a poll (one code path for both)."""

    order_id: int
    status: str
    order_no: str | None = None
    fulfillment: dict[str, Any] | None = None
    amount: str | None = None
    currency: str | None = None
    refunded_amount: str | None = None
    polled: bool = False  # from a fallback poll: an unchanged answer backs the next poll off


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
    """A person sends the procurement again."""

    note: str | None = None


@dataclass(frozen=True, slots=True)
class Resolve:
    """A person closes the exception by hand."""

    note: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """The order is being canceled: locally (never sent) or after the upstream confirmed the cancel."""

    upstream_confirmed: bool


Event = (
    SubmitAccepted
    | SubmitRejected
    | SubmitUnavailable
    | UpstreamReport
    | PollFailed
    | GiveUp
    | Retry
    | Resolve
    | Cancel
)


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one event.

    ``changes`` are column values for the procurement row. ``record`` says whether the audit trail gets an
    entry (every state change, and facts that are recorded without being applied, such as a late status).
    ``burn_number`` marks the current downstream number as canceled upstream; ``new_number`` is a number to
    register and use from now on.
    """

    state: State
    event: str
    changes: dict[str, Any] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    record: bool = True
    burn_number: bool = False
    new_number: str | None = None

    @property
    def noop(self) -> bool:
        return not self.changes and not self.record and not self.burn_number and self.new_number is None
