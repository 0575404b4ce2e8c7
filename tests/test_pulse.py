"""The shop's pulse over real sockets: the charts of the console's overview and of a provider account's page
state what the ``procurements`` table says, the hourly rollup the state path keeps equals the one computed
from that table, and the status report's runway follows the rollup.

A known history (30 days of intakes, deliveries, exceptions, cancels and open orders) is written through
the state path at chosen moments (:mod:`pulse_support`); the pages are read from procurd's admin listener
and every figure is compared with a count of the table, hour by hour and day by day.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import procurd
from console_support import ConsoleClient, order
from procurd.core.rollup import HOUR, VALUE_COLUMNS, hour_of, window_start
from procurd.db.database import Database
from procurd.db.schema import procurement_hours
from procurd.db.stores import Tx
from procurd.http.testing import Stack, procurd_stack
from procurd.operations.pings import ping_upstream
from pulse_support import (
    PRICE,
    ShownChart,
    bucket_bound,
    counted,
    days_of,
    hours_of,
    plan_history,
    seed_history,
    shown_charts,
    whole,
)
from support import sql_rows
from test_console_provider import delivered, place, provider_chain

PRICING = {"rules": [{"markup_percent": "20"}]}  # 9.90 sells for 11.88
CHART_KEYS = ["hourly", "daily", "delivery", "balance", "spend"]
BALANCES = {26: "950.00", 20: "700.00", 9: "520.50", 3: "400.00"}  # hours ago: the wallet then


@dataclass
class History:
    stack: Stack
    client: ConsoleClient
    sku: int


@pytest.fixture
async def history(database_url: str) -> AsyncIterator[History]:
    """One upstream (a 9.90 SKU priced at 11.88), 90 orders of the last 30 days written through the state
    path, the wallet's balance recorded at four past hours, and a ping now."""
    async with procurd_stack(database_url, upstreams=("main",), pricing=PRICING) as stack:
        product = stack.sandbox.state.add_product(price=PRICE)
        await stack.sync("main")
        sku = stack.sandbox.state.product(product).skus[0].id
        now = datetime.now(UTC)
        await seed_history(stack.runtime.database, stack.settings, sku, plan_history(now, orders=90))
        for hours, balance in BALANCES.items():
            await record_balance(stack.runtime.database, balance, now - timedelta(hours=hours))
        await ping_upstream(stack.runtime, "main")
        client = ConsoleClient(stack.admin_url)
        try:
            yield History(stack, client, sku)
        finally:
            await client.close()


async def record_balance(database: Database, balance: str, at: datetime) -> None:
    """The wallet as a ping at ``at`` showed it."""

    def write(tx: Tx) -> None:
        tx.charts.record_balance("main", balance, "CNY", at)

    await database.write(write)


def chart(charts: list[ShownChart], key: str) -> ShownChart:
    [found] = [c for c in charts if c.key == key]
    return found


async def test_every_chart_has_its_picture_title_description_and_figures(history: History) -> None:
    """The overview draws the five charts of the upstream, each an SVG whose title is the chart's, with a
    description in words, key figures beside it and a table of every value."""
    page = await history.client.get("/ui/")
    assert page.status == 200
    charts = shown_charts(page.text)
    assert [c.key for c in charts] == CHART_KEYS
    for shown in charts:
        assert shown.svgs == 1, shown.key
        assert shown.svg_title == shown.title
        assert len(shown.svg_desc) > 40, shown.key
        assert shown.figures, shown.key
        assert shown.rows, shown.key
    assert len(chart(charts, "hourly").rows) == 24
    assert len(chart(charts, "daily").rows) == 30
    assert "<script" not in page.text
    assert ' style="' not in page.text  # the policy allows no inline style: classes colour the charts


