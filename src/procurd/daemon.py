"""``procurd run``: one process hosting both listeners, the workers and the scheduled jobs.

Scheduled jobs (APScheduler) only wake tasks this module owns; the tasks do the work and are drained on
shutdown, so stopping the scheduler never cuts a catalogue page or an order submission in half.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC

import structlog
from aiohttp import web
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from procurd.aio import wait_for_any
from procurd.catalog.sync import run_sync
from procurd.config import Settings
from procurd.db import migrate
from procurd.http.admin import make_admin_app
from procurd.http.errors import listener_runner
from procurd.http.public import make_public_app
from procurd.procurement.poller import Poller
from procurd.procurement.worker import SubmissionPool, SubmissionWorker
from procurd.runtime import Runtime
from procurd.status import record_ping
from procurd.systemd import Notifier
from procurd.upstream.errors import UpstreamError
from procurd.webhook import WebhookDispatcher

log = structlog.get_logger("procurd.daemon")

POLL_TICK_SECONDS = 5.0


class StartupError(Exception):
    """A reason not to start; the message is for a person. ``exit_code`` 2 for configuration, 1 otherwise."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


async def startup_checks(settings: Settings, runtime: Runtime) -> None:
    """Everything that must hold before anything listens."""
    problem = settings.server.callback_url_problem()
    if problem is not None:
        raise StartupError(
            f"[server] callback_url {settings.server.callback_url!r}: {problem}; upstreams refuse such "
            "an address (set allow_private_callback_url = true only for a sandbox on this machine)"
        )
    try:
        current = await migrate.current_revision(runtime.engine)
    except Exception as exc:  # noqa: BLE001 - any driver error means the database is unusable
        reason = (str(getattr(exc, "orig", exc)).strip().splitlines() or [type(exc).__name__])[0]
        raise StartupError(f"[database] url: cannot use the database: {reason}", 1) from None
    head = migrate.head_revision()
    if current != head:
        where = "empty" if current is None else f"at revision {current}"
        raise StartupError(f"the database is {where}, this version needs {head}: run `procurd db upgrade`", 1)


@dataclass
class Periodic:
    """A task that runs ``job`` whenever woken (by the scheduler or at start), one run at a time."""

    name: str
    job: Callable[[], Awaitable[None]]
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_for_any(stop, self.wakeup, timeout=3600)
            if stop.is_set():
                return
            self.wakeup.clear()
            try:
                await self.job()
            except Exception:
                log.exception("job.failed", job=self.name)


