"""End to end: a daemon in-process, the sandbox upstream and real sockets, order intake to delivery."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from procurd.config import Settings
from procurd.protocol.dujiao.signing import signature_matches
from procurd.sandbox import Sandbox, SandboxConfig
from support import AdminClient, mirror, running_daemon, settings_for, wait_until

FAST_CALLBACKS = (0.1, 0.2, 0.3, 0.5)


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig(
        products=12,
        balance=Decimal("1000000"),
        allow_private_callbacks=True,
        callback_retry_delays=FAST_CALLBACKS,
    )
    async with Sandbox(config) as sandbox:
        yield sandbox


@pytest.fixture
async def settings(database_url: str, sandbox: Sandbox) -> Settings:
    settings = settings_for(database_url, ("main", sandbox))
    await mirror(settings)
    return settings


@pytest.fixture
async def admin(settings: Settings) -> AsyncIterator[AdminClient]:
    async with running_daemon(settings), aiohttp.ClientSession() as session:
        yield AdminClient(settings, session)


def auto_item(sandbox: Sandbox, **extra: Any) -> dict[str, Any]:
    return {"sku_id": sandbox.state.first_sku("auto").id, "quantity": 1, **extra}


def manual_item(sandbox: Sandbox) -> dict[str, Any]:
    sku = sandbox.state.first_sku("manual")
    return {"sku_id": sku.id, "quantity": 1, "manual_form_data": {"account": "buyer@example.com"}}


async def test_auto_order_is_delivered_through_the_callback(sandbox: Sandbox, admin: AdminClient) -> None:
    """An accepted order answers at once, is bought upstream once, and its delivery arrives by callback."""
    accepted = await admin.submit("A1001", auto_item(sandbox, quantity=2))
    assert accepted["status"] == "paid"
    assert accepted["procurements"][0]["state"] == "queued"
    await admin.wait_status("A1001", "delivered")
    # The callback may settle the order before the worker has the answer that carries the amount.
    order = await wait_until(lambda: _with_amount(admin, "A1001"))
    item = order["procurements"][0]
    assert item["downstream_order_no"] == "A1001"
    assert item["upstream_status"] == "delivered"
    assert item["fulfillment"]["payload_line_count"] == 2
    assert item["fulfillment"]["type"] == "auto"
    assert item["amount"] == str(sandbox.orders_for("A1001")[0].amount)
    assert len(sandbox.orders_for("A1001")) == 1
    assert any(attempt.ok for attempt in sandbox.callback_log)


async def _with_amount(admin: AdminClient, order_no: str) -> dict[str, Any] | None:
    order = await admin.order(order_no)
    return order if order["procurements"][0]["amount"] is not None else None


async def test_manual_order_waits_for_the_upstream(sandbox: Sandbox, admin: AdminClient) -> None:
    """A manual item stays submitted (no local fulfilment) until the upstream delivers it."""
    await admin.submit("M1", manual_item(sandbox))
    order = await admin.wait_state("M1", "submitted")
    assert order["status"] == "fulfilling"
    upstream_order = sandbox.orders_for("M1")[0]
    await sandbox.deliver(upstream_order.order_id, payload="CODE-1\nCODE-2")
    delivered = await admin.wait_status("M1", "delivered")
    assert delivered["procurements"][0]["fulfillment"]["payload_line_count"] == 2


async def test_lost_callback_is_healed_by_a_poll(sandbox: Sandbox, admin: AdminClient) -> None:
    """When every callback try is lost, the fallback poll still delivers the order."""
    sandbox.faults.drop_callbacks_next(count=10)
    await admin.submit("P1", auto_item(sandbox))
    order = await admin.wait_status("P1", "delivered")
    assert order["procurements"][0]["fulfillment"] is not None
    assert sandbox.request_counts["orders.get"] >= 1


async def test_server_errors_then_success_make_one_upstream_order(
    sandbox: Sandbox, admin: AdminClient
) -> None:
    """Two 500s are retried under the same number; the upstream ends with exactly one order."""
    sandbox.faults.fail_next("orders.create", count=2, status=500)
    await admin.submit("R1", auto_item(sandbox))
    order = await admin.wait_status("R1", "delivered")
    assert order["procurements"][0]["attempts"] == 3
    assert len(sandbox.orders_for("R1")) == 1


async def test_lost_response_after_creation_makes_no_duplicate(sandbox: Sandbox, admin: AdminClient) -> None:
    """The upstream created the order but the answer was lost: the retry gets the same order back."""
    sandbox.faults.fail_after_next("orders.create")
    sandbox.faults.drop_next("orders.create")
    await admin.submit("L1", auto_item(sandbox))
    await admin.wait_status("L1", "delivered")
    assert len(sandbox.orders_for("L1")) == 1


async def test_payment_failed_then_retry_after_top_up(sandbox: Sandbox, admin: AdminClient) -> None:
    """payment_failed is an exception; after a top-up a retry buys under a new derived number."""
    sandbox.state.set_balance(Decimal("0"))
    await admin.submit("F1", auto_item(sandbox))
    order = await admin.wait_state("F1", "exception")
    item = order["procurements"][0]
    assert order["exception"] is True
    assert item["exception_reason"] == "payment_failed"
    assert item["upstream_order_id"] == sandbox.orders_for("F1")[0].order_id
    sandbox.state.top_up(Decimal("10000"))
    status, body = await admin.call("POST", f"/api/v1/exceptions/{item['id']}/retry", {})
    assert status == 200, body
    delivered = await admin.wait_status("F1", "delivered")
    assert delivered["exception"] is False
    assert delivered["procurements"][0]["downstream_order_no"] == "F1-r2"
    assert [o.status for o in sandbox.orders_for("F1")] == ["canceled"]
    assert len(sandbox.orders_for("F1-r2")) == 1


async def test_business_error_is_an_exception_at_once(sandbox: Sandbox, admin: AdminClient) -> None:
    """insufficient_stock is an exception with that code after a single attempt."""
    sku = sandbox.state.first_sku("auto")
    sandbox.state.set_sku_stock(sku.id, 0)
    await admin.submit("S1", {"sku_id": sku.id, "quantity": 1})
    order = await admin.wait_state("S1", "exception")
    assert order["procurements"][0]["exception_reason"] == "insufficient_stock"
    assert order["procurements"][0]["attempts"] == 1


async def test_network_failures_end_in_max_attempts_exceeded(sandbox: Sandbox, admin: AdminClient) -> None:
    """Retryable failures stop after max_attempts with exception max_attempts_exceeded, nothing bought."""
    sandbox.faults.fail_next("orders.create", count=50, status=503)
    await admin.submit("X1", auto_item(sandbox))
    order = await admin.wait_state("X1", "exception")
    assert order["procurements"][0]["exception_reason"] == "max_attempts_exceeded"
    assert order["procurements"][0]["attempts"] == 4
    assert sandbox.orders_for("X1") == []


async def test_cancel_is_upstream_first(sandbox: Sandbox, admin: AdminClient) -> None:
    """A paid upstream order cannot be canceled (409, nothing changes); a pending one is canceled upstream."""
    await admin.submit("C1", manual_item(sandbox))
    await admin.wait_state("C1", "submitted")
    status, body = await admin.call("POST", "/api/v1/orders/C1/cancel")
    assert status == 409
    assert body["error_code"] == "cancel_not_allowed"
    assert (await admin.order("C1"))["procurements"][0]["state"] == "submitted"

    sandbox.faults.pending_payment_next()
    await admin.submit("C2", manual_item(sandbox))
    await admin.wait_state("C2", "submitted")
    status, body = await admin.call("POST", "/api/v1/orders/C2/cancel")
    assert status == 200, body
    assert body["order"]["status"] == "canceled"
    assert sandbox.orders_for("C2")[0].status == "canceled"


async def test_upstream_cancel_seen_by_poll_is_an_exception(sandbox: Sandbox, admin: AdminClient) -> None:
    """The upstream canceling by itself (no callback) is caught by a poll and becomes an exception."""
    await admin.submit("U1", manual_item(sandbox))
    await admin.wait_state("U1", "submitted")
    sandbox.cancel_upstream(sandbox.orders_for("U1")[0].order_id)
    order = await admin.wait_state("U1", "exception")
    assert order["procurements"][0]["exception_reason"] == "upstream_canceled"


async def test_refund_seen_by_poll_is_an_exception(sandbox: Sandbox, admin: AdminClient) -> None:
    """A refund reported by the upstream's order query becomes exception upstream_refunded."""
    await admin.submit("RF1", manual_item(sandbox))
    await admin.wait_state("RF1", "submitted")
    sandbox.refund(sandbox.orders_for("RF1")[0].order_id)
    order = await admin.wait_state("RF1", "exception")
    assert order["procurements"][0]["exception_reason"] == "upstream_refunded"


