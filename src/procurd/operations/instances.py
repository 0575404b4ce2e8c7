"""The daemon's heartbeat: it records the instance as alive, saves what it counted in memory, raises the
alerts its watches found, and finds instances that vanished without a clean shutdown.

An instance whose heartbeat is older than three ``heartbeat_seconds`` is down: an ``instance_down`` alert is
raised, everything it had claimed is released at once, so another instance takes it without waiting for the
claim to expire (the submissions and polls; the storefront events and provider callbacks it was sending,
their tries in flight logged as of unknown outcome), and the singletons it ran are freed for another
instance to take. The heartbeat looks again right when the oldest heartbeat of the others turns stale, so a
vanished instance is found about three beats after its last one. A daemon restarted on the same host
recognises its dead predecessors at start-up, by their process ids.

The leases of the singletons an instance runs (:class:`procurd.background.Singletons`) are kept in the
database by :class:`SharedJobLeases`.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

import structlog

from procurd import __version__
from procurd.background import Worker
from procurd.core.alerts import Kind, Occurrence
from procurd.core.clock import utcnow
from procurd.core.records import Instance
from procurd.db.database import Database
from procurd.db.errors import DatabaseError
from procurd.db.views import WithInstances, WithLeases, WithOutbox, WithProvider, WithRateBudget
from procurd.operations.runtime import Runtime

log = structlog.get_logger("procurd.heartbeat")

STALE_AFTER_BEATS = 3
STALE_CHECK_DELAY = 0.05  # seconds past the moment a heartbeat turns stale before looking


def this_instance(runtime: Runtime) -> Instance:
    now = utcnow()
    return Instance(
        id=runtime.instance,
        host=socket.gethostname(),
        pid=os.getpid(),
        version=__version__,
        started_at=now,
        heartbeat_at=now,
    )


class Heartbeat(Worker):
    name = "heartbeat"

    def __init__(self, runtime: Runtime) -> None:
        super().__init__()
        self.runtime = runtime
        self.idle_seconds = runtime.settings.server.heartbeat_seconds
        self.next_beat = 0.0  # monotonic

    async def start(self) -> None:
        """Take over from predecessors on this host that died, then record this instance (the daemon calls
        this once it serves: a start that fails before leaves no row and takes nothing over).

        A predecessor is an instance of this host, neither stopped nor marked down, whose process is gone,
        or one recorded under this very id (``host:pid`` comes again when a container restarts with the same
        host name and process id 1): its claims are released before this instance starts its own."""
        me = this_instance(self.runtime)
        dead = [
            instance.id
            for instance in await self.runtime.database.read(lambda tx: tx.instances.all())
            if instance.host == me.host
            and instance.stopped_at is None
            and instance.down_at is None
            and (instance.id == me.id or not _process_alive(instance.pid))
        ]
        await self._take_over(dead)
        await self.runtime.database.write(lambda tx: tx.instances.register(me))

    async def step(self) -> float | None:
        if time.monotonic() >= self.next_beat:
            self.next_beat = time.monotonic() + self.idle_seconds
            await self._beat()
        next_stale = await self._take_over([])
        until_beat = self.next_beat - time.monotonic()
        if next_stale is None:
            return until_beat
        return min(until_beat, (next_stale - utcnow()).total_seconds() + STALE_CHECK_DELAY)

    async def _beat(self) -> None:
        runtime = self.runtime
        now = utcnow()
        if not await runtime.database.write(lambda tx: tx.instances.heartbeat(runtime.instance, now)):
            # Marked down by another instance (this one stalled): its claims were released; carry on.
            log.warning("instance.marked_down_while_alive", instance=runtime.instance)
            await self.start()
        await runtime.save_callback_counts()
        await runtime.alerts.raise_(*runtime.health.due(), *runtime.rejections.due())

    async def _take_over(self, also: list[str]) -> datetime | None:
        """Mark down the instances found dead and take their work over; when the next one could turn
        stale."""
        runtime = self.runtime
        now = utcnow()
        stale_after = timedelta(seconds=STALE_AFTER_BEATS * self.idle_seconds)
        survey = await runtime.database.write(_mark_down, now - stale_after, now, also)
        next_stale = None if survey.oldest_heartbeat is None else survey.oldest_heartbeat + stale_after
        down = survey.down
        if not down:
            return next_stale
        released = await runtime.service.release_claims([instance.id for instance in down])
        # What they were telling the storefront and downstream sites is due again now, here or elsewhere.
        wakeups = runtime.service.wakeups
        if survey.events:
            wakeups.events.set()
        if survey.callbacks:
            wakeups.provider_callbacks.set()
        occurrences = [
            Occurrence(
                Kind.INSTANCE_DOWN,
                instance.id,
                f"instance {instance.id} (procurd {instance.version}, started "
                f"{instance.started_at.isoformat()}) stopped without a clean shutdown; last heartbeat "
                f"{instance.heartbeat_at.isoformat()}. "
                "Its claimed submissions and polls, storefront events and provider callbacks, and its "
                "singleton jobs were released to the other instances (a try in flight is logged as of "
                "unknown outcome and sent again). "
                "Check the host and the service's journal (journalctl -u procurd).",
            )
            for instance in down
        ]
        log.error(
            "instance.down",
            instances=[instance.id for instance in down],
            released=len(released),
            events=len(survey.events),
            callbacks=len(survey.callbacks),
            leases=survey.freed_leases,
        )
        await runtime.alerts.raise_(*occurrences)
        return next_stale

    async def drain(self) -> None:
        """A clean shutdown: the instance is marked stopped (not down)."""
        now = utcnow()
        runtime = self.runtime
        try:
            await runtime.database.write(lambda tx: tx.instances.stopped(runtime.instance, now))
        except DatabaseError as exc:
            log.warning("instance.stop_not_recorded", instance=runtime.instance, reason=exc.reason)


@dataclass(frozen=True, slots=True)
class _TakenOver:
    down: list[Instance]
    oldest_heartbeat: datetime | None  # of the instances still alive
    freed_leases: list[str]
    events: list[int] = field(default_factory=list)  # storefront events released (outbox ids)
    callbacks: list[int] = field(default_factory=list)  # provider callbacks released (order ids)


class TakeoverTx(WithInstances, WithLeases, WithRateBudget, WithOutbox, WithProvider, Protocol):
    """What a takeover touches: the instances, the leases they held, what they waited for, the storefront
    events and provider callbacks they were sending."""


def _mark_down(tx: TakeoverTx, stale_before: datetime, now: datetime, also: list[str]) -> _TakenOver:
    """Mark the vanished instances down, free the leases they held, release the storefront events and
    provider callbacks they were sending (their tries in flight logged as of unknown outcome) and forget
    what they waited for, in one transaction."""
    survey = tx.instances.mark_down(stale_before, now, also)
    gone = [instance.id for instance in survey.down]
    if not gone:
        return _TakenOver([], survey.oldest_heartbeat, [])
    freed = tx.leases.release_held_by(gone)
    tx.rate_budget.forget(gone)
    events = [row.id for row in tx.outbox.release(gone, now)]
    callbacks = tx.provider.release_callbacks(gone, now)
    return _TakenOver(survey.down, survey.oldest_heartbeat, freed, events, callbacks)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


class SharedJobLeases:
    """The singletons' leases (:class:`procurd.background.JobLeases`) in the database's ``leases``, which
    every instance shares: each call one write transaction."""

    def __init__(self, database: Database) -> None:
        self.database = database

    async def acquire(self, name: str, holder: str, now: datetime, ttl_seconds: float) -> bool:
        return await self.database.write(lambda tx: tx.leases.acquire(name, holder, now, ttl_seconds))

    async def renew_all(
        self, names: Collection[str], holder: str, now: datetime, ttl_seconds: float
    ) -> set[str]:
        return await self.database.write(lambda tx: tx.leases.renew_all(names, holder, now, ttl_seconds))

    async def release_all(self, names: Collection[str], holder: str) -> None:
        await self.database.write(lambda tx: [tx.leases.release(name, holder) for name in names])
