"""``procurd demo``: the whole loop in one command, on SQLite and two sandbox upstreams on loopback.

It mirrors the catalogues of a Dujiao-Next sandbox site and of an acg-faka sandbox shop, orders one
automatic and one manual product from the site and one card good from the shop through the admin API,
receives the site's callbacks, and prints what an operator wants to see. The database and a configuration
file stay behind for ``procurd status`` and ``procurd order show``.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from procurd.config import Settings, load_settings
from procurd.core.times import count
from procurd.daemon import Daemon
from procurd.logs import configure_logging
from procurd.loopback import unused_ports
from procurd.operations import upgrade_database
from procurd.output import print_status
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.acgfaka import AcgFakaSandbox, ShopConfig
from procurd.systemd import Notifier

DEMO_SECRET = "demo-secret-please-change"  # noqa: S105 - the sandbox's own throwaway credential
DEMO_KEY = "demo-key"
WAIT_SECONDS = 60.0
DATABASE_NAME = "procurd.db"
SITE = "sandbox"  # the Dujiao-Next sandbox site's upstream
SHOP = "acg"  # the acg-faka sandbox shop's upstream
SHOP_COMMODITIES = 16  # two of each kind the sandbox shop generates: a catalogue pass well under a second


def fresh_database(directory: Path) -> Path:
    """The demo's database file, with any earlier run's removed: every run starts from scratch."""
    directory.mkdir(parents=True, exist_ok=True)
    database = directory / DATABASE_NAME
    for leftover in (database, *(database.with_name(database.name + tail) for tail in ("-wal", "-shm"))):
        leftover.unlink(missing_ok=True)
    return database


def write_demo_config(directory: Path, sandbox_url: str, shop: ShopConfig, shop_url: str) -> Path:
    public, admin = unused_ports(2)
    database = fresh_database(directory)
    path = directory / "procurd.toml"
    path.write_text(
        f"""# Written by `procurd demo`: procurd against two sandbox upstreams on this machine,
# a Dujiao-Next site and an acg-faka shop.
[database]
url = "sqlite+aiosqlite:///{database.resolve()}"

[server]
public_host = "127.0.0.1"
public_port = {public}
admin_host = "127.0.0.1"
admin_port = {admin}
callback_url = "http://127.0.0.1:{public}/api/v1/upstream/callback"
allow_private_callback_url = true

[[upstreams]]
name = "{SITE}"
base_url = "{sandbox_url}"
api_key = "{DEMO_KEY}"
api_secret = "{DEMO_SECRET}"
max_requests_per_second = 50
ping_interval_seconds = 300

[[upstreams]]
name = "{SHOP}"
protocol = "acg-faka"
base_url = "{shop_url}"
app_id = "{shop.app_id}"
app_key = "{shop.app_key}"
max_requests_per_second = 200
ping_interval_seconds = 300

[procurement]
poll_initial_seconds = 2
poll_max_seconds = 10

