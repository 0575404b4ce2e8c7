"""Statements of ``upstream_choices``: the SKU ids procurd gives the choices of an upstream numbering none."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, insert, select

from procurd.core.records import ListedChoice, MirroredProduct, UpstreamChoice
from procurd.db.schema import mirror_products, upstream_choices

CHUNK = 500  # keys in one IN list


def _choice(row: Any) -> UpstreamChoice:
    return UpstreamChoice(
        upstream=row.upstream,
        key=row.choice_key,
        sku_id=int(row.sku_id),
        product_id=int(row.product_id),
        code=row.code,
        race=row.race,
        options=tuple((str(group), str(option)) for group, option in row.options),
        first_seen_at=row.first_seen_at,
    )


class ChoiceStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def known(self, upstream: str, keys: Iterable[str]) -> dict[str, UpstreamChoice]:
        """The choices of ``upstream`` among ``keys`` that already have an id, by key."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, UpstreamChoice] = {}
        for start in range(0, len(wanted), CHUNK):
            rows = self.connection.execute(
                select(upstream_choices).where(
                    upstream_choices.c.upstream == upstream,
                    upstream_choices.c.choice_key.in_(wanted[start : start + CHUNK]),
                )
            )
            found.update((row.choice_key, _choice(row)) for row in rows)
        return found

    def assign(self, upstream: str, choices: Sequence[ListedChoice], now: datetime) -> dict[str, int]:
        """The SKU id of each choice, by key: the one it had, or the next of ``upstream``'s (never reused).
        Two writers giving out the same id cannot both commit (the key and the id are unique)."""
        known = self.known(upstream, (choice.key for choice in choices))
        ids = {key: choice.sku_id for key, choice in known.items()}
        new = [choice for choice in {c.key: c for c in choices}.values() if choice.key not in ids]
        if not new:
            return ids
        top = self.connection.execute(
            select(func.max(upstream_choices.c.sku_id)).where(upstream_choices.c.upstream == upstream)
        ).scalar()
        next_id = int(top or 0) + 1
        rows = []
        for offset, choice in enumerate(new):
            ids[choice.key] = next_id + offset
            rows.append(
                {
                    "upstream": upstream,
                    "sku_id": next_id + offset,
                    "choice_key": choice.key,
                    "product_id": choice.product_id,
                    "code": choice.code,
                    "race": choice.race,
                    "options": [[group, option] for group, option in choice.options],
                    "first_seen_at": now,
                }
            )
        self.connection.execute(insert(upstream_choices), rows)
        return ids

    def of(self, upstream: str, sku_id: int) -> UpstreamChoice | None:
        """The choice SKU ``sku_id`` of ``upstream`` stands for, or None when procurd never gave that id."""
        row = self.connection.execute(
            select(upstream_choices).where(
                upstream_choices.c.upstream == upstream, upstream_choices.c.sku_id == sku_id
            )
        ).first()
        return None if row is None else _choice(row)

    def product(self, upstream: str, product_id: int) -> MirroredProduct | None:
        """The mirror's row of product ``product_id`` of ``upstream`` (its form and extras), or None."""
        row = self.connection.execute(
            select(mirror_products.c.manual_form_schema, mirror_products.c.extra).where(
                mirror_products.c.upstream == upstream, mirror_products.c.id == product_id
            )
        ).first()
        if row is None:
            return None
        extra = row.extra if isinstance(row.extra, dict) else None
        return MirroredProduct(upstream, product_id, row.manual_form_schema, extra)
