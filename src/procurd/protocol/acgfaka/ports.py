"""What acg-faka's adapter needs kept beside the supplier, given by the operations (it stores nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from procurd.core.records import ListedChoice, UpstreamChoice


class ChoiceBook(Protocol):
    """The SKU ids procurd gives an acg-faka supplier's choices (the supplier numbers none)."""

    async def sku_ids(self, upstream: str, choices: Sequence[ListedChoice]) -> dict[str, int]:
        """The SKU id of each choice, by key: the one it had, or a new one (stable, never reused)."""

    async def choice(self, upstream: str, sku_id: int) -> UpstreamChoice | None:
        """What SKU ``sku_id`` of ``upstream`` stands for, or None when procurd never gave that id."""
