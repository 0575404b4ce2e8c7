"""The database: owns every connection and transaction, one class per backend behind one interface.

Store code is synchronous: a function of a :class:`Tx` (a transaction and the stores that speak SQL in it)
that the backend runs as one transaction.

* :class:`SqliteDatabase` runs write transactions one at a time on a dedicated writer thread
  (``BEGIN IMMEDIATE``, so a writer queues for the lock instead of failing) and read transactions on a small
  pool of reader threads (deferred ``BEGIN``: reads never take the write lock, WAL lets them run beside it).
  A whole transaction is one hop to a thread, however many statements it runs.
* :class:`PostgresDatabase` runs the same functions through asyncpg (``run_sync``), writes at READ
  COMMITTED with row locks, reads in a REPEATABLE READ READ ONLY transaction (one snapshot).

Driver failures leave this module as :mod:`procurd.db.errors` exceptions.

Transactions are opened in two places only: the operations (:mod:`procurd.operations`) and the state path's
group-commit writer (:class:`procurd.db.batching.BatchWriter`). A transaction's function names the stores it
needs by a view of :mod:`procurd.db.views`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine, Executable, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError

from procurd.db.errors import DatabaseError, translate
from procurd.db.stores import Tx
from procurd.instance import instance_id

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

P = ParamSpec("P")
T = TypeVar("T")
TxFunction = Callable[Concatenate[Tx, P], T]

SQLITE_BUSY_TIMEOUT_MS = 30_000
SQLITE_READERS = 4
# Page cache per connection (SQLite's default: 2,000 KiB). The pages are in the operating system's cache
# anyway; five connections that each went through the mirror once held 10 MB of copies. Measured: no
# slower first catalogue sync.
SQLITE_CACHE_KIB = 512
POSTGRES_POOL_SIZE = 10
PING_AFTER_IDLE_SECONDS = 1.0


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps_json(value: Any) -> str:
    """How JSON columns are written: compact, non-ASCII as is, exact decimals as text."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_json_default)


@dataclass(slots=True)
class TransactionCounts:
    """Transactions this process ran, and the SQL statements they sent (what the benchmarks report)."""

    reads: int = 0
    writes: int = 0
    autocommits: int = 0
    glances: int = 0
    statements: int = 0

    def count_statement(self, *_: Any) -> None:
        self.statements += 1

    def transactions(self) -> dict[str, int]:
        """Transactions by kind: ``read``, ``write``, ``autocommit``, ``glance``."""
        return {
            "read": self.reads,
            "write": self.writes,
            "autocommit": self.autocommits,
            "glance": self.glances,
        }


