"""Every fault knob of the sandbox, seen from a client over a real socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from procurd.sandbox import FaultPlan, Sandbox, SandboxConfig
from procurd.sandbox.testing import SignedClient, wait_until


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig()) as sandbox:
        yield sandbox


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[SignedClient]:
    async with SignedClient(sandbox.base_url) as client:
        yield client


def order_body(sandbox: Sandbox, number: str) -> dict[str, object]:
    sku = sandbox.state.first_sku()
    sandbox.state.set_sku_stock(sku.id, -1)
    return {"sku_id": sku.id, "quantity": 1, "downstream_order_no": number}


async def test_fail_next_answers_error_and_expires(sandbox: Sandbox, client: SignedClient) -> None:
    """fail_next answers the error for the next `count` requests only, then normal service resumes."""
    sandbox.faults.fail_next("ping", count=2, status=503, error_code="service_unavailable")
    for _ in range(2):
        response = await client.post("/ping")
        assert (response.status, response.error_code) == (503, "service_unavailable")
        assert response.json()["ok"] is False
    assert (await client.post("/ping")).status == 200


async def test_fail_next_does_nothing(sandbox: Sandbox, client: SignedClient) -> None:
    """An order answered by fail_next is not created."""
    sandbox.faults.fail_next("orders.create")
    response = await client.post("/orders", order_body(sandbox, "F-1"))
    assert (response.status, response.error_code) == (500, "internal_error")
    assert sandbox.orders_for("F-1") == []


async def test_fail_next_as_plain_http_429(sandbox: Sandbox, client: SignedClient) -> None:
    """fail_next with status 429 and rate_limited gives a plain HTTP 429 error body."""
    sandbox.faults.fail_next("products", status=429, error_code="rate_limited")
    response = await client.get("/products")
    assert (response.status, response.error_code) == (429, "rate_limited")


async def test_fail_next_applies_only_to_its_endpoint(sandbox: Sandbox, client: SignedClient) -> None:
    """A knob for one endpoint leaves the others alone; '*' matches any endpoint."""
    sandbox.faults.fail_next("categories")
    assert (await client.post("/ping")).status == 200
    assert (await client.get("/categories")).status == 500
    sandbox.faults.fail_next("*")
    assert (await client.post("/ping")).status == 500


async def test_fail_after_next_creates_the_order(sandbox: Sandbox, client: SignedClient) -> None:
    """fail_after_next creates and pays the order, then answers 500; a retry gets the same order."""
    sandbox.faults.fail_after_next("orders.create")
    body = order_body(sandbox, "LOST-1")
    response = await client.post("/orders", body)
    assert (response.status, response.error_code) == (500, "internal_error")
    (created,) = sandbox.orders_for("LOST-1")
    assert created.status in ("paid", "delivered")
    retry = (await client.post("/orders", body)).json()
    assert (retry["ok"], retry["order_id"]) == (True, created.order_id)


async def test_drop_next_does_the_work_and_gives_no_answer(sandbox: Sandbox, client: SignedClient) -> None:
    """drop_next creates the order and closes the connection without any response."""
    sandbox.faults.drop_next("orders.create")
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await client.post("/orders", order_body(sandbox, "DROP-1"))
    assert len(sandbox.orders_for("DROP-1")) == 1
    assert (await client.post("/ping")).status == 200


async def test_delay_next_answers_late(sandbox: Sandbox, client: SignedClient) -> None:
    """delay_next holds the answer back: a client with a shorter timeout gives up, a patient one is served."""
    sandbox.faults.delay_next("ping", count=2, seconds=0.5)
    with pytest.raises(TimeoutError):
        await client.post("/ping", timeout=0.1)
    assert (await client.post("/ping", timeout=10)).status == 200


async def test_hang_next_never_answers(sandbox: Sandbox, client: SignedClient) -> None:
    """hang_next keeps the request open until the client gives up; later requests are served."""
    sandbox.faults.hang_next("orders.get")
    with pytest.raises(TimeoutError):
        await client.get("/orders/1001", timeout=0.2)
    assert (await client.get("/orders/1001")).error_code == "order_not_found"


async def test_close_ends_a_hanging_request() -> None:
    """Closing the sandbox ends a hung request with a dropped connection, promptly and cleanly."""
    sandbox = Sandbox()
    await sandbox.start()
    sandbox.faults.hang_next("ping")
    async with SignedClient(sandbox.base_url) as client:
        pending = asyncio.ensure_future(client.post("/ping", timeout=30))
        await wait_until(lambda: sandbox.request_counts["ping"] == 1)
        await sandbox.close()
        with pytest.raises(aiohttp.ClientError):
            await pending


async def test_malformed_next_sends_raw_body(sandbox: Sandbox, client: SignedClient) -> None:
    """malformed_next answers the given bytes with the given status and content type."""
    sandbox.faults.malformed_next("categories")
    response = await client.get("/categories")
    assert (response.status, response.content_type, response.body) == (
        200,
        "text/html",
        b"<html>bad gateway</html>",
    )
    sandbox.faults.malformed_next(
        "categories", body=b'{"ok": tr', status=502, content_type="application/json"
    )
    response = await client.get("/categories")
    assert (response.status, response.body) == (502, b'{"ok": tr')


async def test_hold_delivery_next_until_deliver(sandbox: Sandbox, client: SignedClient) -> None:
    """hold_delivery_next keeps the next paid auto order paid until deliver()."""
    sandbox.faults.hold_delivery_next()
    held = (await client.post("/orders", order_body(sandbox, "H-1"))).json()
    normal = (await client.post("/orders", order_body(sandbox, "H-2"))).json()
    await sandbox.wait_callbacks_idle()
    assert sandbox.state.order(held["order_id"]).status == "paid"
    assert sandbox.state.order(normal["order_id"]).status == "delivered"
    await sandbox.deliver(held["order_id"])
    fulfillment = sandbox.state.order(held["order_id"]).fulfillment
    assert fulfillment is not None
    assert fulfillment.type == "auto"


async def test_pending_payment_next_counts_orders(sandbox: Sandbox, client: SignedClient) -> None:
    """pending_payment_next(2) affects exactly the next two created orders."""
    sandbox.faults.pending_payment_next(2)
    statuses = [
        (await client.post("/orders", order_body(sandbox, f"P-{n}"))).json()["status"] for n in range(3)
    ]
    assert statuses == ["pending_payment", "pending_payment", "paid"]


async def test_knobs_do_not_touch_repeated_orders(sandbox: Sandbox, client: SignedClient) -> None:
    """An idempotent repeat does not use up pending_payment_next."""
    await client.post("/orders", order_body(sandbox, "R-1"))
    sandbox.faults.pending_payment_next()
    await client.post("/orders", order_body(sandbox, "R-1"))
    assert (await client.post("/orders", order_body(sandbox, "R-2"))).json()["status"] == "pending_payment"


async def test_clear_removes_every_knob(sandbox: Sandbox, client: SignedClient) -> None:
    """clear() removes request and order knobs alike."""
    sandbox.faults.fail_next("*", count=10)
    sandbox.faults.pending_payment_next(3)
    sandbox.faults.delay_callbacks(5)
    sandbox.faults.clear()
    assert (await client.post("/ping")).status == 200
    assert sandbox.faults.describe()["requests"] == []
    assert sandbox.faults.callback_delay_seconds == 0


def test_knob_arguments_are_checked() -> None:
    """Unknown endpoints, counts below 1 and negative delays are refused."""
    faults = FaultPlan()
    with pytest.raises(ValueError, match="unknown endpoint"):
        faults.fail_next("orders")
    with pytest.raises(ValueError, match="count"):
        faults.drop_next("ping", count=0)
    with pytest.raises(ValueError, match="negative"):
        faults.delay_callbacks(-1)
