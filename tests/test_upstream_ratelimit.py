"""The rate limiters: strict priority then arrival order, pauses, cancel safety, late shared slots."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from procurd.upstream.ratelimit import (
    BATCH_SECONDS,
    MISSED_SLOT_SECONDS,
    Priority,
    PriorityRateLimiter,
    SharedRateLimiter,
)

FAST_RATE = 200.0  # a 5 ms interval keeps real-time tests quick
DEADLINE_SECONDS = 5.0


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.on_read: Callable[[], None] | None = None

    def __call__(self) -> float:
        if self.on_read is not None:
            self.on_read()
        return self.now


async def wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.001)


async def queue_waiters(
    limiter: PriorityRateLimiter, labelled: list[tuple[str, Priority]], served: list[str]
) -> list[asyncio.Task[None]]:
    """Start one waiter per label, in order, each queued (or already served) before the next starts."""

    async def waiter(label: str, priority: Priority) -> None:
        await limiter.acquire(priority)
        served.append(label)

    tasks = []
    for label, priority in labelled:
        before = limiter.waiting[priority]
        tasks.append(asyncio.create_task(waiter(label, priority)))
        await wait_until(queued_or_served(limiter, priority, before + 1, served, label))
    return tasks


def queued_or_served(
    limiter: PriorityRateLimiter, priority: Priority, count: int, served: list[str], label: str
) -> Callable[[], bool]:
    return lambda: limiter.waiting[priority] >= count or label in served


async def test_first_request_goes_at_once() -> None:
    """With a token in the bucket, acquire returns without queueing."""
    limiter = PriorityRateLimiter(1.0, clock=FakeClock())
    await asyncio.wait_for(limiter.acquire(Priority.CATALOG), DEADLINE_SECONDS)
    assert sum(limiter.waiting.values()) == 0


async def test_second_request_waits_until_a_token_is_due() -> None:
    """Once the burst is spent, the next caller waits and is counted under its priority."""
    clock = FakeClock()
    limiter = PriorityRateLimiter(1.0, clock=clock)
    await limiter.acquire(Priority.CATALOG)
    task = asyncio.create_task(limiter.acquire(Priority.POLL))
    await wait_until(lambda: limiter.waiting[Priority.POLL] == 1)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limiter.waiting[Priority.POLL] == 0


async def test_refill_follows_the_clock() -> None:
    """After one interval of the injected clock the bucket holds a token again."""
    clock = FakeClock()
    limiter = PriorityRateLimiter(2.0, clock=clock)
    await limiter.acquire()
    clock.now += 0.5
    await asyncio.wait_for(limiter.acquire(), DEADLINE_SECONDS)


async def test_burst_allows_back_to_back_requests() -> None:
    """A burst of N lets N callers through at once, the next one waits."""
    clock = FakeClock()
    limiter = PriorityRateLimiter(1.0, burst=3, clock=clock)
    for _ in range(3):
        await asyncio.wait_for(limiter.acquire(), DEADLINE_SECONDS)
    task = asyncio.create_task(limiter.acquire())
    await wait_until(lambda: sum(limiter.waiting.values()) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_waiters_are_served_by_priority_then_arrival() -> None:
    """An order arriving after queued catalogue pages is served before them; equal priorities keep order."""
    limiter = PriorityRateLimiter(FAST_RATE)
    await limiter.acquire(Priority.CATALOG)
    limiter.pause_for(0.05)  # keep everyone queued until all have arrived
    served: list[str] = []
    tasks = await queue_waiters(
        limiter,
        [
            ("catalog-1", Priority.CATALOG),
            ("catalog-2", Priority.CATALOG),
            ("poll-1", Priority.POLL),
            ("catalog-3", Priority.CATALOG),
            ("reconcile-1", Priority.RECONCILE),
            ("order-1", Priority.ORDER),
            ("ping-1", Priority.PING),
            ("order-2", Priority.ORDER),
        ],
        served,
    )
    await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_SECONDS)
    assert served == [
        "order-1", "order-2", "ping-1", "poll-1", "catalog-1", "catalog-2", "catalog-3", "reconcile-1"
    ]  # fmt: skip


async def test_late_order_overtakes_waiting_catalogue_pages() -> None:
    """While catalogue pages are being served one by one, a new order is served next."""
    limiter = PriorityRateLimiter(20.0)
    await limiter.acquire(Priority.CATALOG)
    served: list[str] = []
    limiter.pause_for(0.05)
    catalog = await queue_waiters(limiter, [(f"catalog-{n}", Priority.CATALOG) for n in range(5)], served)
    await wait_until(lambda: len(served) >= 1)
    served_when_order_arrived: list[int] = []

    async def order() -> None:
        served_when_order_arrived.append(len(served))
        await limiter.acquire(Priority.ORDER)
        served.append("order")

    await asyncio.wait_for(asyncio.gather(*catalog, order()), DEADLINE_SECONDS)
    # At most one catalogue page can have been granted without having resumed yet when the order arrived.
    assert served.index("order") <= served_when_order_arrived[0] + 1
    assert [label for label in served if label != "order"] == [f"catalog-{n}" for n in range(5)]


async def test_cancelled_waiter_takes_no_slot() -> None:
    """Cancelling a queued waiter neither consumes a token nor blocks those behind it."""
    limiter = PriorityRateLimiter(FAST_RATE)
    await limiter.acquire()
    limiter.pause_for(0.05)
    served: list[str] = []
    tasks = await queue_waiters(
        limiter, [("a", Priority.ORDER), ("b", Priority.ORDER), ("c", Priority.CATALOG)], served
    )
    tasks[0].cancel()
    await asyncio.wait_for(asyncio.gather(*tasks[1:]), DEADLINE_SECONDS)
    assert served == ["b", "c"]
    assert tasks[0].cancelled()
    assert sum(limiter.waiting.values()) == 0


async def test_waiter_cancelled_after_being_served_returns_its_token() -> None:
    """A waiter cancelled between being granted and resuming gives its token back to the next one."""
    clock = FakeClock()
    limiter = PriorityRateLimiter(50.0, clock=clock)
    await limiter.acquire()
    first = asyncio.create_task(limiter.acquire(Priority.ORDER))
    second = asyncio.create_task(limiter.acquire(Priority.CATALOG))
    await wait_until(lambda: sum(limiter.waiting.values()) == 2)

    def cancel_first_once_granted() -> None:
        # The limiter reads the clock again right after granting "first", before "first" can resume.
        if limiter.waiting[Priority.ORDER] == 0 and not first.done():
            first.cancel()

    clock.on_read = cancel_first_once_granted
    clock.now += 1 / 50  # exactly one token; the clock does not move again
    await asyncio.wait_for(second, DEADLINE_SECONDS)
    assert first.cancelled()
    assert sum(limiter.waiting.values()) == 0


async def test_pause_holds_everyone_until_it_ends() -> None:
    """After pause_for nobody is served, even with tokens in the bucket, until the pause is over."""
    limiter = PriorityRateLimiter(FAST_RATE, burst=5)
    pause_ends_no_earlier_than = time.monotonic() + 0.05
    limiter.pause_for(0.05)
    served_at: list[float] = []

    async def send(priority: Priority) -> None:
        await limiter.acquire(priority)
        served_at.append(time.monotonic())

    await asyncio.wait_for(asyncio.gather(send(Priority.ORDER), send(Priority.CATALOG)), DEADLINE_SECONDS)
    assert min(served_at) >= pause_ends_no_earlier_than


async def test_paused_limiter_queues_even_the_first_caller() -> None:
    """While paused, a caller is queued although the bucket is full."""
    clock = FakeClock()
    limiter = PriorityRateLimiter(100.0, burst=5, clock=clock)
    limiter.pause_for(30)
    assert limiter.paused_for == pytest.approx(30)
    task = asyncio.create_task(limiter.acquire(Priority.ORDER))
    await wait_until(lambda: limiter.waiting[Priority.ORDER] == 1)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_shorter_pause_does_not_shorten_a_longer_one() -> None:
    """A pause only ever grows."""
    clock = FakeClock()
    limiter = PriorityRateLimiter(1.0, clock=clock)
    limiter.pause_for(30)
    limiter.pause_for(5)
    assert limiter.paused_for == pytest.approx(30)


class ScriptedBudget:
    """A shared budget (what the database answers) that grants the slots it is given, one per request, and
    remembers what it was asked."""

    def __init__(self, slot_starts_in: list[float]) -> None:
        self.slot_starts_in = slot_starts_in
        self.taken = 0
        self.asked: list[tuple[int, int | None, int]] = []

    async def take(self, priority: int, then: int | None, count: int = 1) -> tuple[int, float]:
        self.asked.append((priority, then, count))
        seconds = self.slot_starts_in[self.taken]
        self.taken += 1
        return 1, seconds

    async def pause(self, seconds: float) -> None:
        raise AssertionError("nothing is rate-limited here")

    async def withdraw(self) -> None:
        """Nothing is recorded."""


async def test_a_shared_slot_that_started_too_long_ago_is_let_go() -> None:
    """A slot of the shared schedule that could only be handed out late (here the budget's answer arrives
    after the slot began) is not used: its request could arrive just before the next instance's. The limiter
    asks for another slot and sends on that one."""
    budget = ScriptedBudget([-(MISSED_SLOT_SECONDS + 0.5), 0.0])
    limiter = SharedRateLimiter(budget, 1.0, clock=FakeClock())
    await asyncio.wait_for(limiter.acquire(Priority.ORDER), DEADLINE_SECONDS)
    assert (budget.taken, limiter.missed_slots) == (2, 1)
    await limiter.close()


async def test_a_shared_slot_handed_out_on_time_is_used() -> None:
    """A slot that has just begun (the database's clock ran a hair ahead) is used at once."""
    budget = ScriptedBudget([-0.001])
    limiter = SharedRateLimiter(budget, 1.0, clock=FakeClock())
    await asyncio.wait_for(limiter.acquire(Priority.ORDER), DEADLINE_SECONDS)
    assert (budget.taken, limiter.missed_slots) == (1, 0)
    await limiter.close()


class GenerousBudget:
    """A shared budget that grants every slot asked for, the first starting at once."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int | None, int]] = []

    async def take(self, priority: int, then: int | None, count: int = 1) -> tuple[int, float]:
        self.asked.append((priority, then, count))
        return count, 0.0

    async def pause(self, seconds: float) -> None:
        raise AssertionError("nothing is rate-limited here")

    async def withdraw(self) -> None:
        """Nothing is recorded."""


async def test_orders_waiting_together_are_asked_for_in_one_round_trip() -> None:
    """Orders queued together take their slots in one request to the shared budget (each one spacing after
    the other), while a catalogue page behind them is asked for on its own; the page is named as what waits
    next."""
    budget = GenerousBudget()
    clock = FakeClock()
    limiter = SharedRateLimiter(budget, 1000.0, clock=clock)
    limiter.pause_for(0.02)  # nobody is served until all have queued: the limiter's clock stands still
    budget.asked.clear()
    served: list[str] = []
    labelled = [("page", Priority.CATALOG), *((f"order-{n}", Priority.ORDER) for n in range(5))]
    tasks = await queue_waiters(limiter, labelled, served)  # type: ignore[arg-type]
    assert served == []

    def tick() -> None:  # from now on the limiter's clock moves a slot's length at every look
        clock.now += 0.001

    clock.now += 0.02
    clock.on_read = tick
    await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_SECONDS)
    assert served == [*(f"order-{n}" for n in range(5)), "page"]
    assert budget.asked == [(Priority.ORDER, Priority.CATALOG, 5), (Priority.CATALOG, None, 1)]
    await limiter.close()


async def test_a_busy_process_asks_ahead_for_the_orders_it_is_about_to_send() -> None:
    """A process that sent orders one after another through the last second asks the budget for as many
    slots as arrive in a batch's time, not one per order: at 200 orders a second (of the limiter's clock)
    against a budget of 10,000 a second, once a second of them has passed, 100 orders cost a handful of
    round trips."""
    budget = GenerousBudget()
    clock = FakeClock()
    limiter = SharedRateLimiter(budget, 10_000.0, clock=clock)

    async def send(orders: int) -> None:
        for _ in range(orders):
            await asyncio.wait_for(limiter.acquire(Priority.ORDER), DEADLINE_SECONDS)
            clock.now += 0.005

    await send(200)  # a second of orders
    budget.asked.clear()
    await send(100)
    assert len(budget.asked) <= 100 * BATCH_SECONDS, [count for _, _, count in budget.asked]
    await limiter.close()


async def test_a_slow_budget_is_asked_one_slot_at_a_time() -> None:
    """Below ten requests a second a batch holds one slot: the real sites' limit of one a second is
    spent request by request, as before batches existed."""
    budget = GenerousBudget()
    limiter = SharedRateLimiter(budget, 1.0)
    for _ in range(3):
        await limiter.acquire(Priority.ORDER)
    assert [count for _, _, count in budget.asked] == [1, 1, 1]
    await limiter.close()


def test_waiting_lists_every_priority() -> None:
    """The waiting counts (for metrics) have an entry per priority, zero when idle."""
    assert PriorityRateLimiter(1.0).waiting == dict.fromkeys(Priority, 0)


def test_priorities_are_ordered() -> None:
    """Orders go before pings, pings before polls, polls before catalogue pages, and reconciliation (which
    looks for what everything else missed) comes last."""
    assert Priority.ORDER < Priority.PING < Priority.POLL < Priority.CATALOG < Priority.RECONCILE


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (1, 0)])
def test_invalid_settings_are_refused(rate: float, burst: int) -> None:
    """A rate must be positive and a burst at least one."""
    with pytest.raises(ValueError, match="must be"):
        PriorityRateLimiter(rate, burst=burst)
