"""Load and soak: steady intake plus the upstream's callbacks for minutes; throughput, latency, memory.

The sandbox upstream runs in its own process (``procurd sandbox``) and procurd as one or more ``procurd run``
processes on one database. This process is the storefront: it POSTs one-item orders to the admin API at a
steady ``--rate`` (spread over the instances), the daemons buy them from the sandbox, which delivers at once
and pushes its signed callback to the instance that bought. Every ``--interval`` seconds one line: orders
accepted and delivered in the interval, delivered per second, intake latency (the storefront's wait for
``202``) and end-to-end latency (procurd's intake to the stored delivery, ``delivered_at - created_at``)
p50/p99, callbacks accepted, each daemon's CPU (share of one core), the machine's load average (other work
on the machine shows in the latencies) and each daemon's resident memory (``VmRSS`` of ``/proc/PID/status``).

At the end, intake stops, the backlog drains, and the run is accounted for: every accepted order delivered,
exactly one upstream order per ``downstream_order_no``, nothing lost, and each daemon's RSS at start, once
warm (after the first interval), at half time and at the end. Memory counts as flat when no daemon grew by
more than ``--max-rss-growth`` over the second half of the run (the first minutes fill caches: compiled
statements, connection pools).

    python benchmarks/soak.py                        # 10 minutes on SQLite, one daemon
    python benchmarks/soak.py --minutes 1            # a short smoke run
    python benchmarks/soak.py --database-url postgresql+asyncpg://user@127.0.0.1:5432/soak --instances 2

Give ``--database-url`` an empty database (or one this benchmark used before: every run has order numbers of
its own). Exits 1 when an order is lost or doubled, or memory grows by more than ``--max-rss-growth``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import secrets
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import and_, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from procurd.db.schema import mirror_products, mirror_skus, procurements
from procurd.loopback import unused_ports

UPSTREAM = "main"
API_KEY = "soak-key"
API_SECRET = "soak-secret-3d8e51"
SANDBOX_BALANCE = "1000000000.00"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
MAX_IN_FLIGHT = 256  # intake requests outstanding at once; beyond, the storefront falls behind (counted)
LISTENING = re.compile(r"listening on (http://\S+?)\s")


# --- small helpers --------------------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile; NaN when there are no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1000:.0f}"


def shown_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def child_environment() -> dict[str, str]:
    """Our environment without PROCURD_* overrides: each instance runs from its own file."""
    return {key: value for key, value in os.environ.items() if not key.startswith("PROCURD_")}


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time process ``pid`` used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid`` in KiB (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


async def wait_for_file_text(
    path: Path, pattern: re.Pattern[str], process: asyncio.subprocess.Process
) -> str:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        text = await asyncio.to_thread(read_text, path)
        if match := pattern.search(text):
            return match.group(1)
        if process.returncode is not None:
            raise SystemExit(f"{path.name}: the process exited with {process.returncode}:\n{text[-2000:]}")
        await asyncio.sleep(0.1)
    raise SystemExit(f"{path.name}: not ready after {START_TIMEOUT:.0f} s")


async def stop_process(process: asyncio.subprocess.Process) -> int:
    """SIGTERM and wait; SIGKILL if it does not stop in time. The exit code."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
        except TimeoutError:
            process.kill()
            await process.wait()
    return process.returncode if process.returncode is not None else -1


# --- the sandbox and the daemons -------------------------------------------------------------------------


class SandboxProcess:
    """``procurd sandbox`` in a child process, and its unsigned control API."""

    def __init__(self, directory: Path, products: int) -> None:
        self.log_path = directory / "sandbox.log"
        self.products = products
        self.process: asyncio.subprocess.Process | None = None
        self.base_url = ""

    async def start(self) -> None:
        arguments = ["--port", "0", "--products", str(self.products), "--balance", SANDBOX_BALANCE,
                     "--api-key", API_KEY, "--api-secret", API_SECRET, "--log-level", "warning"]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "procurd", "sandbox", *arguments,
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=child_environment(),
            )  # fmt: skip
        self.base_url = await wait_for_file_text(self.log_path, LISTENING, self.process)

    async def control(self, session: aiohttp.ClientSession, path: str) -> Any:
        async with session.get(f"{self.base_url}/_sandbox{path}") as response:
            response.raise_for_status()
            return await response.json()

    async def stop(self) -> None:
        if self.process is not None:
            await stop_process(self.process)


