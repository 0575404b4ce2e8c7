"""Pages of the offered catalogue kept in memory, for as long as the catalogue is as it was.

Every downstream site reads the whole catalogue every few minutes, most of them the same pages at the same
time. A page is built once (read from the database and, for a price tier, repriced product by product) and
then answered from memory to every account of the same tier, until the offered catalogue's version moves:
each refresh that writes a product moves it in the same transaction, in whatever process it runs, and every
request reads the version first. So a page is never answered with a price older than the last refresh.

Pages are kept gzip-compressed and sent so to the clients that take gzip (the real sites' clients do), which
keeps a 10,000-product catalogue in about 2 MB per tier. At most ``budget_bytes`` of pages are kept (the
least recently used go first), and a page that several requests miss at once is built once.
"""

from __future__ import annotations

import asyncio
import gzip
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

DEFAULT_BUDGET_BYTES = 16 * 1024 * 1024


ANSWER_GZIP_LEVEL = 5  # a page of 100 products: 150 KB of JSON in 18 KB, compressed in about 1 ms


@dataclass(frozen=True, slots=True)
class Page:
    """A page as answered: how many products match in all, and the whole answer, gzip-compressed (one eighth
    of its size: what is kept, and what most clients take as it is)."""

    total: int
    answer: bytes

    @classmethod
    def of(cls, total: int, answer: bytes) -> Page:
        return cls(total, gzip.compress(answer, compresslevel=ANSWER_GZIP_LEVEL, mtime=0))

    @property
    def size(self) -> int:
        return len(self.answer) + 128


class PageCache:
    """Pages by key, valid for one version of the offered catalogue."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.version: int | None = None
        self._pages: OrderedDict[Hashable, Page] = OrderedDict()
        self._building: dict[Hashable, asyncio.Future[Page]] = {}
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def _at(self, version: int) -> None:
        """Forget every page of another version."""
        if version != self.version:
            self.version = version
            self._pages.clear()
            self._bytes = 0

    async def get(
        self, version: int, key: Hashable, build: Callable[[], Awaitable[tuple[int, Page]]]
    ) -> Page:
        """The page ``key`` of catalogue ``version``, built by ``build`` when not kept (``build`` answers the
        version it read the page at, and the page; a page of another version than asked is answered but not
        kept unless it is the newer)."""
        self._at(version)
        page = self._pages.get(key)
        if page is not None:
            self._pages.move_to_end(key)
            self.hits += 1
            return page
        self.misses += 1
        pending = self._building.get((version, key))
        if pending is not None:
            await asyncio.wait({pending})  # cancels nothing of the other request's
            if not pending.cancelled() and pending.exception() is None:
                return pending.result()
            return await self._build(version, key, build, share=False)  # that build failed: try again
        return await self._build(version, key, build, share=True)

    async def _build(
        self, version: int, key: Hashable, build: Callable[[], Awaitable[tuple[int, Page]]], *, share: bool
    ) -> Page:
        future: asyncio.Future[Page] | None = None
        if share:
            future = asyncio.get_running_loop().create_future()
            self._building[(version, key)] = future
        try:
            built_at, page = await build()
        except asyncio.CancelledError:
            if future is not None:
                future.cancel()
            raise
        except Exception as exc:
            if future is not None:
                future.set_exception(exc)
                future.exception()  # retrieved here: the requests waiting for it build their own
            raise
        finally:
            if share:
                del self._building[(version, key)]
        if future is not None:
            future.set_result(page)
        if built_at >= version:
            self._at(built_at)
            self._keep(key, page)
        return page

    def _keep(self, key: Hashable, page: Page) -> None:
        size = page.size
        if size > self.budget_bytes:
            return
        previous = self._pages.pop(key, None)
        if previous is not None:
            self._bytes -= previous.size
        self._pages[key] = page
        self._bytes += size
        while self._bytes > self.budget_bytes:
            _, oldest = self._pages.popitem(last=False)
            self._bytes -= oldest.size
