"""Named leases: one holder at a time, expiry, renewal and release, on the migrated test database."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from procurd.db import leases
from procurd.db.schema import leases as leases_table
from procurd.db.types import utcnow

NAME = "catalog-sync:main"


async def _expire(engine: AsyncEngine, name: str) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            update(leases_table)
            .where(leases_table.c.name == name)
            .values(expires_at=utcnow() - timedelta(seconds=5))
        )


async def test_free_lease_is_taken(engine: AsyncEngine) -> None:
    """A lease nobody holds is granted and recorded with its holder."""
    assert await leases.acquire(engine, NAME, "a", 30)
    assert await leases.holder_of(engine, NAME) == "a"


async def test_held_lease_is_refused_to_others(engine: AsyncEngine) -> None:
    """While one holder's lease is valid, another holder cannot take it."""
    assert await leases.acquire(engine, NAME, "a", 30)
    assert not await leases.acquire(engine, NAME, "b", 30)
    assert await leases.holder_of(engine, NAME) == "a"


async def test_holder_may_take_its_own_lease_again(engine: AsyncEngine) -> None:
    """Acquiring a lease one already holds succeeds and keeps it."""
    assert await leases.acquire(engine, NAME, "a", 30)
    assert await leases.acquire(engine, NAME, "a", 30)
    assert await leases.holder_of(engine, NAME) == "a"


async def test_expired_lease_is_taken_over(engine: AsyncEngine) -> None:
    """An expired lease goes to the next contender, and the old holder can no longer renew it."""
    assert await leases.acquire(engine, NAME, "a", 30)
    await _expire(engine, NAME)
    assert await leases.holder_of(engine, NAME) is None
    assert await leases.acquire(engine, NAME, "b", 30)
    assert not await leases.renew(engine, NAME, "a", 30)
    assert await leases.holder_of(engine, NAME) == "b"


async def test_renew_extends_the_expiry(engine: AsyncEngine) -> None:
    """Renewing moves the expiry forward, even for a lease that lapsed but was not taken."""
    assert await leases.acquire(engine, NAME, "a", 30)
    await _expire(engine, NAME)
    assert await leases.renew(engine, NAME, "a", 600)
    async with engine.connect() as connection:
        expires_at = (
            await connection.execute(select(leases_table.c.expires_at).where(leases_table.c.name == NAME))
        ).scalar_one()
    assert expires_at > utcnow() + timedelta(seconds=300)


async def test_release_frees_the_lease_only_for_its_holder(engine: AsyncEngine) -> None:
    """Only the holder can release; afterwards anyone may take the lease."""
    assert await leases.acquire(engine, NAME, "a", 30)
    assert not await leases.release(engine, NAME, "b")
    assert not await leases.acquire(engine, NAME, "b", 30)
    assert await leases.release(engine, NAME, "a")
    assert not await leases.release(engine, NAME, "a")
    assert await leases.acquire(engine, NAME, "b", 30)


async def test_leases_are_independent_by_name(engine: AsyncEngine) -> None:
    """Holding one name does not block another name."""
    assert await leases.acquire(engine, "catalog-sync:one", "a", 30)
    assert await leases.acquire(engine, "catalog-sync:two", "b", 30)


async def test_concurrent_contenders_for_a_free_lease_get_one_winner(engine: AsyncEngine) -> None:
    """Of many simultaneous acquisitions of a free lease exactly one succeeds."""
    results = await asyncio.gather(*(leases.acquire(engine, NAME, f"holder-{i}", 30) for i in range(8)))
    assert sum(results) == 1


async def test_concurrent_contenders_for_an_expired_lease_get_one_winner(engine: AsyncEngine) -> None:
    """Of many simultaneous takeovers of an expired lease exactly one succeeds."""
    assert await leases.acquire(engine, NAME, "old", 30)
    await _expire(engine, NAME)
    results = await asyncio.gather(*(leases.acquire(engine, NAME, f"holder-{i}", 30) for i in range(8)))
    assert sum(results) == 1
    assert await leases.holder_of(engine, NAME) != "old"


async def test_non_positive_ttl_is_rejected(engine: AsyncEngine) -> None:
    """A lease must last some time: a zero ttl is a programming error."""
    with pytest.raises(ValueError, match="ttl_seconds"):
        await leases.acquire(engine, NAME, "a", 0)
