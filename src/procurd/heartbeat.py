"""The daemon's heartbeat: it records the instance as alive, saves what it counted in memory, raises the
alerts its watches found, and finds instances that vanished without a clean shutdown.

An instance whose heartbeat is older than three ``heartbeat_seconds`` is down: an ``instance_down`` alert is
raised and the submissions it had claimed are released at once, so another instance sends them without
waiting for the claims to expire. A daemon restarted on the same host recognises its dead predecessors at
start-up, by their process ids.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import structlog

from procurd import __version__
from procurd.background import Worker
from procurd.core.alerts import Kind, Occurrence
from procurd.db.errors import DatabaseError
from procurd.db.instance_store import Instance
from procurd.db.types import utcnow
from procurd.runtime import Runtime

log = structlog.get_logger("procurd.heartbeat")

STALE_AFTER_BEATS = 3


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

    async def start(self) -> None:
        """Record this instance, and take over from predecessors on this host that died."""
        me = this_instance(self.runtime)
        await self.runtime.database.write(lambda tx: tx.instances.register(me))
        dead = [
            instance.id
            for instance in await self.runtime.database.read(lambda tx: tx.instances.all())
            if instance.host == me.host
            and instance.id != me.id
            and instance.stopped_at is None
            and instance.down_at is None
            and not _process_alive(instance.pid)
        ]
        await self._take_over(dead)

    async def step(self) -> float | None:
        runtime = self.runtime
        now = utcnow()
        if not await runtime.database.write(lambda tx: tx.instances.heartbeat(runtime.instance, now)):
            # Marked down by another instance (this one stalled): its claims were released; carry on.
            log.warning("instance.marked_down_while_alive", instance=runtime.instance)
            await self.start()
        await runtime.save_callback_counts()
        await runtime.alerts.raise_(*runtime.health.due(), *runtime.rejections.due())
        await self._take_over([])
        return self.idle_seconds

    async def _take_over(self, also: list[str]) -> None:
        runtime = self.runtime
        now = utcnow()
        stale_before = now - timedelta(seconds=STALE_AFTER_BEATS * self.idle_seconds)
        down = await runtime.database.write(lambda tx: tx.instances.mark_down(stale_before, now, also))
        if not down:
            return
        released = await runtime.service.release_claims([instance.id for instance in down])
        occurrences = [
            Occurrence(
                Kind.INSTANCE_DOWN,
                instance.id,
                f"instance {instance.id} (procurd {instance.version}, started "
                f"{instance.started_at.isoformat()}) stopped without a clean shutdown; last heartbeat "
                f"{instance.heartbeat_at.isoformat()}. "
                "Its claimed submissions were released to the other instances. Check the host and the "
                "service's journal (journalctl -u procurd).",
            )
            for instance in down
        ]
        log.error("instance.down", instances=[instance.id for instance in down], released=len(released))
        await runtime.alerts.raise_(*occurrences)

    async def drain(self) -> None:
        """A clean shutdown: the instance is marked stopped (not down)."""
        now = utcnow()
        runtime = self.runtime
        try:
            await runtime.database.write(lambda tx: tx.instances.stopped(runtime.instance, now))
        except DatabaseError as exc:
            log.warning("instance.stop_not_recorded", instance=runtime.instance, reason=exc.reason)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
