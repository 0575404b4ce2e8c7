"""Helpers for the tests of the shop's pulse: a known history of procurements written through the state path
at chosen moments, the figures a page shows (read back from its HTML), and the same figures counted in the
``procurements`` table.

The history is written by a :class:`ProcurementService` whose clock the test sets: intake, a worker's claim
and the upstream's acceptance, a callback's delivery, a cancel, an exception at intake, each at the moment
the plan gives. The upstream's answers are the data a sandbox would send; nothing of procurd's own is
replaced.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from html.parser import HTMLParser
from typing import Any

from sqlalchemy import select

from procurd.config import Settings
from procurd.core.intake import parse_order_request
from procurd.core.procurement import Cancel, Source, SubmitAccepted, UpstreamReport
from procurd.core.rollup import DELIVERY_BOUNDS, OUTCOME_OF, hour_of, micros, percentile
from procurd.db.database import Database
from procurd.db.provider_schema import provider_orders
from procurd.db.schema import procurements
from procurd.http.console.pulse import duration_text
from procurd.procurement.service import ProcurementService

FATES = ("delivered", "exception", "canceled", "submitted", "queued")
PRICE = "9.90"


@dataclass(frozen=True, slots=True)
class Planned:
    """One order of the history: when it is taken in, what becomes of it, and (delivered) how long after."""

    order_no: str
    at: datetime
    fate: str
    after: float = 0.0  # seconds from intake to delivery


class Clock:
    """The state path's clock, set by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


DIURNAL = (2, 1, 1, 1, 1, 2, 3, 5, 7, 8, 9, 9, 10, 10, 9, 9, 10, 11, 12, 12, 11, 8, 5, 3)  # orders by hour


def plan_history(
    now: datetime, *, orders: int = 120, days: int = 30, recent: float = 1 / 3, seed: int = 25
) -> list[Planned]:
    """``orders`` orders over the last ``days`` days (the share ``recent`` of them in the last 24 h, the
    others on earlier days at the hours a shop is busy), each fate present, delivery times from a second to
    a day."""
    rng = random.Random(seed)
    planned = []
    every = max(1, round(1 / recent)) if recent else orders + 1
    for index in range(orders):
        if index % every == 0:
            at = now - timedelta(seconds=rng.uniform(60, 86_000))
        else:
            day = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(
                days=rng.randrange(1, days)
            )
            hour = rng.choices(range(24), weights=DIURNAL)[0]
            at = day + timedelta(hours=hour, seconds=rng.uniform(0, 3599))
        old = at < now - timedelta(days=2)  # an old order is rarely still open
        fate = rng.choices(FATES, weights=(80, 8, 10, 1, 1) if old else (60, 10, 10, 10, 10))[0]
        after = rng.choice((0.5, 3, 40, 200, 1500, 5000, 30_000, 80_000)) if fate == "delivered" else 0.0
        if fate == "delivered" and at + timedelta(seconds=after + 3) >= now:
            after = 1.0
        planned.append(Planned(f"H{index:04d}", at, fate, after))
    return planned


async def seed_history(
    database: Database, settings: Settings, sku: int, planned: Sequence[Planned], *, upstream: str = "main"
) -> None:
    """Write ``planned`` through the state path, each step at its moment (the queued ones last, so that no
    claim takes them)."""
    clock = Clock(datetime.now(UTC))
    service = ProcurementService(database, settings, clock=clock, writer="history")
    try:
        order_ids = iter(range(900_000, 1_000_000))
        for plan in sorted(planned, key=lambda p: (p.fate == "queued", p.at)):
            clock.now = plan.at
            item: dict[str, Any] = {"upstream": upstream, "sku_id": sku, "quantity": 1}
            if plan.fate == "exception":
                item["max_unit_price"] = "1.00"  # an exception price_above_limit at intake
            result = await service.submit(parse_order_request({"order_no": plan.order_no, "items": [item]}))
            [view] = result.order["procurements"]
            if plan.fate in ("exception", "queued"):
                continue
            if plan.fate == "canceled":
                clock.now = plan.at + timedelta(seconds=30)
                await service.apply(view["id"], Cancel(upstream_confirmed=False), Source.ADMIN)
                continue
            clock.now = plan.at + timedelta(seconds=1)
            owner = f"history/{upstream}/{plan.order_no}"
            [claimed] = (await service.claim_submissions(upstream, owner, 1)).procurements
            assert claimed.order_no == plan.order_no
            order_id = next(order_ids)
            clock.now = plan.at + timedelta(seconds=2)
            accepted = SubmitAccepted(owner, order_id, f"U{order_id}", "paid", PRICE, "CNY")
            await service.apply(claimed.id, accepted, Source.WORKER)
            if plan.fate == "delivered":
                clock.now = plan.at + timedelta(seconds=max(plan.after, 2.5))
                fulfillment = {"type": "auto", "status": "delivered", "payload": "CODE-1",
                               "delivery_data": None, "delivered_at": clock.now.isoformat()}  # fmt: skip
                report = UpstreamReport(order_id, "delivered", f"U{order_id}", fulfillment, PRICE, "CNY")
                await service.report(upstream, claimed.downstream_order_no, report, Source.CALLBACK)
    finally:
        await service.close()


# --- what the database says ------------------------------------------------------------------------------


