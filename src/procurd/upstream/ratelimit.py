"""A token-bucket rate limiter that serves waiters strictly by priority, then by arrival.

One limiter is shared by everything that talks to one upstream (one API key). Waiters wait on futures;
a single timer handle on the event loop wakes the queue when the next token is due, so nothing polls.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from enum import IntEnum

# Timers may fire a hair early and float refills may land a hair short of a whole token.
_EPSILON = 1e-9
_MIN_TIMER_DELAY = 0.0005


class Priority(IntEnum):
    """Who goes first when several callers wait: a lower value is served first."""

    ORDER = 0
    PING = 1
    POLL = 2
    CATALOG = 3
    RECONCILE = 4  # the lowest: reconciliation looks for what everything else missed


class PriorityRateLimiter:
    """Allow ``rate_per_second`` requests on average, at most ``burst`` back to back.

    ``await acquire(priority)`` returns when the caller may send. Waiters are served by priority, then in
    arrival order, so an order that arrives while catalogue pages wait goes next. ``pause_for(seconds)``
    stops everybody until then (after the upstream answered "too many requests"). A waiter cancelled before
    it is served takes no slot; one cancelled just after being served gives its slot back.
    """

    def __init__(
        self, rate_per_second: float, burst: int = 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate_per_second <= 0:
            raise ValueError("rate_per_second must be positive")
        if burst < 1:
            raise ValueError("burst must be at least 1")
        self._rate = float(rate_per_second)
        self._burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._updated = clock()
        self._paused_until = float("-inf")
        self._queue: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def rate_per_second(self) -> float:
        return self._rate

    @property
    def waiting(self) -> dict[Priority, int]:
        """How many callers wait right now, per priority (every priority is present)."""
        counts = dict.fromkeys(Priority, 0)
        for priority, _, future in self._queue:
            if not future.done():
                counts[Priority(priority)] += 1
        return counts

    @property
    def paused_for(self) -> float:
        """Seconds left of the current pause (0 when not paused)."""
        return max(0.0, self._paused_until - self._clock())

    async def acquire(self, priority: Priority = Priority.CATALOG) -> None:
        """Return when the caller may send one request."""
        self._drop_abandoned_head()
        if not self._queue and self._take_token():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._queue, (int(priority), next(self._arrivals), future))
        self._schedule()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._give_back_token()
            self._drop_abandoned_head()
            self._schedule()
            raise

    def pause_for(self, seconds: float) -> None:
        """Let nobody send for ``seconds`` from now; the pause only ever grows."""
        until = self._clock() + max(0.0, seconds)
        if until <= self._paused_until:
            return
        self._paused_until = until
        # When the pause ends one request may go at once, the next one an interval later.
        self._tokens = 0.0
        self._updated = until - 1.0 / self._rate
        if self._queue:
            self._schedule()

    def _refill(self, now: float) -> None:
        if now <= self._updated:
            return
        self._tokens = min(float(self._burst), self._tokens + (now - self._updated) * self._rate)
        self._updated = now

    def _take_token(self) -> bool:
        now = self._clock()
        if now < self._paused_until:
            return False
        self._refill(now)
        if self._tokens < 1.0 - _EPSILON:
            return False
        self._tokens = max(0.0, self._tokens - 1.0)
        return True

    def _give_back_token(self) -> None:
        self._tokens = min(float(self._burst), self._tokens + 1.0)

    def _seconds_until_next_token(self) -> float:
        now = self._clock()
        self._refill(now)
        missing = max(0.0, 1.0 - self._tokens)
        token_at = max(self._updated, now) + missing / self._rate
        return max(token_at, self._paused_until) - now

    def _drop_abandoned_head(self) -> None:
        while self._queue and self._queue[0][2].done():
            heapq.heappop(self._queue)

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._drop_abandoned_head()
        if not self._queue:
            return
        delay = self._seconds_until_next_token()
        loop = self._queue[0][2].get_loop()
        self._timer = loop.call_later(max(delay, _MIN_TIMER_DELAY) if delay > 0 else 0, self._release)

    def _release(self) -> None:
        self._timer = None
        self._drop_abandoned_head()
        while self._queue and self._take_token():
            _, _, future = heapq.heappop(self._queue)
            future.set_result(None)
            self._drop_abandoned_head()
        self._schedule()
