"""A chain of three sites over real sockets: the sandbox at the top, procurd B selling its mirror of the top
as a provider, and procurd C buying from B as its only upstream (each procurd with its own database).

One chain serves the whole module; each test orders under its own numbers and puts back whatever it
changed at the top or at B. C polls late (its first fallback poll would come an hour after an order was
accepted), so everything C learns after B's answer comes by B's callbacks.
"""

from __future__ import annotations

import itertools
import json
import re
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from decimal import ROUND_UP, Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from sqlalchemy import select

from procurd.config import Settings, load_settings
from procurd.core.provider import Account, ProviderOrder
from procurd.daemon import Daemon
from procurd.db.schema import mirror_categories, mirror_products, mirror_skus
from procurd.loopback import unused_ports
from procurd.sandbox import Sandbox, SandboxConfig, SandboxOrder
from procurd.sandbox.testing import SignedClient
from provider_support import (
    MARKUP_PERCENT,
    ProviderSite,
    add_account,
    full_pass,
    ledger,
    provider_order_of,
    provider_settings,
    settled,
)
from scale_cluster import own_database
from support import AdminClient, mirror, running_daemon, settings_for, sql_rows, wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")

ACCOUNT = "siteC"
CENT = Decimal("0.01")
LATE_POLL_SECONDS = 3600  # C's first fallback poll: far beyond any wait of this module
LEVELS = [
    {
        "slug": "silver",
        "name": {"en": "Silver", "zh-CN": "白银会员"},
        "icon": "https://cdn.example.test/levels/silver.png",
        "discount_percent": "5",
    },
    {"slug": "vip", "name": {"en": "VIP", "zh-CN": "至尊会员"}, "icon": "", "discount_percent": "20"},
]
UNPRICED_CURRENCY = "USD"


def up_to_cent(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_UP)


def selling_price(cost: str) -> Decimal:
    """B's price of a SKU the top sells at ``cost``: cost plus the markup, rounded up to the cent."""
    return up_to_cent(Decimal(cost) * (1 + Decimal(MARKUP_PERCENT) / 100))


@dataclass
class Chain:
    """The top, B and C running, and what the tests use of them."""

    top: Sandbox
    b: Daemon
    c: Daemon
    site: ProviderSite  # C's account at B, as C is configured with it
    b_admin: AdminClient
    c_admin: AdminClient
    signed: SignedClient  # B's signed API with C's credentials
    unpriced_sku: int  # a SKU of the top that B's pricing sells in another currency than B's
    skus: Iterator[int]  # auto SKUs of the top with stock to spare, taken in turn by the tests
    numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def order_no(self, label: str) -> str:
        return f"C-{label}-{next(self.numbers)}"

    async def account(self) -> Account:
        return await self.b.operations.provider.accounts.get(ACCOUNT)

    async def order(self, order_no: str, sku: int, quantity: int = 1, **fields: Any) -> dict[str, Any]:
        """An order submitted to C's admin API (one item bought from B); its order view."""
        body = {
            "order_no": order_no,
            **fields,
            "items": [{"upstream": "b", "sku_id": sku, "quantity": quantity}],
        }
        status, answer = await self.c_admin.call("POST", "/api/v1/orders", body)
        assert status in (200, 202), answer
        return answer["order"]  # type: ignore[no-any-return]

    async def provider_order(self, c_order_no: str) -> ProviderOrder:
        """B's order for C's order ``c_order_no`` (C sends its single item under the order's number)."""
        account = await self.account()
        return await wait_until(lambda: provider_order_of(self.b.operations, account.id, c_order_no))

    def top_orders(self, provider_order: ProviderOrder) -> list[SandboxOrder]:
        """The top's orders for B's provider order (B buys it under the provider order's number)."""
        return self.top.orders_for(provider_order.order_no)

    async def b_procurement(self, provider_order: ProviderOrder) -> dict[str, Any]:
        """The one procurement by which B buys ``provider_order`` at the top."""
        view = await self.b.operations.orders.view(provider_order.order_no)
        (procurement,) = view["procurements"]
        return procurement  # type: ignore[no-any-return]

    async def b_procurement_state(self, provider_order: ProviderOrder, state: str) -> dict[str, Any]:
        async def reached() -> dict[str, Any] | None:
            procurement = await self.b_procurement(provider_order)
            return procurement if procurement["state"] == state else None

        return await wait_until(reached)

    async def c_procurement(self, order_no: str) -> dict[str, Any]:
        (procurement,) = (await self.c_admin.order(order_no))["procurements"]
        return procurement  # type: ignore[no-any-return]

    async def c_submitted(self, order_no: str) -> dict[str, Any]:
        """C's procurement once C recorded B's answer: submitted, B's order ``paid``."""

        async def reached() -> dict[str, Any] | None:
            procurement = await self.c_procurement(order_no)
            return procurement if procurement["state"] == "submitted" else None

        procurement: dict[str, Any] = await wait_until(reached)
        assert procurement["upstream_status"] == "paid"
        return procurement

    async def balance(self) -> Decimal:
        return Decimal((await self.b.operations.provider.accounts.show(ACCOUNT))["balance"])

    async def ledger_matches_balance(self) -> None:
        """The sum of the account's ledger is its balance."""
        entries = await ledger(self.b.operations, ACCOUNT)
        account = await self.account()
        assert sum(entry.amount_cents for entry in entries) == account.balance_cents

    async def callback_told(self, provider_order: ProviderOrder, status: str) -> dict[str, Any]:
        """B's order view once C's receiver accepted the callback telling it ``status``."""

        async def told() -> dict[str, Any] | None:
            detail = await self.b.operations.provider.order_detail(provider_order.id)
            delivered = [a for a in detail["callback_log"] if a["ok"] and a["status"] == status]
            return detail if delivered else None

        return await wait_until(told)


