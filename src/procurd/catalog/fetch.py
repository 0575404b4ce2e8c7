"""The fetch pipeline of a catalogue pass: pages from the upstream to the pass's writer.

Pages are fetched by ``concurrency`` workers and decoded once, each product digested against the mirror's
snapshot as it arrives (:meth:`procurd.core.listing.ListedProduct.of`); they wait for the single writer in a
queue, and the writer takes as many as have arrived (up to :data:`WRITE_BATCH_ROWS` rows) into one write.
Pages fetched but not yet stored are bounded by a window, so that memory does not grow when fetching outpaces
writing, yet fetching goes on while the writer stores a batch.

A full pass hands the upstream client the digests of the pages it remembers (:mod:`procurd.catalog.pages`):
a page answered byte for byte as before is not decoded but taken from memory, if the mirror still holds its
products as they were listed then; otherwise it is fetched again and decoded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Container, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Final

import structlog

from procurd.catalog.pages import FetchedPage, PackedPage
from procurd.catalog.ports import CatalogClient
from procurd.core.catalog import Entity, Snapshot
from procurd.core.listing import ListedProduct
from procurd.upstream.models import CatalogPage, SeenPage
from procurd.upstream.ratelimit import Priority

log = structlog.get_logger("procurd.catalog")

# Rows (products plus SKUs) the writer gathers from queued pages into one transaction at most.
WRITE_BATCH_ROWS: Final = 2000


class Failure:
    """The first failure among a pass's concurrent parts (fetch workers, writer, lease keeper): once one is
    set, the others stop at their next step."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def set(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error

    def raise_if_set(self) -> None:
        if self.error is not None:
            raise self.error


class _Done:
    """The end of the page queue."""


_DONE: Final = _Done()

PageCheck = Callable[[CatalogPage | FetchedPage, int], None]
"""``check(page, number)``: what the pass checks of each answered page (raising ends the fetching)."""
PageWriter = Callable[[Sequence[FetchedPage]], Awaitable[None]]
"""``store(pages)``: the pass's writer, given the pages of one batch."""


class PageFetcher:
    """Fetches one pass's pages of products: the first alone, the rest through the pipeline.

    The pass sets :attr:`seen`, the remembered pages a full pass offers the client (none for an incremental
    pass), :attr:`updated_after`, what an incremental pass asks for (None for a full pass), and
    :attr:`snapshot`, the mirror's once loaded: decoding digests products against it.
    """

    def __init__(self, client: CatalogClient, upstream: str, *, concurrency: int, failure: Failure) -> None:
        self._client = client
        self._upstream = upstream
        self._concurrency = concurrency
        self._failure = failure
        self.updated_after: datetime | None = None
        self.seen: Mapping[bytes, PackedPage] = {}
        self.snapshot: Mapping[Entity, Snapshot] = {}
        self.unchanged_pages = 0
        """Pages answered byte for byte as in the previous pass, and so not decoded."""
        # Pages being fetched or waiting to be stored: bounded, so memory does not grow when fetching outpaces
        # writing, yet wide enough that fetching goes on while the writer stores a batch.
        self._window = asyncio.Semaphore(max(2, 2 * concurrency))

    async def first(self, page_size: int) -> CatalogPage | SeenPage:
        """The first page's answer, as it came (:meth:`resolve` it once the snapshot is loaded)."""
        return await self._request(1, page_size, self.seen)

    async def page(self, number: int, page_size: int) -> CatalogPage | FetchedPage:
        answer = await self._request(number, page_size, self.seen)
        return await self.resolve(number, page_size, answer)

    async def resolve(
        self, number: int, page_size: int, answer: CatalogPage | SeenPage
    ) -> CatalogPage | FetchedPage:
        """A page answered as one this process remembers becomes that page, if the mirror still holds its
        products as listed then; otherwise it is fetched again and decoded."""
        if isinstance(answer, CatalogPage):
            return answer
        remembered = self.seen[answer.body_digest].unpack()
        if remembered.unchanged_in(self.snapshot):
            self.unchanged_pages += 1
            return remembered
        log.info("catalog.page_fetched_again", upstream=self._upstream, page=number)
        fetched = await self._request(number, page_size, ())
        assert isinstance(fetched, CatalogPage)
        return fetched

    def decoded(self, page: CatalogPage | FetchedPage) -> FetchedPage:
        """A page as the writer takes it: each product digested against the snapshot."""
        if isinstance(page, FetchedPage):
            return page
        products = [ListedProduct.of(item, self.snapshot) for item in page.items]
        return FetchedPage(
            page.page, products, page.total, page.page_size, page.body_digest, None, page.includes_inactive
        )

    async def _request(self, number: int, page_size: int, seen: Container[bytes]) -> CatalogPage | SeenPage:
        return await self._client.catalog_page(
            number, page_size, updated_after=self.updated_after, priority=Priority.CATALOG, seen=seen
        )

    # --- the pipeline ---------------------------------------------------------------------------------------

    async def run(
        self, first: FetchedPage, pages_total: int, page_size: int, *, check: PageCheck, store: PageWriter
    ) -> None:
        """Store ``first`` and fetch pages 2 to ``pages_total``, each ``check``ed, decoded and handed to
        ``store`` in batches; stops at the first failure (set on the pass's :class:`Failure`)."""
        await self._window.acquire()
        queue: asyncio.Queue[FetchedPage | _Done] = asyncio.Queue()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._write_pages(queue, store))
            tasks.create_task(self._fetch_pages(queue, first, pages_total, page_size, check))

    async def _fetch_pages(
        self,
        queue: asyncio.Queue[FetchedPage | _Done],
        first: FetchedPage,
        pages_total: int,
        page_size: int,
        check: PageCheck,
    ) -> None:
        queue.put_nowait(first)
        numbers = iter(range(2, pages_total + 1))
        async with asyncio.TaskGroup() as tasks:
            for _ in range(min(self._concurrency, pages_total - 1)):
                tasks.create_task(self._fetch_worker(numbers, queue, page_size, check))
        queue.put_nowait(_DONE)

    async def _fetch_worker(
        self,
        numbers: Iterator[int],
        queue: asyncio.Queue[FetchedPage | _Done],
        page_size: int,
        check: PageCheck,
    ) -> None:
        for number in numbers:
            await self._window.acquire()
            if self._failure.error is not None:
                self._window.release()
                return
            try:
                page = await self.page(number, page_size)
                check(page, number)
                fetched = self.decoded(page)
            except Exception as exc:  # noqa: BLE001 - ends the fetching; the pass records it as failed
                self._window.release()
                self._failure.set(exc)
                return
            queue.put_nowait(fetched)

    async def _write_pages(self, queue: asyncio.Queue[FetchedPage | _Done], store: PageWriter) -> None:
        finished = False
        while not finished:
            pages: list[FetchedPage] = []
            rows = 0
            item = await queue.get()
            while True:
                if isinstance(item, _Done):
                    finished = True
                    break
                pages.append(item)
                rows += item.rows
                if queue.empty() or rows >= WRITE_BATCH_ROWS:
                    break
                item = queue.get_nowait()
            if pages and self._failure.error is None:
                try:
                    await store(pages)
                except Exception as exc:  # noqa: BLE001 - stops the fetchers; the pass records it as failed
                    self._failure.set(exc)
            for _ in pages:
                self._window.release()
