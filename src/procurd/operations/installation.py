"""What a process needs of the installation before it operates: a database it can use, at the schema this
version needs; and, for a command, the alerts it raised sent before it ends."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from procurd.config import Settings
from procurd.db.database import Database, open_database, sqlite_file, sqlite_location_problem
from procurd.db.errors import DatabaseError
from procurd.db.revision import HEAD_REVISION, describe_mismatch
from procurd.operations.alerts import AlertDispatcher
from procurd.operations.runtime import Runtime

log = structlog.get_logger("procurd.installation")

ALERT_DELIVERY_SECONDS = 10.0  # how long a command spends sending the alerts it raised


class InstallationError(Exception):
    """The installation cannot be used as it is; the message is one line for a person. ``exit_code`` 2 for
    a configuration mistake, 1 for a database that cannot be used."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def database_location_problem(settings: Settings) -> str | None:
    """Why the configured SQLite file cannot be where ``[database] url`` says (its directory is created when
    missing), or ``None``."""
    path = sqlite_file(settings.database.url)
    return None if path is None else sqlite_location_problem(path)


def file_location_problem(path: Path) -> str | None:
    """Why a SQLite database cannot be kept at ``path`` (its directory is created when missing), or
    ``None``."""
    return sqlite_location_problem(path)


def check_database_location(settings: Settings) -> None:
    """:class:`InstallationError` (exit code 2) when the configured SQLite file cannot be where it is
    configured."""
    problem = database_location_problem(settings)
    if problem is not None:
        raise InstallationError(f"{settings.origin('database', 'url')}: [database] url: {problem}", 2)


def missing_database(settings: Settings) -> str | None:
    """Why the configured SQLite database cannot be used because its file does not exist yet (what
    ``procurd db upgrade`` creates), or ``None``. Only ``db upgrade`` creates the file: any other command
    leaves no empty database behind."""
    path = sqlite_file(settings.database.url)
    if path is None or path.exists():
        return None
    if not path.is_absolute():
        # A relative path is read from wherever the command runs: say so before anyone creates a second,
        # empty database beside the first.
        return (
            f"the database {path.absolute()} does not exist ([database] url names the relative path {path}, "
            f"which is relative to the working directory {Path.cwd()}; if the database is elsewhere, run "
            f"procurd from its directory or give its absolute path, sqlite+aiosqlite:////absolute/path.db "
            f"with four slashes): run `procurd db upgrade` to create it"
        )
    return f"the database {path.absolute()} does not exist: run `procurd db upgrade` to create it"


def database_problem(settings: Settings, error: DatabaseError) -> str:
    """``error`` as one line for a person: for SQLite with the file's path and, when the driver only says
    that the file cannot be opened, the operating system's reason."""
    path = sqlite_file(settings.database.url)
    if path is None:
        return f"database error: {error.reason}"
    if "file is not a database" in str(error):
        return f"database error: {path.absolute()} is not a SQLite database"
    return f"database error: {path.absolute()}: {sqlite_open_problem(path) or error.reason}"


def sqlite_open_problem(path: Path) -> str | None:
    """Why SQLite cannot open or create ``path`` (and its ``-wal`` and ``-shm`` files beside it), in the
    operating system's words, or ``None`` when nothing is found."""
    try:
        if path.exists():
            os.close(os.open(path, os.O_RDWR))
        else:
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
            path.unlink()
    except OSError as exc:
        action = "open" if path.exists() else "create"
        return f"cannot {action} the file: {exc.strerror or type(exc).__name__}"
    if not os.access(path.parent, os.W_OK):
        return f"cannot write in {path.parent} (SQLite keeps its -wal and -shm files beside the database)"
    return None


def _open(settings: Settings, *, create: bool = False) -> Database:
    check_database_location(settings)
    missing = None if create else missing_database(settings)
    if missing is not None:
        raise InstallationError(missing)
    try:
        return open_database(settings.database.url)
    except DatabaseError as exc:
        raise InstallationError(database_problem(settings, exc)) from None


