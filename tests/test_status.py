"""The status report, the record of pings and the Prometheus metrics, against the sandbox and a database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from procurd.http.testing import Stack, procurd_stack
from procurd.operations.pings import ping_upstream, record_ping
from procurd.operations.status import status_report
from procurd.upstream.errors import AuthError, TransportError

QUEUE_STATES = ["queued", "submitted", "delivered", "canceled", "exception", "resolved"]


@pytest.fixture
async def stack(database_url: str) -> AsyncIterator[Stack]:
    """procurd in front of the sandbox with both upstreams configured and ``main`` mirrored."""
    async with procurd_stack(database_url) as stack:
        await stack.sync("main")
        yield stack


async def order(stack: Stack, order_no: str, **item: object) -> None:
    sku = stack.sandbox.state.first_sku("auto")
    body = {"order_no": order_no, "items": [{"upstream": "main", "sku_id": sku.id, "quantity": 1, **item}]}
    answer = await stack.admin("POST", "/api/v1/orders", body)
    assert answer.status == 202, answer.body


async def test_status_report_has_the_documented_shape(stack: Stack) -> None:
    """Every upstream has health, last ping, last sync, all six queue states, exceptions and callbacks."""
    await ping_upstream(stack.runtime, "main")
    await order(stack, "S1")
    await order(stack, "S2", max_unit_price="0.01")
    answer = await stack.admin("GET", "/api/v1/status")
    assert answer.status == 200
    report = answer.body
    assert report["ok"] is True
    assert [upstream["name"] for upstream in report["upstreams"]] == ["main", "second"]
    main = report["upstreams"][0]
    assert main["healthy"] is True
    ping = main["last_ping"]
    assert set(ping) >= {"at", "ok", "balance", "currency", "latency_ms"}
    assert (ping["ok"], ping["balance"], ping["currency"]) == (True, "1000.00", "CNY")
    assert isinstance(ping["latency_ms"], int)
    assert (main["site_name"], main["protocol_version"]) == ("procurd sandbox", "1.0")
    sync = main["last_sync"]
    assert set(sync) >= {"at", "ok", "products", "skus"}
    assert (sync["ok"], sync["products"], sync["skus"]) == (True, 4, 8)
    assert list(main["queue"]) == QUEUE_STATES
    assert (main["queue"]["queued"], main["queue"]["exception"], main["open_exceptions"]) == (1, 1, 1)
    assert isinstance(main["oldest_queued_seconds"], int)
    assert main["oldest_queued_seconds"] >= 0
    assert main["callbacks"] == {"accepted": 0, "rejected": 0}
    second = report["upstreams"][1]
    assert second["healthy"] is False
    assert second["last_ping"]["at"] is None
    assert second["last_sync"]["at"] is None
    assert report["storefront"] == {"webhook_configured": False, "events_pending": 0}


async def test_auth_failure_marks_unhealthy_until_a_ping_succeeds(stack: Stack) -> None:
    """An auth error (from a worker or a ping) makes the upstream unhealthy; a good ping clears it."""
    await ping_upstream(stack.runtime, "main")
    await stack.runtime.record_auth_failure("main", AuthError("refused", code="invalid_signature"))
    report = await status_report(stack.runtime)
    main = report["upstreams"][0]
    assert main["healthy"] is False
    assert main["auth_error"]["code"] == "invalid_signature"
    assert main["last_ping"]["ok"] is True

    stack.sandbox.state.disable_api_key("sandbox-key")
    refused = await ping_upstream(stack.runtime, "main")
    assert isinstance(refused, AuthError)
    main = (await status_report(stack.runtime))["upstreams"][0]
    assert (main["healthy"], main["last_ping"]["ok"], main["auth_error"]["code"]) == (
        False,
        False,
        "invalid_api_key",
    )
    assert main["last_ping"]["balance"] == "1000.00"  # the last known balance stays

    stack.sandbox.state.enable_api_key("sandbox-key")
    await ping_upstream(stack.runtime, "main")
    main = (await status_report(stack.runtime))["upstreams"][0]
    assert (main["healthy"], main["auth_error"], main["last_ping"]["error"]) == (True, None, None)


async def test_failed_ping_is_recorded_with_its_reason(stack: Stack) -> None:
    """A ping that fails (here a transport error) is recorded as failed with a one-line reason."""
    await record_ping(stack.runtime, "second", TransportError("connection refused", upstream="second"))
    second = (await status_report(stack.runtime))["upstreams"][1]
    assert (second["healthy"], second["last_ping"]["ok"]) == (False, False)
    assert "connection refused" in second["last_ping"]["error"]
    assert second["auth_error"] is None


async def test_ping_balance_keeps_its_exact_text(stack: Stack) -> None:
    """The balance is stored and reported as the exact decimal text the upstream sent."""
    stack.sandbox.state.set_balance(Decimal("12345.10"))
    await ping_upstream(stack.runtime, "main")
    report = await status_report(stack.runtime)
    assert report["upstreams"][0]["last_ping"]["balance"] == "12345.10"


async def test_metrics_expose_the_procurd_series(stack: Stack) -> None:
    """/metrics is Prometheus text with procurd_ series, the database gauges refreshed for the scrape; what
    this instance counted carries its ``instance`` label, the cluster-wide gauges carry none."""
    await ping_upstream(stack.runtime, "main")
    await order(stack, "M1")
    answer = await stack.admin("GET", "/metrics")
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("text/plain")
    metrics = answer.text
    instance = f'instance="{stack.runtime.instance}"'
    for line in (
        'procurd_procurements{state="queued",upstream="main"} 1.0',
        'procurd_procurements{state="delivered",upstream="second"} 0.0',
        'procurd_upstream_healthy{upstream="main"} 1.0',
        'procurd_upstream_healthy{upstream="second"} 0.0',
        'procurd_upstream_info{protocol="dujiao",upstream="main"} 1.0',
        'procurd_upstream_balance{currency="CNY",upstream="main"} 1000.0',
        "procurd_storefront_events_pending 0.0",
        f"procurd_orders_accepted_total{{{instance}}} 1.0",
        'procurd_catalog_last_sync_ok{upstream="main"} 1.0',
        'procurd_oldest_queued_seconds{upstream="main"}',
        f'procurd_upstream_requests_total{{endpoint="ping",{instance},outcome="ok",upstream="main"}} 1.0',
        f'procurd_http_requests_total{{{instance},listener="admin",route="/api/v1/orders",status="202"}} 1.0',
        f'procurd_upstream_requests_waiting{{{instance},priority="order",upstream="main"}} 0.0',
        f'procurd_database_transactions_total{{{instance},kind="autocommit"}} ',
    ):
        assert line in metrics, line
    cluster_wide = (
        "procurd_procurements{", "procurd_oldest_queued_seconds", "procurd_upstream_healthy",
        "procurd_upstream_balance", "procurd_upstream_last_ping", "procurd_catalog_last_sync",
        "procurd_storefront_events_pending", "procurd_exceptions{", "procurd_instances_alive",
        "procurd_upstream_spend_24h", "procurd_upstream_runway", "procurd_upstream_info",
    )  # fmt: skip
    for line in metrics.splitlines():
        if line.startswith("procurd_"):
            assert (instance in line) != line.startswith(cluster_wide), line
    assert await stack.submit_due()
    await stack.sandbox.wait_callbacks_idle()
    metrics = (await stack.admin("GET", "/metrics")).text
    assert 'procurd_procurements{state="queued",upstream="main"} 0.0' in metrics
    assert 'procurd_procurements{state="delivered",upstream="main"} 1.0' in metrics
    assert f'procurd_callbacks_total{{{instance},result="accepted",upstream="main"}} 1.0' in metrics
    transitions = "procurd_procurement_transitions_total"
    assert (
        f'{transitions}{{from_state="submitted",{instance},source="callback",to_state="delivered"}}'
        in metrics
    )