@dataclass
class Instance:
    """One ``procurd run`` process with its configuration and log file."""

    name: str
    directory: Path
    database_url: str
    sandbox_url: str
    workers: int
    public_port: int
    admin_port: int
    process: asyncio.subprocess.Process | None = None
    rss: dict[str, int] = field(default_factory=dict)

    @property
    def config_path(self) -> Path:
        return self.directory / f"procurd-{self.name}.toml"

    @property
    def log_path(self) -> Path:
        return self.directory / f"procurd-{self.name}.log"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def write_config(self) -> None:
        """Production defaults, but for loopback addresses, the sandbox's key and no request rate limit."""
        self.config_path.write_text(
            f"""[database]
url = {json.dumps(self.database_url)}

[server]
public_host = "127.0.0.1"
public_port = {self.public_port}
admin_host = "127.0.0.1"
admin_port = {self.admin_port}
callback_url = "http://127.0.0.1:{self.public_port}/api/v1/upstream/callback"
allow_private_callback_url = true

[[upstreams]]
name = "{UPSTREAM}"
base_url = "{self.sandbox_url}"
api_key = "{API_KEY}"
api_secret = "{API_SECRET}"
max_requests_per_second = 1000

[procurement]
workers = {self.workers}

[logging]
level = "warning"
format = "json"
""",
            encoding="utf-8",
        )

    async def cli(self, *arguments: str) -> None:
        """Run a ``procurd`` command with this instance's configuration; stop the benchmark if it fails."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "procurd", "--config", str(self.config_path), *arguments,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=child_environment(),
        )  # fmt: skip
        output, _ = await process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"procurd {' '.join(arguments)} failed:\n{output.decode(errors='replace')}")

    async def start(self, session: aiohttp.ClientSession) -> None:
        with self.log_path.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "procurd", "--config", str(self.config_path), "run",
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=child_environment(),
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while not await self.healthy(session):
            if self.process.returncode is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise SystemExit(f"instance {self.name} did not start:\n{tail}")
            await asyncio.sleep(0.1)

    async def healthy(self, session: aiohttp.ClientSession) -> bool:
        try:
            async with session.get(self.admin_url + "/healthz") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    async def callbacks_accepted(self, session: aiohttp.ClientSession) -> float:
        async with session.get(self.admin_url + "/metrics") as response:
            text = await response.text()
        return sum(
            float(line.rpartition(" ")[2])
            for line in text.splitlines()
            if line.startswith("procurd_callbacks_total{") and 'result="accepted"' in line
        )

    def note_rss(self, moment: str) -> int:
        self.rss[moment] = rss_kib(self.pid)
        return self.rss[moment]

    def log_problems(self) -> list[str]:
        """Error lines of the instance's log (warnings are expected: none should be errors)."""
        problems = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                problems.append(line[:200])
                continue
            if isinstance(record, dict) and record.get("level") in ("error", "critical"):
                problems.append(f"{record.get('event')}: {str(record)[:200]}")
        return problems


# --- the storefront ---------------------------------------------------------------------------------------


@dataclass
class Accepted:
    order_no: str
    sent: float  # Unix seconds
    latency: float
    status: int


