"""What the daemon watches in memory so that a person hears of trouble: upstream health, followed request by
request, and bursts of rejected callbacks. Each finding is an alert occurrence that the heartbeat raises
(:mod:`procurd.operations.alerts`); the checks that read the database (balances after a ping, stuck orders)
are operations (:mod:`procurd.operations.pings`, :mod:`procurd.operations.housekeeping`)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import structlog

from procurd.config import UpstreamSettings
from procurd.core.alerts import Kind, Occurrence
from procurd.upstream.errors import AuthError, RateLimited, UpstreamError, UpstreamUnavailable

log = structlog.get_logger("procurd.watch")

REJECTION_BURST = 10  # rejected callbacks of one upstream ...
REJECTION_WINDOW_SECONDS = 60.0  # ... within this long make an alert


@dataclass
class _Health:
    failing_since: float | None = None
    last_error: str = ""
    auth_error: AuthError | None = None
    alerted: bool = False  # an upstream_unhealthy was raised for the current episode


@dataclass
class HealthWatch:
    """Follows every request to each upstream: failing for ``unhealthy_after_seconds`` (or any auth error)
    makes an ``upstream_unhealthy`` alert, the first success after it an ``upstream_recovered``.

    Requests are observed as they end (synchronously, from the client); the alerts are raised by
    :meth:`check`, which the heartbeat calls, and which the observation wakes.
    """

    unhealthy_after_seconds: float
    upstreams: dict[str, UpstreamSettings]
    states: dict[str, _Health] = field(default_factory=dict)
    pending: list[Occurrence] = field(default_factory=list)

    def observe(self, upstream: str, _endpoint: str, _outcome: str, _seconds: float, error: object) -> None:
        state = self.states.setdefault(upstream, _Health())
        if isinstance(error, AuthError):
            state.auth_error = error
            state.failing_since = state.failing_since or time.monotonic()
            state.last_error = f"{error.code}: {error}"
            if not state.alerted:
                state.alerted = True
                self.pending.append(
                    self._unhealthy(upstream, state, f"authentication refused ({error.code})")
                )
        elif isinstance(error, UpstreamUnavailable) and not isinstance(error, RateLimited):
            state.failing_since = state.failing_since or time.monotonic()
            state.last_error = f"{error.code}: {error}"
        elif error is None or isinstance(error, UpstreamError):
            # An answer the upstream meant (a success, or a business refusal): it is reachable and takes us.
            if state.alerted:
                seconds = time.monotonic() - (state.failing_since or time.monotonic())
                message = f"{upstream} answers again after {seconds:.0f} s of failures"
                self.pending.append(Occurrence(Kind.UPSTREAM_RECOVERED, upstream, message, upstream))
            self.states[upstream] = _Health()

    def due(self) -> list[Occurrence]:
        """The alerts to raise now: pending ones, and upstreams failing for long enough."""
        now = time.monotonic()
        for upstream, state in self.states.items():
            if state.alerted or state.failing_since is None:
                continue
            if now - state.failing_since >= self.unhealthy_after_seconds:
                state.alerted = True
                failing = f"requests failing for {now - state.failing_since:.0f} s"
                self.pending.append(self._unhealthy(upstream, state, failing))
        due, self.pending = self.pending, []
        return due

    def _unhealthy(self, upstream: str, state: _Health, what: str) -> Occurrence:
        settings = self.upstreams.get(upstream)
        if state.auth_error is not None:
            check = state.auth_error.hint
        else:
            base = settings.base_url if settings else "its base_url"
            check = f"check that {base} is up and reachable from here (DNS, TLS, firewall) and its timeout"
        message = f"{upstream}: {what}; last error {state.last_error}. What to check: {check}"
        return Occurrence(Kind.UPSTREAM_UNHEALTHY, upstream, message, upstream)


@dataclass
class RejectionWatch:
    """Rejected callbacks: ``REJECTION_BURST`` within ``REJECTION_WINDOW_SECONDS`` from one upstream's key
    (or from keys of no upstream) are a ``callbacks_rejected`` alert: a wrong secret, or an attack."""

    times: dict[str, deque[float]] = field(default_factory=dict)
    reasons: dict[str, dict[str, int]] = field(default_factory=dict)
    pending: list[Occurrence] = field(default_factory=list)

    def rejected(self, upstream: str | None, reason: str) -> None:
        subject = upstream or "unknown"
        now = time.monotonic()
        seen = self.times.setdefault(subject, deque())
        seen.append(now)
        counts = self.reasons.setdefault(subject, {})
        counts[reason] = counts.get(reason, 0) + 1
        while seen and seen[0] < now - REJECTION_WINDOW_SECONDS:
            seen.popleft()
        if len(seen) >= REJECTION_BURST:
            summary = ", ".join(f"{reason} {count}" for reason, count in sorted(counts.items()))
            who = f"with the API key of {upstream}" if upstream else "with keys of no configured upstream"
            message = (
                f"{len(seen)} callbacks {who} rejected within {REJECTION_WINDOW_SECONDS:g} s ({summary}): "
                "a wrong secret or header prefix on the upstream's side, a clock that is off, or an attack"
            )
            self.pending.append(Occurrence(Kind.CALLBACKS_REJECTED, subject, message, upstream))
            seen.clear()
            counts.clear()

    def due(self) -> list[Occurrence]:
        due, self.pending = self.pending, []
        return due
