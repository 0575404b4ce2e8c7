"""systemd integration: the unit file passes systemd-analyze, and the notify protocol is spoken."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from procurd.sandbox import Sandbox, SandboxConfig
from procurd.systemd import Notifier
from support import running_daemon, settings_for, wait_until

ROOT = Path(__file__).parent.parent
UNIT = ROOT / "systemd" / "procurd.service"


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


# --- installed as docs/operating.md says --------------------------------------------------------------------


@dataclass(frozen=True)
class Installation:
    """procurd installed from its wheel into a virtual environment of its own, configured as /etc/procurd
    would be."""

    venv: Path
    config: Path
    credentials: Path
    database: Path

    @property
    def procurd(self) -> Path:
        return self.venv / "bin" / "procurd"

    def run(self, *args: str, **environ: str) -> subprocess.CompletedProcess[str]:
        """The installed console script, as an operator types it (no PROCURD_ variables, no credentials
        directory unless given)."""
        clean = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith("PROCURD_") and name not in ("CREDENTIALS_DIRECTORY", "VIRTUAL_ENV")
        }
        return subprocess.run(
            [str(self.procurd), "--config", str(self.config), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            env={**clean, **environ},
            cwd=self.venv.parent,
        )


@pytest.fixture(scope="module")
def installation(tmp_path_factory: pytest.TempPathFactory) -> Installation:
    """The wheel built from this checkout (in a copy of it) and installed into a fresh virtual environment.

    The new environment gets procurd from the wheel and nothing else; its dependencies are read from this
    test environment's site-packages through a .pth file, so no package index is needed.
    """
    work = tmp_path_factory.mktemp("install")
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheels = work / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(source)], check=True, timeout=300)
    [wheel] = wheels.glob("procurd-*.whl")
    venv = work / "opt" / "procurd"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
                   check=True, timeout=300)  # fmt: skip
    [site_packages] = (venv / "lib").glob("python3*/site-packages")
    (site_packages / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", "utf-8")
    where = subprocess.run([str(python), "-c", "import procurd; print(procurd.__file__)"],
                           capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    assert where.stdout.startswith(str(site_packages)), where.stdout

    # /etc/procurd as "Running as a service" in docs/operating.md writes it, under this test's directory.
    etc = work / "etc" / "procurd"
    credentials = etc / "credentials"
    credentials.mkdir(parents=True)
    (credentials / "main").write_text("the-api-secret", encoding="utf-8")
    database = work / "var" / "lib" / "procurd" / "procurd.db"
    example = (ROOT / "config.example.toml").read_text(encoding="utf-8")
    config = etc / "procurd.toml"
    config.write_text(
        example.replace(
            "sqlite+aiosqlite:////var/lib/procurd/procurd.db", f"sqlite+aiosqlite:///{database}"
        ).replace('api_secret = "your-api-secret"', 'api_secret_file = "main"'),
        encoding="utf-8",
    )
    return Installation(venv, config, credentials, database)


@pytest.mark.slow
def test_an_installed_procurd_serves_its_operator(installation: Installation, tmp_path: Path) -> None:
    """Installed from the wheel and configured as docs/operating.md says: the unit's `db upgrade` (with
    systemd's credentials directory), then an operator's `status` and `exceptions list` from a shell, which
    need no secret, on the service's database."""
    systemd_credentials = tmp_path / "credentials" / "procurd.service"
    shutil.copytree(installation.credentials, systemd_credentials)
    upgrade = installation.run("db", "upgrade", CREDENTIALS_DIRECTORY=str(systemd_credentials))
    assert upgrade.returncode == 0, upgrade.stderr
    assert "database migrated from empty" in upgrade.stdout
    assert installation.database.is_file()

    status = installation.run("status")
    assert status.returncode == 0, status.stderr
    assert "upstream main: NOT HEALTHY" in status.stdout
    assert "last ping     never" in status.stdout
    listing = installation.run("exceptions", "list")
    assert (listing.returncode, listing.stdout) == (0, "no open exceptions\n"), listing.stderr
    assert installation.run("status", "--json").returncode == 0
    assert "the-api-secret" not in upgrade.stderr + status.stdout + status.stderr + listing.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_unit_verifies_against_the_installed_procurd(installation: Installation, tmp_path: Path) -> None:
    """systemd-analyze verify accepts the shipped unit once its /opt/procurd paths point at the installed
    virtual environment (it verifies as shipped only where procurd is installed at /opt/procurd)."""
    unit = tmp_path / "procurd.service"
    unit.write_text(UNIT.read_text().replace("/opt/procurd/bin/procurd", str(installation.procurd)))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr


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

        def heard(text: str) -> bool:
            messages.extend(received(sock))
            return any(text in m for m in messages)

        async with running_daemon(settings, notifier):
            await wait_until(lambda: heard("READY=1"))
            await wait_until(lambda: heard("WATCHDOG=1"))
        messages.extend(received(sock))
    assert any(m.startswith("READY=1") for m in messages)
    assert any(m.startswith("STOPPING=1") for m in messages)
    assert messages.index(next(m for m in messages if m.startswith("READY=1"))) < messages.index(
        next(m for m in messages if m.startswith("STOPPING=1"))
    )