def auto_skus(top: Sandbox, exclude: set[int]) -> list[int]:
    """Active SKUs of listed auto products with stock for a few orders."""
    return [
        sku.id
        for product in top.state.active_products()
        if product.fulfillment_type == "auto"
        for sku in product.skus
        if sku.is_active and (sku.stock_quantity == -1 or sku.stock_quantity >= 50) and sku.id not in exclude
    ]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def chain(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path | None, postgres_template: str | None
) -> AsyncIterator[Chain]:
    """The sandbox (ten products of two SKUs, callbacks to loopback allowed), B selling it at cost + 10 %
    (one SKU priced in USD, so not offered) with two member levels, and C with an account at B."""
    directory = tmp_path_factory.mktemp("chain")
    config = SandboxConfig(
        products=10, skus_per_product=2, allow_private_callbacks=True, balance=Decimal("100000.00")
    )
    async with (
        Sandbox(config) as top,
        own_database(directory, "b", sqlite_template, postgres_template) as b_url,
        own_database(directory, "c", sqlite_template, postgres_template) as c_url,
    ):
        # The last SKU of the last product: that product keeps its other SKU, so it stays listed.
        unpriced = max(top.state.skus)
        b_settings = provider_settings(
            b_url,
            ("top", top),
            provider={"site_name": "procurd B", "levels": LEVELS},
            pricing={
                "rules": [
                    {"sku_ids": [unpriced], "currency": UNPRICED_CURRENCY, "exchange_rate": "0.14"},
                    {"markup_percent": MARKUP_PERCENT},
                ]
            },
        )
        await mirror(b_settings)
        async with running_daemon(b_settings) as b:
            await settled(b)
            site = await add_account(b.operations, ACCOUNT, balance="100000.00")
            c_settings = settings_for(
                c_url,
                ("b", site),
                procurement={
                    "poll_initial_seconds": LATE_POLL_SECONDS,
                    "poll_max_seconds": LATE_POLL_SECONDS,
                },
            )
            async with (
                running_daemon(c_settings) as c,
                aiohttp.ClientSession() as session,
                SignedClient(site.base_url, site.api_key, site.api_secret, site.header_prefix) as signed,
            ):
                await full_pass(c.operations, "b")
                yield Chain(
                    top=top,
                    b=b,
                    c=c,
                    site=site,
                    b_admin=AdminClient(b_settings, session),
                    c_admin=AdminClient(c_settings, session),
                    signed=signed,
                    unpriced_sku=unpriced,
                    skus=itertools.cycle(auto_skus(top, {unpriced})),
                )


# --- the catalogue ------------------------------------------------------------------------------------------


async def mirror_rows(daemon: Daemon, table: Any, upstream: str) -> dict[int, dict[str, Any]]:
    """The live rows of one mirror table, by id."""
    statement = select(table).where(table.c.upstream == upstream, table.c.removed_at.is_(None))
    rows = await sql_rows(daemon.runtime.database, statement)
    return {int(row.id): dict(row._mapping) for row in rows}


PRODUCT_FIELDS = (
    "slug", "title", "description", "content", "seo_meta", "images", "tags", "price_amount",
    "fulfillment_type", "manual_form_schema", "is_active", "category_id", "created_at", "updated_at",
)  # fmt: skip
SKU_FIELDS = ("sku_code", "spec_values", "price_amount", "stock_status", "stock_quantity", "is_active")
CATEGORY_FIELDS = ("parent_id", "slug", "name", "icon", "sort_order")


