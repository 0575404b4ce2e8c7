"""The state machine's schedule knobs and what every decision does to a record (pure): release a claim,
open an exception, ignore an event; who holds a claim. Shared by :mod:`procurd.core.machine` and its parts."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from procurd.core.procurement import Decision, Procurement, State


@dataclass(frozen=True, slots=True)
class Policy:
    """The schedule knobs of ``[procurement]``."""

    max_attempts: int = 6
    retry_base_seconds: float = 1
    retry_max_seconds: float = 300
    poll_initial_seconds: float = 30
    poll_max_seconds: float = 900


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def released(p: Procurement, **changes: Any) -> Procurement:
    """``p`` without its submission claim."""
    return replace(p, lease_owner=None, lease_expires_at=None, **changes)


def to_exception(
    p: Procurement, reason: str, code: str | None = None, message: str | None = None
) -> Procurement:
    """``p`` as an exception for a person: nothing is scheduled any more."""
    return replace(
        p,
        state=State.EXCEPTION,
        exception_reason=reason,
        last_error_code=code or reason,
        last_error_message=message,
        lease_owner=None,
        lease_expires_at=None,
        next_attempt_at=None,
        next_poll_at=None,
    )


def ignored(p: Procurement, event: str, **detail: Any) -> Decision:
    return Decision(p, event, detail, audited=False)


def holds_claim(p: Procurement, owner: str) -> bool:
    return p.state is State.QUEUED and p.lease_owner == owner


def holds_poll(p: Procurement) -> bool:
    """Whether a poller holds ``p``'s poll (a claim on anything but a queued procurement is a poll's)."""
    return p.state is not State.QUEUED and p.lease_owner is not None
