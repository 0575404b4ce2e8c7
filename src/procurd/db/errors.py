"""The database's failures in procurd's own words: the rest of procurd never sees a driver's exception."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError, SQLAlchemyError


class DatabaseError(Exception):
    """Something went wrong in the database.

    ``reason`` is one line for a person, fit for an answer; ``detail`` (for the log only) is the driver's
    first line when the reason alone does not say what happened. Neither carries statement parameters.
    """

    def __init__(self, reason: str, detail: str | None = None) -> None:
        super().__init__(reason if detail is None else f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class DatabaseUnavailable(DatabaseError):
    """The database cannot serve requests now (unreachable, restarting, disk full, locked ...)."""


class Conflict(DatabaseError):
    """A write broke a uniqueness rule: somebody else wrote the same key first."""


# What the driver's message says keeps the database from answering, in words for a person.
_FAILURES = (
    ("database or disk is full", "its disk is full"),
    ("disk i/o error", "it cannot write to its disk (I/O error: a full disk or a file size limit)"),
    ("database is locked", "it is locked by another writer"),
    ("readonly database", "it is read-only"),
    ("unable to open database", "its file cannot be opened"),
)
_UNKNOWN_FAILURE = "it failed (see the log)"
# PostgreSQL refusing work while it shuts down, after a crash, or while it starts up.
_UNAVAILABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})


def translate(exc: BaseException) -> DatabaseError | None:
    """procurd's error for a driver failure, or ``None`` when ``exc`` is not about the database."""
    if isinstance(exc, IntegrityError):
        return Conflict(f"a uniqueness rule was broken: {_first_line(exc.orig)}")
    if isinstance(exc, ConnectionError | TimeoutError):
        return DatabaseUnavailable("the connection to it failed")
    if isinstance(exc, OSError):
        return DatabaseUnavailable(f"it cannot be reached: {exc.strerror or type(exc).__name__}")
    if isinstance(exc, DBAPIError):
        sqlstate = str(getattr(exc.orig, "sqlstate", "") or "")
        if exc.connection_invalidated or sqlstate.startswith("08") or sqlstate in _UNAVAILABLE_SQLSTATES:
            return DatabaseUnavailable("the connection to it was lost (a restart?)")
        if isinstance(exc, OperationalError | InterfaceError):
            text = str(exc.orig).lower()
            reason = next((reason for needle, reason in _FAILURES if needle in text), None)
            if reason is None:
                return DatabaseUnavailable(_UNKNOWN_FAILURE, _first_line(exc.orig))
            return DatabaseUnavailable(reason)
        return DatabaseError(f"{type(exc.orig).__name__}: {_first_line(exc.orig)}")
    if isinstance(exc, SQLAlchemyError):
        return DatabaseError(type(exc).__name__)
    return None


def _first_line(error: object) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
