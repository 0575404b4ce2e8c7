"""``procurd run`` refuses bad set-ups before it listens, and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from procurd.loopback import unused_ports
from procurd.sandbox import Sandbox, SandboxConfig
from support import wait_until

BASE = """
[database]
url = "sqlite+aiosqlite:///{db}"

[server]
public_host = "127.0.0.1"
public_port = {public}
admin_host = "{admin_host}"
admin_port = {admin}
callback_url = "{callback_url}"
allow_private_callback_url = {allow_private}

[[upstreams]]
name = "main"
base_url = "{base_url}"
api_key = "sandbox-key"
api_secret = "sandbox-secret"
max_requests_per_second = 100
"""


def config(tmp_path: Path, base_url: str = "http://127.0.0.1:9", extra: str = "", **values: object) -> Path:
    public, admin = unused_ports(2)
    fields = {
        "db": tmp_path / "procurd.db",
        "public": public,
        "admin": admin,
        "callback_url": f"http://127.0.0.1:{public}/api/v1/upstream/callback",
        "allow_private": "true",
        "base_url": base_url,
        "admin_host": "127.0.0.1",
    }
    fields.update(values)
    path = tmp_path / "procurd.toml"
    path.write_text(BASE.format(**fields) + extra, encoding="utf-8")
    return path


def procurd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "procurd", *args], capture_output=True, text=True, check=False, timeout=60
    )


@pytest.mark.parametrize(
    ("values", "extra", "expected"),
    [
        ({"allow_private": "false"}, "", "callback_url"),
        ({"admin_host": "0.0.0.0"}, "", "admin_token: required"),
        ({}, "\n[procurement]\nworkers = 0\n", "[procurement] workers"),
        ({}, "\n[catalog]\nbogus = 1\n", "[catalog] bogus: unknown key"),
    ],
)
def test_bad_configuration_exits_2(tmp_path: Path, values: dict[str, str], extra: str, expected: str) -> None:
    """Each bad configuration stops `procurd run` with exit code 2 and a message naming the key."""
    path = config(tmp_path, extra=extra, **values)
    result = procurd("--config", str(path), "run")
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_unmigrated_database_is_refused(tmp_path: Path) -> None:
    """A database that was never upgraded is refused with the command that fixes it."""
    result = procurd("--config", str(config(tmp_path)), "run")
    assert result.returncode == 1
    assert "procurd db upgrade" in result.stderr


async def test_sigterm_stops_cleanly(tmp_path: Path) -> None:
    """On SIGTERM the daemon stops taking work, drains, and exits 0."""
    async with Sandbox(SandboxConfig(products=3, allow_private_callbacks=True)) as sandbox:
        path = config(tmp_path, base_url=sandbox.base_url)
        assert procurd("--config", str(path), "db", "upgrade").returncode == 0
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "procurd",
            "--config",
            str(path),
            "run",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        admin_port = int(path.read_text().split("admin_port = ")[1].split()[0])

        async def healthy() -> bool:
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"http://127.0.0.1:{admin_port}/healthz") as response,
                ):
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(healthy, timeout=30)
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=30)
        assert process.returncode == 0, stderr.decode()


async def test_a_daemon_on_sqlite_imports_neither_alembic_nor_postgresql(tmp_path: Path) -> None:
    """``procurd run`` on SQLite, through start-up, its revision check and a whole catalogue pass, never
    imports Alembic (only ``db upgrade`` needs it), asyncpg or SQLAlchemy's PostgreSQL dialect, nor Jinja2
    while nobody opened the console: memory spent on what it does not use."""
    async with Sandbox(SandboxConfig(products=3, allow_private_callbacks=True)) as sandbox:
        path = config(tmp_path, base_url=sandbox.base_url)
        assert procurd("--config", str(path), "db", "upgrade").returncode == 0
        errors = tmp_path / "stderr"
        with errors.open("wb") as stream:  # a file: the import lines alone would fill a pipe
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-X", "importtime", "-m", "procurd", "--config", str(path), "run",
                stdout=asyncio.subprocess.DEVNULL, stderr=stream,
            )  # fmt: skip
        admin_port = int(path.read_text().split("admin_port = ")[1].split()[0])

        async def synced() -> bool:
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"http://127.0.0.1:{admin_port}/api/v1/status") as response,
                ):
                    last_sync = (await response.json())["upstreams"][0]["last_sync"]
                    return last_sync is not None and last_sync["ok"] is True
            except aiohttp.ClientError:
                return False

        try:
            await wait_until(synced, timeout=30)
        finally:
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), timeout=30)
    stderr = errors.read_text(encoding="utf-8", errors="replace")
    assert process.returncode == 0, stderr[-2000:]
    imported = {
        line.rpartition("|")[2].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "procurd.daemon" in imported
    assert "procurd.catalog.sync" in imported
    loaded = {name for name in imported if name.split(".")[0] in ("alembic", "asyncpg", "jinja2")}
    loaded |= {name for name in imported if name.startswith("sqlalchemy.dialects.postgresql")}
    assert loaded == set()
