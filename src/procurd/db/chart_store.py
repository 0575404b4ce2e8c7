"""Statements of the shop's pulse: the hourly rollup of procurements, the wallet's balance hour by hour, and a
downstream account's wallet read back from its ledger.

Every read is bounded by time through a primary key or an index: a chart reads at most one row per hour (and
currency and writer) of the rollup, never the procurements themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, Final

from sqlalchemy import Connection, Insert, Select, bindparam, func, select, type_coerce

from procurd.core.procurement import State
from procurd.core.rollup import (
    DAY_COLUMNS,
    STATE_COLUMNS,
    VALUE_COLUMNS,
    Deltas,
    from_micros,
    hour_of,
    hour_start,
)
from procurd.db.provider_schema import provider_ledger
from procurd.db.schema import procurement_hours, procurements, upstream_balances
from procurd.db.types import UtcDateTime

_HOURS: Final = procurement_hours.c
_LEDGER_ORDER_KINDS: Final = ("order", "refund")


def _insert(connection: Connection, table: Any) -> Any:
    if connection.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    return insert(table)


_UPSERTS: dict[str, Insert] = {}
_BALANCE_UPSERTS: dict[str, Insert] = {}


def _add_statement(connection: Connection) -> Insert:
    """``INSERT ... ON CONFLICT (key) DO UPDATE SET value = value + excluded.value`` for every value."""
    dialect = connection.dialect.name
    statement = _UPSERTS.get(dialect)
    if statement is None:
        insert = _insert(connection, procurement_hours)
        statement = insert.on_conflict_do_update(
            index_elements=list(procurement_hours.primary_key.columns),
            set_={name: _HOURS[name] + insert.excluded[name] for name in VALUE_COLUMNS},
        )
        _UPSERTS[dialect] = statement
    return statement


def _balance_statement(connection: Connection) -> Insert:
    """The hour's row takes a balance seen later than the one it holds."""
    dialect = connection.dialect.name
    statement = _BALANCE_UPSERTS.get(dialect)
    if statement is None:
        insert = _insert(connection, upstream_balances)
        excluded = insert.excluded
        statement = insert.on_conflict_do_update(
            index_elements=[upstream_balances.c.upstream, upstream_balances.c.hour],
            set_={"balance": excluded.balance, "currency": excluded.currency, "at": excluded.at},
            where=excluded.at >= upstream_balances.c.at,
        )
        _BALANCE_UPSERTS[dialect] = statement
    return statement


def _day(value: Any) -> datetime:
    """A day as the database gives it (a date, a timestamp or ``YYYY-MM-DD``), as its UTC midnight."""
    if isinstance(value, str):
        return datetime.fromisoformat(value[:10]).replace(tzinfo=UTC)
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    assert isinstance(value, date)
    return datetime(value.year, value.month, value.day, tzinfo=UTC)


# Built once: a statement of many columns costs more to build and to key for the cache than to run.
_IN_WINDOW = (
    _HOURS.upstream.in_(bindparam("upstreams", expanding=True)),
    _HOURS.account_id == bindparam("account"),
    _HOURS.hour >= bindparam("since", type_=UtcDateTime()),
)
_HOURS_SINCE = (
    select(_HOURS.hour, _HOURS.currency, *(func.sum(_HOURS[name]) for name in VALUE_COLUMNS))
    .where(*_IN_WINDOW)
    .group_by(_HOURS.hour, _HOURS.currency)
    .order_by(_HOURS.hour)
)
_DAYS_SINCE: dict[str, Select[Any]] = {}


def _days_since(dialect: str) -> Select[Any]:
    day: Any
    if dialect == "postgresql":
        day = func.date_trunc("day", func.timezone("UTC", _HOURS.hour))
    else:
        day = func.substr(_HOURS.hour, 1, 10)  # stored as "YYYY-MM-DD HH:MM:SS.ffffff" (UTC)
    return (
        select(day.label("day"), _HOURS.currency, *(func.sum(_HOURS[name]) for name in DAY_COLUMNS))
        .where(*_IN_WINDOW)
        .group_by(day, _HOURS.currency)
    )


_WALLET_AT: dict[int, Select[Any]] = {}


def _wallet_at(count: int) -> Select[Any]:
    """``count`` seeks in one select: each the balance after an account's last ledger row up to a moment."""
    ledger = provider_ledger.c
    return select(
        *(
            select(ledger.balance_after_cents)
            .where(ledger.account_id == bindparam("account"), ledger.created_at <= bindparam(f"t{index}"))
            .order_by(ledger.created_at.desc(), ledger.id.desc())
            .limit(1)
            .scalar_subquery()
            .label(f"b{index}")
            for index in range(count)
        )
    )


class ChartStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    # --- writing ----------------------------------------------------------------------------------------

    def add(self, deltas: Deltas, writer: str) -> None:
        """Add a transaction's differences to the rollup, in rows of ``writer`` (keys in a fixed order)."""
        if not deltas:
            return
        rows = [
            {"upstream": upstream, "account_id": account, "hour": hour_start(hour), "currency": currency,
             "writer": writer, **{name: values.get(name, 0) for name in VALUE_COLUMNS}}
            for (upstream, account, hour, currency), values in sorted(deltas.items())
        ]  # fmt: skip
        self.connection.execute(_add_statement(self.connection), rows)

    def record_balance(self, upstream: str, balance: str, currency: str | None, at: datetime) -> None:
        """The wallet's balance as a ping (or an answer that refreshed it) showed it at ``at``."""
        row = {"upstream": upstream, "hour": hour_of(at), "balance": balance, "currency": currency, "at": at}
        self.connection.execute(_balance_statement(self.connection), [row])

    # --- reading ----------------------------------------------------------------------------------------

    def hours(self, upstreams: Sequence[str], account_id: int, since: datetime) -> list[tuple[Any, ...]]:
        """The rollup of ``upstreams`` (``account_id`` 0: every order; another: that downstream account's)
        from the hour ``since`` on, summed over upstreams and writers: ``(hour, currency, *VALUE_COLUMNS)``
        per hour and currency."""
        bind = {"upstreams": list(upstreams), "account": account_id, "since": since}
        return [tuple(row) for row in self.connection.execute(_HOURS_SINCE, bind)]

    def days(self, upstreams: Sequence[str], account_id: int, since: datetime) -> list[tuple[Any, ...]]:
        """:meth:`hours` summed by UTC day in the database: ``(day, currency, *DAY_COLUMNS)``."""
        dialect = self.connection.dialect.name
        statement = _DAYS_SINCE.get(dialect)
        if statement is None:
            statement = _DAYS_SINCE[dialect] = _days_since(dialect)
        bind = {"upstreams": list(upstreams), "account": account_id, "since": since}
        return [(_day(row[0]), *row[1:]) for row in self.connection.execute(statement, bind)]

    def states(self) -> dict[tuple[str, str], int]:
        """Procurements by upstream and state, from the rollup (its rows of every hour, not the
        procurements): ``(upstream, state)`` to how many."""
        columns = [(state, _HOURS[column]) for state, column in STATE_COLUMNS.items()]
        statement = (
            select(_HOURS.upstream, *(func.sum(column) for _, column in columns))
            .where(_HOURS.account_id == 0, _HOURS.currency == "")
            .group_by(_HOURS.upstream)
        )
        counts = {}
        for upstream, *values in self.connection.execute(statement):
            for (state, _), value in zip(columns, values, strict=True):
                if value:
                    counts[(str(upstream), state.value)] = int(value)
        return counts

    def oldest_queued(self, upstreams: Sequence[str]) -> dict[str, datetime]:
        """When the oldest queued procurement of each upstream was taken in (through the index of queued
        procurements by upstream: as many rows as are queued)."""
        statement = (
            select(procurements.c.upstream, type_coerce(func.min(procurements.c.created_at), UtcDateTime()))
            .where(procurements.c.upstream.in_(upstreams), procurements.c.state == State.QUEUED.value)
            .group_by(procurements.c.upstream)
        )
        return {upstream: at for upstream, at in self.connection.execute(statement) if at is not None}

    def exception_reasons(self, upstreams: Sequence[str]) -> dict[str, dict[str, int]]:
        """Open exceptions per upstream and reason (through the index by upstream and state: as many rows
        as are open)."""
        statement = (
            select(procurements.c.upstream, procurements.c.exception_reason, func.count())
            .where(procurements.c.upstream.in_(upstreams), procurements.c.state == State.EXCEPTION.value)
            .group_by(procurements.c.upstream, procurements.c.exception_reason)
        )
        counts: dict[str, dict[str, int]] = {}
        for upstream, reason, count in self.connection.execute(statement):
            counts.setdefault(upstream, {})[reason or "unknown"] = int(count)
        return counts

    def spend_since(self, upstream: str, since: datetime, account_id: int = 0) -> dict[str, Decimal]:
        """The upstream amounts of the procurements submitted from the hour ``since`` on that the upstream
        holds money for, per currency."""
        statement = (
            select(_HOURS.currency, func.sum(_HOURS.spend_micros))
            .where(
                _HOURS.upstream == upstream,
                _HOURS.account_id == account_id,
                _HOURS.hour >= since,
                _HOURS.currency != "",
            )
            .group_by(_HOURS.currency)
        )
        return {
            str(currency): from_micros(int(total or 0))
            for currency, total in self.connection.execute(statement)
        }

    def balances(self, upstream: str, since: datetime) -> list[tuple[datetime, str, str | None]]:
        """The upstream's balance hour by hour from ``since`` on, with the last one before it (where the
        chart begins): ``(at, balance, currency)``, oldest first."""
        table = upstream_balances.c
        columns = (table.at, table.balance, table.currency)
        before = (
            select(*columns)
            .where(table.upstream == upstream, table.hour < since)
            .order_by(table.hour.desc())
            .limit(1)
        )
        during = select(*columns).where(table.upstream == upstream, table.hour >= since).order_by(table.hour)
        rows = list(self.connection.execute(before)) + list(self.connection.execute(during))
        return [(at, str(balance), currency) for at, balance, currency in rows]

    def wallet_at(self, account_id: int, moments: Sequence[datetime]) -> list[int | None]:
        """A downstream account's balance in cents at each of ``moments`` (its last ledger row before it;
        ``None`` before the first): one index seek per moment, in one statement."""
        if not moments:
            return []
        statement = _WALLET_AT.get(len(moments))
        if statement is None:
            statement = _WALLET_AT[len(moments)] = _wallet_at(len(moments))
        values: dict[str, Any] = {f"t{index}": moment for index, moment in enumerate(moments)}
        row = self.connection.execute(statement, {"account": account_id, **values}).one()
        return [None if value is None else int(value) for value in row]

    def wallet_spend(self, account_id: int, since: datetime) -> int:
        """What a downstream account's orders took from its wallet since ``since``, refunds deducted, in
        cents (the rows of one account's ledger in that time, through its index by time)."""
        ledger = provider_ledger.c
        statement = select(func.coalesce(func.sum(ledger.amount_cents), 0)).where(
            ledger.account_id == account_id,
            ledger.created_at >= since,
            ledger.kind.in_(_LEDGER_ORDER_KINDS),
        )
        return -int(self.connection.execute(statement).scalar_one())
