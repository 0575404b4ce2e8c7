"""The wallet's runway against the sandbox: a ``procurd run`` daemon pinging every half second, a burst of
orders, and the alert ``balance_runway`` when the balance left lasts fewer hours than
``runway_alert_hours`` at the last 24 h's spend; ``procurd status`` says the runway in words."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from procurd.config import Settings, UpstreamSettings
from procurd.daemon import Daemon
from procurd.sandbox import Sandbox, SandboxConfig
from support import AdminClient, mirror, run_cli, running_daemon, settings_for, wait_until

BURST = 8
PRICE = Decimal("9.90")


@dataclass
class Shop:
    sandbox: Sandbox
    daemon: Daemon
    settings: Settings
    admin: AdminClient
    config: Path
    sku: int


def write_config(path: Path, settings: Settings) -> Path:
    """The daemon's configuration as a file, for the command line on the same database."""
    upstream = settings.upstream("main")
    path.write_text(
        f"""
[database]
url = "{settings.database.url}"

[server]
callback_url = "{settings.server.callback_url}"
allow_private_callback_url = true

[logging]
level = "warning"
format = "json"

[[upstreams]]
name = "main"
base_url = "{upstream.base_url}"
api_key = "{upstream.api_key}"
api_secret = "{upstream.secret()}"
runway_alert_hours = {upstream.runway_alert_hours}
""",
        encoding="utf-8",
    )
    return path


async def shop(database_url: str, tmp_path: Path, balance: str) -> AsyncIterator[Shop]:
    config = SandboxConfig(products=1, skus_per_product=1, manual_ratio=0, allow_private_callbacks=True)
    async with Sandbox(config) as sandbox:
        sandbox.state.set_balance(balance)
        product = sandbox.state.add_product(price=str(PRICE))
        sku = sandbox.state.product(product).skus[0].id
        settings = settings_for(
            database_url, ("main", sandbox), upstream={"ping_interval_seconds": 0.5, "runway_alert_hours": 24}
        )
        await mirror(settings)
        async with running_daemon(settings) as daemon, aiohttp.ClientSession() as session:
            admin = AdminClient(settings, session)
            yield Shop(
                sandbox, daemon, settings, admin, write_config(tmp_path / "procurd.toml", settings), sku
            )


@pytest.fixture
async def poor(database_url: str, tmp_path: Path) -> AsyncIterator[Shop]:
    """A daemon whose wallet at the sandbox holds 100.00 CNY."""
    async for found in shop(database_url, tmp_path, "100.00"):
        yield found


@pytest.fixture
async def rich(database_url: str, tmp_path: Path) -> AsyncIterator[Shop]:
    """A daemon whose wallet at the sandbox holds 1,000,000.00 CNY."""
    async for found in shop(database_url, tmp_path, "1000000.00"):
        yield found


async def upstream_status(shop: Shop) -> dict[str, Any]:
    status, body = await shop.admin.call("GET", "/api/v1/status")
    assert status == 200, body
    found: dict[str, Any] = body["upstreams"][0]
    return found


async def burst(shop: Shop) -> dict[str, Any]:
    """``BURST`` orders of the 9.90 SKU, all delivered; then the status once a ping has seen the wallet
    after them."""
    for index in range(BURST):
        await shop.admin.submit(f"R{index}", {"upstream": "main", "sku_id": shop.sku, "quantity": 1})
    for index in range(BURST):
        await shop.admin.wait_status(f"R{index}", "delivered")
    left = shop.sandbox.state.balance()

    async def pinged_after() -> dict[str, Any] | None:
        found = await upstream_status(shop)
        return found if found["last_ping"]["balance"] == f"{left:.2f}" else None

    return await wait_until(pinged_after)


async def runway_alerts(shop: Shop) -> list[dict[str, Any]]:
    status, body = await shop.admin.call("GET", "/api/v1/alerts?kind=balance_runway")
    assert status == 200, body
    found: list[dict[str, Any]] = body["items"]
    return found


async def test_nothing_spent_means_no_runway_and_no_alert(poor: Shop) -> None:
    """Before any order the status has spend_24h 0.00 and no runway (nothing runs the wallet down)."""

    async def pinged() -> dict[str, Any] | None:
        found = await upstream_status(poor)
        return found if found["last_ping"]["balance"] == "100.00" else None

    found = await wait_until(pinged)
    assert (found["spend_24h"], found["runway_hours"], found["runway_alert_hours"]) == ("0.00", None, 24)
    assert await runway_alerts(poor) == []


async def test_a_small_balance_and_a_burst_of_orders_raise_balance_runway(poor: Shop) -> None:
    """100.00 CNY less eight orders of 9.90 leaves 20.80, which lasts 6.3 h at 79.20 a day: the next ping
    raises balance_runway with the balance, the spend and the hours left; procurd status prints the runway."""
    found = await burst(poor)
    spent = PRICE * BURST
    assert Decimal(found["spend_24h"]) == spent
    assert found["runway_hours"] == 6.3  # 20.80 / (79.20 / 24)

    async def raised() -> list[dict[str, Any]] | None:
        return await runway_alerts(poor) or None

    [alert] = await wait_until(raised)
    assert (alert["kind"], alert["subject"]) == ("balance_runway", "main")
    assert "the wallet holds 20.80 CNY" in alert["message"]
    assert f"the last 24 h spent {spent} CNY" in alert["message"]
    assert "lasts about 6.3 h, less than runway_alert_hours (24 h)" in alert["message"]
    shown = await run_cli(poor.config, "status")
    assert shown.exit_code == 0, shown.output
    words = " ".join(shown.stdout.split())
    assert f"runway 6.3 h LOW at the last 24 h's spend of {spent} CNY (alert below 24 h)" in words


async def test_a_large_balance_does_not_raise_balance_runway(rich: Shop) -> None:
    """The same burst against a wallet of a million lasts about 300,000 hours: no alert from the pings after
    it; procurd status prints the runway without the LOW mark."""
    found = await burst(rich)
    assert Decimal(found["spend_24h"]) == PRICE * BURST
    assert found["runway_hours"] == round(float(Decimal("999920.80") * 24 / (PRICE * BURST)), 1)

    async def pinged_again() -> bool | None:
        again = await upstream_status(rich)
        return True if again["last_ping"]["at"] != found["last_ping"]["at"] else None

    await wait_until(pinged_again)
    assert await runway_alerts(rich) == []
    shown = await run_cli(rich.config, "status")
    words = " ".join(shown.stdout.split())
    assert (
        f"runway {found['runway_hours']:,.1f} h at the last 24 h's spend of 79.20 CNY (alert below 24 h)"
        in words
    )


@pytest.mark.parametrize("value", [0, -5, "soon", True, "nan"])
def test_a_runway_alert_hours_that_is_no_number_of_hours_is_refused(value: object) -> None:
    """runway_alert_hours takes a number of hours above 0, or "" for off; anything else is a configuration
    error naming the key."""
    data = {"name": "main", "base_url": "https://up.example.com", "api_key": "k", "api_secret": "s"}
    assert UpstreamSettings(**data, runway_alert_hours="").runway_alert_hours == ""
    assert UpstreamSettings(**data, runway_alert_hours=1.5).runway_alert_hours == 1.5
    with pytest.raises(ValidationError) as refused:
        UpstreamSettings(**data, runway_alert_hours=value)
    assert "runway_alert_hours" in str(refused.value)
    assert 'must be a number of hours above 0, or "" for off' in str(refused.value)