async def test_c_mirrors_exactly_what_b_offers_at_b_selling_prices(chain: Chain) -> None:
    """C's full catalogue pass leaves in C's mirror exactly what B's API lists: every category (two levels
    kept), product and SKU under the same ids with the same fields, and nothing else; every SKU at B's
    selling price (its mirror's sell_price: the top's cost plus 10 %), without member fields; the SKU B's
    pricing sells in another currency is offered to nobody."""
    await full_pass(chain.c.operations, "b")
    categories = (await chain.signed.get("/categories")).json()["categories"]
    products = await chain.signed.list_all_products()
    c_categories = await mirror_rows(chain.c, mirror_categories, "b")
    c_products = await mirror_rows(chain.c, mirror_products, "b")
    c_skus = await mirror_rows(chain.c, mirror_skus, "b")
    b_skus = await mirror_rows(chain.b, mirror_skus, "top")

    # Categories: all of B's, two levels, the same fields.
    assert {category["id"] for category in categories} == set(c_categories)
    top_level = {category["id"] for category in categories if category["parent_id"] == 0}
    assert top_level
    assert len(top_level) < len(categories), "both levels are offered"
    for category in categories:
        assert category["parent_id"] in top_level | {0}
        row = c_categories[category["id"]]
        assert {name: row[name] for name in CATEGORY_FIELDS} == {
            name: category[name] for name in CATEGORY_FIELDS
        }
        assert row["is_active"] is True

    # Products and SKUs: what B lists, nothing more, the same fields.
    assert products, "B offers products"
    assert {product["id"] for product in products} == set(c_products)
    offered_skus = {sku["id"]: sku for product in products for sku in product["skus"]}
    assert set(offered_skus) == set(c_skus)
    for product in products:
        row = c_products[product["id"]]
        assert {name: row[name] for name in PRODUCT_FIELDS} == {
            name: product[name] for name in PRODUCT_FIELDS
        }
        assert "original_price" not in product
        assert "member_price" not in product
        assert row["original_price"] is None
        assert row["member_price"] is None
        for sku in product["skus"]:
            assert c_skus[sku["id"]]["product_id"] == product["id"]
    for sku_id, sku in offered_skus.items():
        row = c_skus[sku_id]
        assert {name: row[name] for name in SKU_FIELDS} == {name: sku[name] for name in SKU_FIELDS}
        assert "original_price" not in sku
        assert "member_price" not in sku
        assert row["original_price"] is None
        assert row["member_price"] is None
        # One upstream keeps its ids: the offered SKU is the top's SKU of the same id.
        bought = b_skus[sku_id]
        assert bought["sell_currency"] == "CNY"
        assert row["price_amount"] == bought["sell_price"]
        assert Decimal(row["price_amount"]) == selling_price(bought["price_amount"])
        assert bought["price_amount"] == chain.top.state.sku(sku_id).price_amount

    # The SKU priced in another currency: mirrored at B, offered to nobody.
    assert b_skus[chain.unpriced_sku]["sell_currency"] == UNPRICED_CURRENCY
    assert chain.unpriced_sku not in offered_skus
    assert chain.unpriced_sku not in c_skus
    answer = await chain.signed.create_order(
        chain.unpriced_sku, downstream_order_no=chain.order_no("unpriced")
    )
    assert (answer.status, answer.error_code) == (400, "sku_unavailable")


# --- orders -------------------------------------------------------------------------------------------------


