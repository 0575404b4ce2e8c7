"""An acg-faka supplier's goods as seed 000's catalogue: categories, one product per commodity, one SKU per
orderable choice (ids from the :class:`~procurd.protocol.acgfaka.ports.ChoiceBook`). Being written."""

from __future__ import annotations

from collections.abc import Container
from datetime import datetime
from typing import Any

from procurd.config import UpstreamSettings
from procurd.protocol.acgfaka.client import AcgFakaClient
from procurd.protocol.acgfaka.ports import ChoiceBook
from procurd.upstream.models import CatalogPage, Product, SeenPage
from procurd.upstream.ratelimit import Priority


class AcgFakaCatalogue:
    def __init__(self, settings: UpstreamSettings, client: AcgFakaClient, choices: ChoiceBook) -> None:
        self.settings = settings
        self.client = client
        self.choices = choices

    async def catalog_categories(self, *, priority: Priority = Priority.CATALOG) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def catalog_page(
        self,
        page: int = 1,
        page_size: int = 20,
        *,
        updated_after: datetime | None = None,
        priority: Priority = Priority.CATALOG,
        seen: Container[bytes] | None = None,
    ) -> CatalogPage | SeenPage:
        raise NotImplementedError

    async def product(self, product_id: int, *, priority: Priority = Priority.CATALOG) -> Product:
        raise NotImplementedError
