"""The shop's pulse: the five charts of an upstream (or of a downstream account) from the hourly rollup and
the wallet's history, with the figures a person reads beside them (pure: :class:`PulseFacts` in, charts
out).

* procurements per hour over the last 24 h, and per day over 30 days, by what became of them;
* the time from intake to delivery per hour, p50 and p95;
* the wallet's balance over 7 days, with its runway at the last 24 h's spend;
* the spend per day (upstream amounts), and the margin where the selling price was known at intake.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from procurd.core.rollup import (
    DELIVERY_COLUMNS,
    HOUR,
    OUTCOMES,
    Hour,
    from_micros,
    hour_of,
    percentile,
)
from procurd.http.console.charts import (
    Chart,
    Point,
    Projection,
    Series,
    Tick,
    bars_and_line,
    element_id,
    number,
    range_bars,
    stacked_bars,
    step_line,
)

DAY = timedelta(days=1)
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
HOURS_SHOWN = 24
DAYS_SHOWN = 30
BALANCE_DAYS = 7
OUTCOME_SERIES = (
    Series("delivered", "delivered"),
    Series("exception", "exception"),
    Series("canceled", "canceled"),
    Series("still open", "open"),
)
DELIVERY_SERIES = (Series("p50", "p50"), Series("p95", "p95"))


@dataclass(frozen=True, slots=True)
class PulseFacts:
    """What the charts of one upstream (or account) are drawn from."""

    name: str  # the upstream's, or the account's (for the elements' ids)
    now: datetime
    hours: Mapping[datetime, Hour]  # the rollup's last 24 hours (an hour without a row has none)
    days: Mapping[datetime, Hour]  # the rollup's last 30 days, summed by day (from midnight UTC)
    balances: Sequence[Decimal | None]  # the wallet at the end of each hour of the last 7 days
    balance: Decimal | None  # the last known balance
    currency: str | None  # the wallet's currency
    spend_24h: Decimal  # what the wallet paid in the last 24 h (its currency)
    runway_hours: float | None
    runway_alert_hours: float | None
    wallet: str = "wallet"  # "wallet" at an upstream, "account's wallet" for a downstream account
    spend_currency: str | None = None  # the currency of upstream amounts (default: the wallet's)
    # What each chart's "spent" counts, in its own words: at an upstream both are its wallet's spending;
    # for a downstream account the wallet's is what its orders were charged, the spend chart's what procurd
    # paid upstream to buy them.
    wallet_spent: str = "Spent in the last 24 h"
    upstream_spent: str = "Spent"


def day_of(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def windows(now: datetime) -> tuple[datetime, datetime]:
    """Where the charts of hours and of days begin: 23 hours before the current one, 29 days before today."""
    return hour_of(now) - HOUR * (HOURS_SHOWN - 1), day_of(now) - DAY * (DAYS_SHOWN - 1)


def duration_text(seconds: int | None) -> str:
    """A bucket's bound as people say it: ``5 s``, ``2 min``, ``4 h``, ``3 d``; beyond the last one."""
    if seconds is None:
        return "—"
    if seconds < 0:
        return "over 3 d"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _hour_label(hour: datetime) -> str:
    return hour.strftime("%H:00")


def _day_label(day: datetime) -> str:
    return f"{day.day} {day.strftime('%b')}"


def _plural(count: int, word: str, words: str | None = None) -> str:
    return f"{number(count)} {word if count == 1 else (words or word + 's')}"


def _outcomes(hours: Sequence[Hour | None]) -> dict[str, int]:
    return {name: sum(h.outcome(name) for h in hours if h is not None) for name in OUTCOMES}


def _outcome_sentence(counts: Mapping[str, int]) -> str:
    return (
        f"{number(counts['delivered'])} delivered, {_plural(counts['exception'], 'exception')}, "
        f"{number(counts['canceled'])} canceled, {number(counts['open'])} still open"
    )


def charts(facts: PulseFacts) -> list[Chart]:
    """The five charts, in the order the page shows them."""
    return [hourly(facts), daily(facts), delivery(facts), balance(facts), spend(facts)]


def _last_hours(facts: PulseFacts) -> list[datetime]:
    current = hour_of(facts.now)
    return [current - HOUR * (HOURS_SHOWN - 1 - index) for index in range(HOURS_SHOWN)]


def _last_days(facts: PulseFacts) -> list[datetime]:
    today = day_of(facts.now)
    return [today - DAY * (DAYS_SHOWN - 1 - index) for index in range(DAYS_SHOWN)]


