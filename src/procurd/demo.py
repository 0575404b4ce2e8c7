"""``procurd demo``: the whole loop in one command, on SQLite and a sandbox upstream on loopback.

It mirrors the sandbox's catalogue, orders one automatic and one manual product through the admin API,
receives the upstream's callbacks, and prints what an operator wants to see. The database and a
configuration file stay behind for ``procurd status`` and ``procurd order show``.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import sys
import time
from datetime import datetime
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
from procurd.systemd import Notifier

DEMO_SECRET = "demo-secret-please-change"  # noqa: S105 - the sandbox's own throwaway credential
DEMO_KEY = "demo-key"
WAIT_SECONDS = 60.0
DATABASE_NAME = "procurd.db"


def fresh_database(directory: Path) -> Path:
    """The demo's database file, with any earlier run's removed: every run starts from scratch."""
    directory.mkdir(parents=True, exist_ok=True)
    database = directory / DATABASE_NAME
    for leftover in (database, *(database.with_name(database.name + tail) for tail in ("-wal", "-shm"))):
        leftover.unlink(missing_ok=True)
    return database


def write_demo_config(directory: Path, sandbox_url: str) -> Path:
    public, admin = unused_ports(2)
    database = fresh_database(directory)
    path = directory / "procurd.toml"
    path.write_text(
        f"""# Written by `procurd demo`: procurd against a sandbox upstream on this machine.
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
name = "sandbox"
base_url = "{sandbox_url}"
api_key = "{DEMO_KEY}"
api_secret = "{DEMO_SECRET}"
max_requests_per_second = 50
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
    async with Sandbox(sandbox_config) as sandbox:
        config_path = write_demo_config(directory, sandbox.base_url)
        settings = load_settings(config_path, environ={})
        configure_logging("warning", "console")
        console.rule("[bold]procurd demo")
        console.print(f"sandbox upstream  {sandbox.base_url}  (api key {DEMO_KEY})")
        console.print(f"configuration     {config_path}")
        await upgrade_database(settings)
        daemon = Daemon(settings, notifier=Notifier({}))
        await daemon.start()
        try:
            await _show_catalogue(daemon, console)
            async with aiohttp.ClientSession() as session:
                await _order_and_follow(session, settings, sandbox, console)
            await daemon.operations.upstreams.ping("sandbox")  # the balance after the purchases
            report = await daemon.operations.housekeeping.status()
            _show_status(report, console)
        finally:
            await daemon.shutdown()
    console.rule()
    console.print("The database and configuration stay behind. Explore them with:")
    command = f"{invoked_as()} --config {shlex.quote(str(config_path))}"
    for rest in ("status", "order show DEMO-AUTO-1", "exceptions list"):
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


async def _show_catalogue(daemon: Daemon, console: Console) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    report = None
    while time.monotonic() < deadline:
        report = await daemon.operations.housekeeping.last_sync("sandbox")
        if report is not None and report.status in ("ok", "failed"):
            break
        await asyncio.sleep(0.1)
    if report is None or report.status != "ok":
        raise RuntimeError(f"the catalogue sync did not finish: {report.error if report else 'no run'}")
    seconds = (report.finished_at - report.started_at).total_seconds() if report.finished_at else 0
    console.rule("catalogue mirror")
    console.print(
        f"mirrored {count(report.categories, 'category')}, {count(report.products, 'product')} and "
        f"{count(report.skus, 'SKU')} in {seconds:.2f} s ({count(report.pages, 'page')}, "
        f"{count(report.rows_written, 'row')} written)"
    )


async def _order_and_follow(
    session: aiohttp.ClientSession, settings: Settings, sandbox: Sandbox, console: Console
) -> None:
    admin = f"http://127.0.0.1:{settings.server.admin_port}/api/v1"
    auto_sku = sandbox.state.first_sku("auto")
    manual_sku = sandbox.state.first_sku("manual")
    orders = {
        "DEMO-AUTO-1": {"sku_id": auto_sku.id, "quantity": 2},
        "DEMO-MANUAL-1": {
            "sku_id": manual_sku.id,
            "quantity": 1,
            "manual_form_data": {"account": "buyer@example.com"},
        },
    }
    console.rule("orders")
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
    for order_no in orders:
        order = await _wait_delivered(session, admin, order_no)
        async with session.get(f"{admin}/orders/{order_no}/audit") as response:
            audit = (await response.json())["audit"]
        _show_journey(order, audit, console)


async def _wait_delivered(session: aiohttp.ClientSession, admin: str, order_no: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        async with session.get(f"{admin}/orders/{order_no}") as response:
            order: dict[str, Any] = (await response.json())["order"]
        if order["status"] in ("delivered", "canceled") or order["exception"] or time.monotonic() > deadline:
            return order
        await asyncio.sleep(0.1)


def _show_journey(order: dict[str, Any], audit: list[dict[str, Any]], console: Console) -> None:
    table = Table(title=f"{order['order_no']}: {order['status']}", title_justify="left")
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
