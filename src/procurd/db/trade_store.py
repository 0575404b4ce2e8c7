"""Statements of ``upstream_trades``: each purchase at an upstream that cannot look one up by procurd's
number (acg-faka), written before it is sent."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sqlalchemy import Connection, select, update

from procurd.core.trades import Trade, TradeState
from procurd.db.dialect import insert_or_skip
from procurd.db.schema import upstream_trades


def _trade(row: Any) -> Trade:
    return Trade(
        upstream=row.upstream,
        request_no=row.request_no,
        downstream_order_no=row.downstream_order_no,
        code=row.code,
        quantity=int(row.quantity),
        state=TradeState(row.state),
        sent_at=row.sent_at,
        trade_no=row.trade_no,
        amount=row.amount,
        balance_before=row.balance_before,
        notice=row.notice,
        answered_at=row.answered_at,
    )


class TradeStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def get(self, upstream: str, request_no: str) -> Trade | None:
        row = self.connection.execute(
            select(upstream_trades).where(
                upstream_trades.c.upstream == upstream, upstream_trades.c.request_no == request_no
            )
        ).first()
        return None if row is None else _trade(row)

    def by_trade_no(self, upstream: str, trade_no: str) -> Trade | None:
        row = self.connection.execute(
            select(upstream_trades).where(
                upstream_trades.c.upstream == upstream, upstream_trades.c.trade_no == trade_no
            )
        ).first()
        return None if row is None else _trade(row)

    def begin(self, trade: Trade) -> Trade:
        """Record ``trade`` as being sent, unless one is recorded under its number: then that one (the
        caller decides), or ``trade`` again when the one recorded was refused (nothing bought)."""
        values = asdict(trade)
        values["state"] = trade.state.value
        inserted = self.connection.execute(
            insert_or_skip(
                self.connection, upstream_trades, upstream_trades.c.upstream, upstream_trades.c.request_no
            ).values(**values)
        )
        if inserted.rowcount == 1:
            return trade
        known = self.get(trade.upstream, trade.request_no)
        assert known is not None
        if known.may_have_bought:
            return known
        values.pop("upstream")
        values.pop("request_no")
        self.connection.execute(
            update(upstream_trades)
            .where(
                upstream_trades.c.upstream == trade.upstream,
                upstream_trades.c.request_no == trade.request_no,
                upstream_trades.c.state.in_([TradeState.REFUSED.value, TradeState.CLEARED.value]),
            )
            .values(**values)
        )
        return trade

    def clear(self, upstream: str, request_no: str) -> bool:
        """A person found nothing bought under ``request_no`` (a trade whose outcome was unknown): it may be
        sent again, under the same number. False when no such trade is recorded as possibly bought."""
        result = self.connection.execute(
            update(upstream_trades)
            .where(
                upstream_trades.c.upstream == upstream,
                upstream_trades.c.request_no == request_no,
                upstream_trades.c.state.in_([TradeState.SENDING.value, TradeState.UNKNOWN.value]),
            )
            .values(state=TradeState.CLEARED.value)
        )
        return result.rowcount == 1

    def answered(self, trade: Trade) -> None:
        """Record the answer of ``trade`` (its state, trade number, amount, notice)."""
        self.connection.execute(
            update(upstream_trades)
            .where(
                upstream_trades.c.upstream == trade.upstream,
                upstream_trades.c.request_no == trade.request_no,
            )
            .values(
                state=trade.state.value,
                trade_no=trade.trade_no,
                amount=trade.amount,
                balance_before=trade.balance_before,
                notice=trade.notice,
                answered_at=trade.answered_at,
            )
        )