@dataclass
class Storefront:
    """Steady intake: one order every ``1 / rate`` seconds, round robin over the instances."""

    prefix: str
    skus: list[int]
    instances: list[Instance]
    rate: float
    answers: list[Accepted] = field(default_factory=list)
    refusals: Counter[str] = field(default_factory=Counter)
    behind: int = 0  # orders sent late because MAX_IN_FLIGHT requests were outstanding

    async def run(self, session: aiohttp.ClientSession, seconds: float) -> None:
        slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        index = 0
        while (due := start + index / self.rate) < start + seconds:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if slots.locked():
                self.behind += 1
            await slots.acquire()
            task = asyncio.create_task(self._order(session, index, slots))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            index += 1
        await asyncio.gather(*tasks)

    async def _order(self, session: aiohttp.ClientSession, index: int, slots: asyncio.Semaphore) -> None:
        order_no = f"{self.prefix}{index:07d}"
        instance = self.instances[index % len(self.instances)]
        item = {"upstream": UPSTREAM, "sku_id": self.skus[index % len(self.skus)], "quantity": 1}
        sent, clock = time.time(), time.perf_counter()
        try:
            async with session.post(
                instance.admin_url + "/api/v1/orders", json={"order_no": order_no, "items": [item]}
            ) as response:
                answer = await response.read()
                status = response.status
        except aiohttp.ClientError as exc:
            self.refusals[type(exc).__name__] += 1
            return
        finally:
            slots.release()
        self.answers.append(Accepted(order_no, sent, time.perf_counter() - clock, status))
        if status != 202:
            self.refusals[f"HTTP {status}: {answer[:120].decode(errors='replace')}"] += 1


# --- measuring ----------------------------------------------------------------------------------------------


async def orderable_skus(engine: AsyncEngine) -> list[int]:
    """Active automatic SKUs of unlimited stock: thousands of orders never run out."""
    statement = (
        select(mirror_skus.c.id)
        .join(mirror_products, and_(mirror_products.c.upstream == mirror_skus.c.upstream,
                                    mirror_products.c.id == mirror_skus.c.product_id))
        .where(mirror_skus.c.upstream == UPSTREAM, mirror_skus.c.is_active.is_(True),
               mirror_skus.c.stock_quantity == -1, mirror_products.c.is_active.is_(True),
               mirror_products.c.fulfillment_type == "auto")
        .order_by(mirror_skus.c.id)
    )  # fmt: skip
    async with engine.connect() as conn:
        return list((await conn.execute(statement)).scalars())


async def delivered_between(engine: AsyncEngine, prefix: str, start: float, end: float) -> list[float]:
    """End-to-end seconds of this run's procurements delivered in ``[start, end)`` (Unix seconds)."""
    low, high = datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC)
    statement = select(procurements.c.created_at, procurements.c.delivered_at).where(
        procurements.c.order_no.like(f"{prefix}%"),
        procurements.c.delivered_at >= low,
        procurements.c.delivered_at < high,
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(statement)).all()
    return [(row.delivered_at - row.created_at).total_seconds() for row in rows]


async def states(engine: AsyncEngine, prefix: str) -> Counter[str]:
    statement = (
        select(procurements.c.state, func.count())
        .where(procurements.c.order_no.like(f"{prefix}%"))
        .group_by(procurements.c.state)
    )
    async with engine.connect() as conn:
        return Counter({row[0]: row[1] for row in (await conn.execute(statement)).all()})


@dataclass
class Interval:
    start: float
    end: float
    accepted: int
    delivered: int
    intake: list[float]
    end_to_end: list[float]
    callbacks: float
    rss: list[int]
    cpu: list[float]  # share of one core each daemon used
    load: float  # the machine's 1-minute load average at the end

    def row(self, origin: float) -> str:
        seconds = self.end - self.start
        return (
            f"| {self.start - origin:>5.0f}-{self.end - origin:<5.0f} | {self.accepted:>8} "
            f"| {self.delivered:>9} "
            f"| {self.delivered / seconds:>10.1f} | {ms(percentile(self.intake, 0.5)):>7} "
            f"| {ms(percentile(self.intake, 0.99)):>7} | {ms(percentile(self.end_to_end, 0.5)):>7} "
            f"| {ms(percentile(self.end_to_end, 0.99)):>7} | {self.callbacks:>9.0f} "
            f"| {' / '.join(f'{share * 100:.0f}' for share in self.cpu):>9} | {self.load:>4.1f} "
            f"| {' / '.join(f'{kib / 1024:.1f}' for kib in self.rss):>13} |"
        )


