"""The daemon's background work, one pattern for all of it, under one supervisor.

A :class:`Worker` (a submitter, a poller, the storefront dispatcher, the heartbeat) does what is due in
:meth:`Worker.step` and says when it is due again; between steps it sleeps until then, or until something in
the process sets its ``wakeup``. Nothing spins: a poll due in one second runs in about one second, an idle
worker looks again only at its ``idle_seconds`` (work other processes may have queued).

A database that cannot be reached is waited out with backoff. Any other failure is a bug: the
:class:`Supervisor` logs it and stops the daemon, which exits non-zero so that systemd restarts it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

from procurd.aio import wait_for_any
from procurd.db.errors import DatabaseUnavailable

log = structlog.get_logger("procurd.background")

UNAVAILABLE_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0)


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
