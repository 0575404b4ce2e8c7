"""Alerts: recorded, counted, logged and sent through Apprise to a real receiver on loopback, per trigger.

The receiver is an aiohttp server standing in for a chat or mail service: Apprise's ``json://`` notification
posts each message to it as ``{"title", "message", "type"}``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from procurd.config import Settings
from procurd.core.intake import parse_order_request
from procurd.core.records import Instance
from procurd.daemon import Daemon
from procurd.db.types import utcnow
from procurd.http.testing import procurd_stack, reserve_port, serve, url_of
from procurd.loopback import unused_ports
from procurd.operations.runtime import Runtime
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import SignedClient
from scale_cluster import metric_value
from support import AdminClient, mirror, run_cli, running_daemon, settings_for, wait_until
from test_cli_orders import write_config

REPEAT_AFTER = 2.0


@dataclass
class Receiver:
    """Messages posted to the alert URL, in arrival order."""

    url: str
    messages: list[dict[str, Any]] = field(default_factory=list)

    def titled(self, text: str) -> list[dict[str, Any]]:
        return [message for message in self.messages if text in message["title"]]


@asynccontextmanager
async def receiving(sock: Any = None) -> AsyncIterator[Receiver]:
    received: list[dict[str, Any]] = []

    async def take(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/alerts", take)
    async with serve(app, sock) as base:
        receiver = Receiver(base.replace("http://", "json://") + "/alerts")
        receiver.messages = received
        yield receiver


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with receiving() as found:
        yield found


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(
        SandboxConfig(products=3, skus_per_product=1, allow_private_callbacks=True)
    ) as sandbox:
        yield sandbox


def alert_settings(
    database_url: str, sandbox: Sandbox, urls: list[str], **sections: dict[str, Any]
) -> Settings:
    alerts = {"urls": urls, "repeat_after_seconds": REPEAT_AFTER, **sections.pop("alerts", {})}
    server = {"heartbeat_seconds": 0.2, **sections.pop("server", {})}
    return settings_for(database_url, ("main", sandbox), alerts=alerts, server=server, **sections)


@dataclass
class Shop:
    sandbox: Sandbox
    daemon: Daemon
    admin: AdminClient
    sku: int

    async def alerts(self, **query: str) -> list[dict[str, Any]]:
        path = "/api/v1/alerts" + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
        status, body = await self.admin.call("GET", path)
        assert status == 200, body
        return body["items"]  # type: ignore[no-any-return]

    async def order(self, order_no: str, **item: Any) -> dict[str, Any]:
        return await self.admin.submit(order_no, {"sku_id": self.sku, "quantity": 1, **item})


@asynccontextmanager
async def open_shop(settings: Settings, sandbox: Sandbox) -> AsyncIterator[Shop]:
    await mirror(settings)
    sku = sandbox.state.products[1].skus[0].id
    async with running_daemon(settings) as daemon, aiohttp.ClientSession() as session:
        yield Shop(sandbox, daemon, AdminClient(settings, session), sku)


@pytest.fixture
async def shop(database_url: str, sandbox: Sandbox, receiver: Receiver) -> AsyncIterator[Shop]:
    async with open_shop(alert_settings(database_url, sandbox, [receiver.url]), sandbox) as opened:
        yield opened


async def test_an_exception_is_recorded_counted_and_sent(shop: Shop, receiver: Receiver) -> None:
    """An exception opened by the state path is an alert: sent with its kind and order in the title and the
    reason in the message, listed by the API with when it was sent, counted in the metrics."""
    await shop.order("A1", max_unit_price="0.01")
    await wait_until(lambda: receiver.titled("exception_opened: A1"))
    [message] = receiver.messages
    assert message["title"] == "procurd exception_opened: A1"
    assert "price_above_limit" in message["message"]
    assert "main" in message["message"]
    [alert] = await wait_until(lambda: _sent(shop))
    assert (alert["kind"], alert["key"], alert["count"], alert["error"]) == (
        "exception_opened", "exception_opened:A1", 1, None
    )  # fmt: skip
    async with shop.admin.session.get(shop.admin.base + "/metrics") as answer:
        text = await answer.text()
    assert metric_value(text, "procurd_alerts_total", kind="exception_opened") == 1.0


async def _sent(shop: Shop) -> list[dict[str, Any]]:
    alerts = await shop.alerts()
    return alerts if alerts and all(alert["sent_at"] for alert in alerts) else []


async def test_repeats_within_the_window_are_held_back_then_summed_up(shop: Shop, receiver: Receiver) -> None:
    """The same key again within repeat_after_seconds is not sent at once; when the window ends one message
    sums up what was held back."""
    shop.sandbox.state.set_balance("0.00")  # every purchase fails: payment_failed
    order = await shop.order("B1")
    pid = order["procurements"][0]["id"]
    await shop.admin.wait_state("B1", "exception")
    await wait_until(lambda: receiver.titled("exception_opened: B1"))
    for _ in range(2):
        status, body = await shop.admin.call("POST", f"/api/v1/exceptions/{pid}/retry", {"note": "again"})
        assert status == 200, body
        await shop.admin.wait_state("B1", "exception")
    alert = (await shop.alerts())[0]
    assert (alert["count"], alert["unsent"]) == (3, 2)
    assert len(receiver.titled("exception_opened: B1")) == 1  # held back within the window
    await wait_until(lambda: len(receiver.titled("exception_opened: B1")) == 2, timeout=REPEAT_AFTER + 10)
    summary = receiver.titled("exception_opened: B1")[1]["message"]
    assert "(2 occurrences since the last message; 3 in all)" in summary


async def test_delivery_survives_a_restart(database_url: str, sandbox: Sandbox) -> None:
    """An alert whose URL does not answer is kept and retried; after a restart of procurd, with the URL
    answering, it arrives exactly once."""
    sock = reserve_port()
    url = url_of(sock).replace("http://", "json://") + "/alerts"
    settings = alert_settings(database_url, sandbox, [url])
    async with open_shop(settings, sandbox) as shop:
        await shop.order("R1", max_unit_price="0.01")
        failing = await wait_until(lambda: _failing(shop))
        assert failing[0]["sent_at"] is None
    async with receiving(sock) as receiver:
        async with open_shop(settings, sandbox) as shop:
            await wait_until(lambda: receiver.titled("exception_opened: R1"), timeout=20)
            [alert] = await wait_until(lambda: _sent(shop))
            assert (alert["count"], alert["error"]) == (1, None)
        assert len(receiver.titled("exception_opened: R1")) == 1


async def _failing(shop: Shop) -> list[dict[str, Any]]:
    return [alert for alert in await shop.alerts() if alert["error"]]


async def test_low_balance_says_what_was_spent_and_how_long_it_lasts(
    database_url: str, sandbox: Sandbox, receiver: Receiver
) -> None:
    """A ping that shows less than low_balance_threshold raises low_balance with the last day's spend and
    how long the balance lasts at that rate."""
    settings = alert_settings(
        database_url, sandbox, [receiver.url], upstream={"low_balance_threshold": "500.00"}
    )
    async with open_shop(settings, sandbox) as shop:
        await shop.order("L1")
        await shop.admin.wait_status("L1", "delivered")
        sandbox.state.set_balance("100.00")
        shop.daemon.run_now("ping:main")

        def alerted() -> list[dict[str, Any]]:
            # A ping still running (the daemon's first, which read the balance before) makes the scheduler
            # skip the one asked for: ask again until one has started for it.
            if "ping:main" in shop.daemon.jobs_asked_for and _job_idle(shop.daemon, "ping:main"):
                shop.daemon.run_now("ping:main")
            return receiver.titled("low_balance: main")

        [message] = await wait_until(alerted)
        spent = (await shop.admin.order("L1"))["procurements"][0]["amount"]
        assert f"spent in the last 24 h: {spent} CNY" in message["message"]
        assert "below the threshold of 500.00" in message["message"]
        assert "lasts about" in message["message"]


async def test_a_refused_payment_refreshes_the_balance_shown(shop: Shop) -> None:
    """After payment_failed the status shows the balance the upstream holds now, not the last ping's."""
    shop.sandbox.state.set_balance("1.00")
    await shop.order("P1")
    await shop.admin.wait_state("P1", "exception")

    async def balance() -> str | None:
        _, status = await shop.admin.call("GET", "/api/v1/status")
        return str(status["upstreams"][0]["last_ping"]["balance"]) == "1.00" or None  # type: ignore[return-value]

    await wait_until(balance)


