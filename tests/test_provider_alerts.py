"""The provider's low-balance alert: an account whose wallet falls below ``[provider] low_balance_threshold``
raises ``provider_low_balance``, one key per account, recorded and sent like every alert."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest
from aiohttp import web
from sqlalchemy import select

from procurd.db.schema import alerts
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import SignedClient
from provider_support import add_account, provider_settings, settled
from support import mirror, running_daemon, sql_rows, wait_until

THRESHOLD = "100.00"


class AlertReceiver:
    """A ``json://`` Apprise target: records every alert posted to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/alerts", self.receive)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"json://127.0.0.1:{port}/alerts"

    async def receive(self, request: web.Request) -> web.Response:
        self.bodies.append(json.loads(await request.read()))
        return web.json_response({"ok": True})

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def receiver() -> AsyncIterator[AlertReceiver]:
    found = AlertReceiver()
    await found.start()
    try:
        yield found
    finally:
        await found.close()


async def alert_rows(database_url: str, kind: str) -> list[Any]:
    return await sql_rows(database_url, select(alerts).where(alerts.c.kind == kind))


async def test_an_order_that_takes_a_wallet_below_the_threshold_raises_and_sends_one_alert(
    database_url: str, receiver: AlertReceiver
) -> None:
    """An order that takes an account's wallet below ``low_balance_threshold`` raises
    ``provider_low_balance`` keyed by the account, recorded with the balance and the command that tops it
    up, and sent to the configured URL with the account in its title; an order that leaves a wallet above
    the threshold raises nothing."""
    async with Sandbox(SandboxConfig(products=6, manual_ratio=0, allow_private_callbacks=True)) as top:
        settings = provider_settings(
            database_url,
            ("main", top),
            provider={"low_balance_threshold": THRESHOLD},
            alerts={"urls": [receiver.url]},
        )
        await mirror(settings)
        async with running_daemon(settings) as daemon:
            await settled(daemon)
            operations = daemon.operations
            rich = await add_account(operations, "rich", balance="100000.00")
            async with SignedClient(rich.base_url, rich.api_key, rich.api_secret) as rich_client:
                listing = await rich_client.list_all_products()
            skus = [
                (sku["id"], Decimal(sku["price_amount"]))
                for item in listing
                for sku in item["skus"]
                if sku["is_active"] and sku["stock_status"] != "out_of_stock"
            ]
            cheap_id, price = min(skus, key=lambda pair: pair[1])
            # The first order leaves the wallet above the threshold, the second below it.
            start = Decimal(THRESHOLD) + price * Decimal("1.5")
            poor = await add_account(operations, "poor", balance=f"{start:.2f}")
            async with SignedClient(poor.base_url, poor.api_key, poor.api_secret) as poor_client:
                first = (await poor_client.create_order(cheap_id, downstream_order_no="LOW-1")).json()
                assert first["ok"] is True, first
                assert await alert_rows(database_url, "provider_low_balance") == []
                second = (await poor_client.create_order(cheap_id, downstream_order_no="LOW-2")).json()
                assert second["ok"] is True, second
            async with SignedClient(rich.base_url, rich.api_key, rich.api_secret) as rich_client:
                answer = (await rich_client.create_order(cheap_id, downstream_order_no="RICH-1")).json()
                assert answer["ok"] is True, answer

            rows = await wait_until(lambda: alert_rows(database_url, "provider_low_balance"))
            await wait_until(lambda: len(receiver.bodies) >= 1)
    (row,) = rows
    assert row.subject == "poor"
    assert row.count >= 1
    assert f"holds {start - 2 * price:.2f} CNY, below {THRESHOLD}" in row.message, row.message
    assert "procurd provider topup poor" in row.message
    (sent,) = [body for body in receiver.bodies if "provider_low_balance" in body["title"]]
    assert "poor" in sent["title"]
    assert "below 100.00" in sent["message"]


async def test_a_debit_by_hand_below_the_threshold_raises_the_alert(database_url: str) -> None:
    """A hand debit that leaves the wallet below the threshold raises ``provider_low_balance`` for that
    account; a top-up that keeps it above raises nothing."""
    async with Sandbox(SandboxConfig(products=2, allow_private_callbacks=True)) as top:
        settings = provider_settings(
            database_url, ("main", top), provider={"low_balance_threshold": THRESHOLD}
        )
        async with running_daemon(settings) as daemon:
            accounts = daemon.operations.provider.accounts
            await add_account(daemon.operations, "shop", balance="500.00")
            assert await alert_rows(database_url, "provider_low_balance") == []
            moved = await accounts.move("shop", "450.00", "refund of a prepayment", topup=False)
            assert moved["balance"] == "50.00"
            rows = await alert_rows(database_url, "provider_low_balance")
    (row,) = rows
    assert row.subject == "shop"
    assert "50.00" in row.message