[logging]
level = "warning"
format = "console"
""",
        encoding="utf-8",
    )
    return path


async def run_demo(directory: Path, console: Console) -> int:
    sandbox_config = SandboxConfig(
        api_key=DEMO_KEY,
        api_secret=DEMO_SECRET,
        products=24,
        allow_private_callbacks=True,
        callback_retry_delays=(1, 2, 4, 8),
        site_name="procurd demo upstream",
    )
    shop_config = ShopConfig(commodities=SHOP_COMMODITIES, shop_name="procurd demo acg-faka shop")
    async with Sandbox(sandbox_config) as sandbox, AcgFakaSandbox(shop_config) as shop:
        config_path = write_demo_config(directory, sandbox.base_url, shop_config, shop.base_url)
        settings = load_settings(config_path, environ={})
        configure_logging("warning", "console")
        console.rule("[bold]procurd demo")
        console.print(f"sandbox upstream  {sandbox.base_url}  (api key {DEMO_KEY})")
        console.print(f"acg-faka shop     {shop.base_url}  (member {shop_config.app_id})")
        console.print(f"configuration     {config_path}")
        await upgrade_database(settings)
        daemon = Daemon(settings, notifier=Notifier({}))
        await daemon.start()
        try:
            console.rule("catalogue mirror")
            for upstream in settings.upstreams:
                await _show_catalogue(daemon, upstream.name, upstream.protocol, console)
            async with aiohttp.ClientSession() as session:
                await _order_and_follow(session, settings, (sandbox, shop), daemon, console)
            for upstream in settings.upstreams:  # the balances after the purchases
                await daemon.operations.upstreams.ping(upstream.name)
            report = await daemon.operations.housekeeping.status()
            _show_status(report, console)
        finally:
            await daemon.shutdown()
    console.rule()
    console.print("The database and configuration stay behind. Explore them with:")
    command = f"{invoked_as()} --config {shlex.quote(str(config_path))}"
    for rest in ("status", "order show DEMO-AUTO-1", "order show DEMO-ACG-1", "exceptions list"):
        console.print(f"  {command} {rest}", markup=False, highlight=False, soft_wrap=True)
    return 0


def invoked_as() -> str:
    """How to run this very procurd again from the same directory: ``procurd`` when that is what the
    ``PATH`` finds, else the path it was started by (``.venv/bin/procurd``), or ``python -m procurd`` with
    the interpreter that runs it."""
    argv0 = sys.argv[0] if sys.argv else ""
    if not argv0 or Path(argv0).name == "__main__.py":
        python = sys.executable
        on_path = shutil.which(Path(python).name)
        same = on_path is not None and Path(on_path).resolve() == Path(python).resolve()
        return f"{Path(python).name if same else shlex.quote(python)} -m procurd"
    on_path = shutil.which("procurd")
    if on_path is not None and Path(on_path).resolve() == Path(argv0).resolve():
        return "procurd"
    return shlex.quote(argv0)


async def _show_catalogue(daemon: Daemon, upstream: str, protocol: str, console: Console) -> None:
    """Waits for the daemon's first catalogue pass of ``upstream`` and shows what it mirrored."""
    deadline = time.monotonic() + WAIT_SECONDS
    report = None
    while time.monotonic() < deadline:
        report = await daemon.operations.housekeeping.last_sync(upstream)
        if report is not None and report.status in ("ok", "failed"):
            break
        await asyncio.sleep(0.1)
    if report is None or report.status != "ok":
        raise RuntimeError(
            f"the catalogue sync of {upstream} did not finish: {report.error if report else 'no run'}"
        )
    seconds = (report.finished_at - report.started_at).total_seconds() if report.finished_at else 0
    console.print(
        f"mirrored {count(report.categories, 'category')}, {count(report.products, 'product')} and "
        f"{count(report.skus, 'SKU')} in {seconds:.2f} s ({count(report.pages, 'page')}, "
        f"{count(report.rows_written, 'row')} written) from {upstream} ({protocol})"
    )


async def _order_and_follow(
    session: aiohttp.ClientSession,
    settings: Settings,
    upstreams: tuple[Sandbox, AcgFakaSandbox],
    daemon: Daemon,
    console: Console,
) -> None:
    sandbox, shop = upstreams
    admin = f"http://127.0.0.1:{settings.server.admin_port}/api/v1"
    auto_sku = sandbox.state.first_sku("auto")
    manual_sku = sandbox.state.first_sku("manual")
    card = await _card_good(daemon, SHOP, shop)
    orders: dict[str, dict[str, Any]] = {
        "DEMO-AUTO-1": {"upstream": SITE, "sku_id": auto_sku.id, "quantity": 2},
        "DEMO-MANUAL-1": {
            "upstream": SITE,
            "sku_id": manual_sku.id,
            "quantity": 1,
            "manual_form_data": {"account": "buyer@example.com"},
        },
        "DEMO-ACG-1": {"upstream": SHOP, "sku_id": card.sku_id, "quantity": 1},
    }
    currency = next(upstream.currency for upstream in settings.upstreams if upstream.name == SHOP)
    console.rule("orders")
    console.print(
        f"{SHOP}: card good {card.title}, SKU {card.sku_id} in procurd's mirror, {card.price} {currency}, "
        f"{card.stock}",
        highlight=False,
    )
    for order_no, item in orders.items():
        async with session.post(f"{admin}/orders", json={"order_no": order_no, "items": [item]}) as response:
            body = await response.json()
        if response.status not in (200, 202):
            raise RuntimeError(f"intake refused {order_no}: {body}")
        console.print(f"{order_no}: accepted (HTTP {response.status}), status {body['order']['status']}")
    # The sandbox's operator fulfils the manual order once it has been bought.
    deadline = time.monotonic() + WAIT_SECONDS
    while not sandbox.orders_for("DEMO-MANUAL-1") and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)  # the sandbox's order book has no event to wait on
    await asyncio.sleep(0.5)
    manual = sandbox.orders_for("DEMO-MANUAL-1")
    if manual:
        await sandbox.deliver(manual[0].order_id, payload="ACCOUNT-ACTIVATION-CODE-7Q2M")
    protocols = {upstream.name: upstream.protocol for upstream in settings.upstreams}
    for order_no, item in orders.items():
        order = await _wait_delivered(session, admin, order_no)
        async with session.get(f"{admin}/orders/{order_no}/audit") as response:
            audit = (await response.json())["audit"]
        _show_journey(order, audit, f"{item['upstream']}, {protocols[item['upstream']]}", console)


