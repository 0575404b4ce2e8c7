"""Named leases in the ``leases`` table: at most one holder per name across every process on one database.

A lease is taken with one conditional statement pair inside one transaction: an ``INSERT`` when the name is
new, else an ``UPDATE ... WHERE expires_at < now OR holder = me``. On PostgreSQL the loser's ``UPDATE``
re-checks the condition after the winner's commit; on SQLite writers are serialised.

A holder is an instance's id (``host:pid``), or that id followed by ``#`` and a token when one instance holds
several leases of one name in turn (catalogue passes): :meth:`LeaseStore.release_held_by` frees everything
an instance held once it is found dead.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from sqlalchemy import Connection, delete, or_, update

from procurd.db.dialect import insert_or_skip
from procurd.db.schema import leases


class LeaseStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def acquire(self, name: str, holder: str, now: datetime, ttl_seconds: float) -> bool:
        """Take lease ``name`` for ``holder`` when it is free, expired or already ``holder``'s."""
        expires_at = _expiry(now, ttl_seconds)
        inserted = self.connection.execute(
            insert_or_skip(self.connection, leases, leases.c.name).values(
                name=name, holder=holder, expires_at=expires_at, acquired_at=now
            )
        )
        if inserted.rowcount == 1:
            return True
        result = self.connection.execute(
            update(leases)
            .where(leases.c.name == name, or_(leases.c.expires_at < now, leases.c.holder == holder))
            .values(holder=holder, expires_at=expires_at, acquired_at=now)
        )
        return result.rowcount == 1

    def renew(self, name: str, holder: str, now: datetime, ttl_seconds: float) -> bool:
        """Extend ``holder``'s lease to ``ttl_seconds`` from now; False when ``holder`` no longer holds it."""
        result = self.connection.execute(
            update(leases)
            .where(leases.c.name == name, leases.c.holder == holder)
            .values(expires_at=_expiry(now, ttl_seconds))
        )
        return result.rowcount == 1

    def renew_all(self, names: Collection[str], holder: str, now: datetime, ttl_seconds: float) -> set[str]:
        """Extend every lease of ``names`` that ``holder`` still holds; the names renewed."""
        if not names:
            return set()
        result = self.connection.execute(
            update(leases)
            .where(leases.c.name.in_(sorted(names)), leases.c.holder == holder)
            .values(expires_at=_expiry(now, ttl_seconds))
            .returning(leases.c.name)
        )
        return {str(row.name) for row in result}

    def release_held_by(self, instances: Collection[str]) -> list[str]:
        """Free every lease held by one of ``instances`` (under its id, or its id and a token)."""
        held = [
            or_(leases.c.holder == instance, leases.c.holder.startswith(f"{instance}#", autoescape=True))
            for instance in instances
        ]
        if not held:
            return []
        result = self.connection.execute(delete(leases).where(or_(*held)).returning(leases.c.name))
        return sorted(str(row.name) for row in result)

    def release(self, name: str, holder: str) -> bool:
        """Give the lease up if ``holder`` holds it; returns whether there was anything to release."""
        result = self.connection.execute(
            delete(leases).where(leases.c.name == name, leases.c.holder == holder)
        )
        return result.rowcount == 1


def _expiry(now: datetime, ttl_seconds: float) -> datetime:
    if ttl_seconds <= 0:
        raise ValueError("ttl_seconds must be positive")
    return now + timedelta(seconds=ttl_seconds)
