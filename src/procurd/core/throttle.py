"""Wrong admin tokens (pure): how long a client address waits before its next try is checked.

Both doors of the admin listener (the console's sign-in and the JSON API's bearer token) count wrong tokens
per client address. The first :data:`FREE_FAILURES` cost nothing; each one after that makes the address wait
twice as long as the one before (1 s, 2 s, 4 s ... up to :data:`BACKOFF_CAP_SECONDS`) before a token from it
is checked again. A try while it waits is answered 429 unchecked and counts for nothing. An address quiet
for :data:`FORGET_AFTER_SECONDS` starts afresh. Crossing into the throttle is the start of a burst: it is
told once (the alert ``admin_auth_failures``), not at every try.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

FREE_FAILURES = 5
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 300.0
FORGET_AFTER_SECONDS = 900.0


@dataclass(frozen=True, slots=True)
class Failures:
    """The wrong tokens of one client address (``auth_failures`` row)."""

    address: str
    failures: int
    first_at: datetime
    last_at: datetime
    blocked_until: datetime | None = None
    alerted: bool = False  # the burst was told (admin_auth_failures)


@dataclass(frozen=True, slots=True)
class Counted:
    """A wrong token recorded: the address's failures after it, whether it counted (a try made while the
    address already had to wait does not), and whether it starts a burst to be told of."""

    failures: Failures
    counted: bool
    burst: bool


def backoff_seconds(failures: int) -> float:
    """How long an address waits after its ``failures``-th wrong token."""
    if failures <= FREE_FAILURES:
        return 0.0
    return min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2.0 ** min(failures - FREE_FAILURES - 1, 30))


def wait_seconds(state: Failures | None, now: datetime) -> float:
    """Seconds before a token from the address is checked again (0: now)."""
    if state is None or state.blocked_until is None:
        return 0.0
    return max(0.0, (state.blocked_until - now).total_seconds())


def retry_after(seconds: float) -> int:
    """The ``Retry-After`` of a wait: whole seconds, at least 1."""
    return max(1, math.ceil(seconds))


def forgotten(state: Failures, now: datetime) -> bool:
    """Whether the address has been quiet long enough to start afresh."""
    return now - state.last_at >= timedelta(seconds=FORGET_AFTER_SECONDS) and wait_seconds(state, now) == 0


def after_failure(state: Failures | None, address: str, now: datetime) -> Counted:
    """The address's failures after one more wrong token at ``now``."""
    if state is not None and wait_seconds(state, now) > 0:
        # It should not have been checked (another instance knew it had to wait): it counts for nothing.
        return Counted(state, counted=False, burst=False)
    if state is None or forgotten(state, now):
        state = Failures(address, 0, now, now)
    failures = state.failures + 1
    delay = backoff_seconds(failures)
    blocked_until = now + timedelta(seconds=delay) if delay else None
    burst = delay > 0 and not state.alerted
    after = replace(
        state, failures=failures, last_at=now, blocked_until=blocked_until, alerted=state.alerted or burst
    )
    return Counted(after, counted=True, burst=burst)
