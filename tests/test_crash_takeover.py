"""A crash while a provider callback and a storefront event are in flight: the restart takes them over at
once, not after their claims' 60 s lease, and each order's log keeps the try the crash cut short.

A provider, B, is a real ``procurd run`` process over the sandbox, with a storefront webhook. A downstream
site orders from it; B buys from the sandbox, which delivers; B then tells the storefront (its order's
events) and the downstream (the provider order's callback), and both receivers of the test's own hold those
requests without answering. With both in flight, B is SIGKILLed and started again: the new process finds
its predecessor dead at start-up (the heartbeat's takeover, by process id), releases what it had claimed and
logs each try in flight as of unknown outcome, and delivers both again. The receivers answer from then on.
The test waits at most its deadline (``DEADLINE`` seconds), far below the claims' lease (60 s): only the
takeover can deliver them in time.

Until then, a live dispatcher facing an event another instance holds waits instead of looking again and
again: the takeover wakes it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiohttp import web
from pydantic import SecretStr
from sqlalchemy import select

from fault_processes import Incarnations
from procurd.config import StorefrontSettings
from procurd.db.database import Database
from procurd.db.schema import outbox
from procurd.db.types import utcnow
from procurd.operations import open_operations
from procurd.operations.events import LEASE as EVENT_LEASE
from procurd.operations.events import WebhookDispatcher
from procurd.provider.callbacks import LEASE as CALLBACK_LEASE
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import SignedClient
from provider_support import add_account, provider_config
from scale_cluster import settings_of
from support import AdminClient, mirror, sql_rows, wait_until

DEADLINE = 20.0  # seconds the test waits for the deliveries after the restart


@dataclass
class Receiver:
    """A storefront's webhook or a downstream's callback endpoint on 127.0.0.1: records every request's JSON
    body and holds the first one without answering (until the test ends), answering the others
    ``{"ok": true}``."""

    path: str
    received: list[dict[str, Any]] = field(default_factory=list)
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        self.received.append(json.loads(await request.read()))
        if len(self.received) == 1:
            self.holding.set()
            await self.release.wait()
        return web.json_response({"ok": True, "message": "received"})

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_post(self.path, self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self._runner = runner
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}{self.path}"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()


async def offered_sku(client: SignedClient) -> int:
    """An SKU id B offers, once its offered catalogue (built at start-up) lists the sandbox's products."""

    async def listed() -> list[dict[str, Any]] | None:
        return await client.list_all_products() or None

    products = await wait_until(listed)
    return int(products[0]["skus"][0]["id"])


