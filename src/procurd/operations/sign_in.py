"""Signing in to the admin listener: the console's signed-in sessions and the wrong admin tokens counted per
client address, both rows of the database that every instance shares (``console_sessions`` and
``auth_failures``: a session signed out on one instance is gone on all, an address made to wait waits on all).

The two reads on the way of a request (is this session still signed in, must this address wait) are one-row
glances (:meth:`procurd.db.database.Database.glance`); the listener's side, cookies and the count's
arithmetic, is :mod:`procurd.http.console.session` and :mod:`procurd.http.throttle`.
"""

from __future__ import annotations

from datetime import datetime

from procurd.core.throttle import Counted
from procurd.db.auth_store import BLOCKED_UNTIL_QUERY, SESSION_QUERY
from procurd.db.database import Database
from procurd.operations.runtime import Runtime


class SignIn:
    """Sessions and wrong-token counts, each call one transaction (or one glance)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    @property
    def database(self) -> Database:
        return self.runtime.database

    # --- sessions -----------------------------------------------------------------------------------------

    async def session_expiry(self, key: str) -> int | None:
        """When the signed-in session of ``key`` expires (Unix seconds); ``None`` once it was signed out (or
        never was)."""
        expires = await self.database.glance(SESSION_QUERY, {"id": key})
        return None if expires is None else int(expires)

    async def start_session(self, key: str, expires_epoch: int, address: str | None, now: datetime) -> None:
        await self.database.write(lambda tx: tx.auth.start_session(key, expires_epoch, address, now))

    async def end_session(self, key: str) -> bool:
        """Sign the session of ``key`` out everywhere; whether it was signed in."""
        return await self.database.write(lambda tx: tx.auth.end_session(key))

    async def end_all_sessions(self) -> int:
        """Sign every session out; how many were signed in."""
        return await self.database.write(lambda tx: tx.auth.end_all_sessions())

    # --- wrong tokens -------------------------------------------------------------------------------------

    async def blocked_until_ms(self, address: str) -> int | None:
        """Until when ``address`` must wait (Unix milliseconds), as any instance counted; ``None``: it need
        not."""
        until = await self.database.glance(BLOCKED_UNTIL_QUERY, {"address": address})
        return None if until is None else int(until)

    async def count_failure(self, address: str, now: datetime) -> Counted:
        """Count a wrong token from ``address``: its failures, and whether the count went up at all."""
        return await self.database.write(lambda tx: tx.auth.record_failure(address, now))

    async def forget(self, address: str) -> None:
        """The right token signed in from ``address``: its count starts again."""
        await self.database.write(lambda tx: tx.auth.forget(address))