async def test_duplicate_callbacks_change_nothing(sandbox: Sandbox, admin: AdminClient) -> None:
    """A callback delivered twice is applied once: one delivered event in the audit trail."""
    sandbox.faults.duplicate_callbacks_next(count=1)
    await admin.submit("D1", auto_item(sandbox))
    await admin.wait_status("D1", "delivered")
    await sandbox.wait_callbacks_idle()
    status, body = await admin.call("GET", "/api/v1/orders/D1/audit")
    assert status == 200
    delivered = [entry for entry in body["audit"] if entry["new_state"] == "delivered"]
    assert len(delivered) == 1


async def test_late_paid_after_delivered_is_recorded_not_applied(
    sandbox: Sandbox, admin: AdminClient
) -> None:
    """An out-of-order paid callback after delivery leaves the order delivered."""
    await admin.submit("O1", auto_item(sandbox))
    await admin.wait_status("O1", "delivered")
    upstream_order = sandbox.orders_for("O1")[0]
    await sandbox.set_status(upstream_order.order_id, "paid", callback=True)
    await sandbox.wait_callbacks_idle()
    order = await admin.order("O1")
    assert order["status"] == "delivered"
    _, body = await admin.call("GET", "/api/v1/orders/O1/audit")
    assert any(entry["event"] == "late_status_ignored" for entry in body["audit"])