async def test_c_orders_are_delivered_with_the_top_goods_one_order_per_hop(chain: Chain) -> None:
    """An order at C is bought once at each hop (one provider order and one procurement at B, one order at the
    top), delivered at C with exactly the top's fulfillment, and charged to C's wallet at B as quantity x
    B's price; the account's ledger adds up to its balance."""
    sku = next(chain.skus)
    price = Decimal((await mirror_rows(chain.c, mirror_skus, "b"))[sku]["price_amount"])
    before = await chain.balance()
    order_no = chain.order_no("deliver")
    await chain.order(order_no, sku, quantity=2)
    delivered = await chain.c_admin.wait_status(order_no, "delivered", "canceled")
    assert delivered["status"] == "delivered"

    provider_order = await chain.provider_order(order_no)
    (top_order,) = chain.top_orders(provider_order)
    procurement = await chain.b_procurement(provider_order)
    (c_procurement,) = delivered["procurements"]
    assert top_order.fulfillment is not None
    goods = top_order.fulfillment.to_dict()
    assert {key: c_procurement["fulfillment"][key] for key in goods} == goods
    assert top_order.status == "delivered"
    assert top_order.item.quantity == 2
    assert top_order.item.sku_id == sku
    assert procurement["state"] == "delivered"
    assert procurement["upstream_order_id"] == top_order.order_id

    # One provider order for C's number, and C's procurement bought exactly that order.
    _, orders = await chain.b.operations.provider.orders(ACCOUNT, None, 1, 100)
    assert [o["id"] for o in orders if o["downstream_order_no"] == order_no] == [provider_order.id]
    assert c_procurement["upstream_order_id"] == provider_order.id
    assert c_procurement["upstream_order_no"] == provider_order.order_no
    assert provider_order.status == "delivered"

    # The wallet: charged quantity x price, once.
    assert provider_order.amount_cents == int(2 * price * 100)
    assert Decimal(c_procurement["amount"]) == 2 * price
    assert await chain.balance() == before - 2 * price
    charges = [e for e in await ledger(chain.b.operations, ACCOUNT) if e.order_id == provider_order.id]
    assert [(e.kind, e.amount_cents) for e in charges] == [("order", -provider_order.amount_cents)]
    await chain.ledger_matches_balance()


async def test_a_failure_at_the_top_waits_for_b_operator_retry_delivers(chain: Chain) -> None:
    """The top refusing B's order (its stock gone) makes an exception at B, while C's order stays open (its
    procurement submitted, B's order paid, not an exception at C) and C's wallet stays charged. Once the
    stock is back, B's operator retries (admin API) and the order goes on to delivery at C."""
    sku = next(chain.skus)
    stock = chain.top.state.sku(sku).stock_quantity
    chain.top.state.set_sku_stock(sku, 0)
    try:
        order_no = chain.order_no("retry")
        await chain.order(order_no, sku)
        provider_order = await chain.provider_order(order_no)
        procurement = await chain.b_procurement_state(provider_order, "exception")
        assert procurement["exception_reason"] == "insufficient_stock"
        assert chain.top_orders(provider_order) == []
        await chain.c_submitted(order_no)
        c_order = await chain.c_admin.order(order_no)
        assert (c_order["status"], c_order["exception"]) == ("fulfilling", False)
        api = (await chain.signed.get(f"/orders/{provider_order.id}")).json()
        assert api["status"] == "paid"
        assert "fulfillment" not in api
    finally:
        chain.top.state.set_sku_stock(sku, stock)

    status, answer = await chain.b_admin.call(
        "POST", f"/api/v1/exceptions/{procurement['id']}/retry", {"note": "stock is back at the top"}
    )
    assert status == 200, answer
    delivered = await chain.c_admin.wait_status(order_no, "delivered", "canceled")
    assert delivered["status"] == "delivered"
    (top_order,) = chain.top_orders(provider_order)
    assert top_order.fulfillment is not None
    goods = top_order.fulfillment.to_dict()
    assert {key: delivered["procurements"][0]["fulfillment"][key] for key in goods} == goods
    charges = [e.kind for e in await ledger(chain.b.operations, ACCOUNT) if e.order_id == provider_order.id]
    assert charges == ["order"]
    await chain.ledger_matches_balance()