@dataclass
class Counted:
    """The figures of the charts, counted in ``procurements`` (for an upstream, or one downstream account)."""

    rows: list[Any]

    def outcomes(self, start: datetime, end: datetime) -> Counter[str]:
        """Procurements taken in from ``start`` to before ``end``, by what became of them."""
        return Counter(OUTCOME_OF[row.state] for row in self.rows if start <= row.created_at < end)

    def deliveries(self, start: datetime, end: datetime) -> list[float]:
        """How long each delivery from ``start`` to before ``end`` took from intake (seconds)."""
        return [
            (row.delivered_at - row.created_at).total_seconds()
            for row in self.rows
            if row.state == "delivered" and row.delivered_at is not None and start <= row.delivered_at < end
        ]

    def money(self, start: datetime, end: datetime) -> tuple[Decimal, int, int, Decimal, Decimal]:
        """Of the procurements submitted from ``start`` to before ``end`` the upstream holds money for: the
        amount, how many, how many with a selling price, what they sold for (upstream currency, to the
        millionth as the rollup sums it) and their margin."""
        spent, paid, priced, sold, cost = Decimal(0), 0, 0, 0, 0
        for row in self.rows:
            if row.state not in ("submitted", "delivered") or row.amount is None or row.submitted_at is None:
                continue
            if not start <= row.submitted_at < end:
                continue
            spent += Decimal(row.amount)
            paid += 1
            if row.sell_price and row.sell_rate:
                priced += 1
                sold += micros(Decimal(row.sell_price) * row.quantity / Decimal(row.sell_rate))
                cost += micros(row.amount)
        return spent, paid, priced, Decimal(sold) / 1_000_000, Decimal(sold - cost) / 1_000_000


async def counted(database: Database, upstream: str | None = None, account_id: int | None = None) -> Counted:
    """The procurements of ``upstream`` (or those bought for the downstream account ``account_id``)."""
    names = (
        "state",
        "created_at",
        "submitted_at",
        "delivered_at",
        "amount",
        "quantity",
        "sell_price",
        "sell_rate",
    )
    columns = [procurements.c[name] for name in names]
    statement = select(*columns)
    if upstream is not None:
        statement = statement.where(procurements.c.upstream == upstream)
    if account_id is not None:
        statement = statement.join(
            provider_orders, provider_orders.c.order_no == procurements.c.order_no
        ).where(provider_orders.c.account_id == account_id)
    rows = await database.read(lambda tx: list(tx.connection.execute(statement)))
    return Counted(rows)


def bucket_bound(seconds: Sequence[float], fraction: float) -> str:
    """A percentile as the charts state it: the bound of the histogram bucket that holds it."""
    histogram: Counter[str] = Counter()
    for value in seconds:
        name = next((n for n, bound in DELIVERY_BOUNDS if value <= bound), "dt_more")
        histogram[name] += 1
    found = percentile(histogram, fraction)
    return duration_text(found)


def hour_start(label: str) -> datetime:
    """``2026-11-25 14:00`` (a table's hour) as an aware datetime."""
    return datetime.strptime(label, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)


def day_start(label: str) -> datetime:
    return datetime.strptime(label, "%Y-%m-%d").replace(tzinfo=UTC)


# --- what a page shows -----------------------------------------------------------------------------------


@dataclass
class ShownChart:
    key: str
    title: str = ""
    svg_title: str = ""
    svg_desc: str = ""
    svgs: int = 0
    figures: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)

    def table(self) -> list[dict[str, str]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


class _Charts(HTMLParser):
    """The figures (``<figure class="chart">``) of a page, in order, with what each says in words."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: list[ShownChart] = []
        self._open: list[str] = []  # the elements whose text is being read, innermost last
        self._text: list[str] = []
        self._row: list[str] | None = None
        self._inside = False  # within a chart's <figure>

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if tag == "figure" and "chart" in classes:
            key = dict(attrs).get("data-chart") or ""
            self.charts.append(ShownChart(key))
            self._inside = True
        if not self._inside:
            return
        if tag == "svg":
            self.charts[-1].svgs += 1
        elif tag == "ul" and "figures" in classes:
            self._open.append("figures")
        elif tag == "tr":
            self._row = []
        elif tag in ("h3", "title", "desc", "li", "th", "td"):
            self._open.append(tag)
            self._text = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._inside = False
        if not self._inside:
            return
        chart = self.charts[-1]
        if tag == "tr" and self._row is not None:
            if self._row:
                chart.rows.append(self._row)
            self._row = None
            return
        if tag == "ul" and self._open and self._open[-1] == "figures":
            self._open.pop()
            return
        if not self._open or tag != self._open[-1]:
            return
        self._open.pop()
        text = " ".join("".join(self._text).split())
        self._text = []
        if tag == "h3":
            chart.title = text
        elif tag == "title" and not chart.svg_title:
            chart.svg_title = text
        elif tag == "desc":
            chart.svg_desc = text
        elif tag == "li" and "figures" in self._open:
            chart.figures.append(text)
        elif tag == "th":
            chart.columns.append(text)
        elif tag == "td" and self._row is not None:
            self._row.append(text)

    def handle_data(self, data: str) -> None:
        if self._open:
            self._text.append(data)


def shown_charts(page: str) -> list[ShownChart]:
    """Every chart of ``page`` with its title, the SVG's title and description, the figures beside it and
    its table of every value."""
    parser = _Charts()
    parser.feed(page)
    parser.close()
    return parser.charts


def hours_of(charts: Sequence[ShownChart], key: str) -> dict[datetime, dict[str, str]]:
    [chart] = [chart for chart in charts if chart.key == key]
    return {hour_start(row["Hour (UTC)"]): row for row in chart.table()}


def days_of(charts: Sequence[ShownChart], key: str) -> dict[datetime, dict[str, str]]:
    [chart] = [chart for chart in charts if chart.key == key]
    return {day_start(row["Day (UTC)"]): row for row in chart.table()}


def whole(text: str) -> int:
    return int(text.replace(",", ""))


def current_hour() -> datetime:
    return hour_of(datetime.now(UTC))
