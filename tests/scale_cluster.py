"""Several real ``procurd run`` processes on one database, for the scale-out tests.

Each instance gets its own configuration file, its own ports and its own log file under the test's
temporary directory; they share the database and the sandbox upstream running in the test process.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from procurd.config import Settings
from support import UpstreamSite, config_data, wait_until

POSTGRES_URL = os.environ.get("PROCURD_TEST_POSTGRES_URL", "")
requires_postgres = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        not POSTGRES_URL,
        reason="scale-out needs a shared PostgreSQL: set PROCURD_TEST_POSTGRES_URL (scripts/test does)",
    ),
]
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
CALLBACK_PATH = "/api/v1/upstream/callback"


def instance_config(
    database_url: str, sandbox: UpstreamSite, **sections: Mapping[str, Any]
) -> dict[str, Any]:
    """One instance's configuration (as the TOML file holds it): loopback ports, fast schedules.

    ``sections`` update the defaults section by section (``upstream`` updates the one upstream block).
    """
    defaults: dict[str, dict[str, Any]] = {
        "upstream": {"timeout_seconds": 10},
        # Longer than any upstream call: an expired claim is taken again, so it must mean a dead worker.
        "procurement": {"poll_initial_seconds": 0.5, "lease_seconds": 30},
    }
    for section, values in sections.items():
        defaults[section] = {**defaults.get(section, {}), **values}
    return config_data(database_url, ("main", sandbox), **defaults)


def callback_url(public_port: int) -> str:
    return f"http://127.0.0.1:{public_port}{CALLBACK_PATH}"


def settings_of(config: Mapping[str, Any]) -> Settings:
    """The settings an instance started from ``config`` runs with."""
    return Settings(**config)


def to_toml(config: Mapping[str, Any]) -> str:
    """``config`` as a TOML document (tables of scalars, lists and inline tables; arrays of such tables)."""
    lines: list[str] = []
    for section, values in config.items():
        blocks = values if isinstance(values, list) else [values]
        header = f"[[{section}]]" if isinstance(values, list) else f"[{section}]"
        for block in blocks:
            lines.append(header)
            lines.extend(f"{key} = {_toml_value(value)}" for key, value in block.items())
            lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):  # an inline table: ``pricing.rules`` items, a level's ``name``
        return "{" + ", ".join(f"{_toml_key(key)} = {_toml_value(item)}" for key, item in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _child_environment() -> dict[str, str]:
    # PROCURD_<SECTION>__<KEY> variables of the test run must not override an instance's own file.
    return {key: value for key, value in os.environ.items() if not key.startswith("PROCURD_")}


class DaemonProcess:
    """One ``procurd run`` subprocess with its configuration file and log file."""

    def __init__(self, name: str, config: Mapping[str, Any], directory: Path) -> None:
        self.name = name
        self.config = config
        self.settings = settings_of(config)
        self.config_path = directory / f"procurd-{name}.toml"
        self.log_path = directory / f"procurd-{name}.log"
        self.process: asyncio.subprocess.Process | None = None
        self.killed = False  # by the test, on purpose

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.server.admin_port}"

    @property
    def callback_url(self) -> str:
        """This instance's own public callback receiver."""
        return callback_url(self.settings.server.public_port)

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self) -> None:
        self.config_path.write_text(to_toml(self.config), encoding="utf-8")
        with self.log_path.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "procurd", "--config", str(self.config_path), "run",
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=_child_environment(),
            )  # fmt: skip

    async def wait_ready(self, session: aiohttp.ClientSession) -> None:
        """Wait until the admin listener answers ``/healthz``; fail at once if the process exits."""

        async def ready() -> bool:
            if self.returncode is not None:
                raise AssertionError(
                    f"instance {self.name} exited with {self.returncode}:\n{self.log_tail()}"
                )
            try:
                async with session.get(self.admin_url + "/healthz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(ready, timeout=START_TIMEOUT, interval=0.05)

    async def stop(self) -> int:
        """SIGTERM, then wait for the drain; returns the exit code."""
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.process.wait(), STOP_TIMEOUT)

    async def kill(self) -> None:
        """SIGKILL: no drain, no commit, claims and leases left behind."""
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            self.killed = True
            await self.process.wait()

    def log_lines(self) -> list[str]:
        if not self.log_path.exists():
            return []
        return self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_lines()[-lines:])

    def log_events(self, event: str | None = None) -> list[dict[str, Any]]:
        """The instance's JSON log records so far (only those named ``event`` when given)."""
        records = []
        for line in self.log_lines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and (event is None or record.get("event") == event):
                records.append(record)
        return records

    async def metrics(self, session: aiohttp.ClientSession) -> str:
        async with session.get(self.admin_url + "/metrics") as response:
            assert response.status == 200
            return await response.text()


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when there are none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        sample, _, value = line.rpartition(" ")
        if all(f'{key}="{wanted}"' in sample for key, wanted in labels.items()):
            total += float(value)
    return total


@asynccontextmanager
async def cluster(
    directory: Path, configs: Mapping[str, Mapping[str, Any]]
) -> AsyncIterator[list[DaemonProcess]]:
    """Start one ``procurd run`` per configuration at once and wait until all listen.

    On a clean exit every instance is stopped with SIGTERM and must exit 0; when the body fails they are
    killed.
    """
    daemons = [DaemonProcess(name, config, directory) for name, config in configs.items()]
    async with AsyncExitStack() as cleanup:
        for daemon in daemons:
            cleanup.push_async_callback(daemon.kill)
        await asyncio.gather(*(daemon.start() for daemon in daemons))
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(daemon.wait_ready(session) for daemon in daemons))
        yield daemons
        await stop_all(daemons)


async def stop_all(daemons: Sequence[DaemonProcess]) -> None:
    """Stop every instance at once; each must drain and exit 0 (unless the test killed it)."""
    alive = [daemon for daemon in daemons if not daemon.killed]
    codes = await asyncio.gather(*(daemon.stop() for daemon in alive))
    for daemon, code in zip(alive, codes, strict=True):
        assert code == 0, f"instance {daemon.name} exited with {code}:\n{daemon.log_tail()}"


@asynccontextmanager
async def own_database(
    directory: Path, name: str, sqlite_template: Path | None, postgres_template: str | None
) -> AsyncIterator[str]:
    """A fresh migrated database beside the test's own (for a site or a group of instances that must not
    share the test's), of the run's kind: a copy of the session's SQLite template under ``directory``, or a
    PostgreSQL database cloned from the session's template and dropped afterwards (conftest's two template
    fixtures give ``sqlite_template`` and ``postgres_template``)."""
    if sqlite_template is not None:
        path = directory / f"{name}.db"
        shutil.copyfile(sqlite_template, path)
        yield f"sqlite+aiosqlite:///{path}"
        return
    assert postgres_template is not None, "neither a SQLite nor a PostgreSQL template"
    database = f"procurd_test_{name}_{uuid.uuid4().hex[:10]}"
    admin = create_async_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as connection:
            await connection.execute(text(f"CREATE DATABASE {database} TEMPLATE {postgres_template}"))
        yield make_url(POSTGRES_URL).set(database=database).render_as_string(hide_password=False)
    finally:
        async with admin.connect() as connection:
            await connection.execute(text(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        await admin.dispose()
