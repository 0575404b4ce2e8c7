"""Named leases: one holder at a time, expiry, renewal and release, on the migrated test database."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta

import pytest
from sqlalchemy import select, text, update

from procurd.db.database import Database, open_database
from procurd.db.schema import leases as leases_table
from procurd.db.stores import Tx
from procurd.db.types import utcnow
from support import lease_holder, wait_until

NAME = "catalog-sync:main"


async def acquire(database: Database, name: str, holder: str, ttl: float) -> bool:
    now = utcnow()
    return await database.write(lambda tx: tx.leases.acquire(name, holder, now, ttl))


async def renew(database: Database, name: str, holder: str, ttl: float) -> bool:
    now = utcnow()
    return await database.write(lambda tx: tx.leases.renew(name, holder, now, ttl))


async def release(database: Database, name: str, holder: str) -> bool:
    return await database.write(lambda tx: tx.leases.release(name, holder))


async def _expire(database: Database, name: str) -> None:
    def expire(tx: Tx) -> None:
        tx.connection.execute(
            update(leases_table)
            .where(leases_table.c.name == name)
            .values(expires_at=utcnow() - timedelta(seconds=5))
        )

    await database.write(expire)


async def test_free_lease_is_taken(database: Database) -> None:
    """A lease nobody holds is granted and recorded with its holder."""
    assert await acquire(database, NAME, "a", 30)
    assert await lease_holder(database, NAME) == "a"


async def test_held_lease_is_refused_to_others(database: Database) -> None:
    """While one holder's lease is valid, another holder cannot take it."""
    assert await acquire(database, NAME, "a", 30)
    assert not await acquire(database, NAME, "b", 30)
    assert await lease_holder(database, NAME) == "a"


async def test_holder_may_take_its_own_lease_again(database: Database) -> None:
    """Acquiring a lease one already holds succeeds and keeps it."""
    assert await acquire(database, NAME, "a", 30)
    assert await acquire(database, NAME, "a", 30)
    assert await lease_holder(database, NAME) == "a"


async def test_expired_lease_is_taken_over(database: Database) -> None:
    """An expired lease goes to the next contender, and the old holder can no longer renew it."""
    assert await acquire(database, NAME, "a", 30)
    await _expire(database, NAME)
    assert await lease_holder(database, NAME) is None
    assert await acquire(database, NAME, "b", 30)
    assert not await renew(database, NAME, "a", 30)
    assert await lease_holder(database, NAME) == "b"


async def test_renew_extends_the_expiry(database: Database) -> None:
    """Renewing moves the expiry forward, even for a lease that lapsed but was not taken."""
    assert await acquire(database, NAME, "a", 30)
    await _expire(database, NAME)
    assert await renew(database, NAME, "a", 600)
    expires_at = await database.read(
        lambda tx: tx.connection.execute(
            select(leases_table.c.expires_at).where(leases_table.c.name == NAME)
        ).scalar_one()
    )
    assert expires_at > utcnow() + timedelta(seconds=300)


async def test_release_frees_the_lease_only_for_its_holder(database: Database) -> None:
    """Only the holder can release; afterwards anyone may take the lease."""
    assert await acquire(database, NAME, "a", 30)
    assert not await release(database, NAME, "b")
    assert not await acquire(database, NAME, "b", 30)
    assert await release(database, NAME, "a")
    assert not await release(database, NAME, "a")
    assert await acquire(database, NAME, "b", 30)


async def test_leases_are_independent_by_name(database: Database) -> None:
    """Holding one name does not block another name."""
    assert await acquire(database, "catalog-sync:one", "a", 30)
    assert await acquire(database, "catalog-sync:two", "b", 30)


async def test_concurrent_contenders_for_a_free_lease_get_one_winner(database: Database) -> None:
    """Of many simultaneous acquisitions of a free lease exactly one succeeds."""
    results = await asyncio.gather(*(acquire(database, NAME, f"holder-{i}", 30) for i in range(8)))
    assert sum(results) == 1


async def test_concurrent_contenders_for_an_expired_lease_get_one_winner(database: Database) -> None:
    """Of many simultaneous takeovers of an expired lease exactly one succeeds."""
    assert await acquire(database, NAME, "old", 30)
    await _expire(database, NAME)
    results = await asyncio.gather(*(acquire(database, NAME, f"holder-{i}", 30) for i in range(8)))
    assert sum(results) == 1
    assert await lease_holder(database, NAME) != "old"


async def test_non_positive_ttl_is_rejected(database: Database) -> None:
    """A lease must last some time: a zero ttl is a programming error."""
    with pytest.raises(ValueError, match="ttl_seconds"):
        await acquire(database, NAME, "a", 0)


BLOCKING_LOCK = 7_240_001  # an advisory lock key of this test's own


@asynccontextmanager
async def a_gate(
    database: Database, url: str
) -> AsyncIterator[tuple[Callable[[Tx], None], Callable[[], object]]]:
    """``(step, waiting)``: ``step`` is something a transaction can do that blocks until the gate opens on
    leaving the block; ``waiting()`` tells whether a transaction is blocked at it. On PostgreSQL the step
    waits for an advisory lock another connection holds; on SQLite (writes run on a thread) for an event."""
    if database.dialect != "postgresql":
        entered, gate = threading.Event(), threading.Event()

        def wait_at_gate(tx: Tx) -> None:
            entered.set()
            gate.wait(timeout=30)

        try:
            yield wait_at_gate, entered.is_set
        finally:
            gate.set()
        return
    holder = open_database(url)
    lock = {"key": BLOCKING_LOCK}
    await holder.autocommit(lambda tx: tx.connection.execute(text("SELECT pg_advisory_lock(:key)"), lock))

    def wait_for_lock(tx: Tx) -> None:
        tx.connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), lock)

    async def waiting() -> bool:
        query = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return bool(await holder.read(lambda tx: tx.connection.execute(query).scalar_one()))

    try:
        yield wait_for_lock, waiting
    finally:
        await holder.autocommit(
            lambda tx: tx.connection.execute(text("SELECT pg_advisory_unlock(:key)"), lock)
        )
        await holder.close()


async def test_a_release_whose_caller_is_cancelled_still_happens(
    database: Database, database_url: str
) -> None:
    """A task cancelled while its write is under way (a pass's ``finally`` releasing its lease as the daemon
    shuts down) does not roll that write back: the transaction runs to its end, on both databases."""
    assert await acquire(database, NAME, "a", 30)
    async with a_gate(database, database_url) as (gate, waiting):

        def release_then_wait(tx: Tx) -> None:
            tx.leases.release(NAME, "a")
            gate(tx)

        writing = asyncio.create_task(database.write(release_then_wait))
        await wait_until(waiting)
        writing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writing
        assert await lease_holder(database, NAME) == "a"  # not committed yet: the gate is closed
    await wait_until(lambda: _released(database))


async def _released(database: Database) -> bool:
    return await lease_holder(database, NAME) is None
