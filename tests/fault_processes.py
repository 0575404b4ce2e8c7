"""Processes the crash and fault tests kill, starve or restart.

- :class:`Incarnations`: one procurd instance (one configuration, fixed ports, one database) run as a
  new ``procurd run`` process each time it is started again after a SIGKILL;
- :class:`FileSizeLimitedDaemon`: ``procurd run`` whose files cannot grow past a limit (a full disk, as
  SQLite sees it through EFBIG), until the test lifts the limit;
- :class:`PostgresServer`: a PostgreSQL server of the test's own (initdb in a temporary directory), so the
  test may restart it.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from procurd.db.database import open_database
from procurd.loopback import unused_ports
from procurd.operations.installation import migrate_schema
from scale_cluster import DaemonProcess, to_toml

POSTGRES_USER = "procurd"


def child_environment() -> dict[str, str]:
    """The test's environment without PROCURD_* overrides, which must not reach an instance."""
    return {key: value for key, value in os.environ.items() if not key.startswith("PROCURD_")}


class Incarnations:
    """One procurd instance started as a new process each time; logs of every incarnation are kept."""

    def __init__(self, name: str, config: Mapping[str, Any], directory: Path) -> None:
        self.name = name
        self.config = config
        self.directory = directory
        self.processes: list[DaemonProcess] = []
        self.kills = 0

    @property
    def current(self) -> DaemonProcess:
        return self.processes[-1]

    @property
    def admin_url(self) -> str:
        return self.current.admin_url

    @property
    def running(self) -> bool:
        return bool(self.processes) and self.current.returncode is None

    async def start(self, session: aiohttp.ClientSession) -> None:
        """Start a new process on the same configuration and wait until it listens."""
        process = DaemonProcess(f"{self.name}-{len(self.processes)}", self.config, self.directory)
        self.processes.append(process)
        await process.start()
        await process.wait_ready(session)

    async def kill(self) -> None:
        """SIGKILL the running process: no drain, no commit, claims left behind."""
        assert self.running
        await self.current.kill()
        self.kills += 1

    async def stop(self) -> int:
        return await self.current.stop()

    async def kill_if_running(self) -> None:
        if self.processes:
            await self.current.kill()

    def log_events(self, event: str | None = None) -> list[dict[str, Any]]:
        return [record for process in self.processes for record in process.log_events(event)]

    def log_lines(self) -> list[str]:
        return [line for process in self.processes for line in process.log_lines()]


# The child sets its own file-size limit and ignores SIGXFSZ, so a write past the limit fails with EFBIG
# instead of killing it, then becomes ``procurd`` (the same pid, so the test can lift the limit later).
_LIMITED_LAUNCHER = (
    "import os, resource, signal, sys\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), hard))\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'procurd', *sys.argv[2:]])\n"
)


class FileSizeLimitedDaemon(DaemonProcess):
    """``procurd run`` that cannot grow any file past ``limit_bytes`` until :meth:`lift_limit`.

    Its output goes through a pipe (a log file would hit the limit too) into the usual log file.
    """

    def __init__(self, name: str, config: Mapping[str, Any], directory: Path, limit_bytes: int) -> None:
        super().__init__(name, config, directory)
        self.limit_bytes = limit_bytes
        self._copier: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.config_path.write_text(to_toml(self.config), encoding="utf-8")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _LIMITED_LAUNCHER, str(self.limit_bytes),
            "--config", str(self.config_path), "run",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=child_environment(),
        )  # fmt: skip
        self._copier = asyncio.create_task(self._copy_output())

    async def _copy_output(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        with self.log_path.open("wb") as log:
            while line := await self.process.stdout.readline():
                log.write(line)
                log.flush()

    def lift_limit(self) -> None:
        """The disk has room again: files may grow."""
        assert self.process is not None
        unlimited = resource.RLIM_INFINITY
        resource.prlimit(self.process.pid, resource.RLIMIT_FSIZE, (unlimited, unlimited))

    async def finish(self) -> None:
        if self._copier is not None:
            await self._copier


# --- a PostgreSQL server of our own -------------------------------------------------------------------------


def postgres_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are, or ``None`` when PostgreSQL is not installed."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    return next((path for path in candidates if (path / "initdb").exists()), None)


class PostgresServer:
    """A throwaway PostgreSQL cluster on a free loopback port, owned by the test (started, restarted,
    stopped and removed by it). As root it runs as the ``postgres`` user, as PostgreSQL requires."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        (self.port,) = unused_ports(1)
        self.directory = Path(tempfile.mkdtemp(prefix="procurd-fault-pg."))
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self.restarts = 0

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://{POSTGRES_USER}@127.0.0.1:{self.port}/{database}"

    async def start(self) -> None:
        if os.getuid() == 0:
            if await _run("id", "postgres", check=False) != 0:
                await _run("useradd", "--system", "--no-create-home", "postgres")
            await _run("chown", "postgres", str(self.directory))
        await self._pg("initdb", "-D", str(self.data), "-U", POSTGRES_USER, "--auth=trust", "-E", "UTF8",
                       "--no-sync")  # fmt: skip
        await self._ctl("start")

    async def restart(self) -> None:
        """A fast restart: every connection is cut, the server is back within a second or so."""
        await self._pg("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        await self._ctl("start")
        self.restarts += 1

    async def stop(self) -> None:
        if self.data.exists():
            await self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.directory, ignore_errors=True)

    async def create_database(self, name: str) -> str:
        """A new, migrated database; its URL."""
        await self._pg("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", POSTGRES_USER, name)
        url = self.url(name)
        database = open_database(url)
        try:
            await migrate_schema(database)
        finally:
            await database.close()
        return url

    async def _ctl(self, action: str) -> None:
        options = (
            f"-h 127.0.0.1 -p {self.port} -k {self.directory} -c fsync=off -c full_page_writes=off "
            "-c max_connections=100"
        )
        await self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-o", options, action)

    async def _pg(self, program: str, *args: str, check: bool = True) -> None:
        command: Sequence[str] = (str(self.bin_dir / program), *args)
        if os.getuid() == 0:
            command = ("runuser", "-u", "postgres", "--", *command)
        await _run(*command, check=check, log=self.log)


async def _run(*command: str, check: bool = True, log: Path | None = None) -> int:
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await process.communicate()
    if check and process.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited with {process.returncode}:\n{output.decode(errors='replace')}"
            f"\n{_tail(log)}"
        )
    return process.returncode or 0


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return log.read_text(errors="replace")[-2000:]


# --- a disk that fills up ---------------------------------------------------------------------------------


class TinyDisk:
    """A small tmpfs mounted for the test: :meth:`fill` takes every free byte, :meth:`free` gives it back.

    Mounting needs root (CAP_SYS_ADMIN); :meth:`mount` returns False where that is not allowed.
    """

    def __init__(self, mountpoint: Path, size: str = "16m") -> None:
        self.mountpoint = mountpoint
        self.size = size
        self.filler = mountpoint / "filler"
        self.mounted = False

    async def mount(self) -> bool:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        code = await _run(
            "mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.mountpoint), check=False
        )
        self.mounted = code == 0
        return self.mounted

    def fill(self) -> int:
        """Write a file until the disk refuses another byte; how many bytes it took."""
        written = 0
        descriptor = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9):
                block = bytes(chunk)
                while True:
                    try:
                        written += os.write(descriptor, block)
                    except OSError:
                        break
        finally:
            os.close(descriptor)
        return written

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    async def unmount(self) -> None:
        if self.mounted:
            await _run("umount", "-l", str(self.mountpoint), check=False)
            self.mounted = False
