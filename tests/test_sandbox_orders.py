"""Procurement orders on the sandbox: creation rules, wallet and stock, query, cancel, refunds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.catalog import SKU
from procurd.sandbox.testing import SignedClient, wait_until


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig(allow_private_callbacks=False)) as sandbox:
        yield sandbox


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[SignedClient]:
    async with SignedClient(sandbox.base_url) as client:
        yield client


def stocked_sku(
    sandbox: Sandbox, fulfillment_type: str = "auto", stock: int = 50, price: str = "10.00"
) -> SKU:
    sku = sandbox.state.first_sku(fulfillment_type)
    sandbox.state.set_sku_stock(sku.id, stock)
    sandbox.state.set_sku_price(sku.id, price)
    return sku


async def test_order_success_debits_wallet_and_stock(sandbox: Sandbox, client: SignedClient) -> None:
    """A paid order answers ok with its number, status paid and amount; wallet and stock go down."""
    sku = stocked_sku(sandbox, price="9.90")
    response = await client.create_order(sku.id, 3, downstream_order_no="A1-1", trace_id="t-1")
    data = response.json()
    assert response.status == 200
    assert set(data) == {"ok", "order_id", "order_no", "status", "amount", "currency"}
    assert (data["ok"], data["status"], data["amount"], data["currency"]) == (True, "paid", "29.70", "CNY")
    assert data["order_no"].startswith("DJ")
    assert len(data["order_no"]) == 16
    assert sandbox.state.balance() == Decimal("970.30")
    assert sku.stock_quantity == 47


async def test_member_price_is_what_is_charged(sandbox: Sandbox, client: SignedClient) -> None:
    """A SKU with a member discount is charged its member price."""
    sku = next(s for s in sandbox.state.skus.values() if s.member_price and s.is_active and s.stock_quantity)
    product = sandbox.state.product(sku.product_id)
    product.is_active = True
    if product.fulfillment_type == "manual":
        product.fulfillment_type = "auto"
    data = (await client.create_order(sku.id, 1)).json()
    assert Decimal(data["amount"]) == Decimal(sku.member_price or "")
    assert Decimal(data["amount"]) < Decimal(sku.original_price or "")


async def test_unlimited_stock_stays_unlimited(sandbox: Sandbox, client: SignedClient) -> None:
    """Ordering an unlimited SKU leaves stock_quantity at -1."""
    sku = stocked_sku(sandbox, stock=-1)
    assert (await client.create_order(sku.id, 5)).json()["ok"] is True
    assert sku.stock_quantity == -1


async def test_stock_status_follows_orders(sandbox: Sandbox, client: SignedClient) -> None:
    """Buying a SKU from 21 down to 20 turns it low_stock, then to 0 out_of_stock, in the product detail."""
    sku = stocked_sku(sandbox, stock=21)
    await client.create_order(sku.id, 1)
    detail = (await client.get(f"/products/{sku.product_id}")).json()["product"]
    assert {s["id"]: s["stock_status"] for s in detail["skus"]}[sku.id] == "low_stock"
    await client.create_order(sku.id, 20)
    detail = (await client.get(f"/products/{sku.product_id}")).json()["product"]
    assert {s["id"]: s["stock_status"] for s in detail["skus"]}[sku.id] == "out_of_stock"


async def test_same_downstream_number_returns_existing_order(sandbox: Sandbox, client: SignedClient) -> None:
    """A repeated downstream_order_no answers the first order (current status) and creates nothing."""
    sku = stocked_sku(sandbox)
    first = (await client.create_order(sku.id, 1, downstream_order_no="REPEAT")).json()
    await sandbox.wait_callbacks_idle()
    again = (await client.create_order(sku.id, 2, downstream_order_no="REPEAT")).json()
    assert again["order_id"] == first["order_id"]
    assert again["status"] == "delivered"
    assert again["amount"] == first["amount"]
    assert len(sandbox.orders_for("REPEAT")) == 1
    assert sandbox.state.balance() == Decimal("990.00")


async def test_idempotency_is_per_api_key(sandbox: Sandbox, client: SignedClient) -> None:
    """Another API key using the same downstream_order_no gets its own order."""
    sandbox.state.add_api_key("second-key", "second-secret")
    sku = stocked_sku(sandbox)
    first = (await client.create_order(sku.id, 1, downstream_order_no="SHARED")).json()
    async with SignedClient(sandbox.base_url, "second-key", "second-secret") as other:
        second = (await other.create_order(sku.id, 1, downstream_order_no="SHARED")).json()
    assert first["order_id"] != second["order_id"]
    assert len(sandbox.orders_for("SHARED")) == 2
    assert len(sandbox.orders_for("SHARED", api_key="second-key")) == 1


async def test_payment_failed_is_http_200_and_canceled(sandbox: Sandbox, client: SignedClient) -> None:
    """A short wallet answers HTTP 200 ok false payment_failed with a canceled order; nothing is taken."""
    sku = stocked_sku(sandbox, price="10.00")
    sandbox.state.set_balance(Decimal("5.00"))
    response = await client.create_order(sku.id, 1, downstream_order_no="POOR")
    data = response.json()
    assert response.status == 200
    assert (data["ok"], data["status"], data["error_code"]) == (False, "canceled", "payment_failed")
    assert isinstance(data["order_id"], int)
    assert data["order_no"].startswith("DJ")
    assert sandbox.state.balance() == Decimal("5.00")
    assert sku.stock_quantity == 50


async def test_canceled_order_number_never_buys_again(sandbox: Sandbox, client: SignedClient) -> None:
    """After payment_failed the same number answers ok true with the canceled order, even once funded."""
    sku = stocked_sku(sandbox, price="10.00")
    sandbox.state.set_balance(Decimal("1.00"))
    failed = (await client.create_order(sku.id, 1, downstream_order_no="ONCE")).json()
    sandbox.state.top_up(Decimal("100"))
    again = (await client.create_order(sku.id, 1, downstream_order_no="ONCE")).json()
    assert again == {
        "ok": True,
        "order_id": failed["order_id"],
        "order_no": failed["order_no"],
        "status": "canceled",
        "amount": "10.00",
        "currency": "CNY",
    }


async def test_insufficient_balance_mode_is_402_without_order(sandbox: Sandbox, client: SignedClient) -> None:
    """In insufficient_balance mode a short wallet answers 402 and creates no order."""
    sandbox.config.balance_failure = "insufficient_balance"
    sku = stocked_sku(sandbox)
    sandbox.state.set_balance("0")
    response = await client.create_order(sku.id, 1, downstream_order_no="NOPE")
    assert (response.status, response.error_code) == (402, "insufficient_balance")
    assert sandbox.orders_for("NOPE") == []


async def test_insufficient_stock_is_409(sandbox: Sandbox, client: SignedClient) -> None:
    """Asking for more than the stock answers 409 insufficient_stock and changes nothing."""
    sku = stocked_sku(sandbox, stock=2)
    response = await client.create_order(sku.id, 3)
    assert (response.status, response.error_code) == (409, "insufficient_stock")
    assert sku.stock_quantity == 2
    assert sandbox.state.balance() == Decimal("1000.00")


async def test_missing_sku_is_400_sku_unavailable(client: SignedClient) -> None:
    """An unknown sku_id answers 400 sku_unavailable."""
    response = await client.create_order(10_000_000, 1)
    assert (response.status, response.error_code) == (400, "sku_unavailable")


async def test_inactive_sku_is_400_sku_unavailable(sandbox: Sandbox, client: SignedClient) -> None:
    """An inactive SKU answers 400 sku_unavailable."""
    sku = stocked_sku(sandbox)
    sandbox.state.set_sku_active(sku.id, False)
    assert (await client.create_order(sku.id, 1)).error_code == "sku_unavailable"


async def test_sku_of_removed_product_is_unavailable(sandbox: Sandbox, client: SignedClient) -> None:
    """A SKU whose product was removed answers sku_unavailable."""
    sku = stocked_sku(sandbox)
    sandbox.state.remove_product(sku.product_id)
    assert (await client.create_order(sku.id, 1)).error_code == "sku_unavailable"


async def test_inactive_product_is_400_product_unavailable(sandbox: Sandbox, client: SignedClient) -> None:
    """A SKU of an inactive product answers 400 product_unavailable."""
    sku = stocked_sku(sandbox)
    sandbox.state.set_product_active(sku.product_id, False)
    response = await client.create_order(sku.id, 1)
    assert (response.status, response.error_code) == (400, "product_unavailable")


@pytest.mark.parametrize(
    "fields",
    [
        {"quantity": 0},
        {"quantity": "1"},
        {"quantity": 1.0},
        {"quantity": None},
        {"sku_id": "1"},
        {"sku_id": True},
        {"manual_form_data": "x"},
        {"callback_url": 5},
        {"downstream_order_no": 12},
    ],
)
async def test_wrong_field_types_are_400(
    sandbox: Sandbox, client: SignedClient, fields: dict[str, object]
) -> None:
    """Missing or wrongly typed fields answer 400 bad_request."""
    sku = stocked_sku(sandbox)
    body = {"sku_id": sku.id, "quantity": 1, **fields}
    response = await client.post("/orders", {k: v for k, v in body.items() if v is not None})
    assert (response.status, response.error_code) == (400, "bad_request")


async def test_manual_product_needs_form_data(sandbox: Sandbox, client: SignedClient) -> None:
    """A manual product without manual_form_data (or without a required field) answers bad_request."""
    sku = stocked_sku(sandbox, "manual")
    assert (await client.create_order(sku.id, 1)).error_code == "bad_request"
    assert (await client.create_order(sku.id, 1, manual_form_data={"note": "hi"})).error_code == "bad_request"
    good = await client.create_order(sku.id, 1, manual_form_data={"account": "alice@example.com"})
    assert good.json()["status"] == "paid"


async def test_manual_order_stays_paid_until_delivered(sandbox: Sandbox, client: SignedClient) -> None:
    """A manual order stays paid with no fulfillment until deliver() gives it one."""
    sku = stocked_sku(sandbox, "manual")
    created = (await client.create_order(sku.id, 1, manual_form_data={"account": "bob"})).json()
    await sandbox.wait_callbacks_idle()
    order = (await client.get(f"/orders/{created['order_id']}")).json()
    assert order["status"] == "paid"
    assert "fulfillment" not in order
    await sandbox.deliver(created["order_id"], payload="code: 1234")
    order = (await client.get(f"/orders/{created['order_id']}")).json()
    assert order["status"] == "delivered"
    assert order["fulfillment"]["type"] == "manual"
    assert order["fulfillment"]["payload"] == "code: 1234"


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost/cb",
        "http://127.0.0.1:8080/cb",
        "http://[::1]/cb",
        "http://0.0.0.0/cb",
        "http://10.1.2.3/cb",
        "http://192.168.0.5/cb",
        "http://169.254.1.1/cb",
        "ftp://shop.example.com/cb",
        "not a url",
    ],
)
async def test_private_callback_url_is_refused(sandbox: Sandbox, client: SignedClient, url: str) -> None:
    """callback_url on localhost, loopback, private or link-local literals (or not http) is refused."""
    sku = stocked_sku(sandbox)
    response = await client.create_order(sku.id, 1, callback_url=url)
    assert (response.status, response.error_code) == (400, "invalid_callback_url")


async def test_public_callback_host_is_not_resolved(sandbox: Sandbox, client: SignedClient) -> None:
    """A callback_url with a public-looking host name is accepted without resolving it."""
    sku = stocked_sku(sandbox)
    sandbox.faults.hold_delivery_next()
    response = await client.create_order(
        sku.id, 1, callback_url="https://shop.example.com/api/v1/upstream/callback"
    )
    assert response.json()["ok"] is True


async def test_private_callback_url_allowed_when_configured(sandbox: Sandbox, client: SignedClient) -> None:
    """With allow_private_callbacks a loopback callback_url is accepted."""
    sandbox.config.allow_private_callbacks = True
    sandbox.faults.hold_delivery_next()
    sku = stocked_sku(sandbox)
    assert (await client.create_order(sku.id, 1, callback_url="http://127.0.0.1:9/cb")).json()["ok"] is True


async def test_auto_order_is_delivered_with_one_code_per_unit(sandbox: Sandbox, client: SignedClient) -> None:
    """A paid auto order becomes delivered with a fulfillment of one code per unit, one per line."""
    sku = stocked_sku(sandbox)
    created = (await client.create_order(sku.id, 3)).json()
    await sandbox.wait_callbacks_idle()
    order = (await client.get(f"/orders/{created['order_id']}")).json()
    assert order["status"] == "delivered"
    fulfillment = order["fulfillment"]
    assert (fulfillment["type"], fulfillment["status"]) == ("auto", "delivered")
    assert len(fulfillment["payload"].split("\n")) == 3
    assert fulfillment["delivery_data"]["cards"] == fulfillment["payload"].split("\n")
    assert fulfillment["delivered_at"].endswith("+08:00")


async def test_order_query_shape(sandbox: Sandbox, client: SignedClient) -> None:
    """GET /orders/:id answers the seed's fields with the item's prices and quantity."""
    sku = stocked_sku(sandbox, price="2.50")
    sandbox.faults.hold_delivery_next()
    created = (await client.create_order(sku.id, 2)).json()
    order = (await client.get(f"/orders/{created['order_id']}")).json()
    assert order["ok"] is True
    assert {k: order[k] for k in ("order_id", "order_no", "status", "amount", "currency")} == {
        k: created[k] for k in ("order_id", "order_no", "status", "amount", "currency")
    }
    assert order["items"] == [
        {
            "product_id": sku.product_id,
            "sku_id": sku.id,
            "title": sandbox.state.product(sku.product_id).title,
            "quantity": 2,
            "unit_price": "2.50",
            "total_price": "5.00",
            "fulfillment_type": "auto",
        }
    ]
    assert "fulfillment" not in order


async def test_other_keys_orders_are_not_found(sandbox: Sandbox, client: SignedClient) -> None:
    """An order is invisible (404 order_not_found) to another API key, for query and cancel."""
    sandbox.state.add_api_key("second-key", "second-secret")
    created = (await client.create_order(stocked_sku(sandbox).id, 1)).json()
    async with SignedClient(sandbox.base_url, "second-key", "second-secret") as other:
        response = await other.get(f"/orders/{created['order_id']}")
        assert (response.status, response.error_code) == (404, "order_not_found")
        cancel = await other.post(f"/orders/{created['order_id']}/cancel")
        assert cancel.error_code == "order_not_found"


async def test_unknown_order_is_404(client: SignedClient) -> None:
    """An unknown order id answers 404 order_not_found."""
    response = await client.get("/orders/424242")
    assert (response.status, response.error_code) == (404, "order_not_found")


async def test_paid_order_cannot_be_canceled(sandbox: Sandbox, client: SignedClient) -> None:
    """Canceling a paid (or delivered) order answers 409 cancel_not_allowed and changes nothing."""
    created = (await client.create_order(stocked_sku(sandbox).id, 1)).json()
    response = await client.post(f"/orders/{created['order_id']}/cancel")
    assert (response.status, response.error_code) == (409, "cancel_not_allowed")
    assert sandbox.state.order(created["order_id"]).status in ("paid", "delivered")


async def test_pending_payment_order_can_be_canceled(sandbox: Sandbox, client: SignedClient) -> None:
    """A pending_payment order cancels: ok, number and status canceled; its stock comes back."""
    sku = stocked_sku(sandbox, stock=10)
    sandbox.faults.pending_payment_next()
    created = (await client.create_order(sku.id, 4)).json()
    assert created["status"] == "pending_payment"
    assert sku.stock_quantity == 6
    assert sandbox.state.balance() == Decimal("1000.00")
    response = await client.post(f"/orders/{created['order_id']}/cancel")
    assert response.json() == {
        "ok": True,
        "order_id": created["order_id"],
        "order_no": created["order_no"],
        "status": "canceled",
    }
    assert sku.stock_quantity == 10
    again = await client.post(f"/orders/{created['order_id']}/cancel")
    assert again.error_code == "cancel_not_allowed"


async def test_pending_payment_order_is_paid_later(sandbox: Sandbox, client: SignedClient) -> None:
    """pay() turns a pending_payment order paid, takes the money, and delivers an auto order."""
    sku = stocked_sku(sandbox, price="3.00")
    sandbox.faults.pending_payment_next()
    created = (await client.create_order(sku.id, 1)).json()
    await sandbox.pay(created["order_id"])
    assert sandbox.state.balance() == Decimal("997.00")
    await sandbox.wait_callbacks_idle()
    assert sandbox.state.order(created["order_id"]).status == "delivered"


async def test_refund_shows_refunded_amount_and_records(sandbox: Sandbox, client: SignedClient) -> None:
    """Partial then full refunds set status, refunded_amount and refund_records, and credit the wallet."""
    created = (await client.create_order(stocked_sku(sandbox, price="10.00").id, 1)).json()
    await sandbox.wait_callbacks_idle()
    sandbox.refund(created["order_id"], Decimal("4.00"))
    order = (await client.get(f"/orders/{created['order_id']}")).json()
    assert (order["status"], order["refunded_amount"]) == ("partially_refunded", "4.00")
    sandbox.refund(created["order_id"])
    order = (await client.get(f"/orders/{created['order_id']}")).json()
    assert (order["status"], order["refunded_amount"]) == ("refunded", "10.00")
    assert [r["amount"] for r in order["refund_records"]] == ["4.00", "6.00"]
    assert sandbox.state.balance() == Decimal("1000.00")


async def test_upstream_cancel_returns_money(sandbox: Sandbox, client: SignedClient) -> None:
    """cancel_upstream sets canceled and gives the paid amount back to the wallet."""
    sandbox.faults.hold_delivery_next()
    created = (await client.create_order(stocked_sku(sandbox, price="7.00").id, 1)).json()
    sandbox.cancel_upstream(created["order_id"])
    assert (await client.get(f"/orders/{created['order_id']}")).json()["status"] == "canceled"
    assert sandbox.state.balance() == Decimal("1000.00")


async def test_complete_and_set_status(sandbox: Sandbox, client: SignedClient) -> None:
    """complete() moves delivered to completed; set_status forces any status (fulfillment kept)."""
    created = (await client.create_order(stocked_sku(sandbox).id, 1)).json()
    await wait_until(lambda: sandbox.state.order(created["order_id"]).status == "delivered")
    await sandbox.complete(created["order_id"])
    order = (await client.get(f"/orders/{created['order_id']}")).json()
    assert order["status"] == "completed"
    assert "fulfillment" in order
    await sandbox.set_status(created["order_id"], "fulfilling", callback=False)
    assert (await client.get(f"/orders/{created['order_id']}")).json()["status"] == "fulfilling"


async def test_auto_delivery_can_be_turned_off(sandbox: Sandbox, client: SignedClient) -> None:
    """With auto_deliver off a paid auto order stays paid."""
    sandbox.config.auto_deliver = False
    created = (await client.create_order(stocked_sku(sandbox).id, 1)).json()
    await sandbox.wait_callbacks_idle()
    assert sandbox.state.order(created["order_id"]).status == "paid"