HEADER = (
    "| seconds     | accepted | delivered | per second | in p50  | in p99  | e2e p50 | e2e p99 | callbacks "
    "| CPU %     | load | RSS MiB       |\n"
    "|-------------|---------:|----------:|-----------:|--------:|--------:|--------:|--------:|----------:"
    "|----------:|-----:|--------------:|"
)


@dataclass
class Soak:
    options: argparse.Namespace
    engine: AsyncEngine
    sandbox: SandboxProcess
    instances: list[Instance]
    storefront: Storefront
    intervals: list[Interval] = field(default_factory=list)
    callbacks_seen: float = 0.0
    cpu_seen: list[float] = field(default_factory=list)

    async def measure(self, session: aiohttp.ClientSession, start: float, end: float) -> Interval:
        answers = [a for a in self.storefront.answers if start <= a.sent < end]
        callbacks = sum([await instance.callbacks_accepted(session) for instance in self.instances])
        end_to_end = await delivered_between(self.engine, self.storefront.prefix, start, end)
        cpu = [cpu_seconds(instance.pid) for instance in self.instances]
        seen = self.cpu_seen or [0.0] * len(cpu)
        interval = Interval(
            start,
            end,
            accepted=sum(1 for a in answers if a.status == 202),
            delivered=len(end_to_end),
            intake=[a.latency for a in answers],
            end_to_end=end_to_end,
            callbacks=callbacks - self.callbacks_seen,
            rss=[rss_kib(instance.pid) for instance in self.instances],
            cpu=[(now - before) / max(end - start, 0.001) for now, before in zip(cpu, seen, strict=True)],
            load=os.getloadavg()[0],
        )
        self.callbacks_seen, self.cpu_seen = callbacks, cpu
        return interval

    async def run(self, session: aiohttp.ClientSession) -> float:
        """Intake for ``--minutes`` with a line per interval. The run's start (Unix seconds)."""
        seconds = self.options.minutes * 60
        step = self.options.interval
        origin = time.time()
        intake = asyncio.create_task(self.storefront.run(session, seconds))
        print(HEADER, flush=True)
        start = origin
        for number in range(1, math.ceil(seconds / step) + 1):
            end = origin + min(number * step, seconds)
            await asyncio.wait({intake}, timeout=max(0.0, end - time.time()))
            if intake.done():
                intake.result()  # a failed storefront stops the run here
            await asyncio.sleep(max(0.0, end - time.time()))
            interval = await self.measure(session, start, end)
            self.intervals.append(interval)
            for moment in ("warm",) * (number == 1) + ("half",) * (number == math.ceil(seconds / step / 2)):
                for instance, kib in zip(self.instances, interval.rss, strict=True):
                    instance.rss[moment] = kib
            print(interval.row(origin), flush=True)
            start = end
        await intake
        return origin

    async def drain(self, session: aiohttp.ClientSession, origin: float) -> Interval:
        """Wait until every accepted order settled (or ``--drain-seconds``); the drain as one interval."""
        accepted = sum(1 for a in self.storefront.answers if a.status == 202)
        start = time.time()
        deadline = start + self.options.drain_seconds
        while time.time() < deadline:
            counts = await states(self.engine, self.storefront.prefix)
            if counts["delivered"] + counts["exception"] + counts["canceled"] >= accepted:
                break
            await asyncio.sleep(0.5)
        interval = await self.measure(session, start, max(time.time(), start + 0.001))
        print(interval.row(origin) + "  (drain)", flush=True)
        return interval


# --- the report ------------------------------------------------------------------------------------------


