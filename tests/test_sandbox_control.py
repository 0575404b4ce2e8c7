"""The unsigned control API under /_sandbox/, for people and for tests running procurd in another process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.control import _is_loopback
from procurd.sandbox.testing import CallbackReceiver, ControlClient, SignedClient


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig(allow_private_callbacks=True, callback_retry_delays=(0.01,))
    async with Sandbox(config) as sandbox:
        yield sandbox


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[SignedClient]:
    async with SignedClient(sandbox.base_url) as client:
        yield client


@pytest.fixture
async def control(sandbox: Sandbox) -> AsyncIterator[ControlClient]:
    async with ControlClient(sandbox.base_url) as control:
        yield control


async def new_order(
    sandbox: Sandbox, client: SignedClient, number: str, kind: str = "auto", **extra: Any
) -> int:
    sku = sandbox.state.first_sku(kind)
    sandbox.state.set_sku_stock(sku.id, -1)
    sandbox.state.set_sku_price(sku.id, "10.00")
    form = {"manual_form_data": {"account": "x"}} if kind == "manual" else {}
    data = (await client.create_order(sku.id, 1, downstream_order_no=number, **form, **extra)).json()
    order_id: int = data["order_id"]
    return order_id


async def test_state_reports_orders_wallet_requests_and_callbacks(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """GET /_sandbox/state counts orders by status, the balance, requests per endpoint and callbacks."""
    await client.post("/ping")
    await new_order(sandbox, client, "S-1", "manual")
    state = await control.get("/state")
    assert state["orders"] == {"total": 1, "by_status": {"paid": 1}}
    assert state["balance"] == "990.00"
    assert state["requests"]["ping"] == 1
    assert state["requests"]["orders.create"] == 1
    assert state["requests"]["*"] == 2
    assert state["callbacks"]["sent"] == 0
    assert state["catalogue"]["listed_products"] == 40


async def test_orders_filter_by_downstream_number(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """GET /_sandbox/orders?downstream_order_no= lists just that number's orders, with their key."""
    await new_order(sandbox, client, "O-1")
    await new_order(sandbox, client, "O-2")
    listed = (await control.get("/orders?downstream_order_no=O-2"))["orders"]
    assert [(o["downstream_order_no"], o["api_key"]) for o in listed] == [("O-2", "sandbox-key")]
    assert len((await control.get("/orders"))["orders"]) == 2


async def test_fault_knobs_over_http(sandbox: Sandbox, client: SignedClient, control: ControlClient) -> None:
    """POST /_sandbox/faults maps onto the FaultPlan methods; /faults/clear removes them."""
    await control.post("/faults", {"knob": "fail_next", "endpoint": "ping", "status": 502})
    assert (await client.post("/ping")).status == 502
    await control.post("/faults", {"knob": "malformed_next", "endpoint": "*", "body": "oops"})
    assert (await client.post("/ping")).body == b"oops"
    await control.post("/faults", {"knob": "pending_payment_next", "count": 2})
    await control.post("/faults", {"knob": "delay_callbacks", "seconds": 0.5})
    described = (await control.post("/faults/clear"))["faults"]
    assert described["pending_payment_next"] == 0
    assert described["delay_callbacks_seconds"] == 0


@pytest.mark.parametrize(
    "body",
    [
        {"knob": "explode"},
        {"knob": "fail_next", "endpoint": "nowhere"},
        {"knob": "fail_next", "endpoint": "ping", "count": "two"},
        {"knob": "fail_next", "endpoint": "ping", "colour": "red"},
    ],
)
async def test_bad_fault_requests_are_400(control: ControlClient, body: dict[str, Any]) -> None:
    """Unknown knobs, endpoints, parameters or wrong types answer 400 bad_request."""
    data = await control.post("/faults", body, expect=400)
    assert data["error_code"] == "bad_request"


