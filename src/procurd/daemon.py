"""``procurd run``: one process hosting both listeners, the background workers and the scheduled jobs.

Continuous work (submitters, pollers, storefront events, the heartbeat) runs as supervised
:class:`procurd.background.Worker` loops that wake on their own due times or on a signal; a worker that
dies stops the daemon with a non-zero exit. Periodic work (catalogue passes, pings, checks) runs as
APScheduler jobs: a failed job is logged and runs again on its schedule, and stopping the daemon cuts a
running pass short (it resumes on the next schedule) while order submissions in flight finish.

In a cluster every scheduled job and every poller is a singleton (:class:`procurd.background.Singletons`):
it runs on the one instance that holds its lease, and moves to another instance when that one dies. A job
run now on purpose (:meth:`Daemon.run_now`) runs on the instance asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import structlog
from aiohttp import web
from apscheduler.events import EVENT_JOB_ERROR, JobExecutionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from procurd import __version__
from procurd.background import Singletons, Supervisor, Worker
from procurd.config import Settings
from procurd.core.alerts import Kind, Occurrence
from procurd.http.admin import make_admin_app
from procurd.http.errors import listener_runner
from procurd.http.public import make_public_app
from procurd.logs import muted_on_terminal
from procurd.operations import DatabaseError, Operations, Refused
from procurd.operations.alerts import AlertDispatcher, load_notifiers
from procurd.operations.events import WebhookDispatcher
from procurd.operations.installation import database_problem, deliver_due_alerts, usable_database_problem
from procurd.operations.instances import Heartbeat, SharedJobLeases
from procurd.operations.pings import describe_failure
from procurd.operations.runtime import Runtime
from procurd.procurement.poller import Poller
from procurd.procurement.submitter import Submitter
from procurd.provider.callbacks import CallbackDispatcher
from procurd.systemd import Notifier
from procurd.upstream.errors import AuthError, BusinessError, UpstreamError
from procurd.upstream.models import OrderCreated

log = structlog.get_logger("procurd.daemon")

EXIT_WORKER_FAILED = 1
CHECKS_INTERVAL_SECONDS = 60.0
RETENTION_INTERVAL_SECONDS = 86400.0  # [retention] is applied daily, first a few minutes after start
RETENTION_FIRST_DELAY_SECONDS = 300.0
BALANCE_CODES = frozenset({"payment_failed", "insufficient_balance"})


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
    problem = await usable_database_problem(settings, runtime.database)
    if problem is not None:
        raise StartupError(problem, 1)


def daemon_failed(runtime: Runtime, what: str) -> Occurrence:
    """The alert of a daemon that could not start, or stopped on a failure: one key per host, so that a
    service restarted again and again is one alert whose count is the number of tries."""
    host = socket.gethostname()
    return Occurrence(
        Kind.DAEMON_FAILED,
        host,
        f"{what}. Instance {runtime.instance}, procurd {__version__}.\n"
        "A service restarted on failure (systemd's Restart=on-failure) tries again, and each try that "
        "fails counts here. Fix the cause; `systemctl status procurd` and `journalctl -u procurd` show "
        "the tries.",
    )


class Daemon:
    def __init__(self, settings: Settings, runtime: Runtime | None = None, notifier: Notifier | None = None):
        self.settings = settings
        self.runtime = runtime or Runtime.build(settings)
        self.operations = Operations(self.runtime)
        self.notifier = notifier or Notifier()
        self.stop_event = asyncio.Event()
        self.supervisor = Supervisor(self.stop_event)
        self.runners: list[web.AppRunner] = []
        self.scheduler = AsyncIOScheduler(timezone=UTC)
        self.job_tasks: set[asyncio.Task[object]] = set()
        self.jobs_asked_for: set[str] = set()
        self.workers: dict[str, Worker] = {}
        self.singletons = Singletons(
            SharedJobLeases(self.runtime.database), self.runtime.instance, settings.server.heartbeat_seconds
        )
        self.public_port: int | None = None
        self.admin_port: int | None = None
        self.heartbeat: Heartbeat | None = None
        self.database_usable = False  # the start-up checks found the database at the current revision

    # --- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Check, listen, then count as an instance: the heartbeat records this instance (and takes over
        from dead predecessors) only once both listeners are up, so a start that fails before serving
        leaves no row in ``instances`` and takes nothing over (:class:`StartupError`, after which
        :meth:`abandon` closes what was opened). A :class:`DatabaseError` after that: :meth:`shutdown`."""
        await startup_checks(self.settings, self.runtime)
        self.database_usable = True
        if self.settings.alerts.urls:
            # Apprise loads its notifiers on first use (about 0.3 s): before anything listens, not on the
            # first alert.
            await asyncio.get_running_loop().run_in_executor(None, load_notifiers, self.settings.alerts.urls)
        server = self.settings.server
        try:
            await self.runtime.start()
        except DatabaseError as exc:
            raise StartupError(database_problem(self.settings, exc), 1) from None
        self.public_port = await self._listen(
            make_public_app(self.operations), "public", server.public_host, server.public_port
        )
        self.admin_port = await self._listen(
            make_admin_app(self.operations), "admin", server.admin_host, server.admin_port
        )
        self.heartbeat = Heartbeat(self.runtime)
        await self.heartbeat.start()
        self._start_workers()
        self._start_scheduler()
        self.operations.catalog.start_reprice()
        if self.settings.provider.enabled:
            # The configuration may have changed what is offered and how: every document is rebuilt.
            self.operations.catalog.start_task(
                "provider-catalog", lambda: self.operations.provider.refresh(full=True)
            )
        self.notifier.ready(f"listening on {self.public_port} (public) and {self.admin_port} (admin)")
        log.info(
            "daemon.started",
            instance=self.runtime.instance,
            public_port=self.public_port,
            admin_port=self.admin_port,
            upstreams=[u.name for u in self.settings.upstreams],
        )

    async def _listen(self, app: web.Application, which: str, host: str, port: int) -> int:
        """Serve ``app`` on ``host:port``; :class:`StartupError` naming the listener when it cannot."""
        runner = listener_runner(app, shutdown_timeout=self.settings.server.shutdown_timeout_seconds)
        await runner.setup()
        self.runners.append(runner)
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
            if exc.errno == errno.EADDRINUSE:
                reason += " (another procurd, or another program, listens there)"
            raise StartupError(
                f"cannot listen on {host}:{port} ([server] {which}_host and {which}_port): {reason}", 1
            ) from None
        addresses = runner.addresses
        return int(addresses[0][1]) if addresses else port

    def _start_workers(self) -> None:
        runtime = self.runtime
        settings = self.settings
        idle = 1.0 if runtime.database.dialect == "postgresql" else 5.0
        workers: list[Worker] = []
        for upstream in settings.upstreams:
            client = runtime.client(upstream.name)
            workers.append(
                Submitter(
                    runtime.service,
                    client,
                    runtime.instance,
                    settings.procurement.workers,
                    settings.server.callback_url,
                    on_answer=self._submission_answered,
                    idle_seconds=idle,
                )
            )
            poller = Poller(
                runtime.service,
                client,
                settings.procurement.poll_give_up_seconds,
                instance=runtime.instance,
                idle_seconds=idle,
            )
            workers.append(self.singletons.worker(poller, f"poll:{upstream.name}"))
        if settings.storefront.webhook_url:
            dispatcher = WebhookDispatcher(
                runtime.database,
                settings.storefront,
                runtime.instance,
                wakeup=runtime.service.wakeups.events,
                idle_seconds=idle,
            )
            workers.append(dispatcher)
        if runtime.alerts.delivering:
            workers.append(AlertDispatcher(runtime.alerts, runtime.instance))
        if settings.provider.enabled:
            callbacks = CallbackDispatcher(
                runtime.database,
                settings.provider,
                runtime.instance,
                sender=self.operations.provider.sender,
                wakeup=runtime.service.wakeups.provider_callbacks,
                idle_seconds=idle,
            )
            workers.append(callbacks)
        assert self.heartbeat is not None
        workers += [self.heartbeat, self.singletons]
        for worker in workers:
            self.workers[worker.name] = worker
            self.supervisor.start(worker)
        if self.notifier.watchdog_interval is not None:
            self.supervisor.spawn(self.notifier.run_watchdog(self.stop_event), "watchdog")

    def _start_scheduler(self) -> None:
        now = datetime.now(UTC)
        for upstream in self.settings.upstreams:
            name = upstream.name
            self._schedule(
                f"catalog-sync:{name}", self._sync_job(name), self.settings.catalog.sync_interval_seconds, now
            )
            self._schedule(f"ping:{name}", self._ping_job(name), upstream.ping_interval_seconds, now)
        checks_every = min(CHECKS_INTERVAL_SECONDS, self.settings.alerts.stuck_after_seconds / 4)
        self._schedule("checks", self._checks_job, checks_every, now + timedelta(seconds=checks_every))
        reconcile_every = self.settings.reconcile.interval_seconds
        self._schedule(
            "reconcile", self._reconcile_job, reconcile_every, now + timedelta(seconds=reconcile_every)
        )
        first_prune = now + timedelta(seconds=RETENTION_FIRST_DELAY_SECONDS)
        self._schedule("retention", self._retention_job, RETENTION_INTERVAL_SECONDS, first_prune)
        self.scheduler.add_listener(self._job_failed, EVENT_JOB_ERROR)
        self.scheduler.start()

    def _schedule(
        self, job_id: str, job: Callable[[], Awaitable[None]], seconds: float, first: datetime
    ) -> None:
        """Run ``job`` every ``seconds`` from ``first``, as singleton ``job_id`` of the cluster."""
        on_one_instance = self.singletons.job(job_id, job)

        async def run() -> None:
            task = asyncio.current_task()
            assert task is not None
            self.job_tasks.add(task)
            try:
                if job_id in self.jobs_asked_for:
                    self.jobs_asked_for.discard(job_id)
                    await job()
                else:
                    await on_one_instance()
            except asyncio.CancelledError:
                if not self.stop_event.is_set():
                    raise
                # The daemon stops; the job runs again next time. Ending here, not raising, keeps the
                # scheduler from logging a normal stop as a job that failed.
                log.info("job.cut_short", job=job_id)
            finally:
                self.job_tasks.discard(task)

        self.scheduler.add_job(
            run,
            "interval",
            seconds=seconds,
            id=job_id,
            name=job_id,
            next_run_time=first,
            misfire_grace_time=max(30, int(seconds)),
            coalesce=True,
            max_instances=1,
        )

    def run_now(self, job_id: str) -> None:
        """Run scheduled job ``job_id`` (``catalog-sync:NAME``, ``ping:NAME``) now on this instance, unless it
        is running (a catalogue pass still skips while another instance's pass holds the upstream's lease)."""
        job = self.scheduler.get_job(job_id)
        if job is None:
            raise KeyError(job_id)
        self.jobs_asked_for.add(job_id)
        job.modify(next_run_time=datetime.now(UTC))

    @staticmethod
    def _job_failed(event: JobExecutionEvent) -> None:
        log.error("job.failed", job=event.job_id, error=repr(event.exception), exc_info=event.exception)

    def _sync_job(self, upstream: str) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            await self.operations.catalog.sync(upstream, lease_ttl_seconds=self.singletons.ttl_seconds)

        return job

    async def _reconcile_job(self) -> None:
        await self.operations.upstreams.reconcile(trigger="scheduled")

    async def _retention_job(self) -> None:
        with contextlib.suppress(Refused):  # another instance prunes now (logged as retention.skipped)
            await self.operations.housekeeping.prune()

    async def _checks_job(self) -> None:
        """Orders stuck at the upstream; the provider's wallets and callbacks."""
        await self.operations.housekeeping.check_stuck_orders()
        await self.operations.provider.check()

    async def _submission_answered(self, upstream: str, outcome: OrderCreated | UpstreamError) -> None:
        """An auth error makes the upstream unhealthy; a refused payment refreshes the balance shown."""
        if isinstance(outcome, AuthError):
            await self.runtime.record_auth_failure(upstream, outcome)
        elif isinstance(outcome, BusinessError) and outcome.code in BALANCE_CODES:
            self.run_now(f"ping:{upstream}")

    def _ping_job(self, upstream: str) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            await self.operations.upstreams.ping(upstream)

        return job

    def request_stop(self) -> None:
        if not self.stop_event.is_set():
            log.info("daemon.stopping")
            self.stop_event.set()

    async def wait(self) -> None:
        await self.stop_event.wait()

    async def shutdown(self) -> None:
        """Stop taking work, let in-flight upstream calls finish up to the deadline, then close everything.

        The instance is marked stopped (a clean shutdown, also after a failure); when a background worker
        failed, alert ``daemon_failed`` is raised and sent before the database is closed."""
        self.notifier.stopping("draining")
        self.stop_event.set()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)  # cancels running jobs: a catalogue pass resumes next time
        for runner in self.runners:
            await runner.cleanup()
        deadline = self.settings.server.shutdown_timeout_seconds
        for name in await self.supervisor.wait(deadline):
            log.warning("daemon.task_cut_off", task=name)
        if self.job_tasks:
            await asyncio.wait(list(self.job_tasks), timeout=deadline)
        if self.heartbeat is not None and self.heartbeat.name not in self.workers:
            await self.heartbeat.drain()  # recorded, but stopped before its worker ran
        failure = self.supervisor.failure
        if failure is not None:
            await self._tell(f"stopped on a failure: {describe_failure(failure)}")
        await self.operations.close()
        log.info("daemon.stopped")

    async def abandon(self, reason: str) -> None:
        """After a start that failed before serving (:class:`StartupError`): close what was opened. Nothing
        of this process stays in ``instances`` and nothing was taken over from other instances; when the
        database could be used, alert ``daemon_failed`` is raised (one key per host, counted)."""
        log.error("daemon.refused_to_start", reason=reason)
        for runner in self.runners:
            await runner.cleanup()
        if self.database_usable:
            await self._tell(f"could not start: {reason}")
        await self.operations.close()

    async def _tell(self, what: str) -> None:
        """Raise ``daemon_failed`` and send it (for a few seconds at most): nothing may be left to send it
        if the daemon does not come back."""
        try:
            await self.runtime.alerts.raise_(daemon_failed(self.runtime, what))
            await deliver_due_alerts(self.runtime)
        except DatabaseError as exc:
            log.warning("daemon.failure_not_recorded", reason=exc.reason)


async def run_daemon(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT; 0 after a clean shutdown, 1 when a background worker failed."""
    daemon = Daemon(settings)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, daemon.request_stop)
    try:
        await daemon.start()
    except StartupError as exc:
        with muted_on_terminal():  # on a terminal the one sentence `procurd run` prints says it all
            await daemon.abandon(str(exc))
        raise
    except DatabaseError as exc:  # after both listeners were up: an instance that served, stopped cleanly
        reason = database_problem(settings, exc)
        log.error("daemon.refused_to_start", reason=reason)
        await daemon.shutdown()
        raise StartupError(reason, 1) from None
    try:
        await daemon.wait()
    finally:
        await daemon.shutdown()
    if daemon.supervisor.failure is not None:
        log.error("daemon.stopped_on_failure", error=repr(daemon.supervisor.failure))
        return EXIT_WORKER_FAILED
    return 0
