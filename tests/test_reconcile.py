"""Reconciliation against the sandbox: what polls never see (a refund days after delivery, a delivery whose
callbacks were lost, an amount that differs) is found, recorded, alerted and repaired through the state
path; with repair off it is only reported."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from console_support import delivered_order, order
from procurd.core.alerts import Kind
from procurd.http.testing import Stack, procurd_stack
from procurd.operations.reconcile import ReconcileReport, reconcile
from support import run_cli
from test_cli_orders import write_config

WEEK = 7 * 24 * 3600.0


@pytest.fixture
async def stack(database_url: str) -> AsyncIterator[Stack]:
    """One upstream mirrored; no workers or scheduler run: each step is driven by the test."""
    async with procurd_stack(database_url, upstreams=("main",)) as running:
        await running.sync("main")
        yield running


def sku_of(stack: Stack) -> int:
    sku = stack.sandbox.state.first_sku("auto")
    stack.sandbox.state.set_sku_stock(sku.id, -1)
    return sku.id


async def run(stack: Stack, *, repair: bool = True, trigger: str = "manual") -> ReconcileReport:
    runtime = stack.runtime
    return await reconcile(
        runtime.service, runtime.clients, runtime.alerts, window_seconds=WEEK, repair=repair, trigger=trigger
    )


async def item_of(stack: Stack, order_no: str) -> dict[str, Any]:
    view = await stack.order(order_no)
    item: dict[str, Any] = view["procurements"][0]
    return item


async def test_a_refund_after_delivery_becomes_an_exception_with_a_finding_and_an_alert(stack: Stack) -> None:
    """The upstream refunds a delivered order and says nothing (real sites send no callback): the pass finds
    the status differs, repairs it into exception upstream_refunded (source reconcile in the audit trail),
    stores the finding and raises reconcile_mismatch."""
    view = await delivered_order(stack, "RF1", sku_of(stack))
    stack.sandbox.refund(view["procurements"][0]["upstream_order_id"])
    report = await run(stack)
    assert (report.checked, report.mismatches, report.repaired) == (1, 1, 1)
    [finding] = report.findings
    assert (finding.field, finding.local_value, finding.upstream_value, finding.repair) == (
        "status",
        "delivered",
        "refunded",
        "upstream_refunded",
    )
    item = await item_of(stack, "RF1")
    assert (item["state"], item["exception_reason"]) == ("exception", "upstream_refunded")
    audit = await stack.operations.views.audit("RF1")
    assert audit[-1]["source"] == "reconcile"
    total, alerts = await stack.runtime.alerts.recent(1, 10, Kind.RECONCILE_MISMATCH.value)
    assert total == 1
    assert "RF1" in alerts[0].message
    assert "refunded" in alerts[0].message
    answer = await stack.admin("GET", "/api/v1/reconcile")
    [latest, *_] = answer.body["runs"]
    assert latest["findings"][0]["field"] == "status"


async def test_a_delivery_whose_callbacks_were_lost_is_delivered(stack: Stack) -> None:
    """Every callback of an order is lost and procurd still waits: the pass finds it delivered upstream and
    delivers it here, goods included."""
    await order(stack, "LC1", sku_of(stack))
    stack.sandbox.faults.drop_callbacks_next(10)
    assert await stack.submit_due()
    await stack.sandbox.wait_callbacks_idle()
    assert (await item_of(stack, "LC1"))["state"] == "submitted"
    report = await run(stack)
    assert report.repaired == 1
    item = await item_of(stack, "LC1")
    assert item["state"] == "delivered"
    assert item["fulfillment"] is not None


async def test_an_amount_that_differs_is_an_exception(stack: Stack) -> None:
    """The upstream's order shows another amount than the one its answer gave: exception
    amount_mismatch with both amounts in its message."""
    view = await delivered_order(stack, "AM1", sku_of(stack))
    upstream_order = stack.sandbox.state.orders[view["procurements"][0]["upstream_order_id"]]
    upstream_order.amount = Decimal(upstream_order.amount) + Decimal("1.00")
    report = await run(stack)
    assert [f.field for f in report.findings] == ["amount"]
    item = await item_of(stack, "AM1")
    assert (item["state"], item["exception_reason"]) == ("exception", "amount_mismatch")
    assert str(upstream_order.amount) in item["last_error_message"]


async def test_without_repair_it_only_reports(stack: Stack) -> None:
    """--no-repair: the finding is stored and alerted, the procurement is left as it was."""
    view = await delivered_order(stack, "NR1", sku_of(stack))
    stack.sandbox.refund(view["procurements"][0]["upstream_order_id"])
    report = await run(stack, repair=False)
    assert (report.mismatches, report.repaired) == (1, 0)
    assert report.findings[0].repair is None
    assert (await item_of(stack, "NR1"))["state"] == "delivered"


async def test_agreeing_orders_find_nothing_and_the_scheduled_pass_skips_settled_ones(stack: Stack) -> None:
    """Orders in agreement are no findings. The first scheduled pass of a day checks delivered orders too
    (trigger daily); the next scheduled one only checks what is not settled."""
    sku = sku_of(stack)
    await delivered_order(stack, "OK1", sku)
    await order(stack, "OK2", sku)
    stack.sandbox.faults.hold_delivery_next(1)
    assert await stack.submit_due()
    first = await run(stack, trigger="scheduled")
    assert (first.trigger, first.checked, first.mismatches) == ("daily", 2, 0)
    second = await run(stack, trigger="scheduled")
    assert (second.trigger, second.checked, second.mismatches) == ("scheduled", 1, 0)


async def test_reconcile_from_the_command_line(stack: Stack, tmp_path: Path) -> None:
    """``procurd reconcile`` runs a pass now and prints its findings; --json answers them; --no-repair
    leaves the order alone."""
    view = await delivered_order(stack, "CL1", sku_of(stack))
    stack.sandbox.refund(view["procurements"][0]["upstream_order_id"])
    config = write_config(tmp_path / "procurd.toml", stack)
    report_only = await run_cli(config, "reconcile", "--no-repair", "--json")
    assert report_only.exit_code == 0, report_only.stderr
    body = json.loads(report_only.stdout)
    assert (body["mismatches"], body["repaired"], body["findings"][0]["order_no"]) == (1, 0, "CL1")
    assert (await item_of(stack, "CL1"))["state"] == "delivered"
    repaired = await run_cli(config, "reconcile")
    assert repaired.exit_code == 0, repaired.stderr
    assert "1 order checked, 1 mismatch, 1 repaired" in repaired.stdout
    assert "CL1" in repaired.stdout
    assert (await item_of(stack, "CL1"))["exception_reason"] == "upstream_refunded"
