"""Selling prices in the mirror, end to end: passes against the sandbox over real sockets price SKUs and
products from [pricing], log every sell_price change, hold steep cost rises until released (HTTP and command
line), and `procurd catalog reprice` applies changed rules."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import select

from procurd.catalog.sync import SyncOptions, SyncReport
from procurd.config import PricingSettings, Settings
from procurd.db.database import Database
from procurd.db.schema import mirror_changes, mirror_products, mirror_skus
from procurd.http.admin import make_admin_app
from procurd.http.testing import serve
from procurd.operations import Operations
from procurd.operations.catalog_pass import holds, reprice_upstream, run_sync
from procurd.operations.runtime import Runtime
from procurd.sandbox import Sandbox, SandboxConfig
from support import settings_for, wait_until

UPSTREAM = "main"
MARKUP = Decimal("1.2")


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    """A sandbox upstream with 30 products of 3 SKUs on 127.0.0.1 (currency CNY)."""
    async with Sandbox(SandboxConfig(products=30, skus_per_product=3, seed=11)) as site:
        yield site


def settings(database_url: str, sandbox: Sandbox, **pricing: Any) -> Settings:
    pricing.setdefault("rules", [{"markup_percent": "20"}])
    return settings_for(database_url, (UPSTREAM, sandbox), pricing=pricing)


@pytest.fixture
async def operations(database_url: str, sandbox: Sandbox) -> AsyncIterator[Operations]:
    """procurd's operations with a 20 % markup rule and holds above a 10 % cost rise."""
    built = Operations(Runtime.build(settings(database_url, sandbox, hold_on_cost_increase_percent="10")))
    try:
        yield built
    finally:
        await built.close()


async def sync(operations: Operations) -> SyncReport:
    report = await operations.catalog.sync(UPSTREAM)
    assert report.status == "ok", report.error
    return report


def expected(cost: str, markup: Decimal = MARKUP) -> str:
    return str((Decimal(cost) * markup).quantize(Decimal("0.01"), rounding=ROUND_CEILING))


async def rows(database: Database, table: Any) -> dict[int, dict[str, Any]]:
    statement = select(table).where(table.c.upstream == UPSTREAM)
    return await database.read(
        lambda tx: {row["id"]: dict(row) for row in tx.connection.execute(statement).mappings()}
    )


async def price_changes(database: Database) -> list[tuple[Any, ...]]:
    statement = (
        select(mirror_changes.c.entity, mirror_changes.c.entity_id, mirror_changes.c.old_value,
               mirror_changes.c.new_value)
        .where(mirror_changes.c.field == "sell_price")
        .order_by(mirror_changes.c.seq)
    )  # fmt: skip
    return await database.read(lambda tx: [tuple(row) for row in tx.connection.execute(statement)])


async def test_pass_prices_every_sku_and_each_product_from_its_cheapest(
    operations: Operations, sandbox: Sandbox
) -> None:
    """After the first pass each SKU sells at cost x 1.2 in the upstream's currency (learnt by a ping),
    inactive ones too, each product at its cheapest live SKU's price; the first pass logs no changes."""
    report = await sync(operations)
    assert report.added == report.categories + report.products + report.skus
    skus = await rows(operations.runtime.database, mirror_skus)
    products = await rows(operations.runtime.database, mirror_products)
    for row in skus.values():
        assert (row["sell_price"], row["sell_currency"]) == (expected(row["price_amount"]), "CNY")
        assert (row["price_held_at"], row["held_cost"]) == (None, None)
    for product_id, product in products.items():
        live = [row for row in skus.values() if row["product_id"] == product_id and row["is_active"]]
        cheapest = min(live, key=lambda row: Decimal(row["sell_price"]))
        assert (product["sell_price"], product["sell_currency"]) == (cheapest["sell_price"], "CNY")
    assert sandbox.request_counts["ping"] == 1
    assert await price_changes(operations.runtime.database) == []


