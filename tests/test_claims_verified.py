"""Nothing taken on trust from an upstream, over real sockets against the sandbox: a correctly signed callback
that names an upstream order procurd has not recorded changes only what the upstream, asked, confirms; a
procurement a person resolved is never reopened; polls and reconciliation adopt no other order than the one
asked for; identical late reports count on one audit entry instead of adding rows.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import select, update

from console_support import ConsoleClient
from procurd.core.procurement import Source
from procurd.db.schema import audit_log, procurements, reconcile_findings
from procurd.db.types import utcnow
from procurd.http.testing import Stack, procurd_stack
from procurd.operations.reconcile import reconcile
from procurd.procurement.poller import Poller
from procurd.procurement.submitter import outcome_event, submission_request
from procurd.protocol.dujiao.callback import CALLBACK_PATH
from procurd.sandbox.testing import ApiResponse, SignedClient
from support import sql_execute, sql_rows, wait_until

INVENTED = 777777


@pytest.fixture
async def stack(database_url: str) -> AsyncIterator[Stack]:
    """procurd in front of the sandbox, its catalogue mirrored, no workers but those a test drives."""
    async with procurd_stack(database_url, upstreams=("main",)) as stack:
        await stack.sync("main")
        yield stack


async def intake(stack: Stack, order_no: str) -> int:
    """Accept a one-item order; its procurement's id."""
    sku = stack.sandbox.state.first_sku("auto")
    body = {"order_no": order_no, "items": [{"upstream": "main", "sku_id": sku.id, "quantity": 1}]}
    answer = await stack.admin("POST", "/api/v1/orders", body)
    assert answer.status == 202, answer.body
    return int(answer.body["order"]["procurements"][0]["id"])


async def item(stack: Stack, order_no: str) -> dict[str, Any]:
    view: dict[str, Any] = (await stack.order(order_no))["procurements"][0]
    return view


async def send_due(stack: Stack) -> None:
    """Send the oldest due procurement once it is due (a retry waits a few milliseconds)."""
    await wait_until(stack.submit_due)


def report(order_no: str, order_id: int, status: str, payload: str | None = None) -> bytes:
    body: dict[str, Any] = {
        "event": "order.fulfilled" if payload else "order.status_changed",
        "order_id": order_id,
        "downstream_order_no": order_no,
        "status": status,
        "timestamp": int(time.time()),
    }
    if payload is not None:
        body["fulfillment"] = {"type": "auto", "status": "delivered", "payload": payload,
                               "delivery_data": None, "delivered_at": "2026-11-28T10:00:00Z"}  # fmt: skip
    return json.dumps(body).encode()


async def post(signer: SignedClient, body: bytes) -> ApiResponse:
    return await signer.request(
        "POST", CALLBACK_PATH, body=body, headers={"Content-Type": "application/json"}
    )


def gets(stack: Stack) -> int:
    """How many ``GET /orders/{id}`` the sandbox has answered."""
    return sum(1 for record in stack.sandbox.requests.select() if record.endpoint == "orders.get")


async def audit(stack: Stack, order_no: str) -> list[dict[str, Any]]:
    return await stack.operations.views.audit(order_no)