async def test_procurements_per_hour_and_per_day_are_the_counts_of_the_database(history: History) -> None:
    """Each hour's and each day's bar holds the procurements taken in then, by what became of them
    (delivered, exception or resolved, canceled, still queued or submitted), as the table counts them."""
    charts = shown_charts((await history.client.get("/ui/")).text)
    found = await counted(history.stack.runtime.database, "main")
    columns = {
        "Delivered": "delivered",
        "Exception": "exception",
        "Canceled": "canceled",
        "Still open": "open",
    }
    total = 0
    for hour, row in hours_of(charts, "hourly").items():
        expected = found.outcomes(hour, hour + HOUR)
        assert {name: whole(row[name]) for name in columns} == {
            name: expected[o] for name, o in columns.items()
        }
        assert whole(row["Taken in"]) == sum(expected.values())
        total += sum(expected.values())
    assert 20 <= total < 90  # a third of the history is in the last 24 h
    figures = chart(charts, "hourly").figures
    assert figures[0].startswith(f"{total} procurements taken in over the last 24 h: ")
    month = 0
    for day, row in days_of(charts, "daily").items():
        expected = found.outcomes(day, day + timedelta(days=1))
        assert {name: whole(row[name]) for name in columns} == {
            name: expected[o] for name, o in columns.items()
        }
        month += whole(row["Taken in"])
    assert month == len(found.rows)  # the whole history lies within the 30 days
    assert chart(charts, "daily").figures[0].startswith(f"{month} procurements taken in over 30 days: ")


async def test_time_to_delivery_is_counted_per_hour_with_its_percentiles(history: History) -> None:
    """Each hour shows how many deliveries it had and the bounds their p50 and p95 fall under; the figure
    beside the chart gives the same for the whole 24 hours."""
    charts = shown_charts((await history.client.get("/ui/")).text)
    found = await counted(history.stack.runtime.database, "main")
    rows = hours_of(charts, "delivery")
    every: list[float] = []
    for hour, row in rows.items():
        seconds = found.deliveries(hour, hour + HOUR)
        every += seconds
        assert whole(row["Deliveries"]) == len(seconds), hour
        assert row["p50 within"] == bucket_bound(seconds, 0.5), hour
        assert row["p95 within"] == bucket_bound(seconds, 0.95), hour
    assert every
    summary = chart(charts, "delivery").figures[0]
    assert summary.startswith(f"{len(every)} deliveries in the last 24 h: ")
    assert (
        f"half within {bucket_bound(every, 0.5)} of intake, 95 % within {bucket_bound(every, 0.95)}"
        in summary
    )


async def test_spend_and_margin_per_day_are_the_amounts_of_the_database(history: History) -> None:
    """Each day shows what the upstream was paid for the procurements submitted that day, how many, how many
    had a selling price at intake, what those sold for and the margin."""
    charts = shown_charts((await history.client.get("/ui/")).text)
    found = await counted(history.stack.runtime.database, "main")
    spent_all = Decimal(0)
    for day, row in days_of(charts, "spend").items():
        spent, paid, priced, sold, margin = found.money(day, day + timedelta(days=1))
        spent_all += spent
        assert Decimal(row["Spent"].removesuffix(" CNY")) == spent, day
        assert (whole(row["Paid"]), whole(row["With a selling price"])) == (paid, priced), day
        assert priced == paid  # every procurement of the history was priced when it came in
        if priced:
            assert Decimal(row["Sold for"].removesuffix(" CNY")) == sold
            assert Decimal(row["Margin"].removesuffix(" CNY")) == margin
            assert margin == (Decimal("11.88") - Decimal(PRICE)) * paid
    figures = chart(charts, "spend").figures
    assert figures[0].startswith(f"Spent over 30 days: {spent_all} CNY on ")
    assert "Margin where the selling price was known at intake" in figures[1]


