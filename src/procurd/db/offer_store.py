"""Statements of offers: a storefront SKU code and its upstream SKUs in priority order."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import Connection, Select, delete, func, insert, select, update

from procurd.core.records import Offer as Offer  # re-exported: the state path names it from here
from procurd.db.schema import offer_sources, offers


class OfferStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def put(self, code: str, sources: Sequence[tuple[str, int]], now: datetime) -> bool:
        """Create the offer or replace its sources; True when it is new."""
        found = self.connection.execute(
            select(offers.c.code).where(offers.c.code == code).with_for_update()
        ).first()
        if found is None:
            self.connection.execute(insert(offers).values(code=code, created_at=now, updated_at=now))
        else:
            self.connection.execute(update(offers).where(offers.c.code == code).values(updated_at=now))
            self.connection.execute(delete(offer_sources).where(offer_sources.c.code == code))
        rows = [
            {"code": code, "position": position, "upstream": upstream, "sku_id": sku_id}
            for position, (upstream, sku_id) in enumerate(sources)
        ]
        self.connection.execute(insert(offer_sources), rows)
        return found is None

    def delete(self, code: str) -> bool:
        self.connection.execute(delete(offer_sources).where(offer_sources.c.code == code))
        return self.connection.execute(delete(offers).where(offers.c.code == code)).rowcount > 0

    def get(self, code: str) -> Offer | None:
        return self.many([code]).get(code)

    def many(self, codes: Iterable[str]) -> dict[str, Offer]:
        wanted = sorted(set(codes))
        if not wanted:
            return {}
        return self._offers(select(offers).where(offers.c.code.in_(wanted)))

    def page(self, page: int, page_size: int) -> tuple[int, list[Offer]]:
        """One page of offers by code, and how many there are."""
        total = self.connection.execute(select(func.count()).select_from(offers)).scalar_one()
        statement = select(offers).order_by(offers.c.code).limit(page_size).offset((page - 1) * page_size)
        return int(total), list(self._offers(statement).values())

    def _offers(self, statement: Select[tuple[str, datetime, datetime]]) -> dict[str, Offer]:
        heads = list(self.connection.execute(statement).mappings())
        if not heads:
            return {}
        codes = [head["code"] for head in heads]
        sources: dict[str, list[tuple[str, int]]] = {code: [] for code in codes}
        rows = self.connection.execute(
            select(offer_sources.c.code, offer_sources.c.upstream, offer_sources.c.sku_id)
            .where(offer_sources.c.code.in_(codes))
            .order_by(offer_sources.c.code, offer_sources.c.position)
        )
        for code, upstream, sku_id in rows:
            sources[code].append((upstream, int(sku_id)))
        return {
            head["code"]: Offer(
                head["code"], tuple(sources[head["code"]]), head["created_at"], head["updated_at"]
            )
            for head in heads
        }
