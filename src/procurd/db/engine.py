"""Engine creation: SQLite tuned for one writer and many readers, PostgreSQL via asyncpg, same code."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

SQLITE_BUSY_TIMEOUT_MS = 30_000


def create_engine(url: str, *, pool_size: int = 10, echo: bool = False) -> AsyncEngine:
    """An async engine for ``url``.

    On SQLite every connection runs in WAL mode with a busy timeout and foreign keys on, and every
    transaction starts with ``BEGIN IMMEDIATE`` so a writer queues for the lock instead of failing with
    ``SQLITE_BUSY`` when a read transaction would have to upgrade.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:"):
            raise ValueError("an in-memory SQLite database cannot be shared between tasks; use a file")
        Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(
            url,
            echo=echo,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            pool_pre_ping=False,
            hide_parameters=True,  # statement errors would otherwise log delivered goods and form data
        )
        _tune_sqlite(engine)
        return engine
    return create_async_engine(
        url,
        echo=echo,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_recycle=1800,
        hide_parameters=True,
    )


def _tune_sqlite(engine: AsyncEngine) -> None:
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" hook below own the transaction boundaries.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        finally:
            cursor.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def is_sqlite(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "sqlite"


def sqlite_version_ok() -> bool:
    """``RETURNING`` needs SQLite 3.35 or newer."""
    return sqlite3.sqlite_version_info >= (3, 35, 0)