@dataclass(frozen=True, slots=True)
class CardGood:
    """A SKU of card goods as procurd mirrored it."""

    sku_id: int
    title: str
    price: str
    stock: str


async def _card_good(daemon: Daemon, upstream: str, shop: AcgFakaSandbox) -> CardGood:
    """The first card good of ``upstream`` in procurd's mirror (as the console's catalogue lists it) that can
    be bought as it is: on sale, delivered from the shop's cards at once, with a price and stock, and asking
    the buyer for nothing (its commodity in the demo's own ``shop`` has no buyer inputs). Its SKU id is the
    one procurd gave the choice."""
    page, size = 1, 100
    while True:
        found = await daemon.operations.console.catalog(None, upstream, page, size)
        for product in found.products:
            if product["fulfillment_type"] != "auto" or not _on_sale(product):
                continue
            commodity = shop.shop.commodities.get(product["id"])  # a product's id is its commodity's
            if commodity is None or commodity.code != product["slug"] or commodity.widgets:
                continue
            for sku in found.skus.get((upstream, product["id"]), []):
                stock = sku["stock_quantity"]
                if _on_sale(sku) and sku["stock_status"] != "out_of_stock" and stock != 0:
                    return CardGood(
                        sku_id=int(sku["id"]),
                        title=_title(product["title"]),
                        price=str(sku["price_amount"]),
                        stock=f"{count(stock, 'card')} in stock" if stock and stock > 0 else "in stock",
                    )
        if page * size >= found.total:
            raise RuntimeError(f"{upstream}'s mirror holds no card good with a price and stock")
        page += 1


async def _wait_delivered(session: aiohttp.ClientSession, admin: str, order_no: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        async with session.get(f"{admin}/orders/{order_no}") as response:
            order: dict[str, Any] = (await response.json())["order"]
        if order["status"] in ("delivered", "canceled") or order["exception"] or time.monotonic() > deadline:
            return order
        await asyncio.sleep(0.1)


def _on_sale(row: dict[str, Any]) -> bool:
    """A mirrored product or SKU on sale upstream, with a price."""
    price = row["price_amount"]
    return bool(row["is_active"]) and row["removed_at"] is None and price is not None and Decimal(price) > 0


def _title(title: Any) -> str:
    if isinstance(title, dict):
        return str(next(iter(title.values()), ""))
    return str(title)


def _show_journey(order: dict[str, Any], audit: list[dict[str, Any]], source: str, console: Console) -> None:
    """The order's journey; ``source``: its upstream and that upstream's protocol."""
    table = Table(title=f"{order['order_no']}: {order['status']}  ({source})", title_justify="left")
    table.add_column("+ms", justify="right")
    table.add_column("source")
    table.add_column("event")
    table.add_column("state")
    start = datetime.fromisoformat(audit[0]["at"]) if audit else None
    for entry in audit:
        at = datetime.fromisoformat(entry["at"])
        elapsed = (at - start).total_seconds() * 1000 if start else 0
        state = f"{entry['old_state'] or '-'} -> {entry['new_state'] or '-'}"
        table.add_row(f"{elapsed:.0f}", entry["source"], entry["event"], state)
    console.print(table)
    for item in order["procurements"]:
        fulfillment = item["fulfillment"]
        console.print(
            f"  {item['downstream_order_no']}: upstream order {item['upstream_order_no']} "
            f"{item['amount']} {item['currency']}, upstream status {item['upstream_status']}"
        )
        if fulfillment:
            lines = count(fulfillment["payload_line_count"], "line")
            console.print(f"  delivered ({fulfillment['type']}, {lines}):")
            for line in (fulfillment["payload"] or "").splitlines():
                console.print(f"    {line}")


def _show_status(report: dict[str, Any], console: Console) -> None:
    console.rule("status")
    print_status(report)
