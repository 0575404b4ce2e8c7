"""Buying from Dujiao-Next as it runs since 2026, end to end (a daemon in-process, the sandbox speaking that
dialect): a purchase-limit refusal answered HTTP 500 ``internal_error`` ends an exception within
``max_attempts`` with the upstream's message, bought nowhere; a wholesale charge below the listed price is
recorded as the cost and delivered once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal

import aiohttp
import pytest

from procurd.config import Settings
from procurd.sandbox import Sandbox, SandboxConfig
from support import AdminClient, mirror, running_daemon, settings_for


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig(
        products=8,
        manual_ratio=0,
        balance=Decimal("1000000"),
        allow_private_callbacks=True,
        callback_retry_delays=(0.1, 0.2),
        dialect="2026",
    )
    async with Sandbox(config) as site:
        yield site


@pytest.fixture
async def admin(database_url: str, sandbox: Sandbox) -> AsyncIterator[AdminClient]:
    settings: Settings = settings_for(database_url, ("main", sandbox))
    await mirror(settings)
    async with running_daemon(settings), aiohttp.ClientSession() as session:
        yield AdminClient(settings, session)


async def test_a_purchase_limit_is_an_exception_within_max_attempts(
    sandbox: Sandbox, admin: AdminClient
) -> None:
    """HTTP 500 internal_error for a quantity outside the product's limits is retried under the same number
    up to max_attempts (4 here), then the item is an exception with the upstream's message; nothing was
    bought."""
    sku = sandbox.state.first_sku("auto")
    sku.stock_quantity = -1
    sandbox.state.product(sku.product_id).max_purchase_quantity = 2
    await admin.submit("LIMIT-1", {"sku_id": sku.id, "quantity": 3})
    order = await admin.wait_state("LIMIT-1", "exception")
    (item,) = order["procurements"]
    assert (item["attempts"], item["last_error_code"]) == (4, "internal_error")
    assert "failed to create order" in (item["last_error_message"] or "")
    assert sandbox.orders_for("LIMIT-1") == []


async def test_a_wholesale_charge_below_the_list_price_is_the_cost(
    sandbox: Sandbox, admin: AdminClient
) -> None:
    """Ten units reach the SKU's wholesale tier: the upstream charges 95.00 for a list price of 100.00; the
    procurement records 95.00 and the goods are delivered once."""
    sku = sandbox.state.first_sku("auto")
    sku.stock_quantity, sku.member_price, sku.price_amount = -1, None, "10.00"
    sku.wholesale_prices = [{"min_quantity": 10, "unit_price": "9.50"}]
    await admin.submit("BULK-1", {"sku_id": sku.id, "quantity": 10})
    order = await admin.wait_status("BULK-1", "delivered")
    (item,) = order["procurements"]
    (bought,) = sandbox.orders_for("BULK-1")
    assert (str(bought.amount), bought.item.original_total_price) == ("95.00", "100.00")
    assert (item["amount"], item["currency"]) == ("95.00", "CNY")
    assert item["fulfillment"]["payload_line_count"] == 10