async def test_a_failure_at_the_top_resolved_at_b_refunds_and_tells_c(chain: Chain) -> None:
    """B's operator resolving the exception instead cancels B's provider order, refunds C's wallet (ledger
    ``refund``) and tells C by callback; C then holds the procurement as an exception ``upstream_canceled``
    for its own operator (seed 000 part 1, rule 4: no automatic local cancel or refund), its order not
    canceled."""
    sku = next(chain.skus)
    stock = chain.top.state.sku(sku).stock_quantity
    before = await chain.balance()
    chain.top.state.set_sku_stock(sku, 0)
    try:
        order_no = chain.order_no("resolve")
        await chain.order(order_no, sku)
        provider_order = await chain.provider_order(order_no)
        procurement = await chain.b_procurement_state(provider_order, "exception")
        assert await chain.balance() == before - Decimal(provider_order.amount_cents) / 100
        await chain.c_submitted(order_no)
        c_order = await chain.c_admin.order(order_no)
        assert (c_order["status"], c_order["exception"]) == ("fulfilling", False)
        api = (await chain.signed.get(f"/orders/{provider_order.id}")).json()
        assert api["status"] == "paid"
    finally:
        chain.top.state.set_sku_stock(sku, stock)

    status, answer = await chain.b_admin.call(
        "POST", f"/api/v1/exceptions/{procurement['id']}/resolve", {"note": "the top cannot deliver it"}
    )
    assert status == 200, answer
    assert answer["procurement"]["state"] == "resolved"
    detail = await chain.callback_told(provider_order, "canceled")
    assert detail["status"] == "canceled"
    assert detail["refunded"] == detail["amount"]
    assert chain.top_orders(provider_order) == []

    # The wallet: charged, then refunded in full.
    moves = [
        (e.kind, e.amount_cents)
        for e in await ledger(chain.b.operations, ACCOUNT)
        if e.order_id == provider_order.id
    ]
    assert moves == [("order", -provider_order.amount_cents), ("refund", provider_order.amount_cents)]
    assert await chain.balance() == before
    await chain.ledger_matches_balance()
    api = (await chain.signed.get(f"/orders/{provider_order.id}")).json()
    assert api["status"] == "canceled"
    assert Decimal(api["refunded_amount"]) == Decimal(provider_order.amount_cents) / 100

    # C: the upstream canceled its order; a person at C decides.
    async def told_c() -> dict[str, Any] | None:
        procurement = await chain.c_procurement(order_no)
        return procurement if procurement["upstream_status"] == "canceled" else None

    c_procurement = await wait_until(told_c)
    assert c_procurement["state"] == "exception"
    assert c_procurement["exception_reason"] == "upstream_canceled"
    c_order = await chain.c_admin.order(order_no)
    assert c_order["exception"] is True
    assert c_order["status"] == "paid"  # nothing bought: B canceled and refunded
    audit = await chain.c.operations.orders.audit(order_no)
    assert [entry["source"] for entry in audit if entry["event"] == "upstream_canceled"] == ["callback"]
    status, alerts = await chain.c_admin.call("GET", "/api/v1/alerts")
    assert status == 200, alerts
    assert [a["kind"] for a in alerts["items"] if a["subject"] == order_no] == ["exception_opened"]


async def test_c_cancel_goes_upstream_first_across_both_hops(chain: Chain) -> None:
    """With the top not delivering yet, C's cancel cancels at B, which cancels at the top first: the top's
    order, B's provider order and procurement and C's order all end canceled, and B refunds C's wallet; C
    learns it from B's answer (no callback follows), so its order never passes through an exception.
    When the top refuses (its order is paid), C's cancel is refused 409 ``cancel_not_allowed`` and nothing
    changes at any hop; the order is then delivered as usual."""
    chain.top.config.auto_deliver = False
    try:
        # The top takes the order unpaid, so that it can still be canceled there.
        chain.top.faults.pending_payment_next()
        sku = next(chain.skus)
        before = await chain.balance()
        order_no = chain.order_no("cancel")
        await chain.order(order_no, sku)
        provider_order = await chain.provider_order(order_no)
        await chain.b_procurement_state(provider_order, "submitted")
        (top_order,) = chain.top_orders(provider_order)
        assert top_order.status == "pending_payment"
        await chain.c_submitted(order_no)

        status, answer = await chain.c_admin.call("POST", f"/api/v1/orders/{order_no}/cancel")
        assert status == 200, answer
        assert answer["order"]["status"] == "canceled"
        assert answer["order"]["procurements"][0]["state"] == "canceled"
        assert top_order.status == "canceled"
        assert (await chain.b_procurement(provider_order))["state"] == "canceled"
        canceled = await chain.provider_order(order_no)
        assert canceled.status == "canceled"
        assert canceled.refunded_cents == canceled.amount_cents
        moves = [e.kind for e in await ledger(chain.b.operations, ACCOUNT) if e.order_id == provider_order.id]
        assert moves == ["order", "refund"]
        assert await chain.balance() == before
        await chain.ledger_matches_balance()
        # C asked for the cancel and has B's answer: B calls it back with nothing (a callback racing the
        # answer would reach C as an upstream's cancel of a live order, an exception), and C's order went
        # straight to canceled, with no exception and no alert on the way.
        detail = await chain.b.operations.provider.order_detail(provider_order.id)
        assert (detail["callback"], detail["callback_log"]) == (None, []), detail
        c_order = await chain.c_admin.order(order_no)
        assert (c_order["status"], c_order["exception"]) == ("canceled", False)
        assert c_order["procurements"][0]["state"] == "canceled"
        assert c_order["procurements"][0]["exception_reason"] is None
        status, audit = await chain.c_admin.call("GET", f"/api/v1/orders/{order_no}/audit")
        assert status == 200, audit
        assert "exception" not in [entry["new_state"] for entry in audit["audit"]], audit
        status, alerts = await chain.c_admin.call("GET", "/api/v1/alerts")
        assert [a["kind"] for a in alerts["items"] if a["subject"] == order_no] == []

        # The top refuses to cancel a paid order: so does every hop below it.
        sku = next(chain.skus)
        order_no = chain.order_no("refused")
        await chain.order(order_no, sku)
        provider_order = await chain.provider_order(order_no)
        await chain.b_procurement_state(provider_order, "submitted")
        (top_order,) = chain.top_orders(provider_order)
        assert top_order.status == "paid"
        await chain.c_submitted(order_no)
        balance = await chain.balance()
        c_before = await chain.c_admin.order(order_no)

        status, answer = await chain.c_admin.call("POST", f"/api/v1/orders/{order_no}/cancel")
        assert (status, answer["error_code"]) == (409, "cancel_not_allowed"), answer
        assert top_order.status == "paid"
        assert (await chain.b_procurement(provider_order))["state"] == "submitted"
        assert (await chain.provider_order(order_no)).status == "paid"
        assert await chain.balance() == balance
        c_after = await chain.c_admin.order(order_no)
        assert c_after["status"] == c_before["status"]
        assert c_after["procurements"][0]["state"] == "submitted"
    finally:
        chain.top.config.auto_deliver = True
        chain.top.faults.clear()

    await chain.top.deliver(top_order.order_id)
    delivered = await chain.c_admin.wait_status(order_no, "delivered", "canceled")
    assert delivered["status"] == "delivered"
    await chain.ledger_matches_balance()


