"""A dead alert URL never delays an order: delivery times with alerts going nowhere, and going to a URL that
accepts connections and never answers.

Two runs of the same load against a procurd daemon (``Daemon``, in this process) on a fresh SQLite database
and the sandbox upstream: ``--orders`` one-item orders, every other one refused at intake by its
``max_unit_price`` (an exception, so an ``exception_opened`` alert each), the others bought and delivered.
The baseline has no ``[alerts] urls``; the other run sends every alert to a black hole: a listening socket on
loopback that never reads, so each send waits for Apprise's timeout. Measured per delivered order: intake
to delivery as the storefront sees it (polling the order). Prints p50/p99 of both runs and their ratio; it
does not pass or fail.

    python benchmarks/alert_delivery.py [--orders 200]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import aiohttp

from procurd.config import Settings
from procurd.daemon import Daemon
from procurd.db.database import open_database
from procurd.logs import configure_logging
from procurd.loopback import unused_ports
from procurd.operations import Operations
from procurd.operations.installation import migrate_schema
from procurd.operations.runtime import Runtime
from procurd.protocol.dujiao.callback import CALLBACK_PATH
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.systemd import Notifier

IN_FLIGHT = 8  # orders the storefront has open at once


def settings(database_url: str, sandbox: Sandbox, alert_urls: list[str]) -> Settings:
    public_port, admin_port = unused_ports(2)
    return Settings(
        database={"url": database_url},
        server={
            "public_host": "127.0.0.1", "public_port": public_port, "admin_host": "127.0.0.1",
            "admin_port": admin_port, "callback_url": f"http://127.0.0.1:{public_port}{CALLBACK_PATH}",
            "allow_private_callback_url": True,
        },
        upstreams=[{
            "name": "main", "base_url": sandbox.base_url, "api_key": sandbox.config.api_key,
            "api_secret": sandbox.config.api_secret, "max_requests_per_second": 100_000,
            "ping_interval_seconds": 3600,
        }],
        alerts={"urls": alert_urls},
        logging={"level": "error", "format": "json"},
    )  # fmt: skip


async def run(orders: int, alert_urls: list[str], label: str) -> tuple[list[float], int]:
    config = SandboxConfig(
        products=2, balance=Decimal(10_000_000), allow_private_callbacks=True, rate_limit=False
    )
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite+aiosqlite:///{Path(directory) / 'alerts.db'}"
        database = open_database(url)
        await migrate_schema(database)
        await database.close()
        async with Sandbox(config) as sandbox:
            sku = sandbox.state.first_sku("auto").id
            sandbox.state.set_sku_stock(sku, -1)
            configured = settings(url, sandbox, alert_urls)
            operations = Operations(Runtime.build(configured))
            try:
                await operations.catalog.sync("main")  # mirrored before the clock starts
            finally:
                await operations.close()
            daemon = Daemon(configured, notifier=Notifier({}))
            await daemon.start()
            admin = f"http://127.0.0.1:{daemon.admin_port}/api/v1/orders"
            try:
                stalls: list[float] = []
                watch = asyncio.create_task(loop_stalls(stalls))
                gate = asyncio.Semaphore(IN_FLIGHT)

                async def gated(number: int) -> float | None:
                    async with gate:
                        return await one_order(session, admin, f"{label}{number}", sku, number % 2 == 1)

                async with aiohttp.ClientSession() as session:
                    times = await asyncio.gather(*(gated(n) for n in range(orders)))
                watch.cancel()
                print(f"{label}: longest event-loop stall {max(stalls, default=0) * 1000:.1f} ms")
                _, found = await daemon.runtime.alerts.recent(1, 100)
                failing = sum(1 for alert in found if alert.error)
            finally:
                await daemon.shutdown()
    return [t for t in times if t is not None], failing


async def loop_stalls(stalls: list[float]) -> None:
    """How late a 10 ms sleep wakes, again and again: the event loop's stalls (procurd runs on this loop)."""
    while True:
        started = time.perf_counter()
        await asyncio.sleep(0.01)
        stalls.append(time.perf_counter() - started - 0.01)


async def one_order(
    session: aiohttp.ClientSession, admin: str, order_no: str, sku: int, refused: bool
) -> float | None:
    """Intake to delivery of one order (None for an order refused by its limit: it only raises an alert)."""
    item = {"sku_id": sku, "quantity": 1, **({"max_unit_price": "0.01"} if refused else {})}
    started = time.perf_counter()
    async with session.post(admin, json={"order_no": order_no, "items": [item]}) as response:
        assert response.status == 202, await response.text()
    if refused:
        return None
    while True:
        async with session.get(f"{admin}/{order_no}") as response:
            if (await response.json())["order"]["status"] == "delivered":
                return time.perf_counter() - started
        await asyncio.sleep(0.01)


def summary(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def main_async(orders: int) -> None:
    configure_logging("error")
    baseline, _ = await run(orders, [], "B")
    with socket.socket() as black_hole:  # accepts connections (backlog) and never reads or answers
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(1024)
        port = black_hole.getsockname()[1]
        dead, failing = await run(orders, [f"json://127.0.0.1:{port}/alerts"], "D")
    base_p50, base_p99 = summary(baseline)
    dead_p50, dead_p99 = summary(dead)
    alerted = orders - len(baseline)
    delivered = len(baseline)
    print(f"{orders} orders per run, {IN_FLIGHT} at a time: {delivered} delivered, {alerted} refused")
    print(f"alerts to the dead URL: {failing} failing to send when the run ended (none sent)")
    print(f"{'run':<34}{'p50 ms':>10}{'p99 ms':>10}")
    print(f"{'no alert URL (baseline)':<34}{base_p50 * 1000:>10.1f}{base_p99 * 1000:>10.1f}")
    print(f"{'every alert to a dead URL':<34}{dead_p50 * 1000:>10.1f}{dead_p99 * 1000:>10.1f}")
    print(f"ratio dead/baseline: p50 {dead_p50 / base_p50:.2f}, p99 {dead_p99 / base_p99:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=200)
    asyncio.run(main_async(parser.parse_args().orders))


if __name__ == "__main__":
    main()
