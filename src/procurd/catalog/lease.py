"""The lease a catalogue pass holds while it runs: ``catalog-sync:<upstream>``, one holder across every
process on the database."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Final, TypeVar

import structlog

from procurd.aio import undone_if_cancelled
from procurd.catalog.errors import LeaseLost, describe_error
from procurd.catalog.ports import LeaseStorage
from procurd.core.clock import utcnow

log = structlog.get_logger("procurd.catalog")
T = TypeVar("T")

LEASE_PREFIX: Final = "catalog-sync:"
DEFAULT_LEASE_TTL_SECONDS: Final = 60.0


class LeaseKeeper:
    """The lease of one pass of ``upstream``: taken before the pass, renewed every third of its time to live
    while the pass runs, given back after it.

    ``holder`` names the instance; a token is added per pass, so that two passes in one process exclude each
    other like passes on two machines.
    """

    def __init__(self, storage: LeaseStorage, upstream: str, holder: str, ttl_seconds: float) -> None:
        self._storage = storage
        self.upstream = upstream
        self.name = LEASE_PREFIX + upstream
        self.holder = f"{holder}#{secrets.token_hex(4)}"
        self.ttl_seconds = ttl_seconds

    async def acquire(self, now: datetime) -> bool:
        """Take the lease; False when another holds it. A caller cancelled meanwhile gives it back."""

        async def give_back(acquired: bool) -> None:
            if acquired:
                await self.release()

        taking = self._storage.acquire_lease(self.name, self.holder, now, self.ttl_seconds)
        return await undone_if_cancelled(taking, give_back)

    async def release(self) -> None:
        """Give the lease back; a failure of the storage is only logged (the lease expires on its own, so a
        failed release only delays the next pass)."""
        await self._logging_failure(
            self._storage.release_lease(self.name, self.holder), "catalog.sync_lease_release_failed", None
        )

    async def keep(self, finished: asyncio.Event, lost: Callable[[BaseException], None]) -> None:
        """Renew the lease until ``finished`` is set; tell ``lost`` when another instance took it."""
        interval = self.ttl_seconds / 3
        while not finished.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), interval)
                return
            renewing = self._storage.renew_lease(self.name, self.holder, utcnow(), self.ttl_seconds)
            renewed = await self._logging_failure(renewing, "catalog.sync_lease_renewal_failed", True)
            if not renewed:
                log.warning("catalog.sync_lease_lost", upstream=self.upstream, lease=self.name)
                lost(LeaseLost(f"lease {self.name} was taken by another instance"))
                return

    async def _logging_failure(self, step: Awaitable[T], event: str, otherwise: T) -> T:
        """The result of ``step``, or ``otherwise`` when the storage failed (logged as ``event``)."""
        try:
            return await step
        except Exception as exc:
            if self._storage.failure(exc) is None:
                raise
            log.warning(
                event, upstream=self.upstream, lease=self.name, error=describe_error(exc, self._storage)
            )
            return otherwise
