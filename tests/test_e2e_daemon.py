"""The daemon as a service: graceful shutdown, several upstreams side by side, failing jobs."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from decimal import Decimal

import aiohttp
import pytest

from procurd.daemon import Daemon
from procurd.operations.runtime import Runtime
from procurd.operations.views import ProcurementViews
from procurd.protocol.dujiao.signing import HeaderNames, signed_headers
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.systemd import Notifier
from support import AdminClient, captured_log, mirror, running_daemon, settings_for, wait_until

FAST_CALLBACKS = (0.1, 0.2, 0.3, 0.5)


def sandbox_config(**overrides: object) -> SandboxConfig:
    values: dict[str, object] = {
        "products": 6,
        "balance": Decimal("1000000"),
        "allow_private_callbacks": True,
        "callback_retry_delays": FAST_CALLBACKS,
    }
    values.update(overrides)
    return SandboxConfig(**values)  # type: ignore[arg-type]


@pytest.fixture
async def two_sandboxes() -> AsyncIterator[tuple[Sandbox, Sandbox]]:
    async with (
        Sandbox(sandbox_config(api_key="key-a", api_secret="secret-a-123")) as a,
        Sandbox(sandbox_config(api_key="key-b", api_secret="secret-b-456", header_prefix="Dujiao-Next")) as b,
    ):
        yield a, b


async def test_shutdown_lets_in_flight_submission_finish(database_url: str) -> None:
    """A submission in flight when shutdown starts completes and is committed: nothing is lost or doubled."""
    async with Sandbox(sandbox_config()) as sandbox:
        settings = settings_for(database_url, ("main", sandbox))
        await mirror(settings)
        sandbox.faults.delay_next("orders.create", count=1, seconds=1.0)
        daemon = Daemon(settings, notifier=Notifier({}))
        await daemon.start()
        async with aiohttp.ClientSession() as session:
            admin = AdminClient(settings, session)
            await admin.submit(
                "G1",
                {
                    "sku_id": sandbox.state.first_sku("manual").id,
                    "quantity": 1,
                    "manual_form_data": {"account": "x"},
                },
            )
            await wait_until(lambda: sandbox.request_counts["orders.create"] >= 1)
            await daemon.shutdown()
        runtime = Runtime.build(settings)
        try:
            order = await ProcurementViews(runtime).order("G1")
        finally:
            await runtime.close()
    assert order is not None
    item = order["procurements"][0]
    assert item["state"] == "submitted"
    assert item["upstream_order_id"] == sandbox.orders_for("G1")[0].order_id
    assert len(sandbox.orders_for("G1")) == 1


async def test_several_upstreams_are_independent(
    database_url: str, two_sandboxes: tuple[Sandbox, Sandbox]
) -> None:
    """Two upstreams with their own keys and header prefixes: a hanging one does not hold up the other."""
    a, b = two_sandboxes
    settings = settings_for(
        database_url,
        ("a", a),
        ("b", b),
        upstream={"timeout_seconds": 30},
        server={"shutdown_timeout_seconds": 0.5},
    )
    await mirror(settings)
    a.faults.hang_next("orders.create", count=1)
    async with running_daemon(settings), aiohttp.ClientSession() as session:
        admin = AdminClient(settings, session)
        await admin.submit("HA1", {"upstream": "a", "sku_id": a.state.first_sku("auto").id, "quantity": 1})
        await wait_until(lambda: a.request_counts["orders.create"] >= 1)
        await admin.submit("HB1", {"upstream": "b", "sku_id": b.state.first_sku("auto").id, "quantity": 1})
        order = await admin.wait_status("HB1", "delivered")
        assert order["procurements"][0]["upstream"] == "b"
        # b's order went all the way while a's first submission is still hanging.
        hanging = (await admin.order("HA1"))["procurements"][0]
        assert (hanging["state"], hanging["attempts"]) == ("queued", 1)
        status, body = await admin.call("GET", "/api/v1/status")
        assert status == 200
        assert [u["name"] for u in body["upstreams"]] == ["a", "b"]
    assert b.orders_for("HB1")[0].status == "delivered"
    assert a.orders_for("HB1") == []


async def test_callbacks_are_routed_by_api_key(
    database_url: str, two_sandboxes: tuple[Sandbox, Sandbox]
) -> None:
    """A callback signed with upstream b's key cannot settle upstream a's order (404, no change)."""
    a, b = two_sandboxes
    settings = settings_for(database_url, ("a", a), ("b", b))
    await mirror(settings)
    async with running_daemon(settings), aiohttp.ClientSession() as session:
        admin = AdminClient(settings, session)
        await admin.submit(
            "RA1",
            {
                "upstream": "a",
                "sku_id": a.state.first_sku("manual").id,
                "quantity": 1,
                "manual_form_data": {"account": "x"},
            },
        )
        order = await admin.wait_state("RA1", "submitted")
        upstream_order_id = order["procurements"][0]["upstream_order_id"]
        body = (
            f'{{"event":"order.fulfilled","order_id":{upstream_order_id},"downstream_order_no":"RA1",'
            '"status":"delivered","fulfillment":{"type":"manual","status":"delivered","payload":"X"}}'
        ).encode()
        path = "/api/v1/upstream/callback"
        headers = signed_headers(
            HeaderNames.for_prefix("Dujiao-Next"),
            "key-b",
            "secret-b-456",
            "POST",
            path,
            int(time.time()),
            body,
        )
        url = f"http://127.0.0.1:{settings.server.public_port}{path}"
        async with session.post(url, data=body, headers=headers) as response:
            assert response.status == 404
            assert (await response.json())["ok"] is False
        assert (await admin.order("RA1"))["procurements"][0]["state"] == "submitted"
        await a.deliver(upstream_order_id, payload="CODE-A")
        delivered = await admin.wait_status("RA1", "delivered")
        assert delivered["procurements"][0]["fulfillment"]["payload"] == "CODE-A"


async def test_failing_catalogue_job_does_not_stop_the_daemon(database_url: str) -> None:
    """An upstream whose catalogue fails is logged and retried; the daemon keeps serving."""
    async with Sandbox(sandbox_config()) as sandbox:
        settings = settings_for(database_url, ("main", sandbox), catalog={"sync_interval_seconds": 0.2})
        await mirror(settings)
        sandbox.faults.fail_next("categories", count=3, status=500)
        async with running_daemon(settings) as daemon, aiohttp.ClientSession() as session:
            await wait_until(lambda: sandbox.request_counts["categories"] >= 5)
            admin = AdminClient(settings, session)
            status, _ = await admin.call("GET", "/healthz")
            assert status == 200
            assert all(not task.done() for task in daemon.supervisor.tasks)


async def test_shutdown_cuts_a_catalogue_pass_short_but_lets_a_submission_finish(database_url: str) -> None:
    """Stopping while a catalogue pass waits on a listing that never answers and an order submission is in
    flight: the pass is cancelled at once (recorded as cut short, it resumes on the next schedule; logged as
    ``job.cut_short``, nothing at error level) while the submission completes and is committed.
    Shutdown ends long before its timeout (a deadline here, so a shutdown that waited the timeout out fails
    the test)."""
    async with Sandbox(sandbox_config()) as sandbox:
        settings = settings_for(
            database_url,
            ("main", sandbox),
            server={"shutdown_timeout_seconds": 600},
            upstream={"timeout_seconds": 600},
            catalog={"sync_interval_seconds": 3600},
        )
        await mirror(settings)
        pages_mirrored = sandbox.request_counts["products"]
        sandbox.faults.hang_next("products", count=100)
        sandbox.faults.delay_next("orders.create", count=1, seconds=1.0)
        with captured_log("info") as stream:
            daemon = Daemon(settings, notifier=Notifier({}))
            await daemon.start()
            async with aiohttp.ClientSession() as session:
                admin = AdminClient(settings, session)
                # The daemon's own pass is waiting on its first page.
                await wait_until(lambda: sandbox.request_counts["products"] > pages_mirrored)
                await admin.submit("SIG1", {"sku_id": sandbox.state.first_sku("auto").id, "quantity": 1})
                await wait_until(lambda: sandbox.request_counts["orders.create"] >= 1)
                await asyncio.wait_for(daemon.shutdown(), timeout=60)
        runtime = Runtime.build(settings)
        try:
            order = await ProcurementViews(runtime).order("SIG1")
            runs = await runtime.database.read(lambda tx: tx.console.sync_runs("main", 1, 10))
        finally:
            await runtime.close()
    assert order is not None
    assert order["procurements"][0]["state"] in ("submitted", "delivered")
    assert len(sandbox.orders_for(order["procurements"][0]["downstream_order_no"])) == 1
    _, rows = runs
    assert (rows[0]["status"], rows[0]["error"]) == ("failed", "cancelled before it finished")
    logged = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [record["job"] for record in logged if record["event"] == "job.cut_short"] == ["catalog-sync:main"]
    assert [record for record in logged if record["level"] in ("error", "critical")] == []
