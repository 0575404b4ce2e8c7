"""One installation: a command run beside the daemon goes through the same runtime as the daemon, with the
same request budget, alerts and records, and every request it sends is signed.

Real processes: ``procurd run`` and ``procurd catalog sync`` / ``procurd doctor`` as an operator types them,
against the sandbox upstream, on the test's database (SQLite or PostgreSQL).
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import select

from fault_support import (
    BUDGET,
    WINDOW_REQUESTS,
    WINDOW_SECONDS,
    IntakeClient,
    all_delivered,
    fault_sandbox_config,
    limited_sandbox_config,
    most_in_any_window,
    orderable_skus,
    report,
    single_item,
    take_ledger,
)
from procurd.catalog.lease import LEASE_PREFIX
from procurd.db.schema import alerts, leases, sync_runs
from procurd.sandbox import Sandbox
from scale_cluster import DaemonProcess, _child_environment, instance_config, settings_of, to_toml
from support import mirror, run_procurd, sql_rows, wait_until
from test_alerts import receiving

CATALOGUE_PRODUCTS = 1000  # 20 pages of 50
BURST_ORDERS = 60  # six seconds of the budget
INTAKE_STREAMS = 8


def daemon_config(database_url: str, sandbox: Sandbox, **sections: Any) -> dict[str, Any]:
    """A daemon spending exactly the site's limit, its catalogue pass only at start-up."""
    defaults: dict[str, Any] = {
        "upstream": {"max_requests_per_second": BUDGET, "ping_interval_seconds": 3600, "timeout_seconds": 10},
        "procurement": {"workers": 4, "poll_initial_seconds": 5, "poll_max_seconds": 10, "max_attempts": 20},
        "catalog": {"sync_interval_seconds": 3600, "page_size": 50, "concurrency": 4},
        "server": {"heartbeat_seconds": 1},
    }
    for section, values in sections.items():
        defaults[section] = {**defaults.get(section, {}), **values}
    return instance_config(database_url, sandbox, **defaults)


async def pass_done(database_url: str, passes: int) -> bool:
    """``passes`` passes finished ``ok`` and the lease is given back (the next pass is not skipped for it)."""
    done = select(sync_runs.c.id).where(sync_runs.c.status == "ok", sync_runs.c.finished_at.is_not(None))
    held = select(leases.c.holder).where(leases.c.name == LEASE_PREFIX + "main")
    return len(await sql_rows(database_url, done)) >= passes and not await sql_rows(database_url, held)


async def test_a_command_beside_the_daemon_shares_its_budget_and_orders_go_first(
    database_url: str, tmp_path: Path
) -> None:
    """A running daemon takes a burst of orders while an operator runs ``procurd catalog sync --full`` in
    another process, both spending one key that the upstream limits to its budget: the upstream never
    answers "too many requests", the key's requests stay within the limit, pages wait while orders are
    queued, the command's pass completes, and every order is bought once and delivered."""
    async with Sandbox(limited_sandbox_config(products=CATALOGUE_PRODUCTS)) as sandbox:
        skus = orderable_skus(sandbox)[:20]
        config = daemon_config(database_url, sandbox)
        sandbox.config.rate_limit = False
        await mirror(settings_of(config))
        sandbox.config.rate_limit = True
        daemon = DaemonProcess("daemon", config, tmp_path)
        await daemon.start()
        try:
            async with aiohttp.ClientSession() as session:
                await daemon.wait_ready(session)
                # The daemon's start-up pass first (the run after the test's mirror): the command's pass is
                # then not skipped for it.
                await wait_until(lambda: pass_done(database_url, passes=2), timeout=30)
                sandbox.reset_requests()
                command = asyncio.create_task(
                    run_procurd(
                        "--config", str(daemon.config_path), "catalog", "sync", "--full",
                        env=_child_environment(),
                    )
                )  # fmt: skip
                await wait_until(lambda: sandbox.request_counts.get("products", 0) >= 2, timeout=30)
                numbers = [f"OI{index:03d}" for index in range(BURST_ORDERS)]
                client = IntakeClient(session, [daemon.admin_url])
                gate = asyncio.Semaphore(INTAKE_STREAMS)

                async def submit(index: int) -> None:
                    async with gate:
                        await client.submit(numbers[index], single_item(skus[index % len(skus)]))

                await asyncio.gather(*(submit(index) for index in range(BURST_ORDERS)))
                code, out, err = await command
                await wait_until(lambda: all_delivered(database_url, BURST_ORDERS), timeout=120, interval=0.3)
        finally:
            assert await daemon.stop() == 0, daemon.log_tail()
        requests = [record.to_dict() for record in sandbox.requests.select()]
        ledger = await take_ledger(database_url, sandbox, numbers)
    assert code == 0, err
    assert "ok (full)" in out, out
    creates = [r["at"] for r in requests if r["endpoint"] == "orders.create"]
    pages = [r["at"] for r in requests if r["endpoint"] in ("products", "categories")]
    figures = {
        "requests": len(requests),
        "rate_limited": sum(r["rate_limited"] for r in requests),
        "most_in_any_window": most_in_any_window(sorted(r["at"] for r in requests), WINDOW_SECONDS),
        "pages": len(pages),
        "pages_during_burst": sum(1 for at in pages if creates[0] < at < creates[-1]),
        **ledger.row(),
    }
    report("one_installation_budget", **figures)
    assert figures["rate_limited"] == 0, figures
    assert figures["most_in_any_window"] <= WINDOW_REQUESTS, figures
    assert figures["pages"] >= CATALOGUE_PRODUCTS // 50, figures  # the command's whole pass
    # Once orders wait, a page goes out only when none does (at most a few slip between orders).
    assert figures["pages_during_burst"] <= 3, figures
    assert (ledger.lost, ledger.duplicates, ledger.upstream_orders) == (0, 0, BURST_ORDERS), figures


