"""Alerts (pure): what needs a person, and when to tell them.

Every alert has a key, its kind plus its subject (the storefront's order number for order alerts, the
upstream's name for upstream alerts). One row per key counts its occurrences. The first occurrence is sent at
once; later ones within ``repeat_after_seconds`` of the last message are held back and summed up in the next
message, sent when the window ends. A failed send is tried again with backoff; nothing is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from procurd.core.backoff import retry_delay
from procurd.core.procurement import SETTLE_WITH_UPSTREAM, ExceptionOpened, Procurement

SEND_RETRY_BASE_SECONDS = 5.0
SEND_RETRY_MAX_SECONDS = 600.0


class Kind(StrEnum):
    EXCEPTION_OPENED = "exception_opened"
    LOW_BALANCE = "low_balance"
    BALANCE_RUNWAY = "balance_runway"
    UPSTREAM_UNHEALTHY = "upstream_unhealthy"
    UPSTREAM_RECOVERED = "upstream_recovered"
    ORDER_STUCK = "order_stuck"
    SYNC_FAILED = "sync_failed"
    MASS_REMOVAL_BLOCKED = "mass_removal_blocked"
    PRICE_HELD = "price_held"
    CALLBACKS_REJECTED = "callbacks_rejected"
    ADMIN_AUTH_FAILURES = "admin_auth_failures"
    RECONCILE_MISMATCH = "reconcile_mismatch"
    INSTANCE_DOWN = "instance_down"
    DAEMON_FAILED = "daemon_failed"
    PROVIDER_LOW_BALANCE = "provider_low_balance"
    PROVIDER_CALLBACKS_FAILING = "provider_callbacks_failing"


KINDS = tuple(kind.value for kind in Kind)

# Kinds that mean something is broken now (logged at error level); the rest need a look (warning).
ERRORS = frozenset(
    {
        Kind.UPSTREAM_UNHEALTHY,
        Kind.INSTANCE_DOWN,
        Kind.DAEMON_FAILED,
        Kind.RECONCILE_MISMATCH,
        Kind.CALLBACKS_REJECTED,
        Kind.ADMIN_AUTH_FAILURES,
    }
)
# Good news: sent like the others, logged at info.
RECOVERIES = frozenset({Kind.UPSTREAM_RECOVERED})


@dataclass(frozen=True, slots=True)
class Occurrence:
    """Something happened that a person should hear of."""

    kind: Kind
    subject: str
    message: str
    upstream: str | None = None

    @property
    def key(self) -> str:
        return f"{self.kind.value}:{self.subject}"


def exception_opened(p: Procurement, opened: ExceptionOpened) -> Occurrence:
    """An exception opened on ``p``, as the alert a person gets: the reason, the order, the item, the
    upstream, the error."""
    error = ": ".join(part for part in (opened.code, opened.message) if part)
    message = (
        f"{opened.reason}: order {p.order_no}, item {p.position + 1} ({p.downstream_order_no}) on upstream "
        f"{p.upstream}" + (f": {error}" if error and error != opened.reason else "")
    )
    if opened.reason in SETTLE_WITH_UPSTREAM:
        message += (
            ". Money may have left the upstream balance without goods, and procurd never sends it again: "
            "compare the upstream's purchase records and balance with the above, settle it with the "
            "supplier, then resolve it with a note"
        )
    return Occurrence(Kind.EXCEPTION_OPENED, p.order_no, message, p.upstream)


def goods_after_resolution(p: Procurement) -> Occurrence:
    """The upstream delivered goods for ``p`` after a person resolved it: they deliver or settle them."""
    message = (
        f"order {p.order_no}: the upstream delivered item {p.position + 1} ({p.downstream_order_no}, "
        f"upstream order {p.upstream_order_id}) after a person resolved it. The goods are recorded with "
        "it (it stays resolved; reveal them on the order's page): deliver them to the buyer, or settle "
        "them with the upstream if the buyer was refunded."
    )
    return Occurrence(Kind.RECONCILE_MISMATCH, p.order_no, message, p.upstream)


def claim_unverified(upstream: str, claim: str) -> Occurrence:
    """A correctly signed callback of ``upstream`` claimed what the upstream did not confirm (``claim``: what
    it claimed and why it was refused)."""
    message = (
        f"a callback signed with {upstream}'s key claimed {claim}; nothing was changed. A buggy or "
        "compromised upstream, or a callback replayed from another chain of sites."
    )
    return Occurrence(Kind.CALLBACKS_REJECTED, upstream, message, upstream)


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    """One key's row of ``alerts``."""

    key: str
    kind: Kind
    subject: str
    upstream: str | None
    message: str
    first_at: datetime
    last_at: datetime
    count: int
    unsent: int  # occurrences since the last message that went out
    sent_at: datetime | None = None
    send_due_at: datetime | None = None  # None: nothing to send (or nowhere to send it)
    attempts: int = 0  # failed tries of the pending message
    error: str | None = None

    @property
    def title(self) -> str:
        return f"procurd {self.kind.value}: {self.subject}"

    def body(self) -> str:
        """The message, with what was held back since the last one."""
        if self.unsent <= 1:
            return self.message
        return f"{self.message}\n({self.unsent} occurrences since the last message; {self.count} in all)"


def occur(
    existing: Alert | None, occurrence: Occurrence, now: datetime, repeat_after: float, deliver: bool
) -> Alert:
    """The alert after ``occurrence``. With ``deliver`` off (no URLs configured) it is only recorded."""
    if existing is None:
        return Alert(
            key=occurrence.key,
            kind=occurrence.kind,
            subject=occurrence.subject,
            upstream=occurrence.upstream,
            message=occurrence.message,
            first_at=now,
            last_at=now,
            count=1,
            unsent=1,
            send_due_at=now if deliver else None,
        )
    due: datetime | None = None
    if deliver:
        window_ends = now if existing.sent_at is None else existing.sent_at + timedelta(seconds=repeat_after)
        due = max(now, window_ends)
        if existing.send_due_at is not None:
            due = min(due, existing.send_due_at)
    return replace(
        existing,
        message=occurrence.message,
        upstream=occurrence.upstream or existing.upstream,
        last_at=now,
        count=existing.count + 1,
        unsent=existing.unsent + 1,
        send_due_at=due,
    )


def sent(alert: Alert, covered: int, now: datetime, repeat_after: float) -> Alert:
    """The alert once a message covering ``covered`` occurrences went out to every URL; occurrences that
    came in while it was on its way wait for the end of the new window."""
    unsent = max(0, alert.unsent - covered)
    due = now + timedelta(seconds=repeat_after) if unsent else None
    return replace(alert, sent_at=now, unsent=unsent, send_due_at=due, attempts=0, error=None)


def send_failed(alert: Alert, error: str, now: datetime) -> Alert:
    """The alert after a failed send: tried again later, backing off."""
    attempts = alert.attempts + 1
    delay = retry_delay(attempts, SEND_RETRY_BASE_SECONDS, SEND_RETRY_MAX_SECONDS)
    return replace(alert, attempts=attempts, error=error, send_due_at=now + timedelta(seconds=delay))
