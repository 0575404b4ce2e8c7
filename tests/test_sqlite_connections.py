"""How procurd sets up each SQLite connection, the writer's and the readers'."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from sqlalchemy import text

from conftest import database_kind
from procurd.db.database import SQLITE_CACHE_KIB, SQLITE_READERS, Database
from procurd.db.offered_store import VERSION, VERSION_QUERY
from procurd.db.stores import Tx

pytestmark = pytest.mark.skipif(database_kind() != "sqlite", reason="SQLite's connection settings")


def settings(tx: Tx) -> tuple[str, int, int]:
    def pragma(name: str) -> object:
        return tx.connection.exec_driver_sql(f"PRAGMA {name}").scalar()

    return str(pragma("journal_mode")), int(str(pragma("foreign_keys"))), int(str(pragma("cache_size")))


async def test_every_connection_is_wal_with_foreign_keys_and_a_small_page_cache(database: Database) -> None:
    """The writer and every reader run in WAL mode with foreign keys on and a page cache of
    SQLITE_CACHE_KIB (a negative cache_size is KiB): five connections that each read the whole mirror
    hold 2.5 MB of pages, not SQLite's default 10 MB."""
    expected = ("wal", 1, -SQLITE_CACHE_KIB)
    assert await database.write(settings) == expected
    readers = await asyncio.gather(*(database.read(settings) for _ in range(2 * SQLITE_READERS)))
    assert set(readers) == {expected}


def set_version(tx: Tx, value: int) -> None:
    tx.offered.set_state(VERSION, value)


async def test_a_glance_reads_on_the_loop_and_sees_every_commit(database: Database) -> None:
    """A glance (the provider's catalogue version before a page kept in memory) reads on the event loop, on a
    connection of its own set up like the others, without a transaction of its own, and sees what every
    other connection committed."""
    assert await database.glance(text("PRAGMA journal_mode")) == "wal"
    assert await database.glance(VERSION_QUERY) is None
    for value in (1, 2, 3):
        await database.write(set_version, value)
        assert await database.glance(VERSION_QUERY) == value
    assert (database.counts.glances, database.counts.reads) == (5, 0)


async def test_a_glance_that_finds_the_database_held_waits_as_a_read_does(database: Database) -> None:
    """When another connection holds the database exclusively, a glance does not block the event loop on
    the lock: it is run as a read (on a reader thread, waiting for the lock), and answers once the lock is
    gone."""
    locker = sqlite3.connect(str(database.path), isolation_level=None)  # type: ignore[attr-defined]
    try:
        # In WAL mode only a connection in exclusive locking mode keeps readers out.
        locker.execute("PRAGMA locking_mode=EXCLUSIVE")
        locker.execute("BEGIN EXCLUSIVE")
        locker.execute("INSERT INTO provider_state (name, value) VALUES ('version', 7)")
        glance = asyncio.create_task(database.glance(VERSION_QUERY))
        ticks = 0
        while database.counts.reads == 0:
            await asyncio.sleep(0.01)  # the loop keeps running meanwhile
            ticks += 1
        assert not glance.done()
        locker.execute("COMMIT")
    finally:
        locker.close()  # and with it the exclusive lock
    assert await glance == 7
    assert ticks >= 1
    assert (database.counts.glances, database.counts.reads) == (0, 1)