async def test_an_invented_upstream_order_changes_only_what_the_upstream_confirms(stack: Stack) -> None:
    """A delivery signed by the upstream that owns the orders, naming an upstream order procurd never saw,
    is refused (404 callback_unverified) for a procurement the upstream refused outright, a queued one, one
    whose submission's answer was lost, and one a person resolved: procurd asks the upstream, which knows no
    such order; each gets an audit entry, nothing else changes, and the callbacks_rejected alert counts
    them. The upstream's own callbacks for the real orders are confirmed and applied: the lost answer's
    procurement is delivered; the resolved one stays resolved, its goods recorded and a reconcile_mismatch
    finding raised for the person."""
    faults = stack.sandbox.faults
    faults.fail_next("orders.create", status=409, error_code="insufficient_stock")
    await intake(stack, "V-REF")
    await send_due(stack)
    assert (await item(stack, "V-REF"))["exception_reason"] == "insufficient_stock"

    faults.hold_delivery_next()
    faults.drop_next("orders.create", count=2)
    resolved_id = await intake(stack, "V-RES")
    await send_due(stack)
    await send_due(stack)
    assert (await item(stack, "V-RES"))["exception_reason"] == "max_attempts_exceeded"
    await stack.operations.orders.resolve(resolved_id, "refunded the buyer")

    faults.hold_delivery_next()
    faults.drop_next("orders.create")
    await intake(stack, "V-T")
    await send_due(stack)
    assert (await item(stack, "V-T"))["state"] == "queued"
    await intake(stack, "V-Q")

    numbers = ("V-REF", "V-Q", "V-T", "V-RES")
    before = {number: await item(stack, number) for number in numbers}
    asked = gets(stack)
    async with stack.signer() as signer:
        for number in numbers:
            answer = await post(signer, report(number, INVENTED, "delivered", f"FORGED-{number}"))
            assert (answer.status, answer.error_code) == (404, "callback_unverified"), answer.body
            assert b"FORGED" not in answer.body
    assert gets(stack) == asked + len(numbers)
    for number in numbers:
        assert await item(stack, number) == before[number]
        [entry] = [entry for entry in await audit(stack, number) if entry["event"] == "callback_unverified"]
        assert (entry["source"], entry["detail"]["order_id"], entry["count"]) == ("callback", INVENTED, 1)
    _, raised = await stack.runtime.database.read(lambda tx: tx.alerts.recent(1, 10, "callbacks_rejected"))
    assert [(alert.subject, alert.count) for alert in raised] == [("main", len(numbers))]
    status = (await stack.admin("GET", "/api/v1/status")).body
    assert status["upstreams"][0]["callbacks"]["rejected"] == len(numbers)

    for number, goods in (("V-T", "GOODS-T"), ("V-RES", "GOODS-RES")):
        [order] = stack.sandbox.orders_for(number)
        await stack.sandbox.deliver(order.order_id, goods)
        await stack.sandbox.wait_callbacks_idle()
    assert all(attempt.ok for attempt in stack.sandbox.callback_log)
    delivered = await item(stack, "V-T")
    [order_t] = stack.sandbox.orders_for("V-T")
    assert (delivered["state"], delivered["upstream_order_id"]) == ("delivered", order_t.order_id)
    assert delivered["fulfillment"]["payload"] == "GOODS-T"
    assert (await audit(stack, "V-T"))[-1]["detail"]["verified"] is True

    kept = await item(stack, "V-RES")
    assert (kept["state"], kept["fulfillment"]["payload"]) == ("resolved", "GOODS-RES")
    findings = await sql_rows(stack.runtime.database, select(reconcile_findings))
    assert [(row.order_no, row.field, row.local_value, row.upstream_value) for row in findings] == [
        ("V-RES", "goods", "resolved", "delivered")
    ]
    _, mismatches = await stack.runtime.database.read(
        lambda tx: tx.alerts.recent(1, 10, "reconcile_mismatch")
    )
    assert [alert.subject for alert in mismatches] == ["V-RES"]
    for number in ("V-REF", "V-Q"):
        assert await item(stack, number) == before[number]


async def test_a_callback_that_overtakes_its_submissions_answer_waits_for_it(stack: Stack) -> None:
    """A callback that names the upstream order before the answer to the submission is recorded waits for
    that answer (its claim is live) and is then taken like any other: no request to confirm it."""
    runtime = stack.runtime
    stack.sandbox.faults.hold_delivery_next()
    procurement_id = await intake(stack, "V-O")
    owner = f"{runtime.instance}/main/1"
    [claimed] = (await runtime.service.claim_submissions("main", owner, 1)).procurements
    created = await runtime.client("main").create_order(
        submission_request(claimed, runtime.settings.server.callback_url)
    )
    asked = gets(stack)
    async with stack.signer() as signer:
        callback = asyncio.create_task(post(signer, report("V-O", created.order_id, "paid")))
        await wait_until(lambda: procurement_id in runtime.service.confirmation.awaiting_submissions)
        assert (await item(stack, "V-O"))["upstream_order_id"] is None
        await runtime.service.apply(
            procurement_id, outcome_event(owner, created), Source.WORKER, order_no="V-O"
        )
        answer = await callback
    assert answer.status == 200, answer.body
    assert gets(stack) == asked
    found = await item(stack, "V-O")
    assert (found["state"], found["upstream_order_id"]) == ("submitted", created.order_id)


