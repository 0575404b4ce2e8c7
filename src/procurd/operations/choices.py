"""The SKU ids of the choices of upstreams that number none (acg-faka), kept in the database: the
:class:`procurd.protocol.acgfaka.ports.ChoiceBook` the runtime gives their adapters."""

from __future__ import annotations

from collections.abc import Sequence

from procurd.core.clock import utcnow
from procurd.core.records import ListedChoice, MirroredProduct, UpstreamChoice
from procurd.db.database import Database
from procurd.db.views import WithChoices


class DatabaseChoices:
    def __init__(self, database: Database) -> None:
        self.database = database

    async def sku_ids(self, upstream: str, choices: Sequence[ListedChoice]) -> dict[str, int]:
        if not choices:
            return {}
        known = await self.database.read(_known, upstream, [choice.key for choice in choices])
        if len(known) == len({choice.key for choice in choices}):
            return known  # a pass that finds no new choice writes nothing
        return await self.database.write(_assign, upstream, choices)

    async def choice(self, upstream: str, sku_id: int) -> UpstreamChoice | None:
        return await self.database.read(_choice, upstream, sku_id)

    async def product(self, upstream: str, product_id: int) -> MirroredProduct | None:
        return await self.database.read(_product, upstream, product_id)


def _known(tx: WithChoices, upstream: str, keys: list[str]) -> dict[str, int]:
    return {key: choice.sku_id for key, choice in tx.choices.known(upstream, keys).items()}


def _assign(tx: WithChoices, upstream: str, choices: Sequence[ListedChoice]) -> dict[str, int]:
    return tx.choices.assign(upstream, choices, utcnow())


def _choice(tx: WithChoices, upstream: str, sku_id: int) -> UpstreamChoice | None:
    return tx.choices.of(upstream, sku_id)


def _product(tx: WithChoices, upstream: str, product_id: int) -> MirroredProduct | None:
    return tx.choices.product(upstream, product_id)
