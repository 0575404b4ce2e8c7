"""Helpers for tests that run procurd against the sandbox: settings, a daemon in-process, waiting."""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import pty
import re
import struct
import sys
import termios
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar, overload

import aiohttp
from click.testing import CliRunner, Result
from sqlalchemy import Executable, Row, select
from structlog._config import BoundLoggerLazyProxy

from procurd.catalog.sync import SyncReport
from procurd.cli import main
from procurd.config import Settings
from procurd.daemon import Daemon
from procurd.db.database import Database, open_database
from procurd.db.schema import leases
from procurd.db.types import utcnow
from procurd.logs import configure_logging
from procurd.loopback import unused_ports
from procurd.operations.catalog_pass import run_sync
from procurd.operations.runtime import Runtime
from procurd.sandbox import SandboxConfig
from procurd.systemd import Notifier

T = TypeVar("T")
DEFAULT_TIMEOUT = 20.0


@overload
async def wait_until(
    predicate: Callable[[], Awaitable[T | None]], timeout: float = ..., interval: float = ...
) -> T: ...
@overload
async def wait_until(predicate: Callable[[], T | None], timeout: float = ..., interval: float = ...) -> T: ...
async def wait_until(
    predicate: Callable[[], Awaitable[T | None] | T | None],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.02,
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds.

    ``predicate`` is a plain function or returns an awaitable (a coroutine function); the first truthy
    value, awaited if need be, is the result, typed without the ``None`` that means "not yet".
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        value: T | None
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            value = await result
        else:
            value = result
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


async def sql_rows(database: Database | str, statement: Executable) -> list[Row[*tuple[Any, ...]]]:
    """The rows of one SELECT, read in its own transaction (``database`` may be a URL)."""
    return await _on(database, lambda connection: list(connection.execute(statement).all()), write=False)


async def sql_execute(database: Database | str, statement: Executable) -> int:
    """Run one write statement in its own transaction; the rows it changed."""
    return await _on(database, lambda connection: int(connection.execute(statement).rowcount), write=True)


async def _on(database: Database | str, work: Callable[[Any], T], *, write: bool) -> T:
    owned = open_database(database) if isinstance(database, str) else None
    target = owned or database
    assert isinstance(target, Database)
    try:
        run = target.write if write else target.read
        return await run(lambda tx: work(tx.connection))
    finally:
        if owned is not None:
            await owned.close()


async def run_procurd(
    *args: str,
    env: Mapping[str, str] | None = None,
    terminal_columns: int | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> tuple[int, str, str]:
    """``python -m procurd ARGS`` as a person runs it (in ``cwd`` when given), while this test's loop keeps
    serving.

    On pipes by default: the exit code, stdout and stderr. With ``terminal_columns`` stdout and stderr are a
    terminal that wide (a pseudo-terminal), and everything written to it comes back as stdout.
    """
    environ = dict(os.environ if env is None else env)
    if terminal_columns is None:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "procurd", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=environ, cwd=cwd,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
        assert process.returncode is not None
        return process.returncode, stdout.decode(), stderr.decode()
    environ.update(COLUMNS=str(terminal_columns), LINES="24", TERM="xterm-256color")
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, terminal_columns, 0, 0))
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "procurd", *args,
            stdin=terminal, stdout=terminal, stderr=terminal, env=environ, cwd=cwd,
        )  # fmt: skip
    finally:
        os.close(terminal)
    try:
        output = await asyncio.wait_for(asyncio.to_thread(_read_until_closed, controller), timeout)
        code = await asyncio.wait_for(process.wait(), timeout)
    finally:
        os.close(controller)
    return code, output.decode(errors="replace"), ""


