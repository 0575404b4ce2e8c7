"""The daemon's background work, one pattern for all of it, under one supervisor.

A :class:`Worker` (a submitter, a poller, the storefront dispatcher, the heartbeat) does what is due in
:meth:`Worker.step` and says when it is due again; between steps it sleeps until then, or until something in
the process sets its ``wakeup``. Nothing spins: a poll due in one second runs in about one second, an idle
worker looks again only at its ``idle_seconds`` (work other processes may have queued).

A database that cannot be reached is waited out with backoff. Any other failure is a bug: the
:class:`Supervisor` logs it and stops the daemon, which exits non-zero so that systemd restarts it.

Work that must run on one instance of a cluster at a time (pings, fallback polls, catalogue passes, the
periodic checks) goes through :class:`Singletons`: a scheduled job wrapped by :meth:`Singletons.job`, or a
worker wrapped by :meth:`Singletons.worker`, runs only while this instance holds the lease ``job:<name>``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine
from datetime import datetime
from typing import Any, Protocol

import structlog

from procurd.aio import wait_for_any
from procurd.core.clock import utcnow
from procurd.db.errors import DatabaseError, DatabaseUnavailable

log = structlog.get_logger("procurd.background")

UNAVAILABLE_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0)
JOB_LEASE_PREFIX = "job:"
LEASE_BEATS = 3  # a singleton's lease lasts this many renewal periods


class Worker:
    """One kind of background work."""

    name: str
    idle_seconds: float = 5.0

    def __init__(self) -> None:
        self.wakeup = asyncio.Event()

    async def step(self) -> float | None:
        """Do what is due now; the seconds until more is due (``None``: nothing known to be due)."""
        raise NotImplementedError

    async def drain(self) -> None:
        """Finish work in flight once the daemon stops (the default has none)."""
        return

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        try:
            while not stop.is_set():
                self.wakeup.clear()
                try:
                    delay = await self.step()
                    failures = 0
                except DatabaseUnavailable as exc:
                    delay = UNAVAILABLE_BACKOFF[min(failures, len(UNAVAILABLE_BACKOFF) - 1)]
                    failures += 1
                    log.warning(
                        "background.database_unavailable", worker=self.name, reason=exc.reason, retry_in=delay
                    )
                timeout = self.idle_seconds if delay is None else max(0.0, min(delay, self.idle_seconds))
                if timeout > 0:
                    await wait_for_any(stop, self.wakeup, timeout=timeout)
        finally:
            await self.drain()


class Supervisor:
    """Runs the daemon's long-lived tasks; the first that fails stops them all."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.tasks: list[asyncio.Task[None]] = []
        self.failure: BaseException | None = None

    def start(self, worker: Worker) -> None:
        self.spawn(worker.run(self.stop), worker.name)

    def spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        task.add_done_callback(self._finished)
        self.tasks.append(task)

    def _finished(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            if not self.stop.is_set():
                self._fail(RuntimeError(f"{task.get_name()} ended on its own"), task)
            return
        self._fail(error, task)

    def _fail(self, error: BaseException, task: asyncio.Task[None]) -> None:
        if self.failure is None:
            self.failure = error
        log.error("background.crashed", task=task.get_name(), error=repr(error), exc_info=error)
        self.stop.set()

    async def wait(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` seconds for every task to end; cancel the rest and return their names."""
        if not self.tasks:
            return []
        _, pending = await asyncio.wait(self.tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        return sorted(task.get_name() for task in pending)


class JobLeases(Protocol):
    """Where the singletons' leases are kept, shared by every instance of the installation (the database's
    ``leases``: :class:`procurd.operations.instances.SharedJobLeases`). Each call is one transaction."""

    async def acquire(self, name: str, holder: str, now: datetime, ttl_seconds: float) -> bool:
        """Take lease ``name`` for ``holder`` when it is free, expired or already ``holder``'s."""
        ...

    async def renew_all(
        self, names: Collection[str], holder: str, now: datetime, ttl_seconds: float
    ) -> set[str]:
        """Extend every lease of ``names`` that ``holder`` still holds; the names renewed."""
        ...

    async def release_all(self, names: Collection[str], holder: str) -> None:
        """Give up every lease of ``names`` that ``holder`` holds."""
        ...


class Singletons(Worker):
    """The singletons this instance runs: it holds their leases ``job:<name>`` and renews them.

    A singleton's lease is taken when the singleton is due and free (nobody holds it, or its holder let it
    expire); it is then renewed every ``renew_seconds`` and lasts three times that, so when this
    instance dies another one takes over within that time at the singleton's next due moment (sooner when the
    heartbeat finds this instance dead and frees its leases at once). Leases are given up when the daemon
    stops. ``claim`` answers from memory while a lease is known to be held, so a worker that checks before
    each step costs no database work.
    """

    name = "singletons"

    def __init__(self, leases: JobLeases, holder: str, renew_seconds: float) -> None:
        super().__init__()
        self.leases = leases
        self.holder = holder
        self.idle_seconds = renew_seconds
        self.ttl_seconds = LEASE_BEATS * renew_seconds
        self._held: dict[str, float] = {}  # lease name to the monotonic time its lease runs out

    def holds(self, name: str) -> bool:
        """Whether this instance holds singleton ``name``'s lease right now, as far as it knows."""
        return self._held.get(JOB_LEASE_PREFIX + name, 0.0) > time.monotonic()

    async def claim(self, name: str) -> bool:
        """Whether this instance may run singleton ``name`` now: it holds the lease, or just took it."""
        if self.holds(name):
            return True
        lease = JOB_LEASE_PREFIX + name
        started = time.monotonic()
        now = utcnow()
        taken = await self.leases.acquire(lease, self.holder, now, self.ttl_seconds)
        if taken:
            if lease not in self._held:
                log.info("singleton.taken", singleton=name, instance=self.holder)
            self._held[lease] = started + self.ttl_seconds
        else:
            self._held.pop(lease, None)
        return taken

    async def step(self) -> float | None:
        """Renew every lease held; a lease found taken by another instance is dropped."""
        if not self._held:
            return None
        started = time.monotonic()
        now = utcnow()
        names = set(self._held)
        renewed = await self.leases.renew_all(names, self.holder, now, self.ttl_seconds)
        for lease in names:
            if lease in renewed:
                self._held[lease] = started + self.ttl_seconds
            else:
                log.warning("singleton.lost", singleton=lease.removeprefix(JOB_LEASE_PREFIX))
                self._held.pop(lease, None)
        return None

    async def drain(self) -> None:
        """Give every lease up, so that another instance takes over at once."""
        names, self._held = list(self._held), {}
        try:
            await self.leases.release_all(names, self.holder)
        except DatabaseError as exc:
            log.warning("singleton.release_failed", singletons=names, reason=exc.reason)

    def job(self, name: str, job: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """``job`` run only on the instance that holds singleton ``name`` (skipped elsewhere)."""

        async def run_if_held() -> None:
            if await self.claim(name):
                await job()

        return run_if_held

    def worker(self, worker: Worker, name: str | None = None) -> Worker:
        """``worker`` stepping only on the instance that holds singleton ``name`` (default: its name)."""
        return _SingletonWorker(worker, self, name or worker.name)


class _SingletonWorker(Worker):
    def __init__(self, inner: Worker, singletons: Singletons, singleton: str) -> None:
        self.inner = inner
        self.singletons = singletons
        self.singleton = singleton
        self.name = inner.name
        self.wakeup = inner.wakeup

    @property
    def idle_seconds(self) -> float:  # type: ignore[override]
        # An instance standing by looks at the lease once per renewal period.
        held = self.singletons.holds(self.singleton)
        return self.inner.idle_seconds if held else self.singletons.idle_seconds

    async def step(self) -> float | None:
        if not await self.singletons.claim(self.singleton):
            return None
        return await self.inner.step()

    async def drain(self) -> None:
        await self.inner.drain()