async def test_many_orders_are_each_bought_exactly_once(sandbox: Sandbox, admin: AdminClient) -> None:
    """Concurrent workers under upstream delays never submit one procurement twice."""
    sandbox.faults.delay_next("orders.create", count=20, seconds=0.05)
    numbers = [f"B{i}" for i in range(40)]
    for number in numbers:
        await admin.submit(number, auto_item(sandbox))
    for number in numbers:
        await admin.wait_status(number, "delivered")
    assert all(len(sandbox.orders_for(number)) == 1 for number in numbers)


@asynccontextmanager
async def storefront_hook(
    database_url: str, sandbox: Sandbox, received: list[dict[str, Any]], *, refuse_first: bool = False
) -> AsyncIterator[AdminClient]:
    """A daemon whose storefront events go to a webhook on loopback that checks each signature and records
    the events in ``received`` (refusing the first with 503 when ``refuse_first``)."""
    refused_once: list[bool] = []

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        headers = request.headers
        assert signature_matches(
            "hook-secret-1",
            "POST",
            "/hooks/procurd",
            headers["Service-Timestamp"],
            body,
            headers["Service-Signature"],
        )
        if refuse_first and not refused_once:
            refused_once.append(True)
            return web.Response(status=503)
        received.append(await request.json())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/hooks/procurd", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        settings = settings_for(
            database_url,
            ("main", sandbox),
            storefront={
                "webhook_url": f"http://127.0.0.1:{port}/hooks/procurd",
                "webhook_api_key": "shop",
                "webhook_secret": "hook-secret-1",
            },
        )
        await mirror(settings)
        async with running_daemon(settings), aiohttp.ClientSession() as session:
            yield AdminClient(settings, session)
    finally:
        await runner.cleanup()


async def test_storefront_events_are_signed_and_in_order(database_url: str, sandbox: Sandbox) -> None:
    """With a webhook configured, order events arrive signed, in order, and are retried until accepted."""
    received: list[dict[str, Any]] = []
    async with storefront_hook(database_url, sandbox, received, refuse_first=True) as admin:
        await admin.submit("W1", auto_item(sandbox))
        await admin.wait_status("W1", "delivered")
        await wait_until(lambda: any(e["event"] == "order.delivered" for e in received))
    events = [e["event"] for e in received if e["order"]["order_no"] == "W1"]
    # paid -> fulfilling may be skipped when the callback settles the order before the worker's answer.
    assert events in (["order.status_changed", "order.delivered"], ["order.delivered"])
    assert received[-1]["order"]["status"] == "delivered"
    assert len({e["event_id"] for e in received}) == len(received)


async def test_an_order_refused_before_anything_was_bought_stays_paid(database_url: str) -> None:
    """An upstream that refuses the callback address (``invalid_callback_url``: nothing bought) leaves the
    order ``paid`` with ``exception`` true, as the order view's rule says, and the storefront is told once,
    ``order.exception``, with that status: no ``order.status_changed`` to a ``fulfilling`` that never was."""
    received: list[dict[str, Any]] = []
    strict = SandboxConfig(products=4, balance=Decimal("1000"), allow_private_callbacks=False)
    async with Sandbox(strict) as sandbox, storefront_hook(database_url, sandbox, received) as admin:
        await admin.submit("V1", auto_item(sandbox))
        order = await admin.wait_state("V1", "exception")
        await wait_until(lambda: received)
    assert order["procurements"][0]["exception_reason"] == "invalid_callback_url"
    assert (order["status"], order["exception"]) == ("paid", True)
    assert [(e["event"], e["order"]["status"], e["order"]["exception"]) for e in received] == [
        ("order.exception", "paid", True)
    ]
