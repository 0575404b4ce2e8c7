"""Resident memory of ``procurd run`` mirroring a large catalogue.

The sandbox upstream (10,000 products x 3 SKUs by default) runs in its own process (``procurd sandbox``);
``procurd run`` starts on an empty database, mirrors the whole catalogue in its first pass, then makes
``--passes`` more full passes asked for through the admin API (``POST /api/v1/catalog/sync``), each answered
as the one before. ``VmRSS`` of the daemon is sampled every 20 ms. The baseline, measured in the same run, is
a process that only imports what the daemon imports (``procurd.cli`` and ``procurd.daemon``): what no
mirror, connection or request adds. Prints the figures and the aim beside them; it does not pass or fail.

    python benchmarks/daemon_memory.py [--products 10000] [--passes 2] [--database-url postgresql+asyncpg://...]

Give ``--database-url`` an empty database; SQLite in a temporary directory by default.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from soak import Instance, SandboxProcess, child_environment, rss_kib, stop_process

from procurd.loopback import unused_ports

AIM_MB = 90.0
PASS_TIMEOUT = 300.0
IMPORTS = "import procurd.cli, procurd.daemon; print(open('/proc/self/status').read())"


@dataclass
class Sampler:
    """The largest ``VmRSS`` of one process seen since ``reset``, sampled in the background."""

    pid: int
    peak_kib: int = 0
    samples: list[int] = field(default_factory=list)

    def reset(self) -> None:
        self.peak_kib = 0

    async def run(self) -> None:
        while True:
            try:
                value = rss_kib(self.pid)
            except (OSError, RuntimeError):
                return
            self.peak_kib = max(self.peak_kib, value)
            self.samples.append(value)
            await asyncio.sleep(0.02)


async def imports_only_kib() -> int:
    """``VmRSS`` of a fresh interpreter that has imported the daemon's modules, and nothing else."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", IMPORTS, stdout=asyncio.subprocess.PIPE, env=child_environment()
    )
    status, _ = await process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"importing the daemon's modules failed ({process.returncode})")
    return next(int(line.split()[1]) for line in status.decode().splitlines() if line.startswith("VmRSS:"))


async def last_sync(session: aiohttp.ClientSession, admin_url: str) -> dict[str, Any] | None:
    async with session.get(f"{admin_url}/api/v1/status") as response:
        body = await response.json()
    synced: dict[str, Any] | None = body["upstreams"][0]["last_sync"]
    return synced


async def wait_for_pass(
    session: aiohttp.ClientSession, admin_url: str, after: str | None, products: int
) -> str:
    """Wait until a pass newer than ``after`` has finished with every product mirrored; its time."""
    deadline = time.monotonic() + PASS_TIMEOUT
    while time.monotonic() < deadline:
        synced = await last_sync(session, admin_url)
        if synced is not None and synced["at"] != after and synced["status"] != "running":
            if not synced["ok"] or synced["products"] != products:
                raise SystemExit(f"the pass did not mirror the catalogue: {synced}")
            return str(synced["at"])
        await asyncio.sleep(0.05)
    raise SystemExit(f"no catalogue pass finished in {PASS_TIMEOUT:.0f} s")


def mb(kib: int) -> str:
    return f"{kib / 1024:.1f} MB"


async def measure(options: argparse.Namespace, directory: Path, database_url: str) -> None:
    baseline = await imports_only_kib()
    sandbox = SandboxProcess(directory, options.products)
    public_port, admin_port = unused_ports(2)
    daemon = Instance(
        "memory", directory, database_url, "", 8, public_port=public_port, admin_port=admin_port
    )
    sampler_task: asyncio.Task[None] | None = None
    try:
        await sandbox.start()
        daemon.sandbox_url = sandbox.base_url
        daemon.write_config()
        await daemon.cli("db", "upgrade")
        async with aiohttp.ClientSession() as session:
            await daemon.start(session)
            sampler = Sampler(daemon.pid)
            at_start = rss_kib(daemon.pid)
            sampler_task = asyncio.create_task(sampler.run())
            synced_at = await wait_for_pass(session, daemon.admin_url, None, options.products)
            first_peak = sampler.peak_kib
            after_first = rss_kib(daemon.pid)
            sampler.reset()
            for _ in range(options.passes):
                sync_url = f"{daemon.admin_url}/api/v1/catalog/sync"
                async with session.post(sync_url, json={"full": True}) as answer:
                    if answer.status != 202:
                        raise SystemExit(f"POST /api/v1/catalog/sync answered {answer.status}")
                synced_at = await wait_for_pass(session, daemon.admin_url, synced_at, options.products)
            later_peak = sampler.peak_kib
            settled = rss_kib(daemon.pid)
    finally:
        if sampler_task is not None:
            sampler_task.cancel()
        if daemon.process is not None:
            await stop_process(daemon.process)
        await sandbox.stop()
    print(f"database: {database_url.partition(':')[0]}; {options.products} products")
    print(f"imports only (baseline)          {mb(baseline)}")
    print(f"procurd run, listeners up        {mb(at_start)}  ({at_start / baseline:.2f} x baseline)")
    aim = f"aim <= {AIM_MB:.0f} MB"
    print(f"peak during the first pass       {mb(first_peak)}  ({first_peak / baseline:.2f} x)   {aim}")
    print(f"after the first pass             {mb(after_first)}")
    later = f"peak during {options.passes} more full passes"
    print(f"{later:<33}{mb(later_peak)}  ({later_peak / baseline:.2f} x)   {aim}")
    print(f"after them                       {mb(settled)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--products", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=2, help="full passes after the first")
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temporary directory")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="procurd-memory-") as temporary:
        directory = Path(temporary)
        database_url = options.database_url or f"sqlite+aiosqlite:///{directory / 'procurd.db'}"
        asyncio.run(measure(options, directory, database_url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
