"""The sandbox speaks both dialects: seed 000 as written (the default, unchanged) and Dujiao-Next as it runs
since mid-2026, chosen by ``SandboxConfig(dialect=)``, ``procurd sandbox --dialect`` or the control API."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import ControlClient, ManualClock, SignedClient


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    """120 products, 3 of them (ids 2, 4 and 6) taken off sale, one (id 8) removed; seed dialect."""
    async with Sandbox(SandboxConfig(products=120, seed=5)) as site:
        for product_id in (2, 4, 6):
            site.state.set_product_active(product_id, False)
        site.state.remove_product(8)
        yield site


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[SignedClient]:
    async with SignedClient(sandbox.base_url) as signed:
        yield signed


@pytest.fixture
async def control(sandbox: Sandbox) -> AsyncIterator[ControlClient]:
    async with ControlClient(sandbox.base_url) as unsigned:
        yield unsigned


async def listing(client: SignedClient, **params: str | int) -> dict[str, object]:
    answer = await client.get("/products", params=params)
    assert answer.status == 200, answer.body
    data: dict[str, object] = answer.json()
    return data


def auto_product(sandbox: Sandbox, after: int) -> int:
    """The first automatic product on sale with an id above ``after``; its first SKU made unlimited."""
    product = next(
        p for p in sandbox.state.active_products() if p.id > after and p.fulfillment_type == "auto"
    )
    product.skus[0].stock_quantity = -1
    product.skus[0].is_active = True
    return product.id


def ids(page: dict[str, object]) -> list[int]:
    items = page["items"]
    assert isinstance(items, list)
    return [int(item["id"]) for item in items]


async def test_the_seed_dialect_is_the_default_and_ignores_include_inactive(
    sandbox: Sandbox, client: SignedClient
) -> None:
    """Out of the box: no ``includes_inactive`` in any answer, inactive products left out even when asked,
    20 products a page unless asked, an inactive product's detail 404 ``product_unavailable``."""
    assert sandbox.config.dialect == "seed"
    plain = await listing(client)
    asked = await listing(client, include_inactive="true", page_size=100)
    assert "includes_inactive" not in plain
    assert "includes_inactive" not in asked
    assert (plain["page_size"], plain["total"], asked["page_size"]) == (20, 116, 50)
    assert not {2, 4, 6, 8} & set(ids(asked))
    detail = await client.get("/products/4")
    assert (detail.status, detail.error_code) == (404, "product_unavailable")


