"""Incremental listings: GET /products?updated_after=, product updated_at stamps, and the switch that makes
the sandbox ignore the parameter like an older site."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from procurd.sandbox import Sandbox, SandboxConfig, SandboxState
from procurd.sandbox.catalog import precise_iso_time
from procurd.sandbox.testing import ControlClient, ManualClock, SignedClient

CLOCK_OFFSET = 30.0  # within the 60 s signature tolerance, so clients sign with wall time


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def sandbox(clock: ManualClock) -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig(clock_offset_seconds=CLOCK_OFFSET), clock=clock) as sandbox:
        yield sandbox


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[SignedClient]:
    async with SignedClient(sandbox.base_url) as client:
        yield client


@pytest.fixture
async def control(sandbox: Sandbox) -> AsyncIterator[ControlClient]:
    async with ControlClient(sandbox.base_url) as control:
        yield control


async def listed_ids(client: SignedClient, updated_after: str, page_size: int = 50) -> list[int]:
    items = await client.list_all_products(page_size, updated_after=updated_after)
    return [item["id"] for item in items]


async def listing(client: SignedClient, updated_after: str) -> dict[str, Any]:
    data: dict[str, Any] = (await client.get("/products", {"updated_after": updated_after})).json()
    return data


def test_generated_updated_at_is_distinct_ordered_and_in_the_past() -> None:
    """Generated products carry ISO 8601 updated_at with a time zone, distinct and rising with the id, after
    their created_at and before the site's now."""
    state = SandboxState(SandboxConfig(products=200, inactive_products=5))
    products = [state.products[key] for key in sorted(state.products)]
    instants = [datetime.fromisoformat(p.updated_at) for p in products]
    assert all(instant.tzinfo is not None for instant in instants)
    assert all(p.updated_at.endswith("+08:00") for p in products)
    assert instants == sorted(set(instants))
    assert all(datetime.fromisoformat(p.created_at) <= datetime.fromisoformat(p.updated_at) for p in products)
    assert instants[-1].timestamp() < state.now()


async def test_updated_after_lists_products_updated_at_or_after(
    sandbox: Sandbox, client: SignedClient
) -> None:
    """updated_after equal to product 30's updated_at lists products 30 to 40 (at or after, inclusive);
    a microsecond later leaves product 30 out; total counts only the matching products on every page."""
    since = sandbox.state.product(30).updated_at
    assert await listed_ids(client, since) == list(range(30, 41))
    assert await listed_ids(client, since, page_size=4) == list(range(30, 41))
    later = (datetime.fromisoformat(since) + timedelta(microseconds=1)).isoformat()
    assert await listed_ids(client, later) == list(range(31, 41))
    page = (await client.get("/products", {"updated_after": since, "page": 2, "page_size": 4})).json()
    assert (page["total"], page["page"], [p["id"] for p in page["items"]]) == (11, 2, [34, 35, 36, 37])


async def test_updated_after_in_any_offset(sandbox: Sandbox, client: SignedClient) -> None:
    """The same instant written in UTC with Z, with +00:00 or with +08:00 selects the same products."""
    instant = datetime.fromisoformat(sandbox.state.product(35).updated_at)
    utc = instant.astimezone(UTC)
    spellings = [utc.strftime("%Y-%m-%dT%H:%M:%SZ"), utc.isoformat(), instant.isoformat()]
    assert [await listed_ids(client, text) for text in spellings] == [list(range(35, 41))] * 3


@pytest.mark.parametrize(
    "changes",
    [
        [("sku", {"price_amount": "12.34"})],
        [("sku", {"stock_quantity": 3})],
        [("sku", {"is_active": False})],
        [("product", {"category_id": 2})],
        [("product", {"title": {"zh-CN": "新名字", "en-US": "New name"}})],
        [("product", {"is_active": False}), ("product", {"is_active": True})],
        [("product", {"removed": True}), ("product", {"removed": False})],
    ],
    ids=[
        "sku price",
        "sku stock",
        "sku active",
        "category",
        "title",
        "product active",
        "removed and restored",
    ],
)
async def test_every_change_bumps_updated_at_to_the_site_clock(
    sandbox: Sandbox,
    clock: ManualClock,
    client: SignedClient,
    control: ControlClient,
    changes: list[tuple[str, dict[str, Any]]],
) -> None:
    """A change through the control API stamps the product with the site's clock (its offset included), to
    the microsecond, and an incremental listing from that instant holds that product alone."""
    sku = sandbox.state.first_sku()
    for target, body in changes:
        clock.advance(7.25)
        path = f"/skus/{sku.id}" if target == "sku" else f"/products/{sku.product_id}"
        await control.post(path, body)
    stamp = precise_iso_time(clock.now + CLOCK_OFFSET)
    assert sandbox.state.product(sku.product_id).updated_at == stamp
    listed = await listing(client, stamp)
    assert ([p["id"] for p in listed["items"]], listed["total"]) == ([sku.product_id], 1)
    assert listed["items"][0]["updated_at"] == stamp


async def test_orders_that_take_stock_bump_updated_at(
    sandbox: Sandbox, clock: ManualClock, client: SignedClient
) -> None:
    """An order that lowers a SKU's stock stamps its product; one on unlimited stock changes nothing."""
    sandbox.state.set_balance("100000.00")
    counted = sandbox.state.first_sku()
    sandbox.state.set_sku_stock(counted.id, 50)
    unlimited = next(
        sku
        for product in sandbox.state.active_products()[::-1]
        if product.fulfillment_type == "auto"
        for sku in product.skus
        if sku.is_active and sku.stock_quantity == -1
    )
    untouched = sandbox.state.product(unlimited.product_id).updated_at
    clock.advance(3)
    stamp = precise_iso_time(clock.now + CLOCK_OFFSET)
    for sku in (counted, unlimited):
        created = await client.create_order(sku.id, 2)
        assert created.json()["ok"] is True
    await sandbox.wait_callbacks_idle()
    assert sandbox.state.product(counted.product_id).updated_at == stamp
    assert sandbox.state.product(unlimited.product_id).updated_at == untouched


@pytest.mark.parametrize(
    "value",
    ["yesterday", "2026-01-02", "2026-01-02T15:04:05", "2026-13-02T15:04:05Z", "2026-01-02T15:04:05 08:00"],
)
async def test_invalid_updated_after_is_400(client: SignedClient, value: str) -> None:
    """A value that is not an RFC 3339 timestamp with a time zone (an unescaped + turns into a space)
    answers 400 bad_request naming the parameter."""
    response = await client.get("/products", {"updated_after": value})
    assert (response.status, response.error_code) == (400, "bad_request")
    assert "updated_after" in response.json()["error_message"]


async def test_an_older_site_ignores_updated_after(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """With honour_updated_after off (config or POST /_sandbox/config) every product is listed whatever
    updated_after says, even a malformed one; switched back on, the parameter filters again."""
    future = precise_iso_time(sandbox.state.now() + 3600)
    assert (await listing(client, future))["total"] == 0
    await control.post("/config", {"honour_updated_after": False})
    assert (await listing(client, future))["total"] == 40
    assert (await listing(client, "soon"))["total"] == 40
    await control.post("/config", {"honour_updated_after": True})
    assert (await listing(client, future))["total"] == 0
    assert (await control.post("/config", {"honour_updated_after": "no"}, expect=400))["field"] == (
        "honour_updated_after"
    )
