"""The hourly rollup of procurements (pure): what each procurement adds to the hours it belongs to, and what a
chart or the runway reads back from them.

A procurement counts, in the rollup of its upstream (and, for an order from a downstream site, in its
account's too):

* in the hour it was taken in, once, under the state it is in now (so the hours of intake say what became of
  what came in: delivered, exception, canceled, still open);
* in the hour it was submitted, with its upstream amount, while the upstream holds its money for it (state
  ``submitted`` or ``delivered``), and with the selling price known at intake beside that amount;
* in the hour it was delivered, in the bucket of its time from intake to delivery, while it is delivered.

The state path adds the difference each change makes in the transaction that makes it
(:func:`difference`), so the hours always equal what the ``procurements`` table says. Amounts are summed as
integer millionths (:func:`micros`): exact for every amount with at most six decimals.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Final

from procurd.core.procurement import Procurement, State

HOUR: Final = timedelta(hours=1)
MICRO: Final = Decimal("0.000001")
MICROS_PER_UNIT: Final = 1_000_000
SPEND_WINDOW_HOURS: Final = 24  # spend_24h: the current hour so far and the 23 before it

STATE_COLUMNS: Final = {state: f"n_{state.value}" for state in State}
# What became of what came in, as the charts stack it.
OUTCOMES: Final = ("delivered", "exception", "canceled", "open")
OUTCOME_OF: Final = {
    State.QUEUED: "open",
    State.SUBMITTED: "open",
    State.DELIVERED: "delivered",
    State.EXCEPTION: "exception",
    State.RESOLVED: "exception",  # an exception a person closed
    State.CANCELED: "canceled",
}
PAID_STATES: Final = frozenset({State.SUBMITTED, State.DELIVERED})

# Time from intake to delivery: each bucket counts the deliveries that took at most its bound (and more than
# the previous bound); the last has no bound.
DELIVERY_BOUNDS: Final = (
    ("dt_1s", 1), ("dt_2s", 2), ("dt_5s", 5), ("dt_10s", 10), ("dt_20s", 20), ("dt_30s", 30),
    ("dt_1m", 60), ("dt_2m", 120), ("dt_5m", 300), ("dt_10m", 600), ("dt_20m", 1200), ("dt_30m", 1800),
    ("dt_1h", 3600), ("dt_2h", 7200), ("dt_4h", 14400), ("dt_8h", 28800), ("dt_1d", 86400),
    ("dt_3d", 259200),
)  # fmt: skip
DELIVERY_MORE: Final = "dt_more"
DELIVERY_COLUMNS: Final = (*(name for name, _ in DELIVERY_BOUNDS), DELIVERY_MORE)

MONEY_COLUMNS: Final = ("spend_micros", "sold_micros", "sold_cost_micros")
COUNT_COLUMNS: Final = (*STATE_COLUMNS.values(), "n_paid", "n_priced")
VALUE_COLUMNS: Final = (*COUNT_COLUMNS, *MONEY_COLUMNS, *DELIVERY_COLUMNS)

# (upstream, account_id, hour, currency): account 0 is every order of the upstream; currency "" holds counts;
# the hour as a number (hours since 1970, UTC: :func:`hour_number`).
Key = tuple[str, int, int, str]
Deltas = dict[Key, dict[str, int]]


def hour_of(moment: datetime) -> datetime:
    """The start of the UTC hour ``moment`` is in."""
    moment = moment.astimezone(UTC)
    return moment.replace(minute=0, second=0, microsecond=0)


def hour_number(moment: datetime) -> int:
    """The UTC hour ``moment`` is in, as hours since 1970 (cheaper to compute than :func:`hour_of`)."""
    return int(moment.timestamp()) // 3600


def hour_start(number: int) -> datetime:
    """The start of the hour :func:`hour_number` numbered."""
    return datetime.fromtimestamp(number * 3600, UTC)


def micros(amount: str | Decimal) -> int:
    """An amount in integer millionths (rounded half-even past six decimals)."""
    value = amount if isinstance(amount, Decimal) else Decimal(amount)
    return int((value / MICRO).to_integral_value(rounding=ROUND_HALF_EVEN))


def from_micros(value: int) -> Decimal:
    """Millionths back to an amount, with at least two decimals (``310.50``) and no needless zeros."""
    amount = (Decimal(value) * MICRO).normalize()
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and exponent > -2:
        amount = amount.quantize(Decimal("0.01"))
    return amount


def delivery_column(seconds: float) -> str:
    """The bucket of a time from intake to delivery."""
    for name, bound in DELIVERY_BOUNDS:
        if seconds <= bound:
            return name
    return DELIVERY_MORE


def sold_value(p: Procurement) -> Decimal | None:
    """What the procurement sells for, in the upstream's currency: the selling price known at intake times
    the quantity, divided by the pricing rule's exchange rate (``None`` when no price was known)."""
    if not p.sell_price or not p.sell_rate:
        return None
    try:
        rate = Decimal(p.sell_rate)
        if rate <= 0:
            return None
        return Decimal(p.sell_price) * p.quantity / rate
    except (InvalidOperation, ArithmeticError):
        return None