@dataclass
class Totals:
    accepted: set[str]
    states: Counter[str]
    per_number: Counter[str]  # upstream orders per downstream_order_no

    @property
    def doubled(self) -> list[str]:
        return sorted(number for number, count in self.per_number.items() if count > 1)

    @property
    def missing(self) -> list[str]:
        return sorted(self.accepted - set(self.per_number))


async def totals(soak: Soak, session: aiohttp.ClientSession) -> Totals:
    prefix = soak.storefront.prefix
    orders = (await soak.sandbox.control(session, "/orders"))["orders"]
    return Totals(
        accepted={a.order_no for a in soak.storefront.answers if a.status == 202},
        states=await states(soak.engine, prefix),
        per_number=Counter(
            o["downstream_order_no"] for o in orders if str(o.get("downstream_order_no")).startswith(prefix)
        ),
    )


def print_totals(soak: Soak, run: Totals) -> None:
    intake = [a.latency for a in soak.storefront.answers]
    end_to_end = [value for interval in soak.intervals for value in interval.end_to_end]
    measured = soak.intervals[-1].end - soak.intervals[0].start
    lines = [
        ("orders sent", f"{len(soak.storefront.answers)} (behind schedule: {soak.storefront.behind})"),
        ("orders accepted (202)", f"{len(run.accepted)}; refused {dict(soak.storefront.refusals) or 'none'}"),
        ("procurement states", str(dict(sorted(run.states.items())))),
        ("upstream orders", f"{sum(run.per_number.values())} for {len(run.per_number)} numbers; doubled "
                            f"{len(run.doubled)}; accepted without one {len(run.missing)}"),
        ("delivered per second", f"{run.states['delivered'] / measured:.1f} over {measured:.0f} s"),
        ("intake latency", f"p50 {ms(percentile(intake, 0.5))} ms, p99 {ms(percentile(intake, 0.99))} ms"),
        ("end-to-end latency", f"p50 {ms(percentile(end_to_end, 0.5))} ms, "
                               f"p99 {ms(percentile(end_to_end, 0.99))} ms"),
    ]  # fmt: skip
    print()
    for name, value in lines:
        print(f"{name:<23}{value}")


def print_memory(instances: Sequence[Instance]) -> dict[str, float]:
    """Each daemon's RSS at start, warm, half time and end; end/half per daemon."""
    growth: dict[str, float] = {}
    print(f"{'RSS (MiB)':<23}{'daemon':<8}{'start':>8}{'warm':>8}{'half':>8}{'end':>8}{'end/start':>11}"
          f"{'end/half':>10}")  # fmt: skip
    for instance in instances:
        start, warm, half, end = (instance.rss[key] / 1024 for key in ("start", "warm", "half", "end"))
        growth[instance.name] = end / half
        figures = f"{start:>8.1f}{warm:>8.1f}{half:>8.1f}{end:>8.1f}{end / start:>11.2f}{end / half:>10.2f}"
        print(f"{'':<23}{instance.name:<8}{figures}")
    return growth


async def account(soak: Soak, session: aiohttp.ClientSession) -> dict[str, bool]:
    """The run's totals, and whether anything was lost or doubled."""
    run = await totals(soak, session)
    print_totals(soak, run)
    growth = print_memory(soak.instances)
    problems = {instance.name: instance.log_problems() for instance in soak.instances}
    for name, lines in problems.items():
        for line in lines[:5]:
            print(f"log error ({name}): {line}")
    accepted = len(run.accepted)
    limit = 1 + soak.options.max_rss_growth
    return {
        "every accepted order delivered": run.states["delivered"] == accepted == run.states.total(),
        "one upstream order per downstream_order_no, none missing": not run.doubled and not run.missing,
        "every intake answered 202": accepted == len(soak.storefront.answers),
        f"RSS end/half <= {limit:.2f} for every daemon (flat memory)": all(
            value <= limit for value in growth.values()
        ),
        "no error in the daemons' logs": not any(problems.values()),
    }