def command_config(database_url: str, sandbox: Sandbox, alert_url: str, directory: Path) -> Path:
    """A configuration file for commands: catalogue removals guarded, holds on a 10 % cost rise, alerts
    sent to ``alert_url``."""
    config = instance_config(
        database_url,
        sandbox,
        pricing={"hold_on_cost_increase_percent": "10"},
        alerts={"urls": [alert_url]},
    )
    path = directory / "procurd.toml"
    path.write_text(to_toml(config) + '\n[[pricing.rules]]\nmarkup_percent = "20"\n', encoding="utf-8")
    return path


async def alert_rows(database_url: str) -> dict[str, Any]:
    rows = await sql_rows(database_url, select(alerts.c.kind, alerts.c.sent_at, alerts.c.message))
    return {row.kind: row for row in rows}


async def test_a_pass_from_the_command_line_raises_and_sends_its_alerts(
    database_url: str, tmp_path: Path
) -> None:
    """``procurd catalog sync --full`` raises what any pass raises, and sends it before it ends: a listing
    of no products removes nothing and records alert ``mass_removal_blocked``; a cost that jumps holds its
    selling price and records alert ``price_held``. Both are sent to the configured URL."""
    async with receiving() as receiver, Sandbox(fault_sandbox_config(products=6)) as sandbox:
        config = command_config(database_url, sandbox, receiver.url, tmp_path)
        environ = _child_environment()
        code, _, err = await run_procurd("--config", str(config), "catalog", "sync", "--full", env=environ)
        assert code == 0, err

        sandbox.faults.empty_listing_next()
        code, out, _ = await run_procurd("--config", str(config), "catalog", "sync", "--full", env=environ)
        assert code == 1
        assert "suspicious" in out
        blocked = (await alert_rows(database_url))["mass_removal_blocked"]
        assert blocked.sent_at is not None

        sku = sandbox.state.product(sandbox.state.active_products()[0].id).skus[0]
        sandbox.state.set_sku_price(sku.id, str(Decimal(sku.price_amount) * 2))
        code, out, err = await run_procurd("--config", str(config), "catalog", "sync", "--full", env=environ)
        assert code == 0, err
        assert f"price held: SKU {sku.id}" in out
        held = (await alert_rows(database_url))["price_held"]
        assert held.sent_at is not None
        assert f"SKU {sku.id}" in held.message
    titles = [message["title"] for message in receiver.messages]
    assert any("mass_removal_blocked" in title for title in titles), titles
    assert any("price_held" in title for title in titles), titles


async def test_doctor_signs_every_request_it_sends(database_url: str, tmp_path: Path) -> None:
    """``procurd doctor`` checks the upstream (authentication, balance, clock offset) with the signed ping
    alone: every request the upstream received from it verified, and the clock offset was measured."""
    async with Sandbox(fault_sandbox_config()) as sandbox:
        path = tmp_path / "procurd.toml"
        path.write_text(to_toml(instance_config(database_url, sandbox)), encoding="utf-8")
        started = sandbox.state.now()
        code, out, err = await run_procurd("--config", str(path), "doctor", env=_child_environment())
        received = sandbox.requests.select(since=started)
    assert code == 0, out + err
    assert "✔ upstream main clock: this machine is " in out
    assert received, "doctor sent nothing"
    assert [(r.endpoint, r.authenticated) for r in received] == [("ping", True)] * len(received)


async def test_a_ping_from_the_command_line_is_recorded_like_the_daemons(
    database_url: str, tmp_path: Path
) -> None:
    """``procurd ping`` is the daemon's ping: the status report shows its outcome and the balance it read."""
    async with Sandbox(fault_sandbox_config(site_name="recorded site")) as sandbox:
        path = tmp_path / "procurd.toml"
        path.write_text(to_toml(instance_config(database_url, sandbox)), encoding="utf-8")
        environ = _child_environment()
        code, _, err = await run_procurd("--config", str(path), "ping", env=environ)
        assert code == 0, err
        code, out, err = await run_procurd("--config", str(path), "status", "--json", env=environ)
    assert code == 0, err
    (upstream,) = json.loads(out)["upstreams"]
    assert (upstream["site_name"], upstream["last_ping"]["ok"], upstream["healthy"]) == (
        "recorded site",
        True,
        True,
    )
    assert Decimal(upstream["last_ping"]["balance"]) == sandbox.config.balance