def _by_day(facts: PulseFacts) -> dict[datetime, list[Hour]]:
    return {day: [summed] for day, summed in facts.days.items()}


def _outcome_point(label: str, hours: Sequence[Hour | None]) -> Point:
    counts = _outcomes(hours)
    total = sum(counts.values())
    return Point(label, tuple(counts[s] for s in OUTCOMES), f"{_plural(total, 'procurement')} in all")


def hourly(facts: PulseFacts) -> Chart:
    hours = _last_hours(facts)
    found = [facts.hours.get(hour) for hour in hours]
    points = [_outcome_point(f"{_hour_label(h)} UTC", [row]) for h, row in zip(hours, found, strict=True)]
    counts = _outcomes(found)
    total = sum(counts.values())
    busiest = max(zip(found, hours, strict=True), key=lambda pair: pair[0].taken_in if pair[0] else -1)
    title = "Procurements per hour, last 24 h"
    desc = (
        "Stacked bars of the procurements taken in during each of the last 24 hours (UTC), by what became "
        f"of them: {total} in all, {_outcome_sentence(counts)}."
    )
    figures = [f"{_plural(total, 'procurement')} taken in over the last 24 h: {_outcome_sentence(counts)}."]
    if busiest[0] is not None and busiest[0].taken_in:
        figures.append(
            f"Busiest hour: {_hour_label(busiest[1])} UTC, {number(busiest[0].taken_in)} taken in."
        )
    ticks = [Tick(index, _hour_label(hour)) for index, hour in enumerate(hours) if hour.hour % 6 == 0]
    rows = tuple(
        (f"{h:%Y-%m-%d %H:00}", *(number(v or 0) for v in (p.values)), number(sum(v or 0 for v in p.values)))
        for h, p in zip(hours, points, strict=True)
    )
    return Chart(
        "hourly", title,
        stacked_bars(element_id(facts.name, "hourly"), title, desc, OUTCOME_SERIES, points, ticks),
        OUTCOME_SERIES, tuple(figures),
        ("Hour (UTC)", "Delivered", "Exception", "Canceled", "Still open", "Taken in"), rows,
    )  # fmt: skip


def daily(facts: PulseFacts) -> Chart:
    days = _last_days(facts)
    by_day = _by_day(facts)
    points = [_outcome_point(_day_label(day), by_day.get(day, [])) for day in days]
    counts = _outcomes([hour for day in days for hour in by_day.get(day, [])])
    total = sum(counts.values())
    per_day = [sum(int(v or 0) for v in p.values) for p in points]
    title = "Procurements per day, last 30 days"
    desc = (
        "Stacked bars of the procurements taken in on each of the last 30 days (UTC), by what became of "
        f"them: {total} in all, {_outcome_sentence(counts)}."
    )
    figures = [f"{_plural(total, 'procurement')} taken in over 30 days: {_outcome_sentence(counts)}."]
    if total:
        best = max(range(len(days)), key=lambda index: per_day[index])
        figures.append(
            f"Today so far: {number(per_day[-1])}; yesterday: {number(per_day[-2])}; "
            f"busiest day: {_day_label(days[best])}, {number(per_day[best])}."
        )
    ticks = [
        Tick(index, _day_label(day)) for index, day in enumerate(days) if (len(days) - 1 - index) % 7 == 0
    ]
    rows = tuple(
        (f"{day:%Y-%m-%d}", *(number(v or 0) for v in p.values), number(per_day[index]))
        for index, (day, p) in enumerate(zip(days, points, strict=True))
    )
    return Chart(
        "daily", title,
        stacked_bars(element_id(facts.name, "daily"), title, desc, OUTCOME_SERIES, points, ticks),
        OUTCOME_SERIES, tuple(figures),
        ("Day (UTC)", "Delivered", "Exception", "Canceled", "Still open", "Taken in"), rows,
    )  # fmt: skip