def contributions(p: Procurement) -> dict[tuple[int, str], dict[str, int]]:
    """What ``p`` adds to the rollup as it is now, by ``(hour number, currency)``."""
    out = {(hour_number(p.created_at), ""): {STATE_COLUMNS[p.state]: 1}}
    if p.state in PAID_STATES and p.amount is not None and p.submitted_at is not None:
        values = {"n_paid": 1, "spend_micros": micros(p.amount)}
        sold = sold_value(p)
        if sold is not None:
            values.update(n_priced=1, sold_micros=micros(sold), sold_cost_micros=values["spend_micros"])
        _add(out, (hour_number(p.submitted_at), p.currency or ""), values)
    if p.state is State.DELIVERED and p.delivered_at is not None:
        seconds = (p.delivered_at - p.created_at).total_seconds()
        _add(out, (hour_number(p.delivered_at), ""), {delivery_column(seconds): 1})
    return out


def _add(
    into: dict[tuple[int, str], dict[str, int]], key: tuple[int, str], values: Mapping[str, int]
) -> None:
    row = into.setdefault(key, {})
    for column, value in values.items():
        row[column] = row.get(column, 0) + value


def _counted(p: Procurement) -> tuple[object, ...]:
    return (p.state, p.amount, p.currency, p.submitted_at, p.delivered_at, p.created_at, p.upstream)


def difference(
    changes: Iterable[tuple[Procurement | None, Procurement, Sequence[int]]],
) -> Deltas:
    """What a transaction's changes add to the rollup: each ``(before, after, accounts)`` (``before`` None
    for a new procurement; ``accounts``: 0 and, for a downstream site's order, its account). Rows whose
    every value nets to zero are left out."""
    deltas: Deltas = {}
    for before, after, accounts in changes:
        if before is not None and _counted(before) == _counted(after):
            continue
        parts: list[tuple[int, Procurement]] = [(1, after)]
        if before is not None:
            parts.append((-1, before))
        for sign, p in parts:
            for (hour, currency), values in contributions(p).items():
                for account in accounts:
                    row = deltas.setdefault((p.upstream, account, hour, currency), {})
                    for column, value in values.items():
                        row[column] = row.get(column, 0) + sign * value
    return {
        key: {column: value for column, value in row.items() if value}
        for key, row in deltas.items()
        if any(row.values())
    }


# --- reading back ------------------------------------------------------------------------------------------


_OUTCOME_COLUMNS: Final = {
    name: tuple(STATE_COLUMNS[state] for state, outcome in OUTCOME_OF.items() if outcome == name)
    for name in OUTCOMES
}
DAY_COLUMNS: Final = (*COUNT_COLUMNS, *MONEY_COLUMNS)  # what the charts of days read


@dataclass(frozen=True, slots=True)
class Hour:
    """One hour (or one day) of the rollup, summed over the instances that wrote it: counts, and money per
    currency."""

    hour: datetime
    counts: Mapping[str, int]
    money: Mapping[str, Mapping[str, int]]  # currency: {spend_micros, sold_micros, sold_cost_micros}

    def outcome(self, name: str) -> int:
        counts = self.counts
        return sum(counts.get(column, 0) for column in _OUTCOME_COLUMNS[name])

    @property
    def taken_in(self) -> int:
        return sum(self.counts.get(column, 0) for column in STATE_COLUMNS.values())

    @property
    def deliveries(self) -> int:
        return sum(self.counts.get(column, 0) for column in DELIVERY_COLUMNS)


def hours_from_rows(rows: Iterable[Sequence[object]], columns: Sequence[str]) -> dict[datetime, Hour]:
    """Rows ``(hour, currency, *values of columns)`` of the rollup, any number per hour (one per currency),
    as one :class:`Hour` per hour."""
    counts: dict[datetime, dict[str, int]] = {}
    money: dict[datetime, dict[str, dict[str, int]]] = {}
    money_at = {index for index, column in enumerate(columns) if column in MONEY_COLUMNS}
    for hour, currency, *values in rows:
        assert isinstance(hour, datetime)
        into = counts.setdefault(hour, {})
        for index, value in enumerate(values):
            if not value:
                continue
            column = columns[index]
            if index in money_at:
                per = money.setdefault(hour, {}).setdefault(str(currency or ""), {})
                per[column] = per.get(column, 0) + int(value)  # type: ignore[call-overload]
            else:
                into[column] = into.get(column, 0) + int(value)  # type: ignore[call-overload]
    return {hour: Hour(hour, counts[hour], money.get(hour, {})) for hour in sorted(counts)}


def percentile(histogram: Mapping[str, int], fraction: float) -> int | None:
    """The bound (seconds) of the bucket that holds the ``fraction`` quantile of a delivery histogram:
    that share of deliveries took at most this long (``None`` for no delivery, ``-1`` beyond the last
    bound)."""
    total = sum(histogram.get(column, 0) for column in DELIVERY_COLUMNS)
    if total <= 0:
        return None
    rank = fraction * total
    seen = 0
    for name, bound in DELIVERY_BOUNDS:
        seen += histogram.get(name, 0)
        if seen >= rank:
            return bound
    return -1


def window_start(now: datetime) -> datetime:
    """Where ``spend_24h`` begins: the start of the hour 23 hours before the current one."""
    return hour_of(now) - HOUR * (SPEND_WINDOW_HOURS - 1)


def runway_hours(balance: Decimal | None, spend_24h: Decimal | None) -> float | None:
    """How many hours ``balance`` lasts at the last 24 h's spend per hour (``None`` when nothing was spent or
    no balance is known; 0 for a balance at or below zero)."""
    if balance is None or spend_24h is None or spend_24h <= 0:
        return None
    if balance <= 0:
        return 0.0
    return round(float(balance * SPEND_WINDOW_HOURS / spend_24h), 1)