# --- member levels ------------------------------------------------------------------------------------------


def member_price(offered: str, discount: str, cost: str) -> Decimal:
    """The member price seed 000 shows a level with ``discount`` percent, never under B's cost."""
    discounted = up_to_cent(Decimal(offered) * (100 - Decimal(discount)) / 100)
    return min(max(discounted, Decimal(cost)), Decimal(offered))


async def ping_level(chain: Chain) -> Any:
    answer = await chain.signed.post("/ping")
    assert answer.status == 200, answer.body
    return answer.json()["member_level"]


async def set_level(chain: Chain, slug: str | None) -> None:
    """C's account at ``slug`` at B, and C's mirror passed in full since."""
    await chain.b.operations.provider.accounts.set_level(ACCOUNT, slug)
    await full_pass(chain.c.operations, "b")


async def test_member_levels_price_c_mirror_and_c_orders(chain: Chain) -> None:
    """Without a level B's ping answers ``member_level`` null and C's mirror has B's selling prices with no
    member fields. At a 5 % level the ping answers the level (id, name, slug, icon), C's mirror holds the
    member prices (``original_price`` = B's price, ``member_price`` = ``price_amount``) and C's order is
    charged them; at a 20 % level, deeper than the 10 % markup, every price stops at B's cost."""
    c_skus = await mirror_rows(chain.c, mirror_skus, "b")
    b_skus = await mirror_rows(chain.b, mirror_skus, "top")
    assert await ping_level(chain) is None
    assert all(row["original_price"] is None and row["member_price"] is None for row in c_skus.values())
    assert all(row["price_amount"] == b_skus[sku]["sell_price"] for sku, row in c_skus.items())
    try:
        await set_level(chain, "silver")
        silver = LEVELS[0]
        assert await ping_level(chain) == {
            "id": 1, "name": silver["name"], "slug": "silver", "icon": silver["icon"]
        }  # fmt: skip
        c_skus = await mirror_rows(chain.c, mirror_skus, "b")
        for sku_id, row in c_skus.items():
            bought = b_skus[sku_id]
            expected = member_price(bought["sell_price"], "5", bought["price_amount"])
            assert row["original_price"] == bought["sell_price"]
            assert row["member_price"] == row["price_amount"]
            assert Decimal(row["price_amount"]) == expected < Decimal(bought["sell_price"])
        c_products = await mirror_rows(chain.c, mirror_products, "b")
        for product_id, product in c_products.items():
            members = [
                Decimal(r["price_amount"])
                for r in c_skus.values()
                if r["product_id"] == product_id and r["is_active"]
            ]
            assert Decimal(product["price_amount"]) == min(members)
            assert product["member_price"] == product["price_amount"]
            assert Decimal(product["original_price"]) > Decimal(product["price_amount"])

        sku = next(chain.skus)
        price = Decimal(c_skus[sku]["price_amount"])
        order_no = chain.order_no("silver")
        await chain.order(order_no, sku, quantity=2)
        delivered = await chain.c_admin.wait_status(order_no, "delivered", "canceled")
        assert delivered["status"] == "delivered"
        provider_order = await chain.provider_order(order_no)
        assert Decimal(provider_order.unit_price) == price
        charges = [e for e in await ledger(chain.b.operations, ACCOUNT) if e.order_id == provider_order.id]
        assert [(e.kind, e.amount_cents) for e in charges] == [("order", -int(2 * price * 100))]
        assert Decimal(delivered["procurements"][0]["amount"]) == 2 * price

        await set_level(chain, "vip")
        level = await ping_level(chain)
        assert (level["id"], level["slug"], level["icon"]) == (2, "vip", "")
        c_skus = await mirror_rows(chain.c, mirror_skus, "b")
        for sku_id, row in c_skus.items():
            cost = b_skus[sku_id]["price_amount"]
            assert Decimal(row["price_amount"]) == Decimal(cost) == Decimal(row["member_price"])
            assert row["original_price"] == b_skus[sku_id]["sell_price"]
        sku = next(chain.skus)
        order_no = chain.order_no("vip")
        await chain.order(order_no, sku)
        delivered = await chain.c_admin.wait_status(order_no, "delivered", "canceled")
        assert delivered["status"] == "delivered"
        provider_order = await chain.provider_order(order_no)
        assert Decimal(provider_order.unit_price) == Decimal(b_skus[sku]["price_amount"])
        await chain.ledger_matches_balance()
    finally:
        await set_level(chain, None)
    assert await ping_level(chain) is None
    c_skus = await mirror_rows(chain.c, mirror_skus, "b")
    assert all(row["original_price"] is None and row["member_price"] is None for row in c_skus.values())
    assert all(row["price_amount"] == b_skus[sku]["sell_price"] for sku, row in c_skus.items())