class Daemon:
    def __init__(self, settings: Settings, runtime: Runtime | None = None, notifier: Notifier | None = None):
        self.settings = settings
        self.runtime = runtime or Runtime.build(settings)
        self.notifier = notifier or Notifier()
        self.stop_event = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.runners: list[web.AppRunner] = []
        self.scheduler = AsyncIOScheduler(timezone=UTC)
        self.pollers: dict[str, Poller] = {}
        self.periodic: dict[str, Periodic] = {}
        self.public_port: int | None = None
        self.admin_port: int | None = None

    # --- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        await startup_checks(self.settings, self.runtime)
        await self.runtime.start()
        server = self.settings.server
        self.public_port = await self._listen(
            make_public_app(self.runtime), server.public_host, server.public_port
        )
        self.admin_port = await self._listen(
            make_admin_app(self.runtime), server.admin_host, server.admin_port
        )
        self._start_tasks()
        self._start_scheduler()
        self.notifier.ready(f"listening on {self.public_port} (public) and {self.admin_port} (admin)")
        log.info(
            "daemon.started",
            instance=self.runtime.instance,
            public_port=self.public_port,
            admin_port=self.admin_port,
            upstreams=[u.name for u in self.settings.upstreams],
        )

    async def _listen(self, app: web.Application, host: str, port: int) -> int:
        runner = listener_runner(app, shutdown_timeout=self.settings.server.shutdown_timeout_seconds)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        self.runners.append(runner)
        addresses = runner.addresses
        return int(addresses[0][1]) if addresses else port

    def _start_tasks(self) -> None:
        settings = self.settings
        callback_url = settings.server.callback_url
        for upstream in settings.upstreams:
            client = self.runtime.client(upstream.name)
            worker = SubmissionWorker(
                self.runtime.service,
                client,
                f"{self.runtime.instance}/{upstream.name}",
                callback_url,
                on_auth_failure=self.runtime.record_auth_failure,
            )
            pool = SubmissionPool(worker, settings.procurement.workers)
            self._spawn(pool.run(self.stop_event), f"workers {upstream.name}")
            poller = Poller(self.runtime.service, client, settings.procurement.poll_give_up_seconds)
            self.pollers[upstream.name] = poller
            self._spawn(poller.run(self.stop_event, POLL_TICK_SECONDS), f"poller {upstream.name}")
            for periodic in (
                Periodic(f"catalog-sync:{upstream.name}", self._sync_job(upstream.name)),
                Periodic(f"ping:{upstream.name}", self._ping_job(upstream.name)),
            ):
                self.periodic[periodic.name] = periodic
                periodic.wakeup.set()  # run once at start
                self._spawn(periodic.run(self.stop_event), periodic.name)
        if settings.storefront.webhook_url:
            dispatcher = WebhookDispatcher(
                self.runtime.engine,
                settings.storefront,
                self.runtime.instance,
                wakeup=self.runtime.service.wakeups.events,
            )
            self._spawn(dispatcher.run(self.stop_event), "storefront events")
        if self.notifier.watchdog_interval is not None:
            self._spawn(self.notifier.run_watchdog(self.stop_event), "watchdog")

    def _start_scheduler(self) -> None:
        job_defaults = {"misfire_grace_time": 30, "coalesce": True, "max_instances": 1}
        for upstream in self.settings.upstreams:
            name = upstream.name
            self.scheduler.add_job(
                self.periodic[f"catalog-sync:{name}"].wakeup.set,
                "interval",
                seconds=self.settings.catalog.sync_interval_seconds,
                id=f"catalog-sync:{name}",
                **job_defaults,
            )
            self.scheduler.add_job(
                self.periodic[f"ping:{name}"].wakeup.set,
                "interval",
                seconds=upstream.ping_interval_seconds,
                id=f"ping:{name}",
                **job_defaults,
            )
            self.scheduler.add_job(
                self.pollers[name].wakeup.set,
                "interval",
                seconds=POLL_TICK_SECONDS,
                id=f"poll:{name}",
                **job_defaults,
            )
        self.scheduler.start()

    def _spawn(self, coroutine: Awaitable[None], name: str) -> None:
        self.tasks.append(asyncio.ensure_future(coroutine))
        self.tasks[-1].set_name(name)

    def _sync_job(self, upstream: str) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            report = await run_sync(
                self.runtime.engine,
                self.runtime.client(upstream),
                upstream,
                page_size=self.settings.catalog.page_size,
                concurrency=self.settings.catalog.concurrency,
                holder=self.runtime.instance,
            )
            log.info(
                "catalog.synced",
                upstream=upstream,
                status=report.status,
                products=report.products,
                rows_written=report.rows_written,
                error=report.error,
            )

        return job

    def _ping_job(self, upstream: str) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            try:
                result = await self.runtime.client(upstream).ping()
            except UpstreamError as exc:
                await record_ping(self.runtime, upstream, exc)
                log.warning("ping.failed", upstream=upstream, code=exc.code, error=str(exc))
                return
            await record_ping(self.runtime, upstream, result)

        return job

    def request_stop(self) -> None:
        if not self.stop_event.is_set():
            log.info("daemon.stopping")
            self.stop_event.set()

    async def wait(self) -> None:
        await self.stop_event.wait()

    async def shutdown(self) -> None:
        """Stop taking work, let in-flight upstream calls finish up to the deadline, then close everything."""
        self.notifier.stopping("draining")
        self.stop_event.set()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        for runner in self.runners:
            await runner.cleanup()
        deadline = self.settings.server.shutdown_timeout_seconds
        _, pending = await asyncio.wait(self.tasks, timeout=deadline) if self.tasks else (set(), set())
        for task in pending:
            log.warning("daemon.task_cut_off", task=task.get_name())
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.runtime.close()
        log.info("daemon.stopped")


async def run_daemon(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT; 0 after a clean shutdown, 1 when start-up failed."""
    daemon = Daemon(settings)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, daemon.request_stop)
    try:
        await daemon.start()
    except StartupError as exc:
        log.error("daemon.refused_to_start", reason=str(exc))
        await daemon.runtime.close()
        raise
    except OSError as exc:
        await daemon.shutdown()
        raise StartupError(f"cannot listen: {exc.strerror or exc}", 1) from None
    try:
        await daemon.wait()
    finally:
        await daemon.shutdown()
    return 0
