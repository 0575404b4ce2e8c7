"""`procurd sandbox` as a real process: it listens, serves signed requests and stops on SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

import click
import pytest

from procurd.sandbox import SandboxConfig
from procurd.sandbox.cli import describe_listener, parse_delays
from procurd.sandbox.testing import SignedClient

RUN_COMMAND = "from procurd.sandbox.cli import sandbox_command; sandbox_command()"


async def run_sandbox_process(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        RUN_COMMAND,
        "--port",
        "0",
        "--products",
        "5",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
    return process, line


async def stop(process: asyncio.subprocess.Process) -> int:
    process.send_signal(signal.SIGTERM)
    await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode


async def test_command_serves_and_stops_on_sigterm() -> None:
    """The command prints where it listens with the default key and secret, serves, and exits 0 on SIGTERM."""
    process, line = await run_sandbox_process()
    try:
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert found, line
        assert "api key sandbox-key" in line
        assert "api secret sandbox-secret" in line
        async with SignedClient(found.group(1)) as client:
            data = (await client.post("/ping")).json()
            assert (await client.get("/products")).json()["total"] == 5
        assert data["ok"] is True
    finally:
        returncode = await stop(process)
    assert returncode == 0


async def test_command_never_prints_a_custom_secret(tmp_path: Path) -> None:
    """A secret read from a file is used for signing but never printed."""
    secret_file = tmp_path / "secret"
    secret_file.write_text("top-secret-value\n")
    process, line = await run_sandbox_process("--api-key", "k1", "--api-secret-file", str(secret_file))
    try:
        assert "top-secret-value" not in line
        found = re.search(r"listening on (\S+) ", line)
        assert found, line
        async with SignedClient(found.group(1), "k1", "top-secret-value") as client:
            assert (await client.post("/ping")).status == 200
    finally:
        await stop(process)


def test_delays_option_parses() -> None:
    """--callback-retry-delays takes comma-separated seconds and refuses anything else."""
    assert parse_delays("30,60,120,300") == (30.0, 60.0, 120.0, 300.0)
    assert parse_delays("0.5, 1") == (0.5, 1.0)
    with pytest.raises(click.BadParameter):
        parse_delays("soon")
    with pytest.raises(click.BadParameter):
        parse_delays("-1")


def test_listener_line_hides_non_default_secret() -> None:
    """The start line shows the default secret but never another one."""
    line = describe_listener(SandboxConfig(api_secret="s3cr3t"), "http://127.0.0.1:9000")
    assert "s3cr3t" not in line
    assert "http://127.0.0.1:9000/api/v1/upstream" in line


async def test_ignore_updated_after_flag() -> None:
    """With --ignore-updated-after the listing holds every product even for an updated_after in the future."""
    process, line = await run_sandbox_process("--ignore-updated-after")
    try:
        found = re.search(r"listening on (\S+) ", line)
        assert found, line
        async with SignedClient(found.group(1)) as client:
            listing = (await client.get("/products", {"updated_after": "2999-01-01T00:00:00Z"})).json()
        assert listing["total"] == 5
    finally:
        await stop(process)