# --- trace and callbacks ------------------------------------------------------------------------------------


async def test_c_trace_id_follows_the_order_to_the_top(chain: Chain) -> None:
    """The trace_id C's order carries is the one the top records for its order, and B's provider order view
    shows it."""
    order_no = chain.order_no("trace")
    trace = "trace-chain-" + order_no
    await chain.order(order_no, next(chain.skus), trace_id=trace)
    await chain.c_admin.wait_status(order_no, "delivered", "canceled")
    provider_order = await chain.provider_order(order_no)
    (top_order,) = chain.top_orders(provider_order)
    assert top_order.trace_id == trace
    detail = await chain.b.operations.provider.order_detail(provider_order.id)
    assert detail["trace_id"] == trace
    assert detail["procurement"]["trace_id"] == trace
    assert (await chain.signed.get(f"/orders/{provider_order.id}")).json()["trace_id"] == trace


async def test_b_callback_delivers_at_c_before_any_poll(chain: Chain) -> None:
    """C's order is delivered by B's signed callback (C's first fallback poll is an hour away), and B's
    GET /orders/{id} agrees with that last callback: the same order, status and goods."""
    order_no = chain.order_no("callback")
    await chain.order(order_no, next(chain.skus))
    delivered = await chain.c_admin.wait_status(order_no, "delivered", "canceled")
    assert delivered["status"] == "delivered"
    audit = await chain.c.operations.orders.audit(order_no)
    assert [(entry["source"], entry["new_state"]) for entry in audit if entry["event"] == "delivered"] == [
        ("callback", "delivered")
    ]
    assert not [entry for entry in audit if entry["source"] == "poll"]

    provider_order = await chain.provider_order(order_no)
    detail = await chain.callback_told(provider_order, "delivered")
    last = detail["callback_log"][-1]
    assert (last["status"], last["http_status"], last["ok"]) == ("delivered", 200, True)
    api = (await chain.signed.get(f"/orders/{provider_order.id}")).json()
    (c_procurement,) = delivered["procurements"]
    assert (api["order_id"], api["order_no"]) == (
        c_procurement["upstream_order_id"], c_procurement["upstream_order_no"]
    )  # fmt: skip
    assert api["status"] == last["status"] == c_procurement["upstream_status"]
    assert {key: c_procurement["fulfillment"][key] for key in api["fulfillment"]} == api["fulfillment"]


# --- the chain on one machine, as docs/provider.md writes it ---------------------------------------------

PROVIDER_DOC = Path(__file__).parent.parent / "docs" / "provider.md"
DOCUMENTED_PORTS = ("9000", "8180", "8181", "8280", "8281")  # the top, B's listeners, C's listeners


