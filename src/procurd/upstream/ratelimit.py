"""Rate limiters that serve waiters strictly by priority, then by arrival.

One limiter is shared by everything in a process that talks to one upstream API key.

* :class:`SharedRateLimiter` takes its slots from a budget that every process of an installation shares
  (:class:`SharedBudget`, in the database): it asks the budget for slots with the priority of its best
  waiter, and hands each slot to the best waiter when the slot starts. Every client a
  :class:`procurd.operations.runtime.Runtime` builds uses it.
* :class:`PriorityRateLimiter` is a token bucket of one process alone, for a client used on its own (the
  sandbox's tests, a benchmark's probe). Waiters wait on futures; a single timer handle on the event loop
  wakes the queue when the next token is due.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable
from enum import IntEnum
from typing import Protocol

import structlog

log = structlog.get_logger("procurd.upstream")

# Requests take unevenly long to reach the upstream (event loop, network), and a site counts arrivals in a
# sliding window: sent exactly 1/rate apart, the 61st request of a minute can arrive inside the first one's
# minute. Each request therefore waits this much longer than 1/rate after the one before (at most a tenth of
# 1/rate), which absorbs that many milliseconds of unevenness per request of a window: 300 ms in a window of
# 60 requests, for 0.5 % of the budget at one request a second.
ARRIVAL_GUARD_SECONDS = 0.005
ARRIVAL_GUARD_MAX_FRACTION = 0.1
# A shared slot is a fixed moment in the cluster's schedule: handed out later than this (a stalled event loop,
# a slow database round trip), its request could arrive right before the next instance's, so it is let go
# unused and a new one is asked for. A bucket in one process moves its schedule with a late grant instead.
MISSED_SLOT_SECONDS = 20 * ARRIVAL_GUARD_SECONDS
# Order submissions waiting together take up to this much of the shared budget's time in one round trip to
# it (one slot at a time below 10 requests a second, as many as wait at the rates of a local benchmark).
BATCH_SECONDS = 0.1

# Timers may fire a hair early and float refills may land a hair short of a whole token.
_EPSILON = 1e-9
_MIN_TIMER_DELAY = 0.0005


class Priority(IntEnum):
    """Who goes first when several callers wait: a lower value is served first."""

    ORDER = 0
    CALLBACK = 1  # confirming a callback's claim while the upstream waits for the answer to it
    PING = 2
    POLL = 3
    CATALOG = 4
    RECONCILE = 5  # the lowest: reconciliation looks for what everything else missed


def sending_rate(rate_per_second: float) -> float:
    """The rate requests are sent at for a budget of ``rate_per_second``: spaced
    :data:`ARRIVAL_GUARD_SECONDS` more than the budget's interval, so that they arrive within it."""
    interval = 1 / rate_per_second
    return 1 / (interval + min(ARRIVAL_GUARD_SECONDS, interval * ARRIVAL_GUARD_MAX_FRACTION))


class RateLimiter(Protocol):
    """What an upstream client needs of its limiter."""

    @property
    def rate_per_second(self) -> float: ...

    @property
    def waiting(self) -> dict[Priority, int]: ...

    @property
    def paused_for(self) -> float: ...

    async def acquire(self, priority: Priority = Priority.CATALOG) -> None: ...

    def pause_for(self, seconds: float) -> None: ...

    async def close(self) -> None: ...


class _QueuedLimiter:
    """What both limiters share: a rate, a queue of waiters by priority and arrival, and a pause."""

    def __init__(self, rate_per_second: float, clock: Callable[[], float]) -> None:
        if rate_per_second <= 0:
            raise ValueError("rate_per_second must be positive")
        self._rate = float(rate_per_second)
        self._clock = clock
        self._queue: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        self._paused_until = float("-inf")

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
        """Seconds left of the pause this process knows of (0 when not paused)."""
        return max(0.0, self._paused_until - self._clock())