async def test_cost_change_reprices_and_logs_the_change(operations: Operations, sandbox: Sandbox) -> None:
    """A small cost rise reprices the SKU (and its product, when it is the cheapest) and logs both."""
    await sync(operations)
    product = sandbox.state.product(4)
    cheapest = min((sku for sku in product.skus if sku.is_active), key=lambda sku: Decimal(sku.price_amount))
    old_cost = cheapest.price_amount
    new_cost = str(Decimal(old_cost) + Decimal("0.01"))
    before = (await rows(operations.runtime.database, mirror_products))[4]["sell_price"]
    sandbox.state.set_sku_price(cheapest.id, new_cost)

    report = await sync(operations)
    assert report.new_holds == ()
    sku_row = (await rows(operations.runtime.database, mirror_skus))[cheapest.id]
    assert sku_row["sell_price"] == expected(new_cost)
    logged = await price_changes(operations.runtime.database)
    assert ("sku", cheapest.id, expected(old_cost), expected(new_cost)) in logged
    after = (await rows(operations.runtime.database, mirror_products))[4]["sell_price"]
    if after != before:
        assert ("product", 4, before, after) in logged


async def test_the_daemons_full_passes_remember_pages_and_still_reprice(
    operations: Operations, sandbox: Sandbox
) -> None:
    """The runtime's full passes of an upstream share what they listed: an unchanged page is not decoded
    again, and a page with a cost change is, and reprices its SKU."""

    async def full_pass() -> SyncReport:
        report = await operations.catalog.sync(UPSTREAM, full=True)
        assert (report.status, report.kind) == ("ok", "full"), report.error
        return report

    first = await full_pass()
    assert (first.pages, first.unchanged_pages) == (1, 0)
    unchanged = await full_pass()
    assert (unchanged.unchanged_pages, unchanged.rows_written) == (1, 0)
    sku = sandbox.state.product(9).skus[0]
    new_cost = str(Decimal(sku.price_amount) + Decimal("0.01"))
    sandbox.state.set_sku_price(sku.id, new_cost)
    changed = await full_pass()
    assert changed.unchanged_pages == 0
    assert (await rows(operations.runtime.database, mirror_skus))[sku.id]["sell_price"] == expected(new_cost)


async def test_steep_cost_rise_is_held_until_released_over_http(
    operations: Operations, sandbox: Sandbox
) -> None:
    """A cost rise above 10 % keeps the old selling price and holds the SKU; the hold is listed, reported
    for alert price_held, and released through the admin API, which reprices the SKU at once."""
    await sync(operations)
    sku = sandbox.state.product(6).skus[0]
    old_cost, old_price = sku.price_amount, expected(sku.price_amount)
    new_cost = str(Decimal(old_cost) * 2)
    sandbox.state.set_sku_price(sku.id, new_cost)

    report = await sync(operations)
    (hold,) = report.new_holds
    assert (hold.sku_id, hold.old_cost, hold.new_cost, hold.sell_price) == (
        sku.id,
        old_cost,
        new_cost,
        old_price,
    )
    assert [alert.kind for alert in report.alerts()] == ["price_held"]
    row = (await rows(operations.runtime.database, mirror_skus))[sku.id]
    assert (row["sell_price"], row["held_cost"], row["price_amount"]) == (old_price, new_cost, new_cost)
    assert row["price_held_at"] is not None

    async with serve(make_admin_app(operations)) as admin, aiohttp.ClientSession() as session:
        async with session.get(f"{admin}/api/v1/catalog/holds") as answer:
            assert answer.status == 200
            listed = (await answer.json())["items"]
        assert [
            (item["upstream"], item["sku_id"], item["held_cost"], item["sell_price"]) for item in listed
        ] == [(UPSTREAM, sku.id, new_cost, old_price)]
        release = f"{admin}/api/v1/catalog/holds/{UPSTREAM}/{sku.id}/release"
        async with session.post(release) as answer:
            assert answer.status == 200
            body = await answer.json()
        assert (body["sell_price"], body["sell_currency"]) == (expected(new_cost), "CNY")
        async with session.post(release) as answer:
            assert (answer.status, (await answer.json())["error_code"]) == (404, "hold_not_found")
        async with session.post(f"{admin}/api/v1/catalog/holds/nowhere/1/release") as answer:
            assert (answer.status, (await answer.json())["error_code"]) == (404, "unknown_upstream")
        async with session.get(f"{admin}/api/v1/catalog/holds?upstream={UPSTREAM}") as answer:
            assert (await answer.json())["items"] == []
    row = (await rows(operations.runtime.database, mirror_skus))[sku.id]
    assert (row["sell_price"], row["price_held_at"], row["held_cost"]) == (expected(new_cost), None, None)
    assert ("sku", sku.id, old_price, expected(new_cost)) in await price_changes(operations.runtime.database)