async def test_an_upstream_failing_is_unhealthy_then_recovered(shop: Shop, receiver: Receiver) -> None:
    """Auth errors (here a clock 90 s off) make upstream_unhealthy with what to check; the first answer after
    the fix makes upstream_recovered."""
    shop.sandbox.config.clock_offset_seconds = 90
    shop.daemon.run_now("ping:main")
    [unhealthy] = await wait_until(lambda: receiver.titled("upstream_unhealthy: main"))
    assert "timestamp_expired" in unhealthy["message"]
    assert "clock" in unhealthy["message"]
    assert unhealthy["type"] == "failure"
    shop.sandbox.config.clock_offset_seconds = 0
    await wait_until(lambda: _job_idle(shop.daemon, "ping:main"))
    shop.daemon.run_now("ping:main")
    await wait_until(lambda: receiver.titled("upstream_recovered: main"))


def _job_idle(daemon: Daemon, job_id: str) -> bool:
    return not any(task.get_name() == job_id for task in daemon.job_tasks)


async def test_a_burst_of_rejected_callbacks(shop: Shop, receiver: Receiver) -> None:
    """Ten callbacks with a wrong signature within a minute make callbacks_rejected, naming the reason."""
    config = shop.daemon.settings.upstream("main")
    public = f"http://127.0.0.1:{shop.daemon.public_port}"
    async with SignedClient(public, config.api_key, "not-the-secret", config.header_prefix) as forger:
        for index in range(10):
            body = {"order_id": index + 1, "downstream_order_no": "X", "status": "delivered"}
            await forger.post("/api/v1/upstream/callback", body)
    [message] = await wait_until(lambda: receiver.titled("callbacks_rejected: main"))
    assert "invalid_signature 10" in message["message"]


