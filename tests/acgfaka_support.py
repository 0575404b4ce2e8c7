"""procurd buying from the sandbox acg-faka shop: the shop's goods (those of test_acgfaka_client), the
``[[upstreams]]`` block, and the shop mirrored by a catalogue pass, with the SKU ids procurd gave the choices
a test buys found in the mirror."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from procurd.catalog.sync import SyncReport
from procurd.config import Settings
from procurd.db.database import Database
from procurd.db.schema import mirror_products, mirror_skus
from procurd.sandbox.acgfaka import DEFAULT_APP_ID, AcgFakaSandbox, ShopConfig
from procurd.sandbox.acgfaka.shop import DEFAULT_APP_KEY
from procurd.sandbox.acgfaka.testing import ControlClient
from support import mirror, sql_rows
from test_acgfaka_client import CARD, MANUAL, PLAIN, build_shop

__all__ = [
    "CARD", "MANUAL", "PLAIN", "Choice", "Mirrored", "acg_block", "mirror_shop", "running_shop", "sku_of",
]  # fmt: skip


@asynccontextmanager
async def running_shop() -> AsyncIterator[AcgFakaSandbox]:
    """The sandbox shop with test_acgfaka_client's goods: CARD (variants 月卡/年卡, add-on 区服; 3 cards of
    月卡 一区), PLAIN (12 cards at 5.00), MANUAL (by hand, a game_uid input), EMPTY (no cards)."""
    async with AcgFakaSandbox(ShopConfig(commodities=0)) as shop:
        async with ControlClient(shop.base_url) as control:
            await build_shop(control)
        yield shop


def acg_block(shop: AcgFakaSandbox, name: str = "acg", **overrides: Any) -> dict[str, Any]:
    """An ``[[upstreams]]`` block for the shop's default member, with test timeouts."""
    return {
        "name": name,
        "protocol": "acg-faka",
        "base_url": shop.base_url,
        "app_id": str(DEFAULT_APP_ID),
        "app_key": DEFAULT_APP_KEY,
        "timeout_seconds": 5,
        "trade_timeout_seconds": 5,
        "max_requests_per_second": 1000,
        "ping_interval_seconds": 3600,
        **overrides,
    }


@dataclass(frozen=True, slots=True)
class Choice:
    """One orderable choice of the shop: a commodity (its code), its variant, and its add-on options."""

    code: str
    race: str | None = None
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Mirrored:
    """What a catalogue pass of the shop gave: the SKU ids of the wanted choices (in the order asked for),
    and the pass (a daemon started later runs a pass of its own, which begins after this one)."""

    skus: list[int]
    report: SyncReport


async def mirror_shop(settings: Settings, *choices: Choice, upstream: str = "acg") -> Mirrored:
    """Mirror the shop with a catalogue pass of the daemon's own upstream (every upstream of ``settings`` is
    mirrored), then find in the mirror the SKU ids procurd gave ``choices``."""
    reports = await mirror(settings)
    skus = [await sku_of(settings.database.url, choice, upstream) for choice in choices]
    return Mirrored(skus, reports[upstream])


async def sku_of(database: Database | str, choice: Choice, upstream: str = "acg") -> int:
    """The id of the mirror's one SKU for ``choice``: of the product whose commodity code it names, the SKU
    of its variant and add-on options."""
    statement = (
        select(mirror_skus.c.id, mirror_skus.c.extra.label("sku"), mirror_products.c.extra.label("product"))
        .join(
            mirror_products,
            (mirror_products.c.upstream == mirror_skus.c.upstream)
            & (mirror_products.c.id == mirror_skus.c.product_id),
        )
        .where(mirror_skus.c.upstream == upstream)
    )
    wanted = sorted([group, option] for group, option in choice.options)
    found = [
        row.id
        for row in await sql_rows(database, statement)
        if row.product["acg_faka"]["code"] == choice.code
        and row.sku["race"] == choice.race
        and sorted(row.sku["options"]) == wanted
    ]
    assert len(found) == 1, (choice, found)
    return int(found[0])
