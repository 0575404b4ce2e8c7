"""The fault matrix: one test per fault of the reliability issue, each against the sandbox's fault knobs or a
real server, each ending with the same ledger: every order delivered (or, where procurd hands it to a
person, delivered once the person acts), one upstream order per ``downstream_order_no``, the audit trail
unbroken.

Faults that last minutes in reality are compressed: retry and poll schedules are fractions of a second
here, and each test says which ratio it keeps.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from fault_processes import FileSizeLimitedDaemon, PostgresServer, TinyDisk, postgres_bin_dir
from fault_support import (
    IntakeClient,
    Ledger,
    UpstreamGate,
    all_delivered,
    audit_events,
    audit_problems,
    fault_sandbox_config,
    orderable_skus,
    procurement_rows,
    report,
    single_item,
    take_ledger,
)
from procurd.config import Settings
from procurd.daemon import Daemon
from procurd.db import database as database_module
from procurd.db.database import open_database
from procurd.db.errors import DatabaseUnavailable
from procurd.db.stores import Tx
from procurd.operations.installation import migrate_schema
from procurd.protocol.dujiao.callback import CALLBACK_PATH
from procurd.protocol.dujiao.signing import sign
from procurd.sandbox import Sandbox
from procurd.sandbox.callbacks import callback_body
from procurd.sandbox.testing import SignedClient
from scale_cluster import POSTGRES_URL, DaemonProcess, instance_config, settings_of
from support import AdminClient, mirror, running_daemon, settings_for, wait_until

UPSTREAM_REQUESTS = "procurd_upstream_requests_total"


@dataclass
class Run:
    """One procurd in-process against one sandbox, and a storefront handing orders over."""

    sandbox: Sandbox
    settings: Settings
    daemon: Daemon
    intake: IntakeClient
    admin: AdminClient
    database_url: str
    skus: list[int]

    async def submit(self, order_no: str, index: int = 0) -> dict[str, Any]:
        return await self.intake.submit(order_no, single_item(self.skus[index % len(self.skus)]))

    async def submit_all(self, numbers: list[str]) -> None:
        await asyncio.gather(*(self.submit(number, index) for index, number in enumerate(numbers)))

    async def wait_delivered(self, count: int, timeout: float = 30) -> None:
        async def delivered() -> bool:
            return await all_delivered(self.database_url, count)

        await wait_until(delivered, timeout=timeout, interval=0.05)

    async def ledger(self, numbers: list[str]) -> Ledger:
        return await take_ledger(self.database_url, self.sandbox, numbers)

    def requests(self, endpoint: str, outcome: str | None = None) -> float:
        """How many requests to ``endpoint`` this procurd sent (with ``outcome`` when given)."""
        registry = self.daemon.runtime.metrics.registry
        total = 0.0
        for metric in registry.collect():
            for sample in metric.samples:
                labels = sample.labels
                wanted = outcome is None or labels.get("outcome") == outcome
                if sample.name == UPSTREAM_REQUESTS and labels.get("endpoint") == endpoint and wanted:
                    total += sample.value
        return total


@asynccontextmanager
async def procurd_run(
    database_url: str, sandbox: Sandbox, base_url: str | None = None, **sections: dict[str, Any]
) -> AsyncIterator[Run]:
    """Mirror the sandbox's catalogue, start procurd in-process and hand over a storefront client."""
    if base_url is not None:
        sections["upstream"] = {**sections.get("upstream", {}), "base_url": base_url}
    settings = settings_for(database_url, ("main", sandbox), **sections)
    skus = orderable_skus(sandbox)
    await mirror(settings)
    async with running_daemon(settings) as daemon, aiohttp.ClientSession() as session:
        intake = IntakeClient(session, [f"http://127.0.0.1:{settings.server.admin_port}"])
        yield Run(sandbox, settings, daemon, intake, AdminClient(settings, session), database_url, skus)


def assert_clean(ledger: Ledger, orders: int) -> None:
    """Nothing lost, nothing doubled, every delivery the one the upstream made."""
    assert ledger.orders == orders, ledger
    assert ledger.lost == 0, ledger
    assert ledger.duplicates == 0, ledger
    assert ledger.upstream_orders == orders, ledger
    assert ledger.mismatched == 0, ledger
    assert ledger.amount_unknown == 0, ledger


QUIET_POLLS = {"poll_initial_seconds": 60, "poll_max_seconds": 60}  # callbacks alone settle the orders