def documented_chain() -> tuple[str, str, str]:
    """B's and C's configuration files and C's first order, as docs/provider.md's "A chain on one
    machine" writes them."""
    text = PROVIDER_DOC.read_text(encoding="utf-8")
    section = text[text.index("## A chain on one machine") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```(toml|sh)\n(.*?)```", section, re.S)
    tomls = [textwrap.dedent(body) for kind, body in blocks if kind == "toml"]
    assert len(tomls) == 2, "B's and C's configuration"
    order = re.search(r"-d '(\{\"order_no\": \"C-1\".*?\})'", section)
    assert order is not None
    return tomls[0], tomls[1], order[1]


def as_installed(documented: str, ports: dict[str, int], database_url: str, **replaced: str) -> str:
    """A documented configuration with this test's ports and database in place of the documented ones, and
    ``replaced`` values (``api_key = "..."`` lines) filled in; nothing else changes."""
    text = documented
    for port, free in ports.items():
        text = re.sub(rf"\b{port}\b", str(free), text)
    text = re.sub(r'url = "sqlite\+aiosqlite:///[a-z]+\.db"', f'url = "{database_url}"', text)
    for key, value in replaced.items():
        text = re.sub(rf'^{key} = "[^"]*"', f'{key} = "{value}"', text, flags=re.M)
    return text


def settings_from(path: Path, text: str) -> Settings:
    path.write_text(text, encoding="utf-8")
    return load_settings(path, environ={})


async def test_the_documented_one_machine_chain_delivers_and_names_b_setting_when_it_is_missing(
    tmp_path: Path, sqlite_template: Path | None, postgres_template: str | None
) -> None:
    """The chain on one machine of docs/provider.md, B's and C's files exactly as written there (this
    test's ports and databases in place of the documented ones): C's documented order is delivered by B's
    callback. With the one line that lets B call back a loopback address taken out of B's file, C's next
    order becomes an exception invalid_callback_url whose message names B's ``[provider]
    allow_private_callback_url`` and says that C's own ``[server]`` setting does not change it."""
    b_text, c_text, first_order = documented_chain()
    assert "allow_private_callback_url = true          # C's callback_url is on loopback" in b_text
    ports = dict(zip(DOCUMENTED_PORTS[1:], unused_ports(4), strict=True))
    async with (
        Sandbox(SandboxConfig(allow_private_callbacks=True)) as top,  # `procurd sandbox` as it starts
        own_database(tmp_path, "b", sqlite_template, postgres_template) as b_url,
        own_database(tmp_path, "c", sqlite_template, postgres_template) as c_url,
        aiohttp.ClientSession() as session,
    ):
        ports["9000"] = int(top.base_url.rsplit(":", 1)[1])
        b_settings = settings_from(tmp_path / "b.toml", as_installed(b_text, ports, b_url))
        await mirror(b_settings)  # procurd db upgrade (the database is migrated) && catalog sync
        async with running_daemon(b_settings) as b:
            await settled(b)
            site = await add_account(b.operations, "shopC", balance="500.00")
            c_settings = settings_from(
                tmp_path / "c.toml",
                as_installed(c_text, ports, c_url, api_key=site.api_key, api_secret=site.api_secret),
            )
            await mirror(c_settings)
            async with running_daemon(c_settings) as c:
                c_admin = AdminClient(c_settings, session)
                status, answer = await c_admin.call("POST", "/api/v1/orders", json.loads(first_order))
                assert status == 202, answer
                delivered = await c_admin.wait_status("C-1", "delivered", "canceled")
                assert delivered["status"] == "delivered"
                audit = await c.operations.orders.audit("C-1")
                assert ("callback", "delivered") in [(e["source"], e["new_state"]) for e in audit]
        without = re.sub(
            r"^allow_private_callback_url = true +# C's callback_url.*\n", "", b_text, flags=re.M
        )
        b_settings = settings_from(tmp_path / "b.toml", as_installed(without, ports, b_url))
        assert b_settings.provider.allow_private_callback_url is False
        async with running_daemon(b_settings) as b, running_daemon(c_settings) as c:
            c_admin = AdminClient(c_settings, session)
            second = json.loads(first_order.replace("C-1", "C-2"))
            status, answer = await c_admin.call("POST", "/api/v1/orders", second)
            assert status == 202, answer
            (procurement,) = (await c_admin.wait_state("C-2", "exception"))["procurements"]
            assert procurement["exception_reason"] == "invalid_callback_url"
            message = procurement["last_error_message"]
            assert "host 127.0.0.1 is a loopback address" in message
            assert "[provider] allow_private_callback_url = true" in message
            assert "[server] allow_private_callback_url does not change what the upstream accepts" in message
