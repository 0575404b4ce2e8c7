"""Named leases in the ``leases`` table: at most one holder per name across every process on one database.

A lease is taken with an ``INSERT`` that fails on the primary key when the row exists, then a conditional
``UPDATE ... WHERE expires_at < now OR holder = me``. Both are single statements, so two contenders never
both win: on PostgreSQL the loser's ``UPDATE`` re-checks the condition after the winner's commit, on SQLite
writers are serialised. Expiry times come from this process's clock (:func:`procurd.db.types.utcnow`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from procurd.db.schema import leases
from procurd.db.types import utcnow


async def acquire(engine: AsyncEngine, name: str, holder: str, ttl_seconds: float) -> bool:
    """Take lease ``name`` for ``holder`` when it is free, expired or already ``holder``'s.

    Returns whether ``holder`` now holds it, valid for ``ttl_seconds`` from now.
    """
    now = utcnow()
    expires_at = _expiry(now, ttl_seconds)
    try:
        async with engine.begin() as connection:
            await connection.execute(
                insert(leases).values(name=name, holder=holder, expires_at=expires_at, acquired_at=now)
            )
        return True
    except IntegrityError:
        pass
    async with engine.begin() as connection:
        result = await connection.execute(
            update(leases)
            .where(leases.c.name == name, or_(leases.c.expires_at < now, leases.c.holder == holder))
            .values(holder=holder, expires_at=expires_at, acquired_at=now)
        )
        return result.rowcount == 1


async def renew(engine: AsyncEngine, name: str, holder: str, ttl_seconds: float) -> bool:
    """Extend ``holder``'s lease to ``ttl_seconds`` from now; False when ``holder`` no longer holds it.

    A lease that expired but was not taken by anyone else is still ``holder``'s and is renewed.
    """
    async with engine.begin() as connection:
        result = await connection.execute(
            update(leases)
            .where(leases.c.name == name, leases.c.holder == holder)
            .values(expires_at=_expiry(utcnow(), ttl_seconds))
        )
        return result.rowcount == 1


async def release(engine: AsyncEngine, name: str, holder: str) -> bool:
    """Give the lease up if ``holder`` holds it; returns whether there was anything to release."""
    async with engine.begin() as connection:
        result = await connection.execute(
            delete(leases).where(leases.c.name == name, leases.c.holder == holder)
        )
        return result.rowcount == 1


async def holder_of(engine: AsyncEngine, name: str) -> str | None:
    """Who holds lease ``name`` right now (``None`` when it is free or expired)."""
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                select(leases.c.holder).where(leases.c.name == name, leases.c.expires_at >= utcnow())
            )
        ).first()
    return None if row is None else str(row.holder)


def _expiry(now: datetime, ttl_seconds: float) -> datetime:
    if ttl_seconds <= 0:
        raise ValueError("ttl_seconds must be positive")
    return now + timedelta(seconds=ttl_seconds)
