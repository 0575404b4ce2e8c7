"""The submitter: one claimer feeding a bounded number of concurrent submissions per upstream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy import event, func, select

from procurd.db.schema import audit_log, procurements
from procurd.db.types import utcnow
from procurd.http.testing import Stack, procurd_stack
from procurd.procurement.service import ProcurementService
from procurd.procurement.submitter import Submitter
from support import sql_rows, wait_until

IDLE_SECONDS = 1.0  # how often the idle submitter of these tests looks for work queued elsewhere
# Only the claim's statement selects queued procurements by their due time and claim.
CLAIM_MARK = "procurements.lease_expires_at <"


class ClaimCounter:
    """Counts the claim statements the state path sends (observed on the database's cursor events)."""

    def __init__(self, stack: Stack) -> None:
        self.count = 0
        self.engine = stack.runtime.database.sync_engine
        event.listen(self.engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        statement = args[2]
        if statement.lstrip().startswith("SELECT") and CLAIM_MARK in statement:
            self.count += 1

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)


@asynccontextmanager
async def running_pool(stack: Stack, size: int) -> AsyncIterator[Submitter]:
    runtime = stack.runtime
    submitter = Submitter(
        runtime.service,
        runtime.client("main"),
        runtime.instance,
        size,
        stack.settings.server.callback_url,
        idle_seconds=IDLE_SECONDS,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(submitter.run(stop))
    try:
        yield submitter
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def submit(stack: Stack, order_no: str, sku: int) -> None:
    body = {"order_no": order_no, "items": [{"sku_id": sku, "upstream": "main", "quantity": 1}]}
    answer = await stack.admin("POST", "/api/v1/orders", body)
    assert answer.status == 202, answer.body


async def states(stack: Stack) -> dict[str, int]:
    statement = select(procurements.c.state, func.count()).group_by(procurements.c.state)
    return {state: int(count) for state, count in await sql_rows(stack.runtime.database, statement)}


async def claimed_owners(stack: Stack) -> list[str]:
    statement = select(procurements.c.lease_owner).where(procurements.c.lease_owner.is_not(None))
    return [owner for (owner,) in await sql_rows(stack.runtime.database, statement)]


@asynccontextmanager
async def mirrored_stack(database_url: str) -> AsyncIterator[tuple[Stack, int]]:
    async with procurd_stack(database_url, upstreams=("main",)) as stack:
        product = stack.sandbox.state.add_product(price="1.00")
        await stack.sync("main")
        yield stack, stack.sandbox.state.product(product).skus[0].id


async def test_pool_claims_no_more_than_its_free_slots(database_url: str) -> None:
    """With 3 slots and 10 orders queued, exactly 3 are claimed while the upstream is slow; all 10 are then
    delivered, once each."""
    async with mirrored_stack(database_url) as (stack, sku):
        stack.sandbox.faults.delay_next("orders.create", count=3, seconds=3.0)
        for index in range(10):
            await submit(stack, f"P{index}", sku)
        async with running_pool(stack, 3):
            await wait_until(lambda: stack.sandbox.request_counts["orders.create"] >= 3)
            owners = await claimed_owners(stack)
            assert len(owners) == 3
            assert stack.sandbox.request_counts["orders.create"] == 3
            await wait_until(lambda: _all_delivered(stack, 10), timeout=30)
        assert [len(stack.sandbox.orders_for(f"P{index}")) for index in range(10)] == [1] * 10


async def _all_delivered(stack: Stack, count: int) -> bool:
    await stack.sandbox.wait_callbacks_idle()
    return (await states(stack)).get("delivered", 0) == count


async def claims_until_delivered(stack: Stack, sku: int, order_no: str) -> tuple[int, float]:
    """Submit one order to a running pool: claim statements sent until it is delivered, and the seconds."""
    counter = ClaimCounter(stack)
    try:
        started = time.monotonic()
        await submit(stack, order_no, sku)
        await wait_until(lambda: _all_delivered(stack, 1))
        return counter.count, time.monotonic() - started
    finally:
        counter.close()


async def test_an_order_wakes_one_claim_not_one_per_worker(database_url: str) -> None:
    """An idle pool of 8 answers one intake with one claim statement (plus at most one per idle second),
    not one per worker."""
    async with mirrored_stack(database_url) as (stack, sku), running_pool(stack, 8):
        claims, elapsed = await claims_until_delivered(stack, sku, "W1")
    # One claim for the intake's wake-up, perhaps one more when an idle look raced the intake's commit,
    # and at most one per idle second.
    idle_ticks = int(elapsed / IDLE_SECONDS) + 1
    assert 1 <= claims <= 2 + idle_ticks, (claims, elapsed)


async def test_each_claim_has_an_owner_of_its_own(database_url: str) -> None:
    """Claims made one after another carry different owners, so a late answer to an expired claim is
    told apart from the current one."""
    async with mirrored_stack(database_url) as (stack, sku):
        stack.sandbox.faults.delay_next("orders.create", count=2, seconds=3.0)
        await submit(stack, "O1", sku)
        async with running_pool(stack, 2):
            await wait_until(lambda: stack.sandbox.request_counts["orders.create"] >= 1)
            await submit(stack, "O2", sku)
            await wait_until(lambda: stack.sandbox.request_counts["orders.create"] >= 2)
            owners = await claimed_owners(stack)
            await wait_until(lambda: _all_delivered(stack, 2), timeout=30)
    assert len(owners) == len(set(owners)) == 2


async def test_a_claim_in_flight_is_due_again_only_when_it_expires(database_url: str) -> None:
    """A claimed procurement counts as due at its claim's expiry, not at its (past) due time."""
    async with mirrored_stack(database_url) as (stack, sku):
        await submit(stack, "D1", sku)
        service = stack.runtime.service
        assert await stack.operations.views.next_submission_due("main") is not None
        [claimed] = (await service.claim_submissions("main", "test-claim", 1)).procurements
        assert claimed.lease_expires_at is not None
        assert await stack.operations.views.next_submission_due("main") == claimed.lease_expires_at
        assert claimed.lease_expires_at > service.clock()


async def test_a_claim_that_takes_fewer_than_asked_says_when_the_next_is_due(database_url: str) -> None:
    """A claim that took fewer procurements than it asked for answers when its upstream's next one can be
    claimed (its own claim counting from its expiry), in its own transaction: the claimer opens no read; a
    claim that took all it asked for does not look."""
    async with mirrored_stack(database_url) as (stack, sku):
        await submit(stack, "N1", sku)
        await submit(stack, "N2", sku)
        service, counts = stack.runtime.service, stack.runtime.database.counts
        reads = counts.reads
        full = await service.claim_submissions("main", "test-claim-1", 1)
        assert (len(full.procurements), full.next_due) == (1, None)
        short = await service.claim_submissions("main", "test-claim-2", 2)
        [claimed] = short.procurements
        leases = [p.lease_expires_at for p in (*full.procurements, claimed)]
        first = min(lease for lease in leases if lease is not None)
        assert short.next_due == first
        nothing = await service.claim_submissions("main", "test-claim-3", 2)
        assert (nothing.procurements, nothing.next_due) == ([], first)
        assert counts.reads == reads


async def test_a_submission_in_flight_does_not_make_the_claimer_spin(database_url: str) -> None:
    """While a submission waits 1.5 s on the upstream, the idle claimer asks for work about once a second,
    not over and over."""
    async with mirrored_stack(database_url) as (stack, sku), running_pool(stack, 8):
        stack.sandbox.faults.delay_next("orders.create", count=1, seconds=1.5)
        claims, elapsed = await claims_until_delivered(stack, sku, "S1")
    assert elapsed >= 1.5
    assert claims <= 2 + int(elapsed / IDLE_SECONDS) + 1, (claims, elapsed)


async def test_a_poll_held_by_a_vanished_instance_is_due_again_at_once(database_url: str) -> None:
    """A fallback poll claimed by an instance that is then found gone is due again at once, and another
    instance's poller takes it, rather than when the claim's hold (``lease_seconds``) ends; the release is
    audited as ``poll_claim_abandoned``."""
    async with procurd_stack(database_url, upstreams=("main",)) as stack:
        await stack.sync("main")
        sku = stack.sandbox.state.first_sku("manual")
        form = {"account": "a@b.example"}
        item = {"upstream": "main", "sku_id": sku.id, "quantity": 1, "manual_form_data": form}
        answer = await stack.admin("POST", "/api/v1/orders", {"order_no": "H1", "items": [item]})
        assert answer.status == 202, answer.body
        async with running_pool(stack, 1):
            await wait_until(lambda: _only(stack, "submitted"))
        # The first poll falls due poll_initial_seconds after the submission: look from a minute later.
        later = utcnow() + timedelta(minutes=1)
        service = ProcurementService(stack.runtime.database, stack.settings, clock=lambda: later)
        try:
            [held] = (await service.claim_polls("main", "gone-host:7/main/poll", 10)).procurements
            assert held.lease_owner == "gone-host:7/main/poll"
            assert (await service.claim_polls("main", "live-host:8/main/poll", 10)).procurements == []

            released = await service.release_claims(["gone-host:7"])
            assert [applied.decision.event for applied in released] == ["poll_claim_abandoned"]
            [taken] = (await service.claim_polls("main", "live-host:8/main/poll", 10)).procurements
            assert (taken.id, taken.lease_owner) == (held.id, "live-host:8/main/poll")
        finally:
            await service.close()
        audit = await sql_rows(
            stack.runtime.database, select(audit_log.c.event).where(audit_log.c.procurement_id == held.id)
        )
        assert "poll_claim_abandoned" in [row.event for row in audit]


async def _only(stack: Stack, state: str) -> bool:
    return await states(stack) == {state: 1}
