"""acg-faka's trades kept in the database, and the lease of each supplier account: the
:class:`procurd.protocol.acgfaka.ports.TradeBook` the runtime gives their adapters."""

from __future__ import annotations

from procurd.core.clock import utcnow
from procurd.core.trades import Trade
from procurd.db.database import Database
from procurd.db.views import WithLeases, WithTrades


class DatabaseTrades:
    def __init__(self, database: Database, instance: str) -> None:
        self.database = database
        self.instance = instance

    def _holder(self, token: str) -> str:
        # An instance found dead frees what it held under its id and a token (LeaseStore.release_held_by).
        return f"{self.instance}#{token}"

    async def hold(self, account: str, token: str, seconds: float) -> bool:
        return await self.database.write(_hold, account, self._holder(token), seconds)

    async def renew(self, account: str, token: str, seconds: float) -> bool:
        return await self.database.write(_renew, account, self._holder(token), seconds)

    async def let_go(self, account: str, token: str) -> None:
        await self.database.write(_let_go, account, self._holder(token))

    async def recorded(self, upstream: str, request_no: str) -> Trade | None:
        return await self.database.read(_recorded, upstream, request_no)

    async def begin(self, trade: Trade) -> Trade:
        return await self.database.write(_begin, trade)

    async def answered(self, trade: Trade) -> None:
        await self.database.write(_answered, trade)

    async def by_trade_no(self, upstream: str, trade_no: str) -> Trade | None:
        return await self.database.read(_by_trade_no, upstream, trade_no)


def _hold(tx: WithLeases, account: str, holder: str, seconds: float) -> bool:
    return tx.leases.acquire(account, holder, utcnow(), seconds)


def _renew(tx: WithLeases, account: str, holder: str, seconds: float) -> bool:
    return tx.leases.renew(account, holder, utcnow(), seconds)


def _let_go(tx: WithLeases, account: str, holder: str) -> None:
    tx.leases.release(account, holder)


def _recorded(tx: WithTrades, upstream: str, request_no: str) -> Trade | None:
    return tx.trades.get(upstream, request_no)


def _begin(tx: WithTrades, trade: Trade) -> Trade:
    return tx.trades.begin(trade)


def _answered(tx: WithTrades, trade: Trade) -> None:
    tx.trades.answered(trade)


def _by_trade_no(tx: WithTrades, upstream: str, trade_no: str) -> Trade | None:
    return tx.trades.by_trade_no(upstream, trade_no)