def _histogram(hours: Sequence[Hour | None]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for hour in hours:
        if hour is None:
            continue
        for column in DELIVERY_COLUMNS:
            merged[column] = merged.get(column, 0) + hour.counts.get(column, 0)
    return merged


def _bound(seconds: int | None) -> Decimal | None:
    if seconds is None:
        return None
    return Decimal(seconds if seconds > 0 else 3 * 259200)  # beyond the last bound: drawn at 9 days


def delivery(facts: PulseFacts) -> Chart:
    hours = _last_hours(facts)
    found = [facts.hours.get(hour) for hour in hours]
    points = []
    rows = []
    for hour, row in zip(hours, found, strict=True):
        histogram = _histogram([row])
        count = sum(histogram.values())
        p50, p95 = percentile(histogram, 0.5), percentile(histogram, 0.95)
        points.append(
            Point(
                f"{_hour_label(hour)} UTC", (_bound(p50), _bound(p95)),
                f"{_plural(count, 'delivery', 'deliveries')}; half within {duration_text(p50)}, "
                f"95 % within {duration_text(p95)}" if count else "no delivery",
            )
        )  # fmt: skip
        rows.append((f"{hour:%Y-%m-%d %H:00}", number(count), duration_text(p50), duration_text(p95)))
    merged = _histogram(found)
    count = sum(merged.values())
    p50, p95 = percentile(merged, 0.5), percentile(merged, 0.95)
    title = "Time from intake to delivery, last 24 h"
    if count:
        summary = (
            f"{_plural(count, 'delivery', 'deliveries')} in the last 24 h: half within {duration_text(p50)} "
            f"of intake, 95 % within {duration_text(p95)}."
        )
    else:
        summary = "No delivery in the last 24 h."
    desc = (
        f"For each hour of the last 24 (UTC), how long its deliveries took from intake (p50, p95). {summary}"
    )
    ticks = [Tick(index, _hour_label(hour)) for index, hour in enumerate(hours) if hour.hour % 6 == 0]
    return Chart(
        "delivery", title,
        range_bars(element_id(facts.name, "delivery"), title, desc, DELIVERY_SERIES, points, ticks),
        DELIVERY_SERIES,
        (summary, "Each bar: the p95 (light) with the p50 inside it, on a logarithmic scale; times are "
                  "rounded up to the histogram's bounds (1, 2, 5, 10, 20, 30 s, 1, 2, 5 min ...)."),
        ("Hour (UTC)", "Deliveries", "p50 within", "p95 within"), tuple(rows),
    )  # fmt: skip


def _money(amount: Decimal | None, currency: str | None) -> str:
    if amount is None:
        return "—"
    return f"{amount} {currency}" if currency else str(amount)


def balance(facts: PulseFacts) -> Chart:
    past = BALANCE_DAYS * 24
    start = hour_of(facts.now) - HOUR * (past - 1)
    ahead = int(min(max((facts.runway_alert_hours or 24) * 1.5, 12), 96))  # hours drawn beyond now
    now_at = (facts.now - start) / HOUR
    currency = facts.currency
    points = []
    days: dict[int, list[Decimal]] = {}  # by days after the first hour's
    for index, value in enumerate(facts.balances[-past:]):
        hour = start + HOUR * index
        points.append(Point(f"{hour.day:02d} {_MONTHS[hour.month - 1]} {hour.hour:02d}:00 UTC", (value,)))
        if value is not None:
            days.setdefault((start.hour + index) // 24, []).append(value)
    first_day = day_of(start)
    rows = [
        (f"{first_day + DAY * day:%Y-%m-%d}", _money(min(values), currency), _money(values[-1], currency))
        for day, values in days.items()
    ]
    runway = facts.runway_hours
    projection = None
    if facts.balance is not None and runway is not None:
        mark = None if facts.runway_alert_hours is None else now_at + facts.runway_alert_hours
        label = "" if facts.runway_alert_hours is None else f"alert: {facts.runway_alert_hours:g} h"
        projection = Projection(now_at, max(facts.balance, Decimal(0)), now_at + runway, mark, label)
    ticks = [Tick(past - 1 - 48 * days, f"-{2 * days} d") for days in (3, 2, 1)] + [Tick(past - 1, "now")]
    rate = (facts.spend_24h / 24).quantize(Decimal("0.01")) if facts.spend_24h else Decimal(0)
    figures = [
        f"Balance: {_money(facts.balance, currency)}."
        if facts.balance is not None
        else "No balance known yet.",
        f"{facts.wallet_spent}: {_money(facts.spend_24h, currency)} (about {rate} an hour).",
    ]
    if runway is None:
        figures.append("Runway: nothing was spent in the last 24 h, so the balance does not run down.")
    else:
        empty = facts.now + timedelta(hours=runway)
        figures.append(
            f"Runway: {runway:,.1f} h at that rate: the {facts.wallet} is empty around "
            f"{empty:%Y-%m-%d %H:%M} UTC."
        )
    if facts.runway_alert_hours is not None:
        figures.append(f"Alert balance_runway below {facts.runway_alert_hours:g} h.")
    title = f"Balance, last {BALANCE_DAYS} days, and the runway"
    desc = (
        f"The {facts.wallet}'s balance hour by hour over the last {BALANCE_DAYS} days, and a dashed line "
        f"from now down to zero at the last 24 h's spend. " + " ".join(figures)
    )
    return Chart(
        "balance", title,
        step_line(
            element_id(facts.name, "balance"), title, desc, Series("balance", "balance"), points, ticks,
            past + ahead, projection, now_at,
        ),
        (Series("balance", "balance"), Series("at the last 24 h's spend", "projection")),
        tuple(figures), ("Day (UTC)", "Lowest", "Last"), tuple(rows),
    )  # fmt: skip


def spend(facts: PulseFacts) -> Chart:
    days = _last_days(facts)
    by_day = _by_day(facts)
    currency = facts.spend_currency or facts.currency or _main_currency(facts.days.values())
    totals = {"spend_micros": 0, "sold_micros": 0, "sold_cost_micros": 0, "n_paid": 0, "n_priced": 0}
    points = []
    rows = []
    for day in days:
        money: dict[str, int] = {}
        paid = priced = 0
        for hour in by_day.get(day, []):
            for column, value in hour.money.get(currency or "", {}).items():
                money[column] = money.get(column, 0) + value
            paid += hour.counts.get("n_paid", 0)
            priced += hour.counts.get("n_priced", 0)
        spent = from_micros(money.get("spend_micros", 0))
        sold = from_micros(money.get("sold_micros", 0))
        margin = (
            from_micros(money.get("sold_micros", 0) - money.get("sold_cost_micros", 0)) if priced else None
        )
        for column in ("spend_micros", "sold_micros", "sold_cost_micros"):
            totals[column] += money.get(column, 0)
        totals["n_paid"] += paid
        totals["n_priced"] += priced
        note = f"{_plural(paid, 'procurement')} paid" + (f", {priced} with a selling price" if paid else "")
        points.append(Point(_day_label(day), (spent, margin), note))
        rows.append(
            (f"{day:%Y-%m-%d}", _money(spent, currency), number(paid), number(priced),
             _money(sold, currency) if priced else "—", _money(margin, currency) if priced else "—")
        )  # fmt: skip
    spent_all = from_micros(totals["spend_micros"])
    figures = [
        f"{facts.upstream_spent} over 30 days: {_money(spent_all, currency)} on "
        f"{_plural(totals['n_paid'], 'procurement')}; today so far: {rows[-1][1]}."
    ]
    if totals["n_priced"]:
        sold = from_micros(totals["sold_micros"])
        margin = from_micros(totals["sold_micros"] - totals["sold_cost_micros"])
        share = (margin * 100 / sold).quantize(Decimal("0.1")) if sold else Decimal(0)
        figures.append(
            f"Margin where the selling price was known at intake ({number(totals['n_priced'])} of "
            f"{number(totals['n_paid'])}): {_money(margin, currency)} on sales of {_money(sold, currency)} "
            f"({share} %)."
        )
    else:
        figures.append(
            "No procurement of these 30 days had a selling price known at intake: no margin to show."
        )
    title = "Spend and margin per day, last 30 days"
    desc = (
        "Bars: what the upstream was paid each day of the last 30 (UTC), by the day of submission; line: the "
        "margin of that day's procurements whose selling price was known at intake. " + " ".join(figures)
    )
    ticks = [
        Tick(index, _day_label(day)) for index, day in enumerate(days) if (len(days) - 1 - index) % 7 == 0
    ]
    series = (
        Series(f"{facts.upstream_spent.lower()}{' (' + currency + ')' if currency else ''}", "spend"),
        Series("margin", "margin"),
    )
    return Chart(
        "spend", title,
        bars_and_line(element_id(facts.name, "spend"), title, desc, series[0], series[1], points, ticks),
        series, tuple(figures),
        ("Day (UTC)", facts.upstream_spent, "Paid", "With a selling price", "Sold for", "Margin"),
        tuple(rows),
    )  # fmt: skip


def _main_currency(hours: Iterable[Hour]) -> str | None:
    """The currency most was spent in (an upstream's wallet has one)."""
    spent: dict[str, int] = {}
    for hour in hours:
        for currency, values in hour.money.items():
            spent[currency] = spent.get(currency, 0) + values.get("spend_micros", 0)
    return max(spent, key=lambda c: spent[c]) if spent else None


def carried(values: Sequence[Decimal | None]) -> list[Decimal | None]:
    """Each hour's value, or the last one before it (a wallet keeps its balance between pings)."""
    out: list[Decimal | None] = []
    last: Decimal | None = None
    for value in values:
        last = value if value is not None else last
        out.append(last)
    return out