class Database(ABC):
    """Runs store functions as transactions. Build one with :func:`open_database`."""

    dialect: str

    def __init__(self, url: str) -> None:
        self.url = url
        self.counts = TransactionCounts()

    @abstractmethod
    async def read(self, fn: TxFunction[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(tx, ...)`` in a read-only transaction that sees one snapshot."""

    @abstractmethod
    async def write(self, fn: TxFunction[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(tx, ...)`` in a write transaction; commit when it returns, roll back when it raises."""

    async def glance(self, statement: Executable, parameters: Mapping[str, Any] | None = None) -> Any:
        """The first column of the first row of ``statement`` (``None`` when there is none): a one-row read
        that must cost next to nothing (the version checked before an answer kept in memory), as cheaply as
        the backend can. The default runs it as a read."""
        return await self.read(lambda tx: tx.connection.execute(statement, dict(parameters or {})).scalar())

    async def autocommit(self, fn: TxFunction[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(tx, ...)`` with each statement its own transaction: for a single statement that must not
        wait for a connection or pay for BEGIN and COMMIT (on PostgreSQL one round trip, on a connection kept
        for these calls). The default runs it as a write transaction."""
        return await self.write(fn, *args, **kwargs)

    @abstractmethod
    async def close(self) -> None:
        """Finish running transactions and close every connection."""

    @property
    @abstractmethod
    def sync_engine(self) -> Engine:
        """A synchronous engine on the same database, for migrations and tests."""

    @abstractmethod
    def engines(self) -> list[Engine]:
        """Every engine this database sends statements through (to observe them)."""

    def count_statements(self) -> None:
        """From now on, count every statement sent in :attr:`counts`."""
        for engine in self.engines():
            event.listen(engine, "before_cursor_execute", self.counts.count_statement)


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL, ``None`` for another database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def sqlite_location_problem(path: Path) -> str | None:
    """Why ``path`` cannot hold a SQLite database (creating its directory when missing), or ``None``."""
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocking = next((p for p in (directory, *directory.parents) if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            return f"{blocking} is not a directory"
        return f"cannot create the directory {directory}: {exc.strerror or exc}"
    if path.is_dir():
        return f"{path} is a directory, not a database file"
    return None


def application_name() -> str:
    """How this process names itself to PostgreSQL: ``procurd host:pid``."""
    return f"procurd {instance_id()}"[:63]


def open_database(url: str) -> Database:
    """The backend for ``url`` (``sqlite+aiosqlite://`` or ``postgresql+asyncpg://``)."""
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        return SqliteDatabase(url)
    if backend == "postgresql":
        return PostgresDatabase(url)
    raise ValueError(f"unsupported database URL scheme {backend!r}")


def _in_tx(connection: Connection, fn: TxFunction[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    return fn(Tx(connection), *args, **kwargs)


# --- SQLite ------------------------------------------------------------------------------------------------


class SqliteDatabase(Database):
    dialect = "sqlite"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        parsed = make_url(url)
        database = parsed.database or ""
        if database in ("", ":memory:"):
            raise ValueError("an in-memory SQLite database cannot be shared between tasks; use a file")
        self.path = Path(database)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise DatabaseError(
                f"cannot create the directory {self.path.parent} for {self.path}: {reason}"
            ) from None
        sync_url = parsed.set(drivername="sqlite+pysqlite")
        self._writer_engine = self._engine(sync_url, "BEGIN IMMEDIATE", pool_size=1)
        self._reader_engine = self._engine(sync_url, "BEGIN", pool_size=SQLITE_READERS)
        # Glances run on the event loop, on a connection of their own that never waits for a lock.
        self._glance_engine = self._engine(sync_url, "BEGIN", pool_size=1, busy_timeout_ms=0)
        self._glance_connection: Any = None
        self._glance_statements: dict[int, tuple[Executable, str, list[str], dict[str, Any]]] = {}
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="procurd-db-writer")
        self._readers = ThreadPoolExecutor(SQLITE_READERS, thread_name_prefix="procurd-db-reader")

    @staticmethod
    def _engine(
        url: Any, begin: str, pool_size: int, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS
    ) -> Engine:
        engine = create_engine(
            url,
            connect_args={"timeout": busy_timeout_ms / 1000, "check_same_thread": False},
            pool_size=pool_size,
            max_overflow=0,
            hide_parameters=True,  # statement errors would otherwise log delivered goods and form data
            json_serializer=dumps_json,
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # SQLAlchemy's "begin" hook below owns the transaction boundaries.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.execute("PRAGMA foreign_keys=ON")
                cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
                cursor.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")
            finally:
                cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(connection: Connection) -> None:
            connection.exec_driver_sql(begin)

        return engine

    @property
    def sync_engine(self) -> Engine:
        return self._writer_engine

    def engines(self) -> list[Engine]:
        return [self._writer_engine, self._reader_engine, self._glance_engine]

    async def read(self, fn: TxFunction[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        self.counts.reads += 1
        return await self._run(self._readers, self._reader_engine, lambda c: _in_tx(c, fn, *args, **kwargs))

    async def write(self, fn: TxFunction[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        self.counts.writes += 1
        return await self._run(self._writer, self._writer_engine, lambda c: _in_tx(c, fn, *args, **kwargs))

    async def glance(self, statement: Executable, parameters: Mapping[str, Any] | None = None) -> Any:
        """On the event loop, on a connection of its own, without a thread's round trip or a transaction
        (one statement is atomic): a WAL reader waits for no writer, so a read of a row in the operating
        system's cache takes microseconds. Should it find the database held (a connection in exclusive
        mode, a checkpoint's recovery), it is run as any read."""
        self.counts.glances += 1
        sql, names, defaults = self._glance_sql(statement)
        given = {**defaults, **(parameters or {})}
        values = [given.get(name) for name in names]
        try:
            if self._glance_connection is None:
                self._glance_connection = self._glance_engine.raw_connection()
            cursor = self._glance_connection.cursor()
            try:
                row = cursor.execute(sql, values).fetchone()
            finally:
                cursor.close()  # a statement left open would keep its snapshot: later glances would be stale
        except sqlite3.Error:
            self.counts.glances -= 1
            return await super().glance(statement, parameters)
        return None if row is None else row[0]

    def _glance_sql(self, statement: Executable) -> tuple[str, list[str], dict[str, Any]]:
        """The statement's SQLite text, the names of its parameters in order and the values it binds itself
        (compiled once)."""
        found = self._glance_statements.get(id(statement))
        if found is None or found[0] is not statement:
            compiled = statement.compile(dialect=self._glance_engine.dialect)  # type: ignore[attr-defined]
            found = (statement, str(compiled), list(compiled.positiontup or []), compiled.construct_params())
            self._glance_statements[id(statement)] = found
        return found[1], found[2], found[3]

    async def _run(self, pool: ThreadPoolExecutor, engine: Engine, work: Callable[[Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        # The thread finishes the transaction even when the awaiting task is cancelled meanwhile.
        future = loop.run_in_executor(pool, self._transaction, engine, work)
        return await asyncio.shield(future)

    @staticmethod
    def _transaction(engine: Engine, work: Callable[[Connection], T]) -> T:
        with _translating(), engine.begin() as connection:
            return work(connection)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._close)

    def _close(self) -> None:
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        if self._glance_connection is not None:
            self._glance_connection.close()
        self._writer_engine.dispose()
        self._reader_engine.dispose()
        self._glance_engine.dispose()


# --- PostgreSQL --------------------------------------------------------------------------------------------


CLOSE_WAIT_SECONDS = 10.0


def _retrieved(write: asyncio.Future[Any]) -> None:
    """A write's failure, when its caller was cancelled, is nobody's to report (its caller's when not)."""
    if not write.cancelled():
        write.exception()


class PostgresDatabase(Database):
    dialect = "postgresql"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        from sqlalchemy.ext.asyncio import create_async_engine

        self._engine: AsyncEngine = create_async_engine(
            url,
            # pg_stat_activity shows which instance holds a connection.
            connect_args={"server_settings": {"application_name": application_name()}},
            pool_size=POSTGRES_POOL_SIZE,
            max_overflow=POSTGRES_POOL_SIZE,
            pool_recycle=1800,
            hide_parameters=True,
            json_serializer=dumps_json,
        )
        # Reads see one snapshot: an order row read before another instance's commit and its procurements
        # read after it would otherwise disagree.
        self._reader = self._engine.execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True
        )
        self._kept: AsyncConnection | None = None
        self._kept_lock = asyncio.Lock()
        self._writes: set[asyncio.Future[Any]] = set()
        _ping_after_idle(self._engine.sync_engine)

    @property
    def sync_engine(self) -> Engine:
        return self._engine.sync_engine

    def engines(self) -> list[Engine]:
        return [self._engine.sync_engine]

    async def read(self, fn: TxFunction[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        self.counts.reads += 1
        with _translating():
            async with self._reader.begin() as connection:
                return await connection.run_sync(_in_tx, fn, *args, **kwargs)

    async def write(self, fn: TxFunction[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        self.counts.writes += 1
        # As on SQLite, a write once begun runs to its end even when the awaiting task is cancelled meanwhile
        # (a shutdown): the caller had decided it, a lease's release in a ``finally`` say.
        write = asyncio.ensure_future(self._write(fn, *args, **kwargs))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)
        write.add_done_callback(_retrieved)
        return await asyncio.shield(write)

    async def _write(self, fn: TxFunction[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        with _translating():
            async with self._engine.begin() as connection:
                return await connection.run_sync(_in_tx, fn, *args, **kwargs)

    async def autocommit(self, fn: TxFunction[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        async with self._kept_lock:
            self.counts.autocommits += 1
            try:
                with _translating():
                    if self._kept is None:
                        kept = await self._engine.connect()
                        self._kept = await kept.execution_options(isolation_level="AUTOCOMMIT")
                    return await self._kept.run_sync(_in_tx, fn, *args, **kwargs)
            except BaseException:
                # A statement that failed or was interrupted leaves the connection in doubt.
                await self._drop_kept()
                raise

    async def _drop_kept(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            with contextlib.suppress(Exception):
                await kept.invalidate()
            with contextlib.suppress(Exception):
                await kept.close()

    async def close(self) -> None:
        if self._writes:
            # Writes whose callers were cancelled finish first (a database that hangs is not waited for).
            await asyncio.wait(set(self._writes), timeout=CLOSE_WAIT_SECONDS)
        async with self._kept_lock:
            await self._drop_kept()
        with contextlib.suppress(Exception):
            await self._engine.dispose()


def _ping_after_idle(engine: Engine) -> None:
    """Check a pooled connection before use only when it has sat idle for ``PING_AFTER_IDLE_SECONDS``.

    A ping on every checkout (``pool_pre_ping``) costs the asyncpg driver three round trips per transaction.
    A connection in steady use needs none: if the server restarted under it, its first statement fails as
    unavailable and SQLAlchemy then renews every connection of the pool."""

    @event.listens_for(engine, "checkin")
    def checked_in(dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        idle_since = record.info.pop("idle_since", None)
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # The pool drops this connection and checks out another.
            raise DisconnectionError(f"a pooled connection no longer answers: {type(exc).__name__}") from exc


@contextlib.contextmanager
def _translating() -> Iterator[None]:
    """Re-raise driver failures as :mod:`procurd.db.errors` exceptions."""
    try:
        yield
    except DatabaseError:
        raise
    except Exception as exc:
        translated = translate(exc)
        if translated is None:
            raise
        raise translated from None
