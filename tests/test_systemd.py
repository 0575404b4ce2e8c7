"""systemd integration: the unit file passes systemd-analyze, and the notify protocol is spoken."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from procurd.sandbox import Sandbox, SandboxConfig
from procurd.systemd import Notifier
from support import running_daemon, settings_for, wait_until

UNIT = Path(__file__).parent.parent / "systemd" / "procurd.service"


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    yield sock, path
    sock.close()


def received(sock: socket.socket) -> list[str]:
    messages = []
    while True:
        try:
            messages.append(sock.recv(4096).decode())
        except BlockingIOError:
            return messages


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_file_verifies(tmp_path: Path) -> None:
    """systemd-analyze verify accepts the shipped unit (with ExecStart pointing at this install)."""
    executable = Path(sys.executable).with_name("procurd")
    unit = tmp_path / "procurd.service"
    unit.write_text(UNIT.read_text().replace("/opt/procurd/bin/procurd", str(executable)))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "Type=notify" in UNIT.read_text()
    assert "WatchdogSec=" in UNIT.read_text()


def unit_settings() -> dict[str, list[str]]:
    """The [Service] settings of the shipped unit, each with its values in order."""
    values: dict[str, list[str]] = {}
    section = ""
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif line and not line.startswith("#") and section == "[Service]":
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def test_the_unit_leaves_the_database_to_the_configuration_file() -> None:
    """The unit sets no PROCURD_ variable (the [database] url of /etc/procurd/procurd.toml holds), and a
    configuration error (exit 2 of the main process) is not restarted every few seconds."""
    unit = unit_settings()
    assert not [value for value in unit.get("Environment", []) if "PROCURD_" in value]
    assert unit["Restart"] == ["on-failure"]
    assert unit["RestartPreventExitStatus"] == ["2"]
    # systemd decides restarts on the main process's status only: a failing ExecStartPre must not end the
    # start before `run` reports the configuration error with its exit status.
    assert all(value.startswith("-") for value in unit["ExecStartPre"])
    assert unit["ExecStart"] == ["/opt/procurd/bin/procurd --config /etc/procurd/procurd.toml run"]
    assert "main:/etc/procurd/credentials/main" in unit["LoadCredential"]


def test_notifier_is_silent_outside_systemd() -> None:
    """Without $NOTIFY_SOCKET nothing is sent and nothing fails."""
    notifier = Notifier({})
    assert not notifier.enabled
    assert not notifier.ready()


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    """The watchdog is pinged at half the interval systemd asks for, and only for our own pid."""
    assert Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "30000000"}).watchdog_interval == 15
    mine = {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier(mine).watchdog_interval == 15
    theirs = {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}
    assert Notifier(theirs).watchdog_interval is None


def test_abstract_socket_address() -> None:
    """A leading @ names the abstract namespace (a NUL byte)."""
    assert Notifier({"NOTIFY_SOCKET": "@procurd/notify"}).address == "\0procurd/notify"


async def test_daemon_sends_ready_watchdog_and_stopping(
    database_url: str, notify_socket: tuple[socket.socket, str]
) -> None:
    """The daemon sends READY=1 once it listens, WATCHDOG=1 from its loop, and STOPPING=1 on shutdown."""
    sock, path = notify_socket
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"})
    messages: list[str] = []
    async with Sandbox(SandboxConfig(products=3, allow_private_callbacks=True)) as sandbox:
        settings = settings_for(database_url, ("main", sandbox))
        async with running_daemon(settings, notifier):
            await wait_until(lambda: messages.extend(received(sock)) or any("READY=1" in m for m in messages))
            await wait_until(
                lambda: messages.extend(received(sock)) or any("WATCHDOG=1" in m for m in messages)
            )
        messages.extend(received(sock))
    assert any(m.startswith("READY=1") for m in messages)
    assert any(m.startswith("STOPPING=1") for m in messages)
    assert messages.index(next(m for m in messages if m.startswith("READY=1"))) < messages.index(
        next(m for m in messages if m.startswith("STOPPING=1"))
    )