async def test_an_order_stuck_at_the_upstream(
    database_url: str, sandbox: Sandbox, receiver: Receiver
) -> None:
    """A submitted order not delivered within stuck_after_seconds makes order_stuck, once."""
    settings = alert_settings(database_url, sandbox, [receiver.url], alerts={"stuck_after_seconds": 0.5})
    async with open_shop(settings, sandbox) as shop:
        sandbox.faults.hold_delivery_next()
        await shop.order("S1")
        await shop.admin.wait_state("S1", "submitted")
        [message] = await wait_until(lambda: receiver.titled("order_stuck: S1"))
        assert "not delivered yet" in message["message"]
        [alert] = await shop.alerts(kind="order_stuck")
        assert alert["count"] == 1


async def test_a_failed_catalogue_pass(shop: Shop, receiver: Receiver) -> None:
    """A catalogue pass that fails makes sync_failed with the error."""
    await wait_until(lambda: _job_idle(shop.daemon, "catalog-sync:main"))
    shop.sandbox.faults.fail_next("categories", count=1, status=500)
    shop.daemon.run_now("catalog-sync:main")
    [message] = await wait_until(lambda: receiver.titled("sync_failed: main"))
    assert "HTTP 500" in message["message"]


async def test_a_vanished_instance_is_reported_and_its_claims_taken_at_once(
    database_url: str, sandbox: Sandbox, receiver: Receiver
) -> None:
    """An instance that stopped beating without a clean shutdown, holding a claim, is marked down when a
    daemon starts: instance_down is raised, and the claimed order is sent at once instead of after the
    claim's lease (an hour here: the order's deadline is far shorter)."""
    settings = alert_settings(database_url, sandbox, [receiver.url], procurement={"lease_seconds": 3600})
    await mirror(settings)
    long_ago = utcnow() - timedelta(minutes=5)
    ghost = Instance(
        id="ghost:1", host="elsewhere", pid=1, version="0", started_at=long_ago, heartbeat_at=long_ago
    )
    runtime = Runtime.build(settings)
    try:
        await runtime.database.write(lambda tx: tx.instances.register(ghost))
        sku = sandbox.state.products[1].skus[0].id
        request = parse_order_request({"order_no": "G1", "items": [{"sku_id": sku, "quantity": 1}]})
        await runtime.service.submit(request)
        [claimed] = (await runtime.service.claim_submissions("main", "ghost:1/main/1", 1)).procurements
        assert claimed.lease_owner == "ghost:1/main/1"
    finally:
        await runtime.close()
    async with running_daemon(settings), aiohttp.ClientSession() as session:
        admin = AdminClient(settings, session)
        await admin.wait_status("G1", "delivered", timeout=30)
        [message] = await wait_until(lambda: receiver.titled("instance_down: ghost:1"))
        audit = (await admin.call("GET", "/api/v1/orders/G1/audit"))[1]["audit"]

        async def status_with_this_daemon_alive() -> dict[str, Any] | None:
            _, report = await admin.call("GET", "/api/v1/status")
            return report if report["daemon_alive"] else None

        status = await wait_until(status_with_this_daemon_alive)
    assert "without a clean shutdown" in message["message"]
    assert [entry["event"] for entry in audit][:3] == ["accepted", "claimed", "claim_abandoned"]
    ghost_row = next(instance for instance in status["instances"] if instance["id"] == "ghost:1")
    assert (ghost_row["alive"], ghost_row["down_at"] is not None) == (False, True)