class PriorityRateLimiter(_QueuedLimiter):
    """Allow ``rate_per_second`` requests on average, at most ``burst`` back to back.

    ``await acquire(priority)`` returns when the caller may send. Waiters are served by priority, then in
    arrival order, so an order that arrives while catalogue pages wait goes next. ``pause_for(seconds)``
    stops everybody until then (after the upstream answered "too many requests"). A waiter cancelled before
    it is served takes no slot; one cancelled just after being served gives its slot back.
    """

    def __init__(
        self, rate_per_second: float, burst: int = 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if burst < 1:
            raise ValueError("burst must be at least 1")
        super().__init__(rate_per_second, clock)
        self._burst = burst
        self._tokens = float(burst)
        self._updated = clock()
        self._timer: asyncio.TimerHandle | None = None

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

    async def close(self) -> None:
        """Nothing to release: the bucket lives in memory."""

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


class SharedBudget(Protocol):
    """A request budget shared with other processes (:class:`procurd.operations.budgets.SharedBudget`)."""

    async def take(self, priority: int, then: int | None, count: int = 1) -> tuple[int, float]:
        """Ask for ``count`` consecutive slots for requests of ``priority``, ``then`` being the best priority
        left waiting here once they are served. ``(n, s)`` with ``n > 0``: ``n`` slots, one spacing apart,
        the first starting in ``s`` seconds; ``(0, s)``: refused, ask again in ``s`` seconds (sooner only
        for a better priority)."""
        ...

    async def pause(self, seconds: float) -> None:
        """Nobody sends for ``seconds`` from now."""
        ...

    async def withdraw(self) -> None:
        """This process waits for nothing any more."""
        ...


class SharedRateLimiter(_QueuedLimiter):
    """Serves this process's waiters by priority, then arrival, from slots of a shared budget.

    One task per limiter talks to the budget, only while somebody waits: it asks for slots for the best
    waiters, and grants each slot to whoever is best when the slot starts (a slot it could only grant
    :data:`MISSED_SLOT_SECONDS` late is let go). Order submissions waiting together are asked for in one
    go, up to :data:`BATCH_SECONDS` of the budget, so that a busy process pays one budget round trip for
    several requests; anything else is asked for one slot at a time. A caller that finds a slot already
    begun and nobody waiting takes it without waking the task. A refused request is asked for again when
    the budget says it is worth it, or at once when a better waiter arrives. ``pause_for`` drops the slots
    held, stops this process and pauses the shared budget for everybody.
    """

    def __init__(
        self,
        budget: SharedBudget,
        rate_per_second: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        batch_below: int = Priority.PING,
    ) -> None:
        super().__init__(rate_per_second, clock)
        self._budget = budget
        self._spacing = 1.0 / self._rate
        self._batch_below = batch_below
        self._max_batch = max(1, int(BATCH_SECONDS * self._rate))
        self._slots: collections.deque[float] = collections.deque()
        self._recent: collections.deque[float] = collections.deque()  # order acquires of the last second
        self._retry_at = float("-inf")
        self._refused_priority: int | None = None
        self._demand_recorded = False
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.missed_slots = 0  # slots let go because they came too late to be used
        self.budget_calls = 0  # round trips to the shared budget
        self.used_slots: collections.deque[float] = collections.deque(maxlen=1000)  # starts of slots used

    async def acquire(self, priority: Priority = Priority.CATALOG) -> None:
        """Return when the caller may send one request."""
        if priority < self._batch_below and self._max_batch > 1:
            self._recent.append(self._clock())
        if self._take_begun_slot():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._queue, (int(priority), next(self._arrivals), future))
        self._changed.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._serve(), name="procurd shared rate limiter")
        try:
            await future
        except asyncio.CancelledError:
            # Cancelled after its grant, the slot stays unused: handed out late it could come too close to
            # the next one.
            self._changed.set()
            raise

    def _take_begun_slot(self) -> bool:
        """A slot held that has begun (and is not missed) goes to a caller when nobody else waits."""
        if self._queue or not self._slots:
            return False
        now = self._clock()
        slot = self._slots[0]
        if slot > now or now - slot > MISSED_SLOT_SECONDS or now < self._paused_until:
            return False
        self.used_slots.append(self._slots.popleft())
        return True

    def pause_for(self, seconds: float) -> None:
        """Let nobody send for ``seconds`` from now, here at once and on every instance soon after."""
        until = self._clock() + max(0.0, seconds)
        if until > self._paused_until:
            self._paused_until = until
            self._slots.clear()
            self._changed.set()
        task = asyncio.get_running_loop().create_task(self._budget.pause(seconds))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Stop asking the budget; waiters still queued are cancelled."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for _, _, future in self._queue:
            future.cancel()
        self._queue.clear()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._demand_recorded:
            self._demand_recorded = False
            await self._budget.withdraw()

    async def _serve(self) -> None:
        try:
            await self._serve_forever()
        except Exception as exc:
            log.exception("rate_limiter.failed")
            for _, _, future in self._queue:
                if not future.done():
                    future.set_exception(exc)

    async def _serve_forever(self) -> None:
        while True:
            self._drop_served()
            if not self._queue:
                if self._demand_recorded:
                    self._demand_recorded = False
                    await self._budget.withdraw()
                    continue
                self._changed.clear()
                await self._changed.wait()
                continue
            now = self._clock()
            if now < self._paused_until:
                await self._sleep(self._paused_until - now)
            elif self._slots:
                slot = self._slots[0]
                if now - slot > MISSED_SLOT_SECONDS:
                    log.debug("rate_limiter.slot_missed", late_ms=round((now - slot) * 1000))
                    self._slots.popleft()
                    self.missed_slots += 1
                elif slot <= now:
                    self.used_slots.append(self._slots.popleft())
                    _, _, future = heapq.heappop(self._queue)
                    future.set_result(None)
                else:
                    await self._sleep(slot - now)
            elif now < self._retry_at and not self._better_than_refused():
                await self._sleep(self._retry_at - now)
            else:
                await self._ask()

    async def _ask(self) -> None:
        ranked = sorted(entry[0] for entry in self._queue)
        best = ranked[0]
        count = 1
        if best < self._batch_below:
            # The orders waiting, or as many as arrived in a batch's time of the last second when that is
            # more: a busy process asks ahead for what it is about to use (a slot left unused is budget not
            # spent, never a request too many).
            waiting = sum(1 for priority in ranked if priority < self._batch_below)
            count = min(self._max_batch, max(waiting, int(self._recent_orders() * BATCH_SECONDS)))
        then = ranked[count] if len(ranked) > count else None
        self.budget_calls += 1
        granted, seconds = await self._budget.take(best, then, count)
        now = self._clock()
        if granted:
            self._demand_recorded = then is not None
            self._refused_priority = None
            if now >= self._paused_until:
                first = now + seconds
                self._slots.extend(first + index * self._spacing for index in range(granted))
        else:
            self._demand_recorded = True
            self._refused_priority = best
            self._retry_at = now + max(0.0, seconds)

    def _recent_orders(self) -> int:
        """Order acquires in the last second."""
        horizon = self._clock() - 1.0
        while self._recent and self._recent[0] < horizon:
            self._recent.popleft()
        return len(self._recent)

    def _better_than_refused(self) -> bool:
        return self._refused_priority is None or self._queue[0][0] < self._refused_priority

    async def _sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or until a waiter arrives or leaves or a pause starts."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), max(seconds, _MIN_TIMER_DELAY))

    def _drop_served(self) -> None:
        if any(entry[2].done() for entry in self._queue):
            self._queue = [entry for entry in self._queue if not entry[2].done()]
            heapq.heapify(self._queue)