async def test_held_sku_keeps_its_price_through_later_passes_and_repricing(
    operations: Operations, sandbox: Sandbox
) -> None:
    """While held, neither another cost change nor a full reprice moves the selling price."""
    await sync(operations)
    sku = sandbox.state.product(8).skus[0]
    held_price = expected(sku.price_amount)
    sandbox.state.set_sku_price(sku.id, str(Decimal(sku.price_amount) * 3))
    await sync(operations)
    sandbox.state.set_sku_price(sku.id, str(Decimal(sku.price_amount) + 1))
    await sync(operations)
    await operations.catalog.reprice()
    row = (await rows(operations.runtime.database, mirror_skus))[sku.id]
    assert row["sell_price"] == held_price
    assert [hold["sku_id"] for hold in await holds(operations.runtime.database)] == [sku.id]


async def test_changed_rules_are_applied_at_start_up(database_url: str, sandbox: Sandbox) -> None:
    """A runtime started with other rules (a daemon after a configuration change) reprices the mirror in
    the background without fetching, and logs each change."""
    first = Operations(Runtime.build(settings(database_url, sandbox)))
    try:
        await sync(first)
    finally:
        await first.close()
    requests = sandbox.request_counts["products"]
    later = Operations(Runtime.build(settings(database_url, sandbox, rules=[{"markup_percent": "50"}])))
    try:
        later.catalog.start_reprice()

        async def repriced() -> bool:
            skus = await rows(later.runtime.database, mirror_skus)
            return all(
                row["sell_price"] == expected(row["price_amount"], Decimal("1.5")) for row in skus.values()
            )

        await wait_until(repriced)
        assert sandbox.request_counts["products"] == requests
        assert len(await price_changes(later.runtime.database)) > 0
    finally:
        await later.close()


async def test_start_of_a_pass_through_the_admin_api(operations: Operations, sandbox: Sandbox) -> None:
    """POST /api/v1/catalog/sync answers 202 and the pass runs in the background; bad requests are
    refused with their reason."""
    async with serve(make_admin_app(operations)) as admin, aiohttp.ClientSession() as session:
        async with session.post(f"{admin}/api/v1/catalog/sync", json={"full": True}) as answer:
            assert answer.status == 202
            assert await answer.json() == {
                "ok": True, "upstream": UPSTREAM, "started": True, "full": True, "allow_mass_removal": False
            }  # fmt: skip

        async def finished() -> bool:
            row = await operations.runtime.database.read(
                lambda tx: tx.mirror.last_run(UPSTREAM, finished=True)
            )
            return row is not None and row["status"] == "ok"

        await wait_until(finished)
        for body, status, code in (
            ({"upstream": "nowhere"}, 404, "unknown_upstream"),
            ({"allow_mass_removal": True}, 400, "invalid_request"),
            ({"full": "yes"}, 400, "invalid_request"),
            ({"bogus": 1}, 400, "invalid_request"),
        ):
            async with session.post(f"{admin}/api/v1/catalog/sync", json=body) as answer:
                assert (answer.status, (await answer.json())["error_code"]) == (status, code), body
    assert sandbox.request_counts["products"] == 1


