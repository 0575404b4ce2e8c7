"""The provider serves ``include_inactive``, as Dujiao-Next's own downstream asks it: with the flag, GET
/products also lists every product offered before that is no longer on sale (``is_active: false``, its id
kept) and says ``includes_inactive: true``; without it nothing changes. A downstream asking it (procurd C
against procurd B) sees a product B stopped offering inactive at once, by an incremental pass; ordering it
is a business refusal, never a 5xx (which such a downstream retries under the same number)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from procurd.catalog.sync import SyncOptions, SyncReport
from procurd.daemon import Daemon
from procurd.db.schema import mirror_changes, mirror_products
from procurd.operations.catalog_pass import run_sync
from procurd.operations.runtime import Runtime
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import SignedClient
from provider_support import ProviderSite, add_account, provider_settings, settled
from scale_cluster import own_database
from support import mirror, running_daemon, settings_for, sql_rows, wait_until

PRODUCTS = 6


@dataclass
class Chain:
    """The top (Dujiao-Next of 2026), B selling it, C's runtime with B as its upstream ``b``."""

    top: Sandbox
    b: Daemon
    site: ProviderSite
    c: Runtime

    def signed(self) -> SignedClient:
        site = self.site
        return SignedClient(site.base_url, site.api_key, site.api_secret, site.header_prefix)

    async def c_pass(self) -> SyncReport:
        settings = self.c.settings
        report = await run_sync(
            self.c.database,
            self.c.client("b"),
            "b",
            options=SyncOptions.from_settings(settings, "b"),
            holder="c",
        )
        assert report.status == "ok", report.error
        return report

    async def b_pass(self, **options: Any) -> SyncReport:
        """A pass of B over the top now (once the daemon's own pass, if one runs, has let go of the lease)."""

        async def ran() -> SyncReport | None:
            report = await self.b.operations.catalog.sync("top", **options)
            return None if report.status == "skipped" else report

        report = await wait_until(ran)
        assert report.status == "ok", report.error
        return report


@pytest.fixture
async def chain(
    tmp_path: Path, database_url: str, sqlite_template: Path | None, postgres_template: str | None
) -> AsyncIterator[Chain]:
    config = SandboxConfig(products=PRODUCTS, skus_per_product=2, manual_ratio=0, dialect="2026")
    async with (
        Sandbox(config) as top,
        own_database(tmp_path, "c", sqlite_template, postgres_template) as c_url,
    ):
        b_settings = provider_settings(database_url, ("top", top))
        await mirror(b_settings)
        async with running_daemon(b_settings) as b:
            await settled(b)
            site = await add_account(b.operations, "shopC", balance="1000.00")
            c = Runtime.build(settings_for(c_url, ("b", site)))
            try:
                yield Chain(top, b, site, c)
            finally:
                await c.close()


async def products(client: SignedClient, **params: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every page of B's listing (with ``params``): the first page's answer, and every product."""
    first = await client.get("/products", params={"page": 1, "page_size": 100, **params})
    assert first.status == 200, first.body
    answer = first.json()
    assert answer["total"] == len(answer["items"])
    return answer, list(answer["items"])


def on_sale(top: Sandbox) -> int:
    """A product of the top with every SKU priced and active: one B offers."""
    return next(p.id for p in top.state.active_products() if all(sku.is_active for sku in p.skus))


async def test_a_dujiao_style_downstream_sees_a_withdrawn_product_inactive_at_once(chain: Chain) -> None:
    """The top takes a product off sale; B's incremental pass stops offering it. Asked without the flag B
    lists what is on sale and says nothing of inactive products; asked include_inactive=true it lists the
    withdrawn product too, inactive under the same id, and says includes_inactive: true. C, which asks the
    flag, makes it inactive by its next pass, an incremental one, with its change row; ordering its SKU at
    B is 400 product_unavailable."""
    first = await chain.c_pass()
    assert (first.kind, first.includes_inactive) == ("full", True)
    withdrawn = on_sale(chain.top)
    async with chain.signed() as client:
        before, listed_before = await products(client, include_inactive="true")
        offered_id = next(
            p["id"] for p in listed_before if p["title"] == chain.top.state.product(withdrawn).title
        )
        sku_id = next(p["skus"][0]["id"] for p in listed_before if p["id"] == offered_id)
        assert before["includes_inactive"] is True

        chain.top.state.set_product_active(withdrawn, False)
        b_pass = await chain.b_pass()
        assert b_pass.kind == "incremental"

        plain, on_sale_now = await products(client)
        assert "includes_inactive" not in plain
        assert offered_id not in {p["id"] for p in on_sale_now}
        assert all(p["is_active"] is True for p in on_sale_now)
        asked, everything = await products(client, include_inactive="true")
        assert asked["includes_inactive"] is True
        assert [p["id"] for p in everything] == [p["id"] for p in listed_before]
        shown = next(p for p in everything if p["id"] == offered_id)
        assert shown["is_active"] is False
        assert asked["total"] == plain["total"] + 1

        order = await client.create_order(sku_id, downstream_order_no="WITHDRAWN-1")
        assert (order.status, order.error_code) == (400, "product_unavailable")

    second = await chain.c_pass()
    assert (second.kind, second.includes_inactive) == ("incremental", True)
    statement = select(mirror_products.c.is_active, mirror_products.c.removed_at).where(
        mirror_products.c.upstream == "b", mirror_products.c.id == offered_id
    )
    (row,) = await sql_rows(chain.c.database, statement)
    assert (row.is_active, row.removed_at) == (False, None)
    changes = select(mirror_changes.c.field, mirror_changes.c.new_value).where(
        mirror_changes.c.upstream == "b",
        mirror_changes.c.entity == "product",
        mirror_changes.c.entity_id == offered_id,
    )
    assert ("is_active", "false") in [tuple(change) for change in await sql_rows(chain.c.database, changes)]


async def test_products_never_offered_are_not_shown_and_ids_stay(chain: Chain) -> None:
    """Only products B offered before are listed inactive: one the top lists off sale from the start (B
    never offered it) is not; a product B stops pricing (its every SKU priced in another currency) is, once
    it had been offered, and so is one the top deletes; their ids never change."""
    state = chain.top.state
    never = state.add_product(price="3.00", is_active=False, title="Never on sale")
    await chain.b_pass(full=True)
    async with chain.signed() as client:
        _, listed = await products(client, include_inactive="true")
        ids = {p["title"]["en-US"]: p["id"] for p in listed}
        assert "Never on sale" not in ids
        assert len(listed) == PRODUCTS
        deleted = on_sale(chain.top)
        state.remove_product(deleted)
        await chain.b_pass(full=True)
        asked, again = await products(client, include_inactive="true")
        plain, _ = await products(client)
    assert never not in {p["id"] for p in again}
    assert {p["title"]["en-US"]: p["id"] for p in again} == ids
    gone = next(p for p in again if p["title"] == state.product(deleted).title)
    assert gone["is_active"] is False
    assert (asked["total"], plain["total"]) == (PRODUCTS, PRODUCTS - 1)
    assert Decimal(gone["price_amount"]) >= 0