def pending_knobs(sandbox: Sandbox, kind: str, endpoint: str) -> int:
    return sum(f.remaining for f in sandbox.faults.request_faults if (f.kind, f.endpoint) == (kind, endpoint))


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def numbers(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{index:03d}" for index in range(count)]


# --- the upstream misbehaves ------------------------------------------------------------------------------


async def test_upstream_5xx_burst(database_url: str) -> None:
    """Bursts of 500/502/503, some after the order was made: retried under one number, each bought once."""
    orders = numbers("X5-", 20)
    async with Sandbox(fault_sandbox_config()) as sandbox:
        for status in (500, 502, 503):
            sandbox.faults.fail_next("orders.create", count=8, status=status)
        # The order is made and paid, then the answer is a 500: the outcome is unknown to procurd.
        sandbox.faults.fail_after_next("orders.create", count=6)
        sandbox.faults.fail_next("orders.get", count=3, status=502)
        async with procurd_run(database_url, sandbox, procurement={"max_attempts": 40}) as run:
            await run.submit_all(orders)
            await run.wait_delivered(len(orders))
            failed = run.requests("orders.create", "internal_error")
        ledger = await run.ledger(orders)
    assert_clean(ledger, len(orders))
    assert failed == 30
    # A 500 before the work costs one more attempt; after it, the callback may deliver before the retry.
    assert len(orders) + 24 <= ledger.attempts <= len(orders) + 30
    assert await audit_problems(database_url) == []
    report("upstream_5xx_burst", server_errors=int(failed), **ledger.row())


async def test_hanging_responses(database_url: str) -> None:
    """Answers that never come, or come after procurd gave up: timeouts, retried, each order bought once."""
    orders = numbers("HG-", 12)
    async with Sandbox(fault_sandbox_config()) as sandbox:
        sandbox.faults.hang_next("orders.create", count=4)
        sandbox.faults.hang_next("orders.get", count=3)
        sandbox.faults.drop_callbacks_next(count=40)
        async with procurd_run(
            database_url,
            sandbox,
            upstream={"timeout_seconds": 0.4},
            procurement={"max_attempts": 20, "lease_seconds": 2},
        ) as run:
            submitting = asyncio.gather(*(run.submit(number, i) for i, number in enumerate(orders)))
            await wait_until(lambda: not pending_knobs(sandbox, "hang", "orders.create"))
            # Then answers that come after the timeout: the order exists upstream, procurd never saw it.
            sandbox.faults.delay_next("orders.create", count=4, seconds=1.0)
            await submitting
            await run.wait_delivered(len(orders))
            timeouts = run.requests("orders.create", "timeout") + run.requests("orders.get", "timeout")
        ledger = await run.ledger(orders)
    assert_clean(ledger, len(orders))
    assert timeouts == 11
    assert await audit_problems(database_url) == []
    report("hanging_responses", timeouts=int(timeouts), **ledger.row())


async def test_refused_connections(database_url: str) -> None:
    """Refused connections are retried; once the upstream listens again each order is bought once."""
    orders = numbers("RF-", 10)
    async with Sandbox(fault_sandbox_config()) as sandbox, UpstreamGate(port_of(sandbox.base_url)) as gate:
        async with procurd_run(
            database_url, sandbox, gate.url, procurement={"max_attempts": 40, "retry_max_seconds": 0.1}
        ) as run:
            await gate.refuse()
            await run.submit_all(orders)

            async def refused_thrice() -> bool:
                return all(row.attempts >= 3 for row in await procurement_rows(database_url))

            await wait_until(refused_thrice)
            refused = run.requests("orders.create", "network_error")
            assert not sandbox.state.orders
            await gate.open()
            await run.wait_delivered(len(orders))
        ledger = await run.ledger(orders)
    assert_clean(ledger, len(orders))
    assert await audit_problems(database_url) == []
    report("refused_connections", refused=int(refused), **ledger.row())


async def test_upstream_down_then_back(database_url: str) -> None:
    """An upstream down for a while (minutes, compressed to seconds): orders wait, then each is bought once.

    The retry schedule is compressed with the outage: 0.1 s doubling to 0.5 s instead of 1 s to 300 s, and
    30 attempts, so the attempts outlast the outage as the defaults outlast an outage of half a minute.
    """
    held, during = numbers("DNH-", 4), numbers("DN-", 8)
    async with Sandbox(fault_sandbox_config()) as sandbox, UpstreamGate(port_of(sandbox.base_url)) as gate:
        schedule = {"max_attempts": 30, "retry_base_seconds": 0.1, "retry_max_seconds": 0.5}
        async with procurd_run(database_url, sandbox, gate.url, procurement=schedule) as run:
            await submitted_and_held(run, held)
            await gate.refuse()
            await run.submit_all(during)

            async def refused_repeatedly() -> bool:
                rows = await procurement_rows(database_url)
                return sum(1 for row in rows if row.order_no in during and row.attempts >= 4) == len(during)

            await wait_until(refused_repeatedly)
            refused = run.requests("orders.create", "network_error")
            failed_polls = run.requests("orders.get", "network_error")
            await gate.open()
            # Back up: the held orders are delivered, and their callbacks lost, so polls must find them.
            sandbox.faults.drop_callbacks_next(count=len(held))
            for number in held:
                await sandbox.deliver(sandbox.orders_for(number)[0].order_id)
            await run.wait_delivered(len(held) + len(during))
        ledger = await run.ledger(held + during)
    assert_clean(ledger, len(held) + len(during))
    assert await audit_problems(database_url) == []
    report("upstream_down_then_back", refused=int(refused), failed_polls=int(failed_polls), exceptions=0,
           **ledger.row())  # fmt: skip


async def test_upstream_down_longer_than_the_retries(database_url: str) -> None:
    """An outage that outlasts max_attempts: exceptions for a person, who may cancel them locally (nothing
    reached the upstream) or buy each once with one bulk retry."""
    orders = numbers("DL-", 8)
    async with Sandbox(fault_sandbox_config()) as sandbox, UpstreamGate(port_of(sandbox.base_url)) as gate:
        schedule = {"max_attempts": 3, "retry_base_seconds": 0.05, "retry_max_seconds": 0.1}
        async with procurd_run(database_url, sandbox, gate.url, procurement=schedule) as run:
            await gate.refuse()
            await run.submit_all(orders)
            await wait_until(lambda: _count_in(run, "exception", len(orders)))
            refused = run.requests("orders.create", "network_error")
            exceptions = (await run.admin.call("GET", "/api/v1/exceptions"))[1]["items"]
            # No request ever reached the upstream, so the shop may cancel one locally, at once.
            canceled, cancel = await run.admin.call("POST", f"/api/v1/orders/{orders[0]}/cancel")
            await gate.open()
            status, retry = await run.admin.call(
                "POST", "/api/v1/exceptions/retry", {"reason": "max_attempts_exceeded", "note": "back up"}
            )
            assert status == 200, retry
            await wait_until(lambda: _count_in(run, "delivered", len(orders) - 1))
        ledger = await run.ledger(orders[1:])  # every order but the canceled one must be delivered
    assert (canceled, cancel["order"]["status"]) == (200, "canceled"), cancel
    assert sandbox.orders_for(orders[0]) == []
    assert {item["exception_reason"] for item in exceptions} == {"max_attempts_exceeded"}
    assert {item["downstream_order_no"] for item in exceptions} == set(orders)  # the retry keeps the number
    assert (len(retry["retried"]), retry["skipped"], retry["remaining"]) == (len(orders) - 1, [], 0)
    assert ledger.states == {"delivered": len(orders) - 1, "canceled": 1}, ledger
    assert (ledger.upstream_orders, ledger.lost, ledger.duplicates, ledger.mismatched) == (
        len(orders) - 1, 0, 0, 0
    ), ledger  # fmt: skip
    assert await audit_problems(database_url) == []
    report("upstream_down_longer_than_retries", refused=int(refused), exceptions=len(exceptions),
           canceled_locally=1, retried_in_one_call=len(retry["retried"]), **ledger.row())  # fmt: skip


# --- callbacks --------------------------------------------------------------------------------------------


async def test_callbacks_dropped(database_url: str) -> None:
    """Every callback try lost: the fallback polls deliver each order, once."""
    orders = numbers("CD-", 10)
    async with Sandbox(fault_sandbox_config()) as sandbox:
        sandbox.faults.drop_callbacks_next(count=1000)
        async with procurd_run(database_url, sandbox) as run:
            await run.submit_all(orders)
            await run.wait_delivered(len(orders))
            polls = run.requests("orders.get", "ok")
        ledger = await run.ledger(orders)
        dropped = sandbox.callbacks.stats["dropped"]
    assert_clean(ledger, len(orders))
    assert dropped == len(orders)
    events = await audit_events(database_url)
    assert events[("poll", "delivered")] == len(orders)
    assert await audit_problems(database_url) == []
    report("callbacks_dropped", dropped=dropped, polls=int(polls), **ledger.row())


async def test_callbacks_duplicated(database_url: str) -> None:
    """Every callback sent twice: the second is answered ok and changes nothing."""
    orders = numbers("CU-", 10)
    async with Sandbox(fault_sandbox_config()) as sandbox:
        sandbox.faults.duplicate_callbacks_next(count=len(orders))
        async with procurd_run(database_url, sandbox, procurement=QUIET_POLLS) as run:
            await run.submit_all(orders)
            await run.wait_delivered(len(orders))
            await sandbox.wait_callbacks_idle()
        ledger = await run.ledger(orders)
    answered_ok = [attempt for attempt in sandbox.callback_log if attempt.ok]
    assert len(answered_ok) == 2 * len(orders)
    assert_clean(ledger, len(orders))
    events = await audit_events(database_url)
    assert events[("callback", "delivered")] == len(orders)
    assert sum(count for (source, _), count in events.items() if source == "callback") == len(orders)
    assert await audit_problems(database_url) == []
    report("callbacks_duplicated", callbacks=len(answered_ok), state_changes=len(orders), **ledger.row())


def callback_signer(run: Run) -> SignedClient:
    """Signs callbacks exactly as the sandbox does, and posts them to procurd's public listener."""
    config = run.sandbox.config
    base = f"http://127.0.0.1:{run.settings.server.public_port}"
    return SignedClient(base, config.api_key, config.api_secret, config.header_prefix)


async def post_callback(signer: SignedClient, body: bytes, **overrides: Any) -> tuple[int, dict[str, Any]]:
    """Post one callback; its HTTP status and JSON answer."""
    answer = await signer.request(
        "POST", CALLBACK_PATH, body=body, headers={"Content-Type": "application/json"}, **overrides
    )
    return answer.status, answer.json()


async def submitted_and_held(run: Run, orders: list[str]) -> None:
    """Every order submitted upstream and paid there, its delivery held back."""
    run.sandbox.faults.hold_delivery_next(count=len(orders))
    await run.submit_all(orders)

    async def all_submitted() -> bool:
        rows = await procurement_rows(run.database_url)
        return len(rows) == len(orders) and all(row.state == "submitted" for row in rows)

    await wait_until(all_submitted)


async def test_callbacks_reordered(database_url: str) -> None:
    """Callbacks arriving newest first (completed, delivered, then paid) never move an order backwards."""
    orders = numbers("CO-", 8)
    async with Sandbox(fault_sandbox_config()) as sandbox:
        async with procurd_run(database_url, sandbox, procurement=QUIET_POLLS) as run:
            await submitted_and_held(run, orders)
            async with callback_signer(run) as signer:
                for number in orders:
                    (upstream,) = sandbox.orders_for(number)
                    now = int(time.time())
                    paid = callback_body(upstream, now)
                    delivered = callback_body(sandbox.state.deliver(upstream.order_id), now)
                    completed = callback_body(sandbox.state.complete(upstream.order_id), now)
                    for body in (completed, delivered, paid):
                        assert await post_callback(signer, body) == (200, {"ok": True, "message": "received"})
            rows = await procurement_rows(database_url)
        ledger = await run.ledger(orders)
    assert_clean(ledger, len(orders))
    assert {(row.state, row.upstream_status) for row in rows} == {("delivered", "completed")}
    events = await audit_events(database_url)
    assert events[("callback", "delivered")] == len(orders)
    assert events[("callback", "late_status_ignored")] == 2 * len(orders)
    assert await audit_problems(database_url) == []
    report("callbacks_reordered", callbacks=3 * len(orders), late_recorded=2 * len(orders), **ledger.row())


async def test_callbacks_replayed(database_url: str) -> None:
    """Replays change nothing: fresh ones are duplicates, stale, altered or misdirected ones are refused."""
    orders = numbers("CR-", 6)
    async with Sandbox(fault_sandbox_config()) as sandbox:
        async with procurd_run(database_url, sandbox) as run:
            await run.submit_all(orders)
            await run.wait_delivered(len(orders))
            await sandbox.wait_callbacks_idle()
            before = await procurement_rows(database_url)
            audit_before = await audit_events(database_url)
            answers: list[tuple[int, dict[str, Any]]] = []
            async with callback_signer(run) as signer:
                for index, number in enumerate(orders):
                    (upstream,) = sandbox.orders_for(number)
                    now = int(time.time())
                    body = callback_body(upstream, now)
                    for _ in range(3):  # the same signed request again, inside the 60 s window
                        answers.append(await post_callback(signer, body, timestamp=now))
                    stale = now - 90  # a request recorded 90 s ago and sent again now
                    answers.append(
                        await post_callback(signer, callback_body(upstream, stale), timestamp=stale)
                    )
                    altered = body.replace(b'"delivered"', b'"canceled"')  # with the original signature
                    signature = sign(signer.api_secret, "POST", CALLBACK_PATH, now, body)
                    answers.append(await post_callback(signer, altered, timestamp=now, signature=signature))
                    # Signed by the upstream, but naming another order's number with this order's id.
                    misdirected = json.loads(body)
                    misdirected["downstream_order_no"] = orders[(index + 1) % len(orders)]
                    answers.append(await post_callback(signer, json.dumps(misdirected).encode()))
            after = await procurement_rows(database_url)
            audit_after = await audit_events(database_url)
            status = (await run.admin.call("GET", "/api/v1/status"))[1]["upstreams"][0]["callbacks"]
        ledger = await run.ledger(orders)
    assert_clean(ledger, len(orders))
    assert [_state(row) for row in after] == [_state(row) for row in before]
    assert audit_after == audit_before
    outcomes = Counter((status, body.get("error_code") or body.get("message")) for status, body in answers)
    assert outcomes == {
        (200, "received"): 3 * len(orders),
        (401, "timestamp_expired"): len(orders),
        (401, "invalid_signature"): len(orders),
        (404, "order_not_found"): len(orders),
    }
    assert status["rejected"] == 3 * len(orders)
    assert await audit_problems(database_url) == []
    named = {f"{status} {code}": count for (status, code), count in outcomes.items()}
    report("callbacks_replayed", replays=len(answers), outcomes=named, **ledger.row())


def _state(row: Any) -> tuple[Any, ...]:
    return (row.id, row.state, row.upstream_status, row.upstream_order_id, row.fulfillment, row.updated_at)


# --- the local clock --------------------------------------------------------------------------------------

CLOCK_OFFSET_SECONDS = 90
QUIET_WINDOW_SECONDS = 2.0
POLL_MAX_SECONDS = 1.0  # tests/support.py's [procurement] poll_max_seconds


async def test_clock_90_seconds_off(database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A clock 90 s off: status and log name the clock and the offset, no retry loop, nothing lost."""
    held, fresh = numbers("CKH-", 3), numbers("CK-", 6)
    caplog.set_level(logging.WARNING)
    async with Sandbox(fault_sandbox_config()) as sandbox:
        async with procurd_run(database_url, sandbox) as run:
            await submitted_and_held(run, held)
            # Our clock falls 90 s behind the upstream's; the next scheduled ping notices.
            sandbox.config.clock_offset_seconds = CLOCK_OFFSET_SECONDS
            upstream = await ping_now(run, healthy=False)
            for number in held:  # delivered upstream; the callbacks carry the upstream's clock
                await sandbox.deliver(sandbox.orders_for(number)[0].order_id)
            await wait_until(lambda: sum(not a.ok for a in sandbox.callback_log) >= len(held))
            await run.submit_all(fresh)
            await wait_until(lambda: _count_in(run, "exception", len(fresh)))
            before = sandbox.request_counts["*"]
            # A fixed window on purpose: it measures how often procurd calls a site that refuses its clock.
            await asyncio.sleep(QUIET_WINDOW_SECONDS)
            requests_in_window = sandbox.request_counts["*"] - before
            exceptions = (await run.admin.call("GET", "/api/v1/exceptions"))[1]["items"]

            sandbox.config.clock_offset_seconds = 0  # NTP fixed it
            await ping_now(run, healthy=True)
            status, retry = await run.admin.call(
                "POST", "/api/v1/exceptions/retry", {"reason": "timestamp_expired", "note": "clock fixed"}
            )
            assert status == 200, retry
            await run.wait_delivered(len(held) + len(fresh))
        ledger = await run.ledger(held + fresh)
    assert {item["exception_reason"] for item in exceptions} == {"timestamp_expired"}
    assert {item["attempts"] for item in exceptions} == {1}
    assert (sorted(retry["retried"]), retry["remaining"]) == (sorted(item["id"] for item in exceptions), 0)
    # Only the fallback polls of the held orders, on their backed-off schedule (at most one a second each,
    # poll_max_seconds in these tests): no loop.
    assert requests_in_window <= len(held) * (int(QUIET_WINDOW_SECONDS / POLL_MAX_SECONDS) + 1)
    assert upstream["auth_error"]["code"] == "timestamp_expired"
    ping_error = upstream["last_ping"]["error"]
    assert "check this machine's clock" in ping_error, ping_error
    assert names_the_offset(ping_error), ping_error
    records = log_records(caplog)
    hints = [r["hint"] for r in records if r["event"] == "upstream.auth_refused"]
    assert hints, records
    assert all(names_the_offset(hint) for hint in hints), hints
    refusals = [r["detail"] for r in records if r["event"] == "callback.rejected"]
    assert refusals, records
    assert all(names_the_offset(detail, "ahead of our clock") for detail in refusals), refusals
    assert_clean(ledger, len(held) + len(fresh))
    assert await audit_problems(database_url) == []
    report(
        "clock_90_seconds_off",
        requests_in_quiet_window=requests_in_window,
        exceptions=len(exceptions),
        callbacks_refused=len(refusals),
        ping_error=ping_error,
        callback_refusal=refusals[0],
        **ledger.row(),
    )


def names_the_offset(text: str, direction: str = "behind the upstream") -> bool:
    """Whether ``text`` gives the clock's offset (measured against a Date header: to the second)."""
    found = re.search(rf"(\d+) s {direction}", text)
    return found is not None and abs(int(found.group(1)) - CLOCK_OFFSET_SECONDS) <= 1


async def ping_now(run: Run, *, healthy: bool) -> dict[str, Any]:
    """Run the daemon's scheduled ping now; the status of the upstream once health is ``healthy``. A ping
    still running (the daemon's first, which may have read the upstream before the test changed it) makes
    the scheduler skip the one asked for: it is asked for again until one has started for it."""
    daemon = run.daemon
    daemon.run_now("ping:main")

    async def reported() -> dict[str, Any] | None:
        if "ping:main" in daemon.jobs_asked_for:  # not started yet
            if not any(task.get_name() == "ping:main" for task in daemon.job_tasks):
                daemon.run_now("ping:main")
            return None
        upstream: dict[str, Any] = (await run.admin.call("GET", "/api/v1/status"))[1]["upstreams"][0]
        return upstream if upstream["healthy"] is healthy and upstream["last_ping"]["at"] else None

    return await wait_until(reported)


async def _count_in(run: Run, state: str, count: int) -> bool:
    rows = await procurement_rows(run.database_url)
    return sum(1 for row in rows if row.state == state) == count


def log_records(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """procurd's structured log records captured so far."""
    return [record.msg for record in caplog.records if isinstance(record.msg, dict)]


# --- the database -----------------------------------------------------------------------------------------

BUSY_HOLD_SECONDS = 3.0


def sqlite_path(database_url: str) -> str:
    database = make_url(database_url).database
    assert database
    return database


def hold_write_lock(path: str, held: threading.Event, seconds: float) -> None:
    """A second writer: another connection holds SQLite's write lock (BEGIN IMMEDIATE) for ``seconds``."""
    connection = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("UPDATE upstream_health SET updated_at = updated_at")
        held.set()
        threading.Event().wait(seconds)  # the fault itself: the lock is held this long
        connection.execute("COMMIT")
    finally:
        connection.close()


async def test_sqlite_busy_from_a_second_writer(database_url: str) -> None:
    """A second writer holds SQLite's write lock 3 s: intake waits and answers, nothing lost or doubled."""
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's write lock; PostgreSQL has row locks")
    before, during = numbers("SB-", 5), numbers("SBW-", 20)
    async with Sandbox(fault_sandbox_config()) as sandbox:
        async with procurd_run(database_url, sandbox) as run:
            await run.submit_all(before)
            held = threading.Event()
            holder = asyncio.create_task(
                asyncio.to_thread(hold_write_lock, sqlite_path(database_url), held, BUSY_HOLD_SECONDS)
            )
            await wait_until(held.is_set)
            await run.submit_all(during)
            await holder
            await run.wait_delivered(len(before) + len(during))
        ledger = await run.ledger(before + during)
    answers = run.intake.record.answers
    assert set(answers) == {202}, answers
    assert run.intake.record.retry_count == 0
    assert_clean(ledger, len(before) + len(during))
    assert await audit_problems(database_url) == []
    report("sqlite_busy", hold_seconds=BUSY_HOLD_SECONDS, intake_answers=dict(answers),
           slowest_intake_seconds=round(max(run.intake.record.seconds), 2), submitted_during_hold=len(during),
           **ledger.row())  # fmt: skip


DISK_FULL_MAX_ORDERS = 400
WAL_ROOM_BYTES = 256 * 1024  # how far a file may grow under the file-size limit


@pytest.mark.parametrize("disk", ["tmpfs", "file-size-limit"])
async def test_sqlite_disk_full(database_url: str, tmp_path: Path, disk: str) -> None:
    """A full disk refuses intake clearly (no 500), keeps every accepted order, and recovers with room."""
    if not database_url.startswith("sqlite"):
        pytest.skip("a full disk under SQLite; PostgreSQL's disk is the server's")
    tiny = TinyDisk(tmp_path / "disk")
    if disk == "tmpfs":
        if not await tiny.mount():
            pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN); the file-size-limit case still runs")
        database_url = f"sqlite+aiosqlite:///{tiny.mountpoint / 'procurd.db'}"
        await migrated(database_url)
    try:
        async with Sandbox(fault_sandbox_config()) as sandbox:
            figures = await fill_the_disk(database_url, tmp_path, sandbox, tiny if disk == "tmpfs" else None)
    finally:
        await tiny.unmount()
    report(f"sqlite_disk_full_{disk}", **figures)


async def fill_the_disk(
    database_url: str, tmp_path: Path, sandbox: Sandbox, tiny: TinyDisk | None
) -> dict[str, Any]:
    skus = orderable_skus(sandbox)
    config = instance_config(database_url, sandbox)
    await mirror(settings_of(config))
    database = Path(sqlite_path(database_url))
    daemon: DaemonProcess
    if tiny is None:
        sizes = [path.stat().st_size for path in database.parent.glob(database.name + "*")]
        daemon = FileSizeLimitedDaemon("limited", config, tmp_path, max(sizes) + WAL_ROOM_BYTES)
    else:
        daemon = DaemonProcess("tiny-disk", config, tmp_path)
    accepted: list[str] = []
    try:
        async with aiohttp.ClientSession() as session:
            await daemon.start()
            await daemon.wait_ready(session)
            intake = IntakeClient(session, [daemon.admin_url])
            for index in range(3):
                await intake.submit(f"DF-{index:03d}", single_item(skus[index % len(skus)]))
                accepted.append(f"DF-{index:03d}")
            filled = tiny.fill() if tiny is not None else 0
            refusal: tuple[int, dict[str, Any]] | None = None
            for index in range(3, DISK_FULL_MAX_ORDERS):
                order_no = f"DF-{index:03d}"
                body = {"order_no": order_no, "items": single_item(skus[0])}
                status, body = await intake.post(daemon.admin_url + "/api/v1/orders", body)
                if status != 202:
                    refusal = (status, body)
                    break
                accepted.append(order_no)
            assert refusal is not None, "the disk never filled up"
            refused_order = order_no
            accepted_while_filling = len(accepted) - 3
            assert daemon.returncode is None, daemon.log_tail()
            reads = [await intake.session.get(f"{daemon.admin_url}/api/v1/orders/{n}") for n in accepted[:3]]
            read_statuses = {response.status for response in reads}
            for response in reads:
                response.release()
            if tiny is not None:
                tiny.free()
            else:
                assert isinstance(daemon, FileSizeLimitedDaemon)
                daemon.lift_limit()
            for order_no in [refused_order, "DF-AFTER-1", "DF-AFTER-2"]:
                await intake.submit(order_no, single_item(skus[0]))
                accepted.append(order_no)
            await wait_until(lambda: all_delivered(database_url, len(accepted)), timeout=30, interval=0.1)
            code = await daemon.stop()
            assert code == 0, daemon.log_tail()
    finally:
        await daemon.kill()
        if isinstance(daemon, FileSizeLimitedDaemon):
            await daemon.finish()
    ledger = await take_ledger(database_url, sandbox, accepted)
    status, body = refusal
    assert (status, body["error_code"]) == (503, "database_unavailable"), refusal
    assert "disk" in body["error_message"], refusal
    assert read_statuses == {200}
    assert_clean(ledger, len(accepted))
    assert await audit_problems(database_url) == []
    return {
        "accepted_after_filling_until_refused": accepted_while_filling,
        "refusal": f"{status} {body['error_code']}: {body['error_message']}",
        "filler_bytes": filled,
        **ledger.row(),
    }


async def migrated(database_url: str) -> None:
    database = open_database(database_url)
    try:
        await migrate_schema(database)
    finally:
        await database.close()


RESTART_ORDERS = 30


@pytest.mark.postgres
async def test_postgres_restarted_mid_run(tmp_path: Path) -> None:
    """PostgreSQL restarted twice amid a stream of orders: intake retried through it, each delivered once."""
    bin_dir = postgres_bin_dir()
    if not POSTGRES_URL or bin_dir is None:
        pytest.skip("runs in the PostgreSQL pass (PROCURD_TEST_POSTGRES_URL) on a server of its own (initdb)")
    server = PostgresServer(bin_dir)
    try:
        await server.start()
        database_url = await server.create_database("procurd_restart")
        async with Sandbox(fault_sandbox_config()) as sandbox:
            figures = await orders_through_restarts(database_url, tmp_path, sandbox, server)
    finally:
        await server.stop()
    report("postgres_restarted", **figures)


@pytest.mark.postgres
@pytest.mark.parametrize("idle_connections_pinged", [True, False])
async def test_pooled_connections_across_a_postgres_restart(
    monkeypatch: pytest.MonkeyPatch, idle_connections_pinged: bool
) -> None:
    """A pooled connection that sat idle while PostgreSQL restarted is checked before its next use and
    replaced: the caller sees nothing. One in steady use (not idle long enough to be checked) fails once as
    unavailable, and every connection of the pool is renewed for the next transaction."""
    bin_dir = postgres_bin_dir()
    if not POSTGRES_URL or bin_dir is None:
        pytest.skip("runs in the PostgreSQL pass (PROCURD_TEST_POSTGRES_URL) on a server of its own (initdb)")
    monkeypatch.setattr(database_module, "PING_AFTER_IDLE_SECONDS", 0.0 if idle_connections_pinged else 3600)
    server = PostgresServer(bin_dir)
    try:
        await server.start()
        database = open_database(await server.create_database("procurd_pool"))
        try:

            def one(tx: Tx) -> int:
                return int(tx.connection.execute(text("SELECT 1")).scalar_one())

            assert await database.read(one) == 1
            await server.restart()
            if idle_connections_pinged:
                assert await database.read(one) == 1
            else:
                with pytest.raises(DatabaseUnavailable):
                    await database.read(one)
                assert await database.read(one) == 1
            assert await database.write(one) == 1
        finally:
            await database.close()
    finally:
        await server.stop()


async def orders_through_restarts(
    database_url: str, tmp_path: Path, sandbox: Sandbox, server: PostgresServer
) -> dict[str, Any]:
    skus = orderable_skus(sandbox)
    config = instance_config(database_url, sandbox, procurement={"lease_seconds": 3, "max_attempts": 20},
                             upstream={"timeout_seconds": 2})  # fmt: skip
    await mirror(settings_of(config))
    daemon = DaemonProcess("pg-restart", config, tmp_path)
    orders = numbers("PR-", RESTART_ORDERS)
    try:
        async with aiohttp.ClientSession() as session:
            await daemon.start()
            await daemon.wait_ready(session)
            intake = IntakeClient(session, [daemon.admin_url])

            async def stream() -> None:
                for index, order_no in enumerate(orders):
                    await intake.submit(order_no, single_item(skus[index % len(skus)]))

            async def restarts() -> None:
                for after in (RESTART_ORDERS // 3, 2 * RESTART_ORDERS // 3):
                    await wait_until(lambda: len(intake.record.accepted) >= after)  # noqa: B023
                    await server.restart()

            await asyncio.gather(stream(), restarts())
            await wait_until(lambda: all_delivered(database_url, len(orders)), timeout=30, interval=0.1)
            code = await daemon.stop()
            assert code == 0, daemon.log_tail()
    finally:
        await daemon.kill()
    ledger = await take_ledger(database_url, sandbox, orders)
    assert_clean(ledger, len(orders))
    assert await audit_problems(database_url) == []
    assert not [r for r in daemon.log_events("http.internal_error") if r.get("listener") == "admin"]
    return {
        "restarts": server.restarts,
        "intake_retries": intake.record.retry_count,
        "intake_retry_reasons": dict(intake.record.retries),
        **ledger.row(),
    }
