"""How procurd sets up each SQLite connection, the writer's and the readers'."""

from __future__ import annotations

import asyncio

import pytest

from conftest import database_kind
from procurd.db.database import SQLITE_CACHE_KIB, SQLITE_READERS, Database
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
