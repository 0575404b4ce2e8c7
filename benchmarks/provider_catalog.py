"""Benchmark of the provider's catalogue, read by many downstream sites at once.

A ``procurd run`` process (B, on SQLite, ``[provider]`` on) mirrors a sandbox upstream of ``--products``
products (3 SKUs each, the top in a child process) and offers them to ``--accounts`` accounts, a fifth of
them at a price tier. A load generator (a child process) then makes every account pull the whole catalogue
at once, ``GET /products`` page by page (``--page-size``, 100: 100 pages of 100), each request signed, one
connection per account. Measured: pages a second, B's CPU per page, B's RSS while it serves.

In the same run, the same load is sent to a bare aiohttp handler (another child process) that checks each
request's signature and answers a page serialised beforehand from memory (gzip-compressed beforehand too, to
the clients that take it, as B sends its pages): the floor no server of these pages can beat. The load
generator takes gzip, as the real sites' clients do, and reads every answer decompressed. Aim: at least
0.5 x the floor's pages a second, and B's RSS at most 120 MB while serving.

Then the benchmark changes the price of one SKU at the top, runs a catalogue pass from the command line (a
process of its own, as an operator would), and reads that SKU's page as every account: each must show the
new price (at its tier) at once, never the page kept from before.

    python benchmarks/provider_catalog.py [--products 10000] [--accounts 50] [--quick] [--include-inactive]

``--include-inactive`` asks every page as Dujiao-Next's own downstream does (``include_inactive=true``: the
products offered before and no longer on sale are listed too, inactive).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gzip
import hashlib
import hmac
import multiprocessing
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from procurement_processes import API_KEY, API_SECRET, STARTUP_DEADLINE_SECONDS, SandboxProcess
from provider_chain import Site, cpu_seconds, upstream_block, wait_for

from procurd.config import load_settings
from procurd.logs import configure_logging
from procurd.operations import open_operations

API = "/api/v1/upstream"
LEVEL = "gold"
LEVEL_DISCOUNT = "5"
FLOOR_RATIO_AIM = 0.5
RSS_AIM_MB = 120.0
SYNC_DEADLINE_SECONDS = 900.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


# --- the load: every account reads the whole catalogue ------------------------------------------------------


def signed_headers(key: str, secret: str, path: str) -> dict[str, str]:
    stamp = str(int(time.time()))
    digest = hashlib.md5(b"", usedforsecurity=False).hexdigest()
    signature = hmac.new(secret.encode(), f"GET\n{path}\n{stamp}\n{digest}".encode(), hashlib.sha256)
    return {"Service-Api-Key": key, "Service-Timestamp": stamp, "Service-Signature": signature.hexdigest()}


def catalogue_load(
    base_url: str,
    accounts: list[tuple[str, str]],
    pages: int,
    page_size: int,
    include_inactive: bool = False,
) -> dict[str, Any]:
    """Every account reads pages 1..``pages`` in order, all accounts at once (runs in a worker process)."""
    return asyncio.run(_catalogue_load(base_url, accounts, pages, page_size, include_inactive))


async def _catalogue_load(
    base_url: str, accounts: list[tuple[str, str]], pages: int, page_size: int, include_inactive: bool
) -> dict[str, Any]:
    path = API + "/products"
    failures: dict[str, int] = {}
    received = 0
    items = 0

    async def site(key: str, secret: str) -> None:
        nonlocal received, items
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            for page in range(1, pages + 1):
                query = {"page": str(page), "page_size": str(page_size)}
                if include_inactive:
                    query["include_inactive"] = "true"
                async with session.get(
                    base_url + path, params=query, headers=signed_headers(key, secret, path)
                ) as response:
                    body = await response.read()
                if response.status != 200 or not body.startswith(b'{"ok":true'):
                    reason = f"HTTP {response.status} {body[:80]!r}"
                    failures[reason] = failures.get(reason, 0) + 1
                    continue
                received += len(body)
                items += body.count(b'"sku_code"')

    started = time.perf_counter()
    await asyncio.gather(*(site(key, secret) for key, secret in accounts))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "bytes": received, "skus": items, "failures": failures}


# --- the floor: a bare handler answering pages from memory ------------------------------------------------


def _serve_floor(pages: dict[str, bytes], secrets_by_key: dict[str, str], ready: Any, stop: Any) -> None:
    """A bare aiohttp handler: checks the signature, answers the page serialised (and gzip-compressed, for the
    clients that take it, as B does) beforehand."""
    compressed = {page: gzip.compress(body, compresslevel=5, mtime=0) for page, body in pages.items()}

    async def products(request: web.Request) -> web.Response:
        key = request.headers.get("Service-Api-Key", "")
        stamp = request.headers.get("Service-Timestamp", "")
        secret = secrets_by_key.get(key)
        digest = hashlib.md5(await request.read(), usedforsecurity=False).hexdigest()
        expected = hmac.new(
            (secret or "").encode(), f"GET\n{request.path}\n{stamp}\n{digest}".encode(), hashlib.sha256
        ).hexdigest()
        if secret is None or not hmac.compare_digest(expected, request.headers.get("Service-Signature", "")):
            return web.json_response({"ok": False, "error_code": "invalid_signature"}, status=401)
        page = request.query.get("page", "1")
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            response = web.Response(body=compressed[page], content_type="application/json")
            response.headers["Content-Encoding"] = "gzip"
            return response
        return web.Response(body=pages[page], content_type="application/json")

    async def serve() -> None:
        app = web.Application()
        app.router.add_get(API + "/products", products)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        ready.send(int(runner.addresses[0][1]))
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await runner.cleanup()

    asyncio.run(serve())


# --- the benchmark ------------------------------------------------------------------------------------------


@dataclass
class Served:
    pages: int
    seconds: float
    megabytes: float
    failures: dict[str, int]
    cpu_seconds: float = 0.0
    rss_peak_mb: float = 0.0

    @property
    def per_second(self) -> float:
        return self.pages / self.seconds


async def serve_load(
    pool: concurrent.futures.ProcessPoolExecutor,
    base_url: str,
    accounts: list[tuple[str, str]],
    pages: int,
    page_size: int,
    pid: int | None,
    include_inactive: bool = False,
) -> Served:
    loop = asyncio.get_running_loop()
    cpu_before = cpu_seconds(pid) if pid else 0.0
    peak = [0]

    async def sample() -> None:
        while True:
            if pid:
                peak[0] = max(peak[0], rss_kib(pid))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        load = await loop.run_in_executor(
            pool, catalogue_load, base_url, accounts, pages, page_size, include_inactive
        )
    finally:
        sampler.cancel()
    return Served(
        pages=pages * len(accounts),
        seconds=load["seconds"],
        megabytes=load["bytes"] / 1e6,
        failures=load["failures"],
        cpu_seconds=(cpu_seconds(pid) - cpu_before) if pid else 0.0,
        rss_peak_mb=peak[0] / 1024,
    )


async def benchmark(args: argparse.Namespace, directory: Path) -> bool:
    context = multiprocessing.get_context("spawn")
    top = SandboxProcess(context, products=args.products, page_size_max=100, rate_limit=False)
    top_url = top.start()
    provider = Site("b", directory, upstream_block("top", top_url, API_KEY, API_SECRET), provider=True)
    try:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            async with aiohttp.ClientSession() as session:
                return await _benchmark(args, context, pool, session, top, provider)
    finally:
        await provider.stop()
        top.stop()


async def _benchmark(
    args: argparse.Namespace,
    context: multiprocessing.context.SpawnContext,
    pool: concurrent.futures.ProcessPoolExecutor,
    session: aiohttp.ClientSession,
    top: SandboxProcess,
    provider: Site,
) -> bool:
    provider.levels = [(LEVEL, LEVEL_DISCOUNT)]
    provider.page_size = 100
    started = time.monotonic()
    await provider.start(session)
    await wait_for(
        lambda: listed(provider, session, args.products), SYNC_DEADLINE_SECONDS, "B's offered catalogue"
    )
    print(
        f"provider catalogue benchmark: {args.products} products x 3 SKUs offered by B (SQLite) in "
        f"{time.monotonic() - started:.0f} s; {args.accounts} accounts ({args.accounts // 5} at level "
        f"{LEVEL}), each reading {args.pages} pages of {args.page_size}"
    )
    accounts = await make_accounts(provider, args.accounts)
    pages = args.pages
    at_rest = rss_kib(provider.pid) / 1024

    # A first read fills nothing in particular: each run starts from B's state after the start-up.
    flag = args.include_inactive
    served = await serve_load(pool, provider.public_url, accounts, pages, args.page_size, provider.pid, flag)
    floor_pages = await serialised_pages(session, provider, accounts, pages, args.page_size)
    receiver, sender = context.Pipe(duplex=False)
    stop = context.Event()
    secrets_by_key = dict(accounts)
    process = context.Process(
        target=_serve_floor, args=(floor_pages, secrets_by_key, sender, stop), daemon=True
    )
    process.start()
    try:
        if not receiver.poll(STARTUP_DEADLINE_SECONDS):
            raise SystemExit("the bare handler did not start")
        port = int(receiver.recv())
        floor = await serve_load(
            pool, f"http://127.0.0.1:{port}", accounts, pages, args.page_size, process.pid, flag
        )
    finally:
        stop.set()
        process.join(30)
    again = await serve_load(pool, provider.public_url, accounts, pages, args.page_size, provider.pid, flag)
    fresh = await price_change_is_seen(session, top, provider, accounts)

    best = max(served, again, key=lambda run: run.per_second)
    ratio = best.per_second / floor.per_second
    cpu_ms = best.cpu_seconds / best.pages * 1000
    rss = max(served.rss_peak_mb, again.rss_peak_mb)
    print(f"B's RSS after start-up, before serving: {at_rest:.1f} MB")
    print(f"\n{'':34} {'pages/s':>9} {'MB/s':>7} {'CPU/page':>9} {'RSS peak':>9}")
    for label, run in (("B, first read", served), ("B, second read", again), ("bare handler (floor)", floor)):
        cpu = f"{run.cpu_seconds / run.pages * 1000:.2f} ms"
        print(
            f"{label:34} {run.per_second:9.0f} {run.megabytes / run.seconds:7.1f} {cpu:>9} "
            f"{run.rss_peak_mb:7.1f} MB"
        )
    checks = [
        (f"B / floor: {ratio:.2f} ({best.per_second:.0f} against {floor.per_second:.0f} pages/s)",
         f"≥ {FLOOR_RATIO_AIM}", ratio >= FLOOR_RATIO_AIM),
        (f"B's CPU per page: {cpu_ms:.2f} ms", "reported", True),
        (f"B's RSS while serving: {rss:.1f} MB", f"≤ {RSS_AIM_MB:.0f} MB", rss <= RSS_AIM_MB),
        (f"every page answered: failures {served.failures or 'none'}, {again.failures or 'none'}", "none",
         not served.failures and not again.failures),
        (f"after a pass changed a price: {fresh}", "every account sees the new price",
         fresh.startswith("all ")),
    ]  # fmt: skip
    print()
    ok = True
    for text, aim, passed in checks:
        ok &= passed
        print(f"  {'PASS' if passed else 'MISS'}  {text}  (aim {aim})")
    return ok


async def listed(provider: Site, session: aiohttp.ClientSession, products: int) -> bool:
    async with session.get(provider.admin_url + "/api/v1/status") as response:
        report = await response.json()
    return bool((report.get("provider") or {}).get("products_listed", 0) >= products * 0.95)


async def make_accounts(provider: Site, count: int) -> list[tuple[str, str]]:
    """``count`` funded accounts, every fifth at the level: their keys and secrets."""
    settings = load_settings(provider.config_path)
    made = []
    async with open_operations(settings) as operations:
        accounts = operations.provider.accounts
        for index in range(count):
            account, secret = await accounts.add(f"site{index:03d}")
            if index % 5 == 0:
                await accounts.set_level(account.name, LEVEL)
            made.append((account.api_key, secret))
    return made


async def serialised_pages(
    session: aiohttp.ClientSession,
    provider: Site,
    accounts: Sequence[tuple[str, str]],
    pages: int,
    page_size: int,
) -> dict[str, bytes]:
    """Every page as B answers it to a first account (the bare handler serves these bytes)."""
    key, secret = accounts[1]
    found = {}
    for page in range(1, pages + 1):
        path = API + "/products"
        async with session.get(
            provider.public_url + path,
            params={"page": str(page), "page_size": str(page_size)},
            headers=signed_headers(key, secret, path),
        ) as response:
            found[str(page)] = await response.read()
    return found


async def price_change_is_seen(
    session: aiohttp.ClientSession, top: SandboxProcess, provider: Site, accounts: Sequence[tuple[str, str]]
) -> str:
    """Double one SKU's price at the top, run a pass from the command line, read its page as every account
    at once: how many show the new price."""
    path = API + "/products"
    key, secret = accounts[1]
    async with session.get(
        provider.public_url + path,
        params={"page": "1", "page_size": "1"},
        headers=signed_headers(key, secret, path),
    ) as response:
        first = (await response.json())["items"][0]
    sku = first["skus"][0]
    cost = Decimal(await top.ask("sku_price", sku["id"]))
    await top.ask("set_price", (sku["id"], str(cost * 2)))
    await provider.cli("catalog", "sync", "--full")

    async def read(key: str, secret: str) -> Decimal:
        async with session.get(
            provider.public_url + path,
            params={"page": "1", "page_size": "1"},
            headers=signed_headers(key, secret, path),
        ) as response:
            item = (await response.json())["items"][0]
        return Decimal(next(s for s in item["skus"] if s["id"] == sku["id"])["price_amount"])

    old = Decimal(sku["price_amount"])
    prices = await asyncio.gather(*(read(key, secret) for key, secret in accounts))
    fresh = sum(1 for price in prices if price > old * Decimal("1.5"))
    if fresh == len(prices):
        return f"all {fresh} accounts read the new price at once"
    return f"{len(prices) - fresh} of {len(prices)} accounts read the old price {old}"


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--products", type=int, default=10_000)
    parser.add_argument("--accounts", type=int, default=50)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1,000 products, 10 accounts")
    parser.add_argument(
        "--include-inactive", action="store_true", help="ask every page include_inactive=true (Dujiao-Next's)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.products, args.accounts = 1000, 10
    args.pages = -(-args.products // args.page_size)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    configure_logging("warning", "json")
    with tempfile.TemporaryDirectory(prefix="procurd-catalogue-") as directory:
        return 0 if asyncio.run(benchmark(args, Path(directory))) else 1


if __name__ == "__main__":
    sys.exit(main())