async def test_rules_that_name_unknown_categories_are_reported(operations: Operations) -> None:
    """At reprice time a rule of the upstream naming a category it does not have is a problem naming the
    rule; the other prices are applied all the same."""
    pricing = PricingSettings(rules=[{"upstream": UPSTREAM, "category_ids": [999]}, {"markup_percent": "20"}])
    report = await run_sync(
        operations.runtime.database,
        operations.runtime.client(UPSTREAM),
        UPSTREAM,
        options=SyncOptions(pricing=pricing),
    )
    problem = "[[pricing.rules]] #1: category_ids: 999 is not a category of upstream main"
    assert problem in report.violations
    repriced = await reprice_upstream(
        operations.runtime.database, UPSTREAM, pricing, client=operations.runtime.client(UPSTREAM)
    )
    assert repriced.problems == [problem]
    assert repriced.priced == report.skus


# --- the command line -------------------------------------------------------------------------------------


def write_config(tmp_path: Path, database_url: str, sandbox: Sandbox, pricing: str) -> Path:
    path = tmp_path / "procurd.toml"
    path.write_text(
        f"""
[database]
url = "{database_url}"

[[upstreams]]
name = "main"
base_url = "{sandbox.base_url}"
api_key = "{sandbox.config.api_key}"
api_secret = "{sandbox.config.api_secret}"
max_requests_per_second = 500

{pricing}
""",
        encoding="utf-8",
    )
    return path


async def procurd(config: Path, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "procurd", "--config", str(config), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


RULES = """
[pricing]
hold_on_cost_increase_percent = "10"

[[pricing.rules]]
markup_percent = "{markup}"
rounding = "x.99"
"""


async def test_reprice_holds_and_release_from_the_command_line(
    tmp_path: Path, database_url: str, sandbox: Sandbox, database: Database
) -> None:
    """catalog reprice applies edited rules without fetching; catalog holds lists a hold and
    release-hold releases it; a SKU without a hold is refused with exit code 1."""
    config = write_config(tmp_path, database_url, sandbox, RULES.format(markup="20"))
    code, out, err = await procurd(config, "catalog", "sync")
    assert code == 0, err
    sku = sandbox.state.product(2).skus[0]
    sandbox.state.set_sku_price(sku.id, str(Decimal(sku.price_amount) * 2))
    code, out, err = await procurd(config, "catalog", "sync")
    assert code == 0, err
    assert f"price held: SKU {sku.id}" in out

    config.write_text(config.read_text().replace('markup_percent = "20"', 'markup_percent = "50"'))
    products_requests = sandbox.request_counts["products"]
    code, out, err = await procurd(config, "catalog", "reprice")
    assert code == 0, err
    assert "main:" in out
    assert sandbox.request_counts["products"] == products_requests
    skus = await rows(database, mirror_skus)
    other = next(row for row in skus.values() if row["id"] != sku.id)
    assert Decimal(other["sell_price"]) >= Decimal(other["price_amount"]) * Decimal("1.5")
    assert other["sell_price"].endswith(".99")

    code, out, err = await procurd(config, "catalog", "holds", "--output", "json")
    assert code == 0, err
    assert [hold["sku_id"] for hold in json.loads(out)["holds"]] == [sku.id]
    code, out, err = await procurd(config, "catalog", "release-hold", "main", str(sku.id))
    assert code == 0, err
    assert "hold released" in out
    code, out, err = await procurd(config, "catalog", "release-hold", "main", str(sku.id))
    assert code == 1
    assert "has no price hold" in err


async def test_unusable_rule_is_a_configuration_error(
    tmp_path: Path, database_url: str, sandbox: Sandbox
) -> None:
    """A rule selling under cost stops the command with exit code 2 and names the rule and the key."""
    config = write_config(tmp_path, database_url, sandbox, RULES.format(markup="-30"))
    code, _, err = await procurd(config, "catalog", "reprice")
    assert code == 2
    assert f"{config}: [[pricing.rules]] #1: markup_percent: -30 sells under cost" in err