def print_parameters(options: argparse.Namespace, database_url: str) -> None:
    print("procurd load and soak")
    print(f"  database      {shown_url(database_url)}")
    print(f"  daemons       {options.instances} x procurd run (workers {options.workers}), "
          f"sandbox in its own process ({options.products} products)")  # fmt: skip
    print(f"  load          {options.rate:g} one-item orders/s for {options.minutes:g} min, "
          f"a line every {options.interval:g} s (latencies in ms, RSS per daemon)")  # fmt: skip
    print(flush=True)


# --- main ---------------------------------------------------------------------------------------------------


async def soak(options: argparse.Namespace, database_url: str, directory: Path) -> bool:
    sandbox = SandboxProcess(directory, options.products)
    instances: list[Instance] = []
    engine = create_async_engine(database_url)  # raw reads only: the daemons own the schema and the writes
    try:
        await sandbox.start()
        ports = unused_ports(2 * options.instances)
        instances = [
            Instance(
                f"d{n + 1}",
                directory,
                database_url,
                sandbox.base_url,
                options.workers,
                public_port=ports[2 * n],
                admin_port=ports[2 * n + 1],
            )
            for n in range(options.instances)
        ]
        for instance in instances:
            instance.write_config()
        await instances[0].cli("db", "upgrade")
        await instances[0].cli("catalog", "sync")
        skus = await orderable_skus(engine)
        if not skus:
            raise SystemExit("the sandbox catalogue has no automatic SKU of unlimited stock")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=MAX_IN_FLIGHT)) as session:
            await asyncio.gather(*(instance.start(session) for instance in instances))
            for instance in instances:
                instance.note_rss("start")
            cpu_at_start = [cpu_seconds(instance.pid) for instance in instances]
            prefix = f"S{secrets.token_hex(3)}-"
            run = Soak(options, engine, sandbox, instances, Storefront(prefix, skus, instances, options.rate))
            run.cpu_seen = cpu_at_start
            origin = await run.run(session)
            run.intervals.append(await run.drain(session, origin))
            for instance in instances:
                instance.note_rss("end")
            checks = await account(run, session)
        codes = [await stop_process(instance.process) for instance in instances if instance.process]
        checks["every daemon stopped cleanly on SIGTERM (exit 0)"] = all(code == 0 for code in codes)
    finally:
        for instance in instances:
            if instance.process is not None and instance.process.returncode is None:
                instance.process.kill()
                await instance.process.wait()
        await sandbox.stop()
        await engine.dispose()
    print()
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'MISS'}  {name}")
    return all(checks.values())


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="intake duration (default 10)")
    parser.add_argument("--rate", type=float, default=10.0, help="orders per second (default 10)")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds per report line (default 30)")
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temporary directory")
    parser.add_argument("--instances", type=int, default=1, help="procurd run processes (default 1)")
    parser.add_argument("--workers", type=int, default=8, help="procurement.workers per instance")
    parser.add_argument("--products", type=int, default=100, help="sandbox catalogue size")
    parser.add_argument("--drain-seconds", type=float, default=120.0, help="wait for the backlog at the end")
    parser.add_argument(
        "--max-rss-growth", type=float, default=0.05, help="allowed RSS growth over the second half (0.05)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs and the SQLite file; print where")
    options = parser.parse_args(argv)
    if options.instances > 1 and not (options.database_url or "").startswith("postgresql"):
        parser.error(
            "several instances need a shared PostgreSQL database (--database-url postgresql+asyncpg://...)"
        )
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse_arguments(argv)
    directory = Path(tempfile.mkdtemp(prefix="procurd-soak-"))
    database_url = options.database_url or f"sqlite+aiosqlite:///{directory / 'soak.db'}"
    print_parameters(options, database_url)
    try:
        passed = asyncio.run(soak(options, database_url, directory))
    finally:
        if options.keep:
            print(f"logs and database kept in {directory}")
        else:
            for path in sorted(directory.rglob("*"), reverse=True):
                path.unlink() if path.is_file() else path.rmdir()
            directory.rmdir()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
