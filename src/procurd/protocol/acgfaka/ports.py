"""What acg-faka's adapter needs kept beside the supplier, given by the operations (it stores nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from procurd.core.records import ListedChoice, MirroredProduct, UpstreamChoice
from procurd.core.trades import Trade


class ChoiceBook(Protocol):
    """The SKU ids procurd gives an acg-faka supplier's choices (the supplier numbers none)."""

    async def sku_ids(self, upstream: str, choices: Sequence[ListedChoice]) -> dict[str, int]:
        """The SKU id of each choice, by key: the one it had, or a new one (stable, never reused)."""

    async def choice(self, upstream: str, sku_id: int) -> UpstreamChoice | None:
        """What SKU ``sku_id`` of ``upstream`` stands for, or None when procurd never gave that id."""

    async def product(self, upstream: str, product_id: int) -> MirroredProduct | None:
        """The mirror's row of the commodity ``product_id`` (its buyer inputs and its ``acg_faka`` extras),
        or None when the mirror holds none."""


class TradeBook(Protocol):
    """Where an acg-faka supplier's trades are recorded, and the lease that keeps its member account to one
    trade at a time across every instance (the supplier's trade can deadlock against a second one)."""

    async def hold(self, account: str, token: str, seconds: float) -> bool:
        """Take the lease of ``account`` for ``seconds`` (False: another holds it)."""

    async def renew(self, account: str, token: str, seconds: float) -> bool:
        """Extend the lease of ``account`` this ``token`` holds to ``seconds`` from now (False: it is not
        held under ``token`` any more)."""

    async def let_go(self, account: str, token: str) -> None:
        """Give the lease of ``account`` up."""

    async def recorded(self, upstream: str, request_no: str) -> Trade | None:
        """The trade recorded under ``request_no``, if any."""

    async def begin(self, trade: Trade) -> Trade:
        """Record ``trade`` as being sent, or answer the one already recorded under its number that may
        have bought (then nothing is recorded: the caller must not send)."""

    async def answered(self, trade: Trade) -> None:
        """Record the answer of a trade ``begin`` recorded."""

    async def by_trade_no(self, upstream: str, trade_no: str) -> Trade | None:
        """The trade of ``upstream`` that the supplier numbered ``trade_no``."""
