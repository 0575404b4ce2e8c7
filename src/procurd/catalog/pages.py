"""The page memory: what a process remembers of an upstream's last full pass, page by page.

A :class:`FetchedPage` is a page of listed products (:class:`procurd.core.listing.ListedProduct`) as the
pass's writer takes it; a :class:`PackedPage` is a page kept between passes in one block of bytes, by the
SHA-256 of its body, in the :class:`PageMemory` of one upstream.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from procurd.core.catalog import DIGEST_BYTES, Entity, Snapshot
from procurd.core.listing import ListedProduct

# A remembered product: id, category id, whether it has one, digest, number of SKUs (their ids follow).
PACKED_PRODUCT: Final = struct.Struct(f"<qq?{DIGEST_BYTES}sH")


@dataclass(frozen=True, slots=True)
class PackedPage:
    """A remembered page as kept between passes: one bytes object instead of an object per product, so a
    large catalogue costs little memory and pins none of the pass's freed memory."""

    total: int
    page: int
    page_size: int
    body_digest: bytes
    packed: bytes
    includes_inactive: bool | None = None

    def unpack(self) -> FetchedPage:
        products = []
        offset, end = 0, len(self.packed)
        while offset < end:
            identity, category, has_category, digest, sku_count = PACKED_PRODUCT.unpack_from(
                self.packed, offset
            )
            offset += PACKED_PRODUCT.size
            sku_ids = struct.unpack_from(f"<{sku_count}q", self.packed, offset)
            offset += 8 * sku_count
            products.append(ListedProduct(identity, category if has_category else None, sku_ids, digest))
        return FetchedPage(
            self.page,
            tuple(products),
            self.total,
            self.page_size,
            self.body_digest,
            self,
            self.includes_inactive,
        )


class PageMemory:
    """The product pages of one upstream's last complete pass in this process, by the SHA-256 of their body.

    A full pass hands the client these digests: a page answered byte for byte as before is not decoded, and
    its products, as listed then, are checked against the mirror's digests instead (a page whose products
    the mirror no longer holds so is fetched again and decoded). The pages are trusted only while no pass
    but this memory's own has run on the upstream since the one that remembered them (another process's,
    an operator's ``procurd catalog sync``); a pass that fails forgets them.
    """

    def __init__(self) -> None:
        self._run_id: int | None = None
        self._pages: dict[bytes, PackedPage] = {}

    def recall(self, last_run_id: int | None) -> Mapping[bytes, PackedPage]:
        """The remembered pages, if the upstream's newest run ``last_run_id`` is the one that left them."""
        if last_run_id is None or last_run_id != self._run_id:
            self.forget()
        return self._pages

    def passed(self, run_id: int, pages: dict[bytes, PackedPage] | None) -> None:
        """Run ``run_id`` completed: a full pass's ``pages`` replace the remembered ones; an incremental pass
        (``None``) keeps them (what it changed no longer matches the mirror's digests)."""
        self._run_id = run_id
        if pages is not None:
            self._pages = pages

    def forget(self) -> None:
        self._run_id = None
        self._pages = {}

    def __len__(self) -> int:
        return len(self._pages)


@dataclass(frozen=True, slots=True)
class FetchedPage:
    """A page of products as the writer takes it: decoded and digested, or unpacked from memory."""

    page: int
    products: Sequence[ListedProduct]
    total: int
    page_size: int
    body_digest: bytes  # empty when the client was not asked for it
    packed: PackedPage | None = None  # the remembered page it was unpacked from
    includes_inactive: bool | None = None  # the answer's echo (its body, and so its echo, is remembered)

    @property
    def rows(self) -> int:
        return sum(1 + len(listed.sku_ids) for listed in self.products)

    def unchanged_in(self, snapshot: Mapping[Entity, Snapshot]) -> bool:
        return all(listed.unchanged_in(snapshot) for listed in self.products)

    def pack(self) -> PackedPage | None:
        """This page's listing (ids, digests, categories; no payloads) in one block of bytes, or None when an
        id does not fit 64 bits or a product has more SKUs than a count of 16 bits holds."""
        if self.packed is not None:
            return self.packed
        parts = []
        try:
            for listed in self.products:
                category = listed.category_id
                parts.append(
                    PACKED_PRODUCT.pack(
                        listed.id, category or 0, category is not None, listed.digest, len(listed.sku_ids)
                    )
                )
                parts.append(struct.pack(f"<{len(listed.sku_ids)}q", *listed.sku_ids))
        except struct.error:
            return None
        return PackedPage(
            self.total, self.page, self.page_size, self.body_digest, b"".join(parts), self.includes_inactive
        )