def _read_until_closed(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: every process holding the terminal has exited
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def screen_lines(output: str) -> list[str]:
    """What a terminal shows of ``output``, line by line: escape sequences removed, each line as it stands
    after its last carriage return."""
    lines = []
    for line in ANSI_ESCAPE.sub("", output).split("\n"):
        lines.append(line.rstrip("\r").split("\r")[-1])
    return lines


class UpstreamSite(Protocol):
    """What procurd's configuration needs of a sandbox (one in this process, or in another)."""

    @property
    def base_url(self) -> str: ...

    @property
    def config(self) -> SandboxConfig: ...


def settings_for(
    database_url: str, *sandboxes: tuple[str, UpstreamSite], **sections: dict[str, Any]
) -> Settings:
    """Settings for a procurd on loopback with fast schedules, one upstream per named sandbox."""
    return Settings(**config_data(database_url, *sandboxes, **sections))


def config_data(
    database_url: str, *sandboxes: tuple[str, UpstreamSite], **sections: Mapping[str, Any]
) -> dict[str, Any]:
    """:func:`settings_for`'s configuration as the TOML file holds it.

    ``sections`` update the defaults section by section (``upstream`` updates every upstream block).
    """
    public_port, admin_port = unused_ports(2)
    data: dict[str, Any] = {
        "database": {"url": database_url},
        "server": {
            "public_host": "127.0.0.1",
            "public_port": public_port,
            "admin_host": "127.0.0.1",
            "admin_port": admin_port,
            "callback_url": f"http://127.0.0.1:{public_port}/api/v1/upstream/callback",
            "allow_private_callback_url": True,
            "shutdown_timeout_seconds": 10,
        },
        "upstreams": [
            {
                "name": name,
                "base_url": sandbox.base_url,
                "api_key": sandbox.config.api_key,
                "api_secret": sandbox.config.api_secret,
                "header_prefix": sandbox.config.header_prefix,
                "timeout_seconds": 5,
                "max_requests_per_second": 1000,
                "ping_interval_seconds": 3600,
            }
            for name, sandbox in sandboxes
        ],
        "catalog": {"sync_interval_seconds": 3600, "page_size": 50, "concurrency": 4},
        "procurement": {
            "workers": 4,
            "max_attempts": 4,
            "retry_base_seconds": 0.05,
            "retry_max_seconds": 0.2,
            "poll_initial_seconds": 0.3,
            "poll_max_seconds": 1,
            "poll_give_up_seconds": 3600,
            "lease_seconds": 10,
        },
        "logging": {"level": "warning", "format": "json"},
    }
    for section, values in sections.items():
        if section == "upstream":
            for block in data["upstreams"]:
                block.update(values)
        else:
            data.setdefault(section, {}).update(values)
    return data


async def mirror(settings: Settings) -> dict[str, SyncReport]:
    """Mirror every upstream's catalogue once (intake validates against the mirror); each one's pass."""
    runtime = Runtime.build(settings)
    reports = {}
    try:
        for upstream in settings.upstreams:
            report = await run_sync(
                runtime.database, runtime.client(upstream.name), upstream.name, holder="test"
            )
            assert report.status == "ok", report.error
            reports[upstream.name] = report
    finally:
        await runtime.close()
    return reports


@asynccontextmanager
async def running_daemon(settings: Settings, notifier: Notifier | None = None) -> AsyncIterator[Daemon]:
    daemon = Daemon(settings, notifier=notifier or Notifier({}))
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.shutdown()


class AdminClient:
    """The storefront's view: JSON calls to the admin listener."""

    def __init__(self, settings: Settings, session: aiohttp.ClientSession) -> None:
        self.base = f"http://127.0.0.1:{settings.server.admin_port}"
        self.session = session
        token = settings.server.admin_token.get_secret_value()
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        async with self.session.request(
            method, self.base + path, json=body, headers=self.headers
        ) as response:
            return response.status, await response.json()

    async def submit(self, order_no: str, *items: dict[str, Any]) -> dict[str, Any]:
        status, body = await self.call("POST", "/api/v1/orders", {"order_no": order_no, "items": list(items)})
        assert status in (200, 202), body
        return body["order"]  # type: ignore[no-any-return]

    async def order(self, order_no: str) -> dict[str, Any]:
        status, body = await self.call("GET", f"/api/v1/orders/{order_no}")
        assert status == 200, body
        return body["order"]  # type: ignore[no-any-return]

    async def wait_status(
        self, order_no: str, *statuses: str, timeout: float = DEFAULT_TIMEOUT
    ) -> dict[str, Any]:
        async def reached() -> dict[str, Any] | None:
            order = await self.order(order_no)
            return order if order["status"] in statuses else None

        return await wait_until(reached, timeout)

    async def wait_state(self, order_no: str, state: str, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        async def reached() -> dict[str, Any] | None:
            order = await self.order(order_no)
            return order if all(p["state"] == state for p in order["procurements"]) else None

        return await wait_until(reached, timeout)


def forget_cached_loggers() -> None:
    """Loggers keep the level they were first used at; let procurd's pick up the current configuration."""
    for module in list(sys.modules.values()):
        if module is None or not module.__name__.startswith("procurd"):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, BoundLoggerLazyProxy):
                value.__dict__.pop("bind", None)


@contextmanager
def captured_log(level: str) -> Iterator[io.StringIO]:
    """procurd's JSON log at ``level`` written into a string during the block (loggers an earlier test
    used at another level included); the tests' configuration is back afterwards."""
    stream = io.StringIO()
    configure_logging(level, "json", stream)
    forget_cached_loggers()
    try:
        yield stream
    finally:
        configure_logging("warning", "json")
        forget_cached_loggers()


async def run_cli(config: Path, *args: str, columns: int = 200) -> Result:
    """``procurd --config CONFIG ARGS`` in a worker thread (its own event loop, as from a shell) while this
    test's loop keeps serving; the click result (exit code, stdout, stderr)."""
    runner = CliRunner()
    try:
        result = await asyncio.to_thread(
            runner.invoke, main, ["--config", str(config), *args], env={"COLUMNS": str(columns)}
        )
    finally:
        # The command pointed logging at the runner's (now closed) stderr.
        configure_logging("warning", "json")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


async def lease_holder(database: Database, name: str) -> str | None:
    """Who holds lease ``name`` now, read from its row (``None``: free or expired)."""
    now = utcnow()
    statement = select(leases.c.holder).where(leases.c.name == name, leases.c.expires_at >= now)
    rows = await database.read(lambda tx: tx.connection.execute(statement).all())
    return str(rows[0].holder) if rows else None