async def test_order_actions_over_http(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """deliver, complete, refund, cancel, pay and status act on orders through the control API."""
    async with CallbackReceiver() as receiver:
        manual = await new_order(sandbox, client, "A-1", "manual", callback_url=receiver.url)
        delivered = await control.post(f"/orders/{manual}/deliver", {"payload": "done"})
        assert delivered["order"]["fulfillment"]["payload"] == "done"
        assert (await control.post(f"/orders/{manual}/complete"))["order"]["status"] == "completed"
        await sandbox.wait_callbacks_idle()
        assert [p["status"] for p in receiver.payloads()] == ["delivered", "completed"]
    refunded = await control.post(f"/orders/{manual}/refund", {"amount": "2.50"})
    assert (refunded["order"]["status"], refunded["order"]["refunded_amount"]) == (
        "partially_refunded",
        "2.50",
    )
    assert (await control.post(f"/orders/{manual}/cancel"))["order"]["status"] == "canceled"
    sandbox.faults.pending_payment_next()
    pending = await new_order(sandbox, client, "A-2", "manual")
    assert (await control.post(f"/orders/{pending}/pay"))["order"]["status"] == "paid"
    forced = await control.post(f"/orders/{pending}/status", {"status": "fulfilling", "callback": False})
    assert forced["order"]["status"] == "fulfilling"


async def test_order_action_errors(sandbox: Sandbox, client: SignedClient, control: ControlClient) -> None:
    """An unknown order is 404 and an impossible move (completing a paid order) is 409."""
    assert (await control.post("/orders/999999/deliver", expect=404))["error_code"] == "not_found"
    order_id = await new_order(sandbox, client, "E-1", "manual")
    assert (await control.post(f"/orders/{order_id}/complete", expect=409))["error_code"] == "conflict"
    assert (await control.post(f"/orders/{order_id}/explode", expect=404))["error_code"] == "not_found"


async def test_wallet_sku_and_product_changes(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """POST /wallet, /skus/{id} and /products/{id} change what the signed API answers at once."""
    assert (await control.post("/wallet", {"balance": "12.34"}))["balance"] == "12.34"
    assert (await client.post("/ping")).json()["balance"] == "12.34"
    sku = sandbox.state.first_sku()
    await control.post(f"/skus/{sku.id}", {"price_amount": "1.23", "stock_quantity": 0, "is_active": True})
    detail = (await client.get(f"/products/{sku.product_id}")).json()["product"]
    shown = {s["id"]: s for s in detail["skus"]}[sku.id]
    assert (shown["price_amount"], shown["stock_status"]) == ("1.23", "out_of_stock")
    await control.post(f"/products/{sku.product_id}", {"is_active": False})
    assert (await client.get(f"/products/{sku.product_id}")).error_code == "product_unavailable"
    await control.post(f"/products/{sku.product_id}", {"is_active": True, "removed": True})
    assert (await client.get(f"/products/{sku.product_id}")).error_code == "product_not_found"
    assert sandbox.state.balance() == Decimal("12.34")


async def test_rate_limit_switch(sandbox: Sandbox, client: SignedClient, control: ControlClient) -> None:
    """POST /_sandbox/rate_limit turns the limit on with its numbers, and off again."""
    await control.post("/rate_limit", {"enabled": True, "requests": 1, "block_seconds": 60})
    await client.post("/ping")
    assert (await client.post("/ping")).json()["status_code"] == 429
    await control.post("/rate_limit", {"enabled": False})
    assert (await client.post("/ping")).json()["ok"] is True


async def test_config_changes(sandbox: Sandbox, control: ControlClient) -> None:
    """POST /_sandbox/config sets the runtime switches it knows and refuses others."""
    await control.post("/config", {"auto_deliver": False, "balance_failure": "insufficient_balance"})
    assert sandbox.config.auto_deliver is False
    assert sandbox.config.balance_failure == "insufficient_balance"
    await control.post("/config", {"callback_retry_delays": [1, 2]})
    assert sandbox.config.callback_retry_delays == (1.0, 2.0)
    assert (await control.post("/config", {"api_secret": "x"}, expect=400))["error_code"] == "bad_request"


async def test_callback_log_over_http(sandbox: Sandbox, client: SignedClient, control: ControlClient) -> None:
    """GET /_sandbox/callbacks lists every try with its outcome."""
    async with CallbackReceiver() as receiver:
        await new_order(sandbox, client, "C-1", callback_url=receiver.url)
        await sandbox.wait_callbacks_idle()
    (attempt,) = (await control.get("/callbacks"))["callbacks"]
    assert (attempt["downstream_order_no"], attempt["ok"], attempt["http_status"]) == ("C-1", True, 200)


async def test_index_lists_endpoints(control: ControlClient) -> None:
    """GET /_sandbox lists the control endpoints."""
    assert "GET /_sandbox/state" in (await control.get(""))["endpoints"]


@pytest.mark.parametrize(
    ("remote", "allowed"),
    [("127.0.0.1", True), ("::1", True), ("10.0.0.2", False), (None, False), ("x", False)],
)
def test_control_api_is_for_loopback_clients(remote: str | None, allowed: bool) -> None:
    """Only loopback peers may use the control API."""
    assert _is_loopback(remote) is allowed


async def test_refunds_as_the_order_query_reports_them(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """POST /_sandbox/orders/{id}/refund with an amount makes GET /orders/:id report partially_refunded,
    then (the rest) refunded, with refunded_amount and one refund record per refund; the wallet gets the
    money back and no callback is sent for either refund."""
    async with CallbackReceiver() as receiver:
        order_id = await new_order(sandbox, client, "R-1", callback_url=receiver.url)
        await sandbox.wait_callbacks_idle()
        await control.post(
            f"/orders/{order_id}/refund", {"amount": "4.00", "reason": "one code did not work"}
        )
        partial = (await client.get(f"/orders/{order_id}")).json()
        assert (partial["status"], partial["refunded_amount"]) == ("partially_refunded", "4.00")
        await control.post(f"/orders/{order_id}/refund")
        await sandbox.wait_callbacks_idle()
        assert [p["status"] for p in receiver.payloads()] == ["delivered"]
    refunded = (await client.get(f"/orders/{order_id}")).json()
    assert (refunded["status"], refunded["refunded_amount"], refunded["amount"]) == (
        "refunded",
        "10.00",
        "10.00",
    )
    assert [{k: r[k] for k in ("amount", "reason")} for r in refunded["refund_records"]] == [
        {"amount": "4.00", "reason": "one code did not work"},
        {"amount": "6.00", "reason": "refunded by the site"},
    ]
    assert all(r["created_at"].endswith("+08:00") for r in refunded["refund_records"])
    assert "fulfillment" in refunded
    assert sandbox.state.balance() == Decimal("1000.00")


async def test_site_cancel_of_a_paid_order_pays_back_without_callback(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """The site canceling a partly refunded order pays back the rest as a refund record, reports canceled
    with the whole amount refunded, and sends no callback."""
    async with CallbackReceiver() as receiver:
        order_id = await new_order(sandbox, client, "K-1", "manual", callback_url=receiver.url)
        await control.post(f"/orders/{order_id}/refund", {"amount": "2.50"})
        await control.post(f"/orders/{order_id}/cancel")
        await sandbox.wait_callbacks_idle()
        assert receiver.received == []
    canceled = (await client.get(f"/orders/{order_id}")).json()
    assert (canceled["status"], canceled["refunded_amount"]) == ("canceled", "10.00")
    assert [r["amount"] for r in canceled["refund_records"]] == ["2.50", "7.50"]
    assert sandbox.state.balance() == Decimal("1000.00")


@pytest.mark.parametrize(
    ("action", "body", "field"),
    [
        ("refund", {"amount": 2.5}, "amount"),
        ("refund", {"amount": "lots"}, "amount"),
        ("refund", {"reason": 7}, "reason"),
        ("refund", {"amount": "1.00", "note": "x"}, "note"),
        ("status", {"status": "lost"}, "status"),
        ("status", {}, "status"),
        ("deliver", {"payload": ["a"]}, "payload"),
    ],
)
async def test_bad_order_action_fields_are_400(
    sandbox: Sandbox, client: SignedClient, control: ControlClient, action: str, body: Any, field: str
) -> None:
    """A bad or unknown field of an order action answers 400 naming it."""
    order_id = await new_order(sandbox, client, "B-1", "manual")
    data = await control.post(f"/orders/{order_id}/{action}", body, expect=400)
    assert (data["error_code"], data["field"]) == ("bad_request", field)


async def test_refund_beyond_the_amount_is_409(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """Refunding more than is left, or an order never paid from the wallet, is a 409 conflict."""
    order_id = await new_order(sandbox, client, "O-9", "manual")
    assert (await control.post(f"/orders/{order_id}/refund", {"amount": "10.01"}, expect=409))[
        "error_code"
    ] == ("conflict")
    sandbox.faults.pending_payment_next()
    pending = await new_order(sandbox, client, "O-10", "manual")
    await control.post(f"/orders/{pending}/refund", expect=409)
