"""Pages of the offered catalogue kept in memory: answered again while the catalogue's version stands, never
once a refresh (in any process) has moved it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

from procurd.provider.pages import Page, PageCache
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import SignedClient
from provider_support import add_account, provider_config, provider_settings, settled
from scale_cluster import to_toml
from support import mirror, run_cli, running_daemon, wait_until

Build = Callable[[], Awaitable[tuple[int, Page]]]


def page(answer: bytes) -> Page:
    return Page(1, answer)


def builder(version: int, body: bytes, built: list[int] | None = None) -> Build:
    """A build that reads ``body`` at catalogue ``version`` (noting the version in ``built``)."""

    async def build() -> tuple[int, Page]:
        if built is not None:
            built.append(version)
        return version, page(body)

    return build


async def test_a_page_is_built_once_and_answered_until_the_version_moves() -> None:
    """The same key at the same version is built once and then answered from memory; at a newer version it
    is built again, and the older version's pages are forgotten."""
    cache = PageCache()
    built: list[int] = []
    first = await cache.get(1, "p1", builder(1, b"old", built))
    again = await cache.get(1, "p1", builder(1, b"never built", built))
    newer = await cache.get(2, "p1", builder(2, b"new", built))
    assert (first.answer, again.answer, newer.answer) == (b"old", b"old", b"new")
    assert built == [1, 2]
    assert (cache.hits, cache.misses) == (1, 2)
    assert (await cache.get(2, "p1", builder(2, b"kept"))).answer == b"new"


async def test_a_page_read_at_an_older_version_than_asked_is_answered_but_not_kept() -> None:
    """A build that read the catalogue at an older version than the request saw (a refresh between the two
    reads is impossible, but a version that went back is not kept) answers its page and keeps nothing."""
    cache = PageCache()

    async def stale() -> tuple[int, Page]:
        return 4, page(b"older")

    assert (await cache.get(5, "p", stale)).answer == b"older"
    assert cache.bytes == 0


async def test_requests_that_miss_together_build_the_page_once() -> None:
    """Ten requests for a page nobody has built yet wait for one build and get its page."""
    cache = PageCache()
    gate = asyncio.Event()
    builds = 0

    async def build() -> tuple[int, Page]:
        nonlocal builds
        builds += 1
        await gate.wait()
        return 1, page(b"shared")

    waiting = [asyncio.create_task(cache.get(1, "p", build)) for _ in range(10)]
    await wait_until(lambda: builds == 1)
    gate.set()
    pages = await asyncio.gather(*waiting)
    assert builds == 1
    assert {p.answer for p in pages} == {b"shared"}


async def test_a_failed_build_is_tried_again_by_those_that_waited_for_it() -> None:
    """When the shared build fails, its own request gets the error and each waiting request builds the page
    itself; nothing failed is kept."""
    cache = PageCache()
    gate = asyncio.Event()
    calls = 0

    async def build() -> tuple[int, Page]:
        nonlocal calls
        calls += 1
        if calls == 1:
            await gate.wait()
            raise RuntimeError("the database went away")
        return 1, page(b"second try")

    first = asyncio.create_task(cache.get(1, "p", build))
    await wait_until(lambda: calls == 1)
    second = asyncio.create_task(cache.get(1, "p", build))
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(first, second, return_exceptions=True)
    assert isinstance(results[0], RuntimeError)
    assert isinstance(results[1], Page)
    assert results[1].answer == b"second try"


async def test_the_budget_keeps_the_most_recently_used_pages() -> None:
    """Past its byte budget the cache forgets the least recently used pages first; a page larger than the
    whole budget is answered and not kept."""
    item = b"x" * 1000
    cache = PageCache(budget_bytes=3 * page(item).size)
    for name in ("p1", "p2", "p3"):
        await cache.get(1, name, builder(1, item))
    await cache.get(1, "p1", builder(1, b"a hit: not built"))  # p1 is now the most recent
    await cache.get(1, "p4", builder(1, item))  # p2 goes
    misses = cache.misses
    assert (await cache.get(1, "p1", builder(1, b"not built"))).answer == item
    assert cache.misses == misses
    assert (await cache.get(1, "p2", builder(1, b"built again"))).answer == b"built again"
    assert cache.misses == misses + 1
    assert (await cache.get(1, "huge", builder(1, b"y" * 4000))).answer == b"y" * 4000
    assert cache.bytes <= cache.budget_bytes
    assert (await cache.get(1, "huge", builder(1, b"built once more"))).answer == b"built once more"