async def test_2026_lists_inactive_products_when_asked_and_echoes_it(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """Switched to 2026 through the control API: ``include_inactive=true`` lists the inactive products too,
    with ``is_active: false``, and the answer says ``includes_inactive: true``; without the flag only
    products on sale, with ``includes_inactive: false``. A removed product is in neither."""
    await control.post("/config", {"dialect": "2026"})
    assert (await control.get("/state"))["dialect"] == "2026"
    everything = await listing(client, include_inactive="true", page=1)
    on_sale = await listing(client)
    assert (everything["includes_inactive"], on_sale["includes_inactive"]) == (True, False)
    assert (everything["total"], on_sale["total"]) == (119, 116)
    items = everything["items"]
    assert isinstance(items, list)
    inactive = [item["id"] for item in items if item["is_active"] is False]
    assert inactive == [2, 4, 6]
    assert 8 not in ids(everything)
    assert not {2, 4, 6} & set(ids(on_sale))
    seen = []
    for page in (1, 2, 3):
        seen += ids(await listing(client, include_inactive="true", page=page))
    assert seen == sorted(set(range(1, 121)) - {8})


async def test_2026_page_size_is_50_by_default_and_out_of_range(
    sandbox: Sandbox, client: SignedClient
) -> None:
    """Dujiao-Next: 50 a page by default, and anything outside 1 to 50 is read as 50 (the seed dialect reads
    0 as its default of 20)."""
    assert (await listing(client, page_size=0))["page_size"] == 20
    sandbox.config.dialect = "2026"
    for asked, answered in ((None, 50), (0, 50), (-3, 50), (7, 7), (50, 50), (100, 50)):
        params = {} if asked is None else {"page_size": asked}
        assert (await listing(client, **params))["page_size"] == answered


async def test_2026_detail_of_an_inactive_product_is_200(sandbox: Sandbox, client: SignedClient) -> None:
    """An inactive product's detail is 200 with ``is_active: false``; a removed one is 404
    ``product_not_found``; ``inactive_product_detail`` still overrides the dialect's answer."""
    sandbox.config.dialect = "2026"
    detail = await client.get("/products/4")
    assert detail.status == 200, detail.body
    assert detail.json()["product"]["is_active"] is False
    removed = await client.get("/products/8")
    assert (removed.status, removed.error_code) == (404, "product_not_found")
    sandbox.config.inactive_product_detail = "404"
    assert (await client.get("/products/4")).error_code == "product_unavailable"


async def test_a_deactivation_moves_updated_at_in_both_dialects(
    sandbox: Sandbox, client: SignedClient
) -> None:
    """Taking a product off sale stamps its ``updated_at``, so a 2026 listing asked for products updated
    since then (``updated_after``) with ``include_inactive`` shows it inactive."""
    sandbox.config.dialect = "2026"
    before = sandbox.state.product(10).updated_at
    since = (await listing(client, include_inactive="true"))["items"]
    assert isinstance(since, list)
    sandbox.state.set_product_active(10, False)
    assert sandbox.state.product(10).updated_at != before
    stamp = sandbox.state.product(10).updated_at
    changed = await listing(client, include_inactive="true", updated_after=stamp)
    assert [(item["id"], item["is_active"]) for item in changed["items"]] == [(10, False)]  # type: ignore[attr-defined]


async def test_over_the_limit_2026_answers_http_429_with_the_envelope() -> None:
    """The limiter's answer: HTTP 200 with the envelope in the seed dialect, HTTP 429 with the same
    envelope in 2026 (no Retry-After in either)."""
    config = SandboxConfig(rate_limit=True, rate_limit_requests=2, rate_limit_block_seconds=30)
    async with Sandbox(config, clock=ManualClock()) as site, SignedClient(site.base_url) as client:
        for dialect, status in (("seed", 200), ("2026", 429)):
            site.config.dialect = dialect  # type: ignore[assignment]
            site.rate_limiter.reset()
            answers = [await client.post("/ping") for _ in range(3)]
            assert [answer.status for answer in answers] == [200, 200, status]
            envelope = answers[-1].json()
            assert (envelope["status_code"], "ok" in envelope) == (429, False)
            assert "Retry-After" not in answers[-1].headers


async def test_purchase_limits_are_400_in_the_seed_and_500_in_2026(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """A product's purchase limits (set through the control API, never listed) refuse an order outside
    them: seed 000 has no code for it (400 ``bad_request``); Dujiao-Next answers HTTP 500
    ``internal_error``. Nothing is charged either way; within the limits the order is taken."""
    product_id = auto_product(sandbox, 10)
    sku = sandbox.state.product(product_id).skus[0]
    limits = {"min_purchase_quantity": 2, "max_purchase_quantity": 5}
    answer = await control.post(f"/products/{product_id}", limits)
    assert (answer["min_purchase_quantity"], answer["max_purchase_quantity"]) == (2, 5)
    listed = await client.get(f"/products/{product_id}")
    assert "min_purchase_quantity" not in listed.json()["product"]
    balance = sandbox.state.balance()
    refused = await client.create_order(sku.id, 1, downstream_order_no="LIMIT-1")
    assert (refused.status, refused.error_code) == (400, "bad_request")
    sandbox.config.dialect = "2026"
    for quantity in (1, 6):
        refused = await client.create_order(sku.id, quantity, downstream_order_no=f"LIMIT-{quantity}x")
        assert (refused.status, refused.error_code) == (500, "internal_error")
    assert sandbox.state.balance() == balance
    taken = await client.create_order(sku.id, 3, downstream_order_no="LIMIT-3")
    assert taken.json()["ok"] is True, taken.body
    lifted = {"min_purchase_quantity": None, "max_purchase_quantity": None}
    await control.post(f"/products/{product_id}", lifted)
    assert (await client.create_order(sku.id, 1, downstream_order_no="LIMIT-free")).json()["ok"] is True


async def test_2026_charges_a_wholesale_tier_below_the_list_price(
    sandbox: Sandbox, client: SignedClient
) -> None:
    """In 2026 an order reaching a SKU's wholesale tier is charged the tier's price; its items carry
    ``original_unit_price`` and ``original_total_price`` (the list price) beside ``unit_price``. The seed
    dialect charges the list price and names no original price."""
    sku = sandbox.state.product(auto_product(sandbox, 20)).skus[0]
    sku.price_amount, sku.member_price = "10.00", None
    sku.wholesale_prices = [
        {"min_quantity": 10, "unit_price": "9.50"},
        {"min_quantity": 50, "unit_price": "9.00"},
    ]
    seed = (await client.create_order(sku.id, 10, downstream_order_no="WHOLESALE-seed")).json()
    assert seed["amount"] == "100.00"
    seed_item = (await client.get(f"/orders/{seed['order_id']}")).json()["items"][0]
    assert "original_unit_price" not in seed_item
    sandbox.config.dialect = "2026"
    for quantity, amount, unit in ((9, "90.00", "10.00"), (10, "95.00", "9.50"), (50, "450.00", "9.00")):
        created = (
            await client.create_order(sku.id, quantity, downstream_order_no=f"WHOLESALE-{quantity}")
        ).json()
        assert created["amount"] == amount
        item = (await client.get(f"/orders/{created['order_id']}")).json()["items"][0]
        assert (item["unit_price"], item["original_unit_price"]) == (unit, "10.00")
        assert (item["total_price"], Decimal(item["original_total_price"])) == (
            amount,
            Decimal(10 * quantity),
        )


async def test_the_command_line_takes_a_dialect() -> None:
    """``procurd sandbox --dialect 2026`` serves the 2026 dialect and says so when it starts."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "procurd", "sandbox", "--port", "0", "--dialect", "2026", "--products", "3",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert "speaking Dujiao-Next of 2026" in line, line
        found = re.search(r"listening on (\S+) ", line)
        assert found is not None
        async with SignedClient(found.group(1)) as client:
            answer = await listing(client, include_inactive="true")
        assert (answer["includes_inactive"], answer["page_size"]) == (True, 50)
    finally:
        process.terminate()
        await process.wait()