async def test_filters_of_the_alert_list(shop: Shop) -> None:
    """The alert list filters by kind; a kind procurd does not have is a 400 naming the known ones."""
    await shop.order("K1", max_unit_price="0.01")
    await wait_until(lambda: shop.alerts(kind="exception_opened"))
    assert await shop.alerts(kind="low_balance") == []
    status, body = await shop.admin.call("GET", "/api/v1/alerts?kind=exception_open")
    assert (status, body["error_code"]) == (400, "unknown_kind")
    assert "exception_opened" in body["error_message"]


async def test_alerts_from_the_command_line(database_url: str, tmp_path: Path) -> None:
    """``procurd alerts list`` shows what was raised (an empty list says so; a kind that does not exist
    is a usage error naming the kinds); ``procurd alerts test`` sends a test message to every URL, says
    which failed and exits 1 when one did."""
    async with procurd_stack(database_url, upstreams=("main",)) as stack, receiving() as receiver:
        await stack.sync("main")
        config = write_config(tmp_path / "procurd.toml", stack)
        dead = f"json://127.0.0.1:{unused_ports(1)[0]}/alerts"
        with config.open("a", encoding="utf-8") as text:
            text.write(f'\n[alerts]\nurls = ["{receiver.url}", "{dead}"]\n')
        empty = await run_cli(config, "alerts", "list")
        assert empty.stdout.strip() == "no alerts"
        sku = stack.sandbox.state.first_sku("auto").id
        body = {"order_no": "AL1", "items": [{"sku_id": sku, "quantity": 1, "max_unit_price": "0.01"}]}
        assert (await stack.admin("POST", "/api/v1/orders", body)).status == 202
        listed = await run_cli(config, "alerts", "list")
        assert listed.exit_code == 0, listed.stderr
        assert "exception_opened" in listed.stdout
        assert "AL1" in listed.stdout
        as_json = json.loads((await run_cli(config, "alerts", "list", "--json")).stdout)
        assert [item["key"] for item in as_json["items"]] == ["exception_opened:AL1"]
        typo = await run_cli(config, "alerts", "list", "--kind", "low_balances")
        assert typo.exit_code == 2
        assert "low_balance" in typo.stderr
        tested = await run_cli(config, "alerts", "test")
        assert tested.exit_code == 1
        assert tested.stdout.splitlines()[-1] == "1 URL reached, 1 failed"
        assert [message["title"] for message in receiver.messages] == ["procurd test alert"]