async def test_balance_chart_and_runway_follow_the_pings_and_the_spend(history: History) -> None:
    """The balance chart's table gives each day's lowest and last balance as the pings left it (the last one
    the status report's); spend_24h is the amount submitted since the current hour's start 23 hours ago, and
    the runway is the balance divided by that spend per hour, in the status report and beside the chart."""
    page = await history.client.get("/ui/")
    charts = shown_charts(page.text)
    shown = days_of(charts, "balance")
    status = (await history.stack.admin("GET", "/api/v1/status")).body
    [main] = status["upstreams"]
    now = datetime.fromisoformat(status["generated_at"].replace("Z", "+00:00"))
    pings = {hour_of(now - timedelta(hours=ago)): Decimal(balance) for ago, balance in BALANCES.items()}
    pings[hour_of(now)] = Decimal(main["last_ping"]["balance"])
    held: dict[datetime, list[Decimal]] = {}  # each day's balance hour by hour, held from ping to ping
    last = None
    for index in range(7 * 24 - 1, -1, -1):
        hour = hour_of(now) - HOUR * index
        last = pings.get(hour, last)
        if last is not None:
            held.setdefault(hour.replace(hour=0), []).append(last)
    expected = {
        day: {"Day (UTC)": f"{day:%Y-%m-%d}", "Lowest": f"{min(values)} CNY", "Last": f"{values[-1]} CNY"}
        for day, values in held.items()
    }
    assert shown == expected
    found = await counted(history.stack.runtime.database, "main")
    spent = found.money(window_start(now), now + HOUR)[0]
    assert Decimal(main["spend_24h"]) == spent > 0
    balance = Decimal(main["last_ping"]["balance"])
    assert main["runway_hours"] == Decimal(str(round(float(balance * 24 / spent), 1)))  # (read exactly)
    assert main["runway_alert_hours"] == 24
    figures = chart(charts, "balance").figures
    assert f"Balance: {balance} CNY." in figures
    assert f"Spent in the last 24 h: {spent} CNY" in figures[1]
    assert figures[2].startswith(f"Runway: {main['runway_hours']:,.1f} h at that rate")
    assert f"{main['runway_hours']:,.1f} h at the last 24 h's spend" in page.text  # the upstream's card


async def test_the_overview_without_charts(history: History) -> None:
    """``?charts=off`` answers the overview without a chart (and says how to see them); any other value than
    on or off is refused with a specific error."""
    page = await history.client.get("/ui/?charts=off")
    assert page.status == 200
    assert shown_charts(page.text) == []
    assert "Charts are off for this page" in page.text
    assert "Spent in 24 h" in page.text  # the runway stays on the upstream's card
    bad = await history.client.get("/ui/?charts=maybe")
    assert (bad.status, bad.error_code) == (400, "invalid_query")