async def open_checked_database(settings: Settings) -> Database:
    """The configured database, at the current migration; :class:`InstallationError` otherwise."""
    database = _open(settings)
    try:
        mismatch = describe_mismatch(await current_revision(database))
    except DatabaseError as exc:
        await database.close()
        raise InstallationError(database_problem(settings, exc)) from None
    if mismatch is not None:
        await database.close()
        raise InstallationError(mismatch)
    return database


async def usable_database_problem(settings: Settings, database: Database) -> str | None:
    """Why the daemon cannot use ``database`` (its file missing, unreachable, at another revision), for a
    person, or ``None``."""
    missing = missing_database(settings)
    if missing is not None:
        return missing
    try:
        current = await current_revision(database)
    except DatabaseError as exc:
        return database_problem(settings, exc)
    return describe_mismatch(current)


async def current_revision(database: Database) -> str | None:
    """The revision ``database`` is at, or ``None`` when it has no schema yet (read without Alembic)."""
    return await database.read(lambda tx: tx.schema.revision())


async def migrate_schema(database: Database, revision: str = "head") -> tuple[str | None, str | None]:
    """Create the schema of ``database`` or migrate it to ``revision`` in one transaction (on PostgreSQL
    under an advisory lock that every instance takes for it); the revisions before and after."""
    return await database.write(lambda tx: tx.schema.upgrade(revision))


async def upgrade_database(settings: Settings, revision: str = "head") -> tuple[str | None, str | None]:
    """Create the schema or migrate it (``procurd db upgrade``); the revisions before and after."""
    database = _open(settings, create=True)
    try:
        return await migrate_schema(database, revision)
    except DatabaseError as exc:
        raise InstallationError(database_problem(settings, exc)) from None
    finally:
        await database.close()


@dataclass(frozen=True, slots=True)
class DatabaseCheck:
    """What ``procurd doctor`` finds of the database."""

    ok: bool
    detail: str
    fix: str = ""


async def check_database(settings: Settings) -> DatabaseCheck:
    """Whether the database can be reached and is at the revision this version needs."""
    fix = "check [database] url, and that the database server runs and accepts procurd"
    missing = missing_database(settings)
    if missing is not None:
        detail, _, command = missing.partition(": run ")
        return DatabaseCheck(False, detail, f"run {command}")
    try:
        database = _open(settings)
    except InstallationError as exc:
        return DatabaseCheck(False, exc.message, "correct [database] url" if exc.exit_code == 2 else fix)
    try:
        current = await current_revision(database)
    except DatabaseError as exc:
        return DatabaseCheck(False, database_problem(settings, exc).removeprefix("database error: "), fix)
    finally:
        await database.close()
    if current != HEAD_REVISION:
        state = "empty" if current is None else f"at revision {current}"
        return DatabaseCheck(
            False, f"{state}; this version needs revision {HEAD_REVISION}", "run `procurd db upgrade`"
        )
    return DatabaseCheck(True, f"reachable, at the current revision {HEAD_REVISION}")


async def deliver_due_alerts(runtime: Runtime, seconds: float = ALERT_DELIVERY_SECONDS) -> None:
    """Send the alerts that are due now to every ``[alerts] urls`` entry, for ``seconds`` at most (what a
    command raised is then on its way before the command ends; what is left, the daemon sends)."""
    if not runtime.alerts.delivering:
        return
    dispatcher = AlertDispatcher(runtime.alerts, runtime.instance)
    deadline = time.monotonic() + seconds
    try:
        async with asyncio.timeout(seconds):
            while time.monotonic() < deadline:
                due_in = await dispatcher.step()
                if due_in is None or due_in > 0:
                    return
    except TimeoutError:
        log.warning("alerts.delivery_cut_short", seconds=seconds)