async def test_a_pass_in_another_process_is_seen_by_the_next_page(database_url: str, tmp_path: Path) -> None:
    """A provider daemon answers a page from memory; a price rise upstream taken in by a catalogue pass run
    from the command line (its own process, its own refresh of the offered catalogue) is in the very next
    page the daemon answers, for an account without a level and for one at a level alike."""
    levels = [{"slug": "gold", "name": {"en": "Gold"}, "discount_percent": "5"}]
    async with Sandbox(SandboxConfig(products=4, manual_ratio=0, allow_private_callbacks=True)) as top:
        config = provider_config(database_url, ("main", top), provider={"levels": levels})
        path = tmp_path / "procurd.toml"
        path.write_text(to_toml(config), encoding="utf-8")
        settings = provider_settings(database_url, ("main", top), provider={"levels": levels})
        await mirror(settings)
        async with running_daemon(settings) as daemon:
            await settled(daemon)
            plain = await add_account(daemon.operations, "plain")
            gold = await add_account(daemon.operations, "gold", level="gold")
            clients = [SignedClient(site.base_url, site.api_key, site.api_secret) for site in (plain, gold)]
            try:

                async def first_sku_price(client: SignedClient) -> tuple[int, Decimal]:
                    answer = (await client.get("/products", {"page": 1, "page_size": 100})).json()
                    sku = answer["items"][0]["skus"][0]
                    return int(sku["id"]), Decimal(sku["price_amount"])

                before = [await first_sku_price(client) for client in clients]
                again = [await first_sku_price(client) for client in clients]
                assert again == before
                assert daemon.operations.provider.pages.hits >= 2  # the second reads came from memory

                sku_id = before[0][0]
                product = next(p for p in top.state.active_products() if any(s.id == sku_id for s in p.skus))
                cost = next(s.price_amount for s in product.skus if s.id == sku_id)
                top.state.set_sku_price(sku_id, Decimal(cost) * 2)
                result = await run_cli(path, "catalog", "sync", "--full")
                assert result.exit_code == 0, result.output

                after = [await first_sku_price(client) for client in clients]
            finally:
                for client in clients:
                    await client.close()
    for (_, old), (_, new) in zip(before, after, strict=True):
        assert new > old * Decimal("1.5"), (before, after)
    assert json.dumps([str(price) for _, price in after])  # both are prices


async def test_pages_go_gzip_compressed_to_clients_that_take_it(database_url: str) -> None:
    """A page is sent gzip-compressed (``Content-Encoding: gzip``, ``Vary: Accept-Encoding``) to a client
    whose ``Accept-Encoding`` takes gzip, and plain to one that does not (or refuses it with ``q=0``): the
    same answer either way."""
    async with Sandbox(SandboxConfig(products=3, manual_ratio=0, allow_private_callbacks=True)) as top:
        settings = provider_settings(database_url, ("main", top))
        await mirror(settings)
        async with running_daemon(settings) as daemon:
            await settled(daemon)
            site = await add_account(daemon.operations, "reader")
            async with SignedClient(site.base_url, site.api_key, site.api_secret) as client:
                answers = {}
                for accept in ("gzip, deflate", "identity", "gzip;q=0", ""):
                    answer = await client.get(
                        "/products", {"page": 1, "page_size": 10}, headers={"Accept-Encoding": accept}
                    )
                    assert answer.status == 200, answer.body
                    answers[accept] = answer
    compressed = answers["gzip, deflate"]
    assert compressed.headers["Content-Encoding"] == "gzip"
    for accept in ("identity", "gzip;q=0", ""):
        assert "Content-Encoding" not in answers[accept].headers, accept
        assert answers[accept].json() == compressed.json()
    assert all(answer.headers["Vary"] == "Accept-Encoding" for answer in answers.values())
    assert compressed.json()["total"] == 3