def migration_rollup() -> Any:
    """The migration that filled the rollup from the stored procurements (its own copy of the arithmetic)."""
    path = Path(procurd.__file__).parent / "migrations" / "versions" / "0004_charts.py"
    spec = importlib.util.spec_from_file_location("migration_0004", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.rollup_of


async def rollup_in_table(database: Database) -> dict[tuple[Any, ...], dict[str, int]]:
    """The rollup as stored, summed over its writers, without the rows that net to nothing."""
    rows = await sql_rows(database, procurement_hours.select())
    summed: dict[tuple[Any, ...], dict[str, int]] = {}
    for row in rows:
        key = (row.upstream, row.account_id, row.hour, row.currency)
        into = summed.setdefault(key, dict.fromkeys(VALUE_COLUMNS, 0))
        for column in VALUE_COLUMNS:
            into[column] += getattr(row, column)
    return {key: values for key, values in summed.items() if any(values.values())}


def without_margins(rollup: dict[tuple[Any, ...], dict[str, int]]) -> dict[tuple[Any, ...], dict[str, int]]:
    """The migration knows no selling prices (they are recorded from this version on)."""
    ignored = ("n_priced", "sold_micros", "sold_cost_micros")
    return {key: {c: v for c, v in values.items() if c not in ignored} for key, values in rollup.items()}


async def test_the_rollup_the_state_path_keeps_is_what_the_procurements_say(history: History) -> None:
    """After the history and live orders through the sandbox (queued ones bought and delivered, an exception
    retried, one resolved, a queued order canceled), the rollup kept change by change equals the one the
    migration computes from the procurements table."""
    stack = history.stack
    await order(stack, "L1", history.sku)
    while await stack.submit_due():  # L1 and the history's queued orders: bought and delivered
        pass
    await stack.sandbox.wait_callbacks_idle()
    assert (await stack.order("L1"))["status"] == "delivered"
    retried = (await order(stack, "L2", history.sku, max_unit_price="1.00"))["procurements"][0]["id"]
    resolved = (await order(stack, "L3", history.sku, max_unit_price="1.00"))["procurements"][0]["id"]
    answer = await stack.admin("POST", f"/api/v1/exceptions/{resolved}/resolve", {"note": "refunded by hand"})
    assert answer.status == 200, answer.body
    answer = await stack.admin("POST", f"/api/v1/exceptions/{retried}/retry", {"note": "try again"})
    assert answer.status == 200, answer.body
    queued = await order(stack, "L4", history.sku)
    assert queued["procurements"][0]["state"] == "queued"
    canceled = await stack.admin("POST", "/api/v1/orders/L4/cancel")
    assert canceled.status == 200, canceled.body
    database = stack.runtime.database
    expected = await database.read(lambda tx: migration_rollup()(tx.connection))
    expected = {(u, a, h.astimezone(UTC), c): v for (u, a, h, c), v in expected.items()}
    assert without_margins(await rollup_in_table(database)) == without_margins(expected)


async def test_a_downstream_accounts_page_has_the_charts_of_its_orders_and_wallet(database_url: str) -> None:
    """With the provider role, an account's page draws the same five charts from that account's orders (its
    share of the rollup) and its wallet (from its ledger), and they state what the database says."""
    async with provider_chain(database_url) as chain:
        for number in ("P1", "P2", "P3"):
            await delivered(chain, await place(chain, number))
        await chain.client.login()
        page = await chain.client.get("/ui/provider/accounts/shop-c")
        assert page.status == 200
        charts = shown_charts(page.text)
        assert [c.key for c in charts] == CHART_KEYS
        assert all(c.svgs == 1 and c.svg_desc and c.figures for c in charts)
        account = await chain.daemon.operations.provider.accounts.show("shop-c", 1, 10)
        database = chain.daemon.runtime.database
        found = await counted(database, account_id=int(account["id"]))
        assert len(found.rows) == 3
        taken = 0
        for hour, row in hours_of(charts, "hourly").items():
            expected = found.outcomes(hour, hour + HOUR)
            assert (whole(row["Delivered"]), whole(row["Taken in"])) == (
                expected["delivered"],
                sum(expected.values()),
            )
            taken += whole(row["Taken in"])
        assert taken == 3
        for day, row in days_of(charts, "spend").items():
            spent, paid, priced, _sold, margin = found.money(day, day + timedelta(days=1))
            assert Decimal(row["Paid upstream for its orders"].split()[0]) == spent
            assert (whole(row["Paid"]), whole(row["With a selling price"])) == (paid, priced)
            if priced:
                assert Decimal(row["Margin"].split()[0]) == margin
        balances = days_of(charts, "balance")
        last = balances[max(balances)]["Last"]
        assert last == f"{account['balance']} {account['currency']}"
        figures = chart(charts, "balance").figures
        assert f"Balance: {account['balance']} {account['currency']}." in figures
        charged = Decimal("500.00") - Decimal(account["balance"])
        # The page's two "spent" figures each say what they count: the wallet's charges, the upstream's price.
        assert figures[1].startswith(
            "Charged to the account's wallet for its orders in the last 24 h (refunds deducted): "
            f"{charged:.2f} {account['currency']}"
        )
        assert chart(charts, "spend").figures[0].startswith("Paid upstream for its orders over 30 days: ")
        assert "Spent" not in page.text
        hours = round(float(Decimal(account["balance"]) * 24 / charged), 1)
        assert figures[2].startswith(f"Runway: {hours:,.1f} h at that rate: the account's wallet is empty")
