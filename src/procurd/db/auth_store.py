"""Statements of signing in to the admin listener: wrong tokens by client address, and console sessions.

Both are rows every instance on the database sees: a throttled address waits on every instance, and a
session signed out on one is gone on all. The two reads made on the way of a request are one-row glances
(:meth:`procurd.db.database.Database.glance`) of integer columns.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, delete, func, select, update

from procurd.core.throttle import FORGET_AFTER_SECONDS, Counted, Failures, after_failure
from procurd.db.dialect import insert_or_skip
from procurd.db.schema import auth_failures, console_sessions

# The moment (Unix milliseconds) until which an address waits; none when it need not.
BLOCKED_UNTIL_QUERY = select(auth_failures.c.blocked_until_ms).where(
    auth_failures.c.address == bindparam("address", "")
)
# A signed-in session's expiry (Unix seconds); none once it was signed out (or never was).
SESSION_QUERY = select(console_sessions.c.expires_epoch).where(console_sessions.c.id == bindparam("id", ""))


def _millis(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


def _moment(millis: int | None) -> datetime | None:
    return None if millis is None else datetime.fromtimestamp(millis / 1000, UTC)


class AuthStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    # --- wrong tokens -------------------------------------------------------------------------------------

    def record_failure(self, address: str, now: datetime) -> Counted:
        """One more wrong token from ``address``, counted under the row's lock (every instance adds to the
        same count)."""
        table = auth_failures
        self.connection.execute(
            insert_or_skip(self.connection, table, table.c.address).values(
                address=address, failures=0, first_at=now, last_at=now, blocked_until_ms=None, alerted=False
            )
        )
        row = (
            self.connection.execute(select(table).where(table.c.address == address).with_for_update())
            .mappings()
            .one()
        )
        before = None if row["failures"] == 0 else _failures(row)
        counted = after_failure(before, address, now)
        state = counted.failures
        if counted.counted:
            self.connection.execute(
                update(table)
                .where(table.c.address == address)
                .values(
                    failures=state.failures,
                    first_at=state.first_at,
                    last_at=state.last_at,
                    blocked_until_ms=_millis(state.blocked_until),
                    alerted=state.alerted,
                )
            )
        if state.failures == 1:
            # A new count now and then: the addresses quiet long enough are forgotten.
            cutoff = now - timedelta(seconds=FORGET_AFTER_SECONDS)
            self.connection.execute(delete(table).where(table.c.last_at < cutoff, table.c.address != address))
        return counted

    def failures(self, address: str) -> Failures | None:
        row = self.connection.execute(select(auth_failures).where(auth_failures.c.address == address))
        found = row.mappings().first()
        return None if found is None else _failures(found)

    def forget(self, address: str) -> None:
        """The address signed in with the right token: its count starts again."""
        self.connection.execute(delete(auth_failures).where(auth_failures.c.address == address))

    # --- console sessions ---------------------------------------------------------------------------------

    def start_session(self, session_id: str, expires_epoch: int, address: str | None, now: datetime) -> None:
        """Record a signed-in session (``session_id`` is the digest of the cookie's id); sessions past their
        expiry are deleted on the way."""
        self.connection.execute(
            delete(console_sessions).where(console_sessions.c.expires_epoch <= int(now.timestamp()))
        )
        self.connection.execute(
            console_sessions.insert().values(
                id=session_id, created_at=now, expires_epoch=expires_epoch, address=address
            )
        )

    def end_session(self, session_id: str) -> bool:
        """Sign one session out; whether it was signed in."""
        result = self.connection.execute(delete(console_sessions).where(console_sessions.c.id == session_id))
        return bool(result.rowcount)

    def end_all_sessions(self) -> int:
        """Sign every session out, on every instance; how many there were."""
        return int(self.connection.execute(delete(console_sessions)).rowcount or 0)

    def live_sessions(self, now: datetime) -> int:
        statement = (
            select(func.count())
            .select_from(console_sessions)
            .where(console_sessions.c.expires_epoch > int(now.timestamp()))
        )
        return int(self.connection.execute(statement).scalar_one())


def _failures(row: Any) -> Failures:
    return Failures(
        address=row["address"],
        failures=row["failures"],
        first_at=row["first_at"],
        last_at=row["last_at"],
        blocked_until=_moment(row["blocked_until_ms"]),
        alerted=row["alerted"],
    )