async def test_identical_late_statuses_count_on_one_audit_entry(stack: Stack) -> None:
    """300 identical late ``paid`` callbacks after the delivery leave one audit entry with count 300; after
    ``completed``, 200 replays of the ``delivered`` callback one more with count 200. The audit trail of the
    API and the console's order page show the counts."""
    stack.sandbox.faults.hold_delivery_next()
    await intake(stack, "V-L")
    await send_due(stack)
    order_id = int((await item(stack, "V-L"))["upstream_order_id"])
    await stack.sandbox.deliver(order_id, "GOODS-L")
    await stack.sandbox.wait_callbacks_idle()
    assert (await item(stack, "V-L"))["state"] == "delivered"
    gate = asyncio.Semaphore(16)

    async def replay(signer: SignedClient, body: bytes) -> int:
        async with gate:
            return (await post(signer, body)).status

    async with stack.signer() as signer:
        late_paid = report("V-L", order_id, "paid")
        assert set(await asyncio.gather(*(replay(signer, late_paid) for _ in range(300)))) == {200}
        await stack.sandbox.complete(order_id)
        await stack.sandbox.wait_callbacks_idle()
        late_delivered = report("V-L", order_id, "delivered", "GOODS-L")
        assert set(await asyncio.gather(*(replay(signer, late_delivered) for _ in range(200)))) == {200}
    late = [entry for entry in await audit(stack, "V-L") if entry["event"] == "late_status_ignored"]
    assert len(late) == 2, f"{len(late)} entries"
    assert [(entry["detail"]["status"], entry["count"]) for entry in late] == [
        ("paid", 300),
        ("delivered", 200),
    ]
    assert all(entry["last_at"] is not None for entry in late)
    rows = await sql_rows(stack.runtime.database, select(audit_log).where(audit_log.c.order_no == "V-L"))
    assert len(rows) < 10, [row.event for row in rows]
    trail = (await stack.admin("GET", "/api/v1/orders/V-L/audit")).body["audit"]
    assert [entry["count"] for entry in trail if entry["event"] == "late_status_ignored"] == [300, 200]
    console = ConsoleClient(stack.admin_url)
    try:
        page = await console.get("/ui/orders/V-L")
    finally:
        await console.close()
    assert ("× 300" in page.text, "× 200" in page.text) == (True, True)


async def test_polls_and_reconciliation_adopt_no_other_order(stack: Stack) -> None:
    """When the upstream answers the order procurd asked for under another downstream number, neither a
    poll nor a reconciliation pass applies it (the procurement stays submitted, without goods): the pass
    records a finding ``order`` instead of a repair."""
    runtime = stack.runtime
    stack.sandbox.faults.hold_delivery_next()
    procurement_id = await intake(stack, "V-P")
    await send_due(stack)
    order_id = int((await item(stack, "V-P"))["upstream_order_id"])
    stack.sandbox.state.order(order_id).downstream_order_no = "SOMEONE-ELSES"
    stack.sandbox.state.deliver(order_id, "GOODS-ELSEWHERE")

    await sql_execute(
        runtime.database,
        update(procurements).where(procurements.c.id == procurement_id).values(next_poll_at=utcnow()),
    )
    poller = Poller(runtime.service, runtime.client("main"), 3600, instance=runtime.instance)
    await poller.step()
    assert gets(stack) == 1
    polled = await item(stack, "V-P")
    assert (polled["state"], polled["fulfillment"]) == ("submitted", None)

    found = await reconcile(
        runtime.service, runtime.clients, runtime.alerts, window_seconds=3600, repair=True, trigger="manual"
    )
    assert (found.checked, found.repaired) == (1, 0)
    assert [(finding.field, finding.repair) for finding in found.findings] == [("order", None)]
    reconciled = await item(stack, "V-P")
    assert (reconciled["state"], reconciled["fulfillment"]) == ("submitted", None)