async def test_a_restart_after_a_kill_delivers_the_callback_and_the_event_in_flight(
    database_url: str, tmp_path: Path
) -> None:
    """B is killed while its provider callback and its storefront event are both in flight; the restarted B
    releases both at start-up and delivers them well before their claims would expire (the test's deadline
    is a third of the lease); the provider order's delivery log shows the cut-short try as ``unknown`` before
    the try that was taken, and the order's audit trail an entry ``storefront_event_unknown`` for the event,
    which the storefront then receives again under the same event_id, followed by the order's later events,
    in order."""
    assert min(CALLBACK_LEASE.total_seconds(), EVENT_LEASE.total_seconds()) >= DEADLINE * 3
    sandbox_config = SandboxConfig(
        products=2, skus_per_product=1, manual_ratio=0, allow_private_callbacks=True, balance=Decimal(10**6)
    )
    async with (
        Sandbox(sandbox_config) as top,
        Receiver("/hooks/storefront") as storefront,
        Receiver("/api/v1/upstream/callback") as downstream,
    ):
        config = provider_config(
            database_url, ("top", top),
            server={"heartbeat_seconds": 0.5},
            storefront={"webhook_url": storefront.url, "webhook_api_key": "shop",
                        "webhook_secret": "storefront-secret-1"},
            provider={"site_name": "B", "rate_limit_per_minute": 100_000},
        )  # fmt: skip
        settings = settings_of(config)
        await mirror(settings)
        async with open_operations(settings) as operations:
            site = await add_account(operations, "siteC", balance="1000.00")
        b = Incarnations("B", config, tmp_path)
        try:
            async with (
                aiohttp.ClientSession() as session,
                SignedClient(site.base_url, site.api_key, site.api_secret) as client,
            ):
                await b.start(session)
                answer = await client.create_order(
                    await offered_sku(client), 1, downstream_order_no="C-1", callback_url=downstream.url
                )
                assert answer.json()["ok"] is True, answer.json()
                order_id, order_no = int(answer.json()["order_id"]), str(answer.json()["order_no"])
                await asyncio.wait_for(downstream.holding.wait(), DEADLINE)
                await asyncio.wait_for(storefront.holding.wait(), DEADLINE)
                dead = f"{b.current.pid}"
                held_event = storefront.received[0]
                await b.kill()

                await b.start(session)
                admin = AdminClient(settings, session)

                async def both_delivered() -> dict[str, Any] | None:
                    status, body = await admin.call("GET", f"/api/v1/provider/orders/{order_id}")
                    assert status == 200, body
                    callback = body["order"]["callback"]
                    rows = await sql_rows(database_url, select(outbox.c.delivered_at))
                    told = callback is not None and callback["delivered_at"] is not None
                    return body["order"] if told and all(row.delivered_at for row in rows) else None

                order = await wait_until(both_delivered, timeout=DEADLINE)
                audit = (await admin.call("GET", f"/api/v1/orders/{order_no}/audit"))[1]["audit"]
                assert await b.stop() == 0
        finally:
            await b.kill_if_running()

    # The callback: the try the kill cut short, as of unknown outcome and naming the dead instance, then the
    # one the restart sent and the downstream took; the downstream was told "delivered" twice.
    log = [(t["status"], t["outcome"], t["http_status"]) for t in order["callback_log"]]
    assert log == [("delivered", "ok", 200), ("delivered", "unknown", None)], order["callback_log"]
    unknown = order["callback_log"][1]["message"]
    assert unknown.startswith("outcome unknown: the instance sending it (")
    assert f":{dead})" in unknown
    assert [push["status"] for push in downstream.received] == ["delivered", "delivered"]

    # The storefront: the event in flight again (same event_id, the storefront de-duplicates), then the
    # order's later events in order; the audit trail records the try of unknown outcome.
    ids = [event["event_id"] for event in storefront.received]
    assert ids[:2] == [held_event["event_id"]] * 2
    assert len(set(ids[1:])) == len(ids) - 1
    assert storefront.received[-1]["event"] == "order.delivered"
    [entry] = [entry for entry in audit if entry["event"] == "storefront_event_unknown"]
    assert entry["detail"]["event_id"] == held_event["event_id"]
    assert entry["detail"]["instance"].endswith(f":{dead}")
    # Taken over at start-up by the restarted process (the heartbeat's takeover), not by a claim expiring.
    [down] = b.log_events("instance.down")
    assert (down["events"], down["callbacks"]) == (1, 1)


async def test_an_event_held_by_another_instance_leaves_the_dispatcher_idle(database: Database) -> None:
    """An event due but claimed by another instance (live, or dead and not yet found) cannot be sent here:
    the dispatcher waits until idle or woken (the takeover wakes it) instead of looking again at once, over
    and over, until the claim expires."""
    now = utcnow()
    row = {"event_id": "e-1", "order_no": "H1", "event": "order.delivered", "payload": {"event": "x"},
           "created_at": now, "attempts": 0, "next_attempt_at": now - timedelta(seconds=1)}  # fmt: skip
    await database.write(lambda tx: tx.procurements.insert_events([row]))
    claimed = await database.write(lambda tx: tx.outbox.claim_events("other:1", now, now + EVENT_LEASE, 5))
    assert [event.event_id for event in claimed] == ["e-1"]
    settings = StorefrontSettings(webhook_url="http://127.0.0.1:9/hook", webhook_secret=SecretStr("s" * 16))
    dispatcher = WebhookDispatcher(database, settings, "me:2")
    try:
        assert await dispatcher.step() is None  # idle: nothing it may send is due
    finally:
        await dispatcher.close()
