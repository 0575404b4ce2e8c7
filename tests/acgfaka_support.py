"""procurd buying from the sandbox acg-faka shop: the shop's goods (those of test_acgfaka_client), the
``[[upstreams]]`` block, and the mirror rows and SKU ids of its choices written straight into the database
(what the catalogue pass will write; until it runs for acg-faka, the tests write them as it would: the
commodity's form and its ``acg_faka`` extras as the goods model gives them)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert

from procurd.core.clock import utcnow
from procurd.core.records import ListedChoice
from procurd.db.database import open_database
from procurd.db.schema import mirror_categories, mirror_products, mirror_skus
from procurd.protocol.acgfaka.goods import choice_key
from procurd.protocol.acgfaka.widgets import form_schema, read_widgets
from procurd.sandbox.acgfaka import DEFAULT_APP_ID, AcgFakaSandbox, ShopConfig
from procurd.sandbox.acgfaka.shop import DEFAULT_APP_KEY
from procurd.sandbox.acgfaka.testing import ControlClient
from test_acgfaka_client import CARD, MANUAL, PLAIN, build_shop

__all__ = ["CARD", "MANUAL", "PLAIN", "Listed", "acg_block", "list_choices", "running_shop"]


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
class Listed:
    """One choice of the shop as the mirror lists it."""

    code: str
    race: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    price: str = "5.00"
    manual: bool = False


async def list_choices(
    database_url: str, shop: AcgFakaSandbox, choices: Sequence[Listed], upstream: str = "acg"
) -> list[int]:
    """Give the choices their SKU ids and write them into the mirror as a catalogue pass would: one product
    per commodity (its id), one SKU per choice. The SKU ids, in the order given."""
    now = utcnow()
    database = open_database(database_url)
    try:
        listed = []
        for choice in choices:
            commodity = shop.shop.by_code(choice.code)
            assert commodity is not None, choice.code
            key = choice_key(choice.code, choice.race, choice.options)
            listed.append(ListedChoice(key, commodity.id, choice.code, choice.race, choice.options))
        ids = await database.write(lambda tx: tx.choices.assign(upstream, listed, now))
        sku_ids = [ids[item.key] for item in listed]

        def write(tx: Any) -> None:
            mirrored = {"synced_at": now, "content_hash": "0" * 32, "upstream": upstream}
            tx.connection.execute(
                insert(mirror_categories).values(
                    id=1, parent_id=0, slug="1", name={"zh-CN": "测试"}, icon="", sort_order=0,
                    is_active=True, **mirrored,
                )
            )  # fmt: skip
            products: dict[int, Listed] = {}
            for item, choice in zip(listed, choices, strict=True):
                products.setdefault(item.product_id, choice)
            for product_id, choice in products.items():
                commodity = shop.shop.commodities[product_id]
                chained = commodity.shared_id is not None
                # the form and the extras as protocol.acgfaka.goods.product_record gives them
                schema = form_schema(read_widgets(commodity.widgets))
                extra = {
                    "acg_faka": {
                        "code": choice.code,
                        "delivery_way": commodity.delivery_way,
                        "chained": chained,
                    }
                }
                tx.connection.execute(
                    insert(mirror_products).values(
                        id=product_id, slug=choice.code, title={"zh-CN": choice.code}, images=[], tags=[],
                        price_amount=choice.price,
                        fulfillment_type="manual" if choice.manual or chained else "auto",
                        manual_form_schema=schema, is_active=True, category_id=1,
                        **{**mirrored, "extra": extra},
                    )
                )  # fmt: skip
            for item, choice, sku_id in zip(listed, choices, sku_ids, strict=True):
                tx.connection.execute(
                    insert(mirror_skus).values(
                        id=sku_id, product_id=item.product_id, sku_code=item.key, price_amount=choice.price,
                        stock_status="in_stock", stock_quantity=-1, is_active=True, **mirrored,
                    )
                )  # fmt: skip

        await database.write(write)
        return sku_ids
    finally:
        await database.close()
