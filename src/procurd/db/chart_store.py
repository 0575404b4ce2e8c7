"""Statements of the shop's pulse: the hourly rollup of procurements, the wallet's balance hour by hour, and a
downstream account's wallet read back from its ledger.

Every read is bounded by time through a primary key or an index: a chart reads at most one row per hour (and
currency and writer) of the rollup, never the procurements themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

from sqlalchemy import Connection, Insert, RowMapping, bindparam, func, select

from procurd.core.rollup import VALUE_COLUMNS, Deltas, from_micros, hour_of, hour_start
from procurd.db.schema import procurement_hours, provider_ledger, upstream_balances

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

    def hours(
        self,
        upstreams: Sequence[str],
        account_id: int,
        since: datetime,
        columns: Sequence[str] = VALUE_COLUMNS,
    ) -> list[RowMapping]:
        """The rollup's rows of ``upstreams`` (``account_id`` 0: every order; another: that downstream
        account's) from the hour ``since`` on, summed over upstreams and writers: one row per hour and
        currency."""
        statement = (
            select(_HOURS.hour, _HOURS.currency, *(func.sum(_HOURS[name]).label(name) for name in columns))
            .where(_HOURS.upstream.in_(upstreams), _HOURS.account_id == account_id, _HOURS.hour >= since)
            .group_by(_HOURS.hour, _HOURS.currency)
            .order_by(_HOURS.hour)
        )
        return [row._mapping for row in self.connection.execute(statement)]

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
        ledger = provider_ledger.c
        seeks = [
            select(ledger.balance_after_cents)
            .where(ledger.account_id == bindparam("account"), ledger.created_at <= bindparam(f"t{index}"))
            .order_by(ledger.created_at.desc(), ledger.id.desc())
            .limit(1)
            .scalar_subquery()
            .label(f"b{index}")
            for index in range(len(moments))
        ]
        values: dict[str, Any] = {f"t{index}": moment for index, moment in enumerate(moments)}
        row = self.connection.execute(select(*seeks), {"account": account_id, **values}).one()
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
