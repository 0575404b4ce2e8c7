"""Helpers of the crash and fault tests.

- :class:`IntakeClient`: a storefront that hands orders to procurd's admin API and keeps trying while
  procurd is away (refused connections, a connection cut by a kill, 503), counting every retry;
- :func:`take_ledger`: what procurd holds and what the upstream holds, as counts (orders, upstream orders,
  duplicates, losses) for the assertions and the reliability report;
- :func:`audit_problems`: every procurement's audit trail read as a chain of state changes;
- :class:`UpstreamGate`: a TCP relay in front of the sandbox that can refuse connections or swallow them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import aiohttp
from sqlalchemy import select

from procurd.db.schema import audit_log, orders, procurements
from procurd.loopback import unused_ports
from procurd.sandbox import Sandbox, SandboxConfig, SandboxOrder
from support import sql_rows

INTAKE_PATH = "/api/v1/orders"
INTAKE_DEADLINE_SECONDS = 60.0
INTAKE_RETRY_PAUSE_SECONDS = 0.05
# Answers a storefront retries: procurd is there but cannot take the order now.
RETRIED_STATUSES = frozenset({503, 507})


def fault_sandbox_config(**overrides: Any) -> SandboxConfig:
    """A sandbox with auto products only, a deep wallet and callback retries in fractions of a second."""
    values: dict[str, Any] = {
        "products": 12,
        "manual_ratio": 0.0,
        "allow_private_callbacks": True,
        "balance": Decimal("10000000.00"),
        "callback_retry_delays": (0.2, 0.4, 0.8, 1.6),
    }
    values.update(overrides)
    return SandboxConfig(**values)


# The real sites' limit (60 requests per 60 s per key, then the key blocked for 30 s, answered as HTTP 200
# with {"status_code": 429}) ten times faster, and the budget that spends exactly it.
WINDOW_REQUESTS = 60
WINDOW_SECONDS = 6.0
BLOCK_SECONDS = 3.0
BUDGET = WINDOW_REQUESTS / WINDOW_SECONDS  # max_requests_per_second


def limited_sandbox_config(**overrides: Any) -> SandboxConfig:
    """:func:`fault_sandbox_config` enforcing the real sites' kind of limit, ten times faster."""
    return fault_sandbox_config(
        rate_limit=True,
        rate_limit_requests=WINDOW_REQUESTS,
        rate_limit_window_seconds=WINDOW_SECONDS,
        rate_limit_block_seconds=BLOCK_SECONDS,
        **overrides,
    )


def orderable_skus(sandbox: Sandbox) -> list[int]:
    """Active SKUs of listed auto products, with unlimited stock so no order runs short."""
    skus = [
        sku.id
        for product in sandbox.state.active_products()
        if product.fulfillment_type == "auto"
        for sku in product.skus
        if sku.is_active
    ]
    for sku_id in skus:
        sandbox.state.set_sku_stock(sku_id, -1)
    assert skus
    return skus


# --- intake -----------------------------------------------------------------------------------------------


@dataclass
class IntakeRecord:
    """What the storefront saw while handing orders over."""

    accepted: dict[str, int] = field(default_factory=dict)  # order_no -> the answer that accepted it
    answers: Counter[int] = field(default_factory=Counter)  # every HTTP status received
    retries: Counter[str] = field(default_factory=Counter)  # why an intake was sent again
    error_bodies: list[dict[str, Any]] = field(default_factory=list)  # every non-2xx body
    seconds: list[float] = field(default_factory=list)  # from first try to acceptance, per order

    @property
    def retry_count(self) -> int:
        return sum(self.retries.values())


class IntakeClient:
    """Submits orders to one or more admin listeners and retries until each one is accepted.

    A try that cannot reach procurd (refused, cut off) or is answered 503/507 is retried, on the next
    listener when there are several (a storefront behind a load balancer fails over). Any other non-2xx
    answer fails the submission at once.
    """

    def __init__(self, session: aiohttp.ClientSession, admin_urls: Sequence[str]) -> None:
        self.session = session
        self.admin_urls = list(admin_urls)
        self.record = IntakeRecord()

    async def submit(self, order_no: str, items: list[dict[str, Any]], first: int = 0) -> dict[str, Any]:
        body = {"order_no": order_no, "items": items}
        started = time.monotonic()
        deadline = started + INTAKE_DEADLINE_SECONDS
        attempt = 0
        while True:
            url = self.admin_urls[(first + attempt) % len(self.admin_urls)] + INTAKE_PATH
            attempt += 1
            try:
                status, answer = await self.post(url, body)
            except (aiohttp.ClientError, TimeoutError) as exc:
                reason = f"unreachable: {type(exc).__name__}"
            else:
                self.record.answers[status] += 1
                if status in (200, 202):
                    self.record.accepted[order_no] = status
                    self.record.seconds.append(time.monotonic() - started)
                    return answer["order"]  # type: ignore[no-any-return]
                self.record.error_bodies.append(answer)
                if status not in RETRIED_STATUSES:
                    raise AssertionError(f"intake of {order_no} answered {status}: {answer}")
                reason = f"{status} {answer.get('error_code')}"
            self.record.retries[reason] += 1
            if time.monotonic() > deadline:
                raise AssertionError(f"intake of {order_no} not accepted within {INTAKE_DEADLINE_SECONDS} s")
            await asyncio.sleep(INTAKE_RETRY_PAUSE_SECONDS)

    async def post(self, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One try: the HTTP status and the JSON answer."""
        timeout = aiohttp.ClientTimeout(total=30)
        async with self.session.post(url, json=body, timeout=timeout) as response:
            raw = await response.read()
            try:
                answer = json.loads(raw)
            except ValueError:
                answer = {"unparsed": raw[:200].decode(errors="replace")}
            return response.status, answer


def single_item(sku_id: int) -> list[dict[str, Any]]:
    return [{"sku_id": sku_id, "quantity": 1}]


# --- what procurd and the upstream hold -------------------------------------------------------------------


@dataclass(frozen=True)
class Ledger:
    """Counts over every procurement procurd holds and every order the upstream holds."""

    orders: int  # local orders
    procurements: int
    states: dict[str, int]
    upstream_orders: int  # orders the upstream created
    duplicates: int  # upstream orders beyond the first under one downstream_order_no
    lost: int  # orders the storefront had accepted that procurd does not hold, or did not deliver
    mismatched: int  # deliveries whose payload or amount is not the one the upstream has
    amount_unknown: int  # deliveries whose cost procurd does not know
    attempts: int  # submission attempts in all

    def row(self) -> dict[str, Any]:
        return {
            "orders": self.orders,
            "upstream_orders": self.upstream_orders,
            "delivered": self.states.get("delivered", 0),
            "duplicates": self.duplicates,
            "lost": self.lost,
            "mismatched": self.mismatched,
            "amount_unknown": self.amount_unknown,
            "attempts": self.attempts,
        }


async def procurement_rows(database_url: str) -> list[Any]:
    return await sql_rows(database_url, select(procurements).order_by(procurements.c.id))


async def take_ledger(database_url: str, sandbox: Sandbox, accepted: Iterable[str]) -> Ledger:
    """The ledger after a run in which every order in ``accepted`` should end delivered."""
    order_numbers = {row.order_no for row in await sql_rows(database_url, select(orders.c.order_no))}
    rows = await sql_rows(database_url, select(procurements))
    upstream = Counter(order.downstream_order_no for order in sandbox.state.orders.values())
    delivered = {row.order_no for row in rows if row.state == "delivered"}
    mismatched = sum(
        1
        for row in rows
        if row.state == "delivered" and not _as_upstream(row, sandbox.state.orders.get(row.upstream_order_id))
    )
    wanted = set(accepted)
    return Ledger(
        orders=len(order_numbers),
        procurements=len(rows),
        states=dict(Counter(row.state for row in rows)),
        upstream_orders=sum(upstream.values()),
        duplicates=sum(count - 1 for count in upstream.values() if count > 1),
        lost=len(wanted - order_numbers) + len(wanted - delivered),
        mismatched=mismatched,
        amount_unknown=sum(1 for row in rows if row.state == "delivered" and row.amount is None),
        attempts=sum(row.attempts for row in rows),
    )


def _as_upstream(row: Any, upstream: SandboxOrder | None) -> bool:
    """Whether a delivered procurement holds the payload the upstream delivered, and its amount if known."""
    if upstream is None or upstream.fulfillment is None or row.fulfillment is None:
        return False
    if row.fulfillment.get("payload") != upstream.fulfillment.payload:
        return False
    return row.amount is None or Decimal(row.amount) == upstream.amount


async def all_delivered(database_url: str, count: int) -> bool:
    """Whether ``count`` procurements exist and every one is delivered, its cost known."""
    rows = await procurement_rows(database_url)
    return len(rows) == count and all(row.state == "delivered" and row.amount is not None for row in rows)


async def audit_problems(database_url: str) -> list[str]:
    """What is wrong with the audit trails: each procurement's starts with the intake's ``accepted`` into
    ``queued``, each entry starts where the one before ended, and the last ends in the current state."""
    rows = await sql_rows(database_url, select(procurements.c.id, procurements.c.state))
    entries = await sql_rows(database_url, select(audit_log).order_by(audit_log.c.id))
    trails: dict[int | None, list[Any]] = {}
    for entry in entries:
        trails.setdefault(entry.procurement_id, []).append(entry)
    problems = [f"{len(trails[None])} audit entries name no procurement"] if None in trails else []
    for procurement_id, state in rows:
        problems += _trail_problems(procurement_id, state, trails.get(procurement_id, []))
    return problems


INTAKE_ACCEPTED = ("intake", "accepted", None, "queued")


def _trail_problems(procurement_id: int, state: str, trail: list[Any]) -> list[str]:
    if not trail:
        return [f"procurement {procurement_id}: no audit trail"]
    name = f"procurement {procurement_id}"
    problems = []
    first = trail[0]
    if (first.source, first.event, first.old_state, first.new_state) != INTAKE_ACCEPTED:
        problems.append(f"{name}: starts with {first.source}/{first.event}")
    for before, after in itertools.pairwise(trail):
        if after.old_state != before.new_state:
            problems.append(
                f"{name}: entry {after.id} ({after.source}/{after.event}) starts in {after.old_state}, "
                f"the one before ended in {before.new_state}"
            )
    if trail[-1].new_state != state:
        problems.append(f"{name}: the trail ends in {trail[-1].new_state}, the state is {state}")
    return problems


async def audit_events(database_url: str) -> Counter[tuple[str, str]]:
    """How often each (source, event) pair was recorded."""
    rows = await sql_rows(database_url, select(audit_log.c.source, audit_log.c.event))
    return Counter((row.source, row.event) for row in rows)


def report(case: str, **figures: Any) -> None:
    """Print one line of figures for the reliability report (``pytest -rP`` shows it)."""
    print(f"FIGURES {case} " + json.dumps(figures, sort_keys=True, default=str))


# --- an upstream that goes away ---------------------------------------------------------------------------


class UpstreamGate:
    """A TCP relay on a fixed port of 127.0.0.1 in front of ``target_port``.

    ``open()`` relays; ``refuse()`` stops listening and cuts every relayed connection, so connections are
    refused as when the upstream is down; ``swallow()`` accepts connections and never answers (a hung
    upstream or a black-holed network).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        (self.port,) = unused_ports(1)
        self.mode = "closed"
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def open(self) -> None:
        await self._listen("open")

    async def swallow(self) -> None:
        await self._listen("swallow")

    async def refuse(self) -> None:
        await self._stop_listening()
        self._cut_all()
        self.mode = "closed"

    async def close(self) -> None:
        await self.refuse()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> UpstreamGate:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _listen(self, mode: str) -> None:
        self._cut_all()
        self.mode = mode
        if self._server is None:
            self._server = await asyncio.start_server(
                self._accept, "127.0.0.1", self.port, reuse_address=True
            )

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def _cut_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self.mode == "swallow":
                await reader.read()  # until the client gives up
                return
            await self._relay(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.transport.abort()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers.add(upstream_writer)
        try:
            await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))
        finally:
            self._writers.discard(upstream_writer)
            upstream_writer.transport.abort()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    if not writer.transport.is_closing() and writer.can_write_eof():
        writer.write_eof()


def most_in_any_window(arrivals: list[float], window: float) -> int:
    """The largest number of arrivals inside any window of ``window`` seconds (as the site counts them)."""
    most, start = 0, 0
    for end, arrival in enumerate(arrivals):
        while arrivals[start] <= arrival - window:
            start += 1
        most = max(most, end - start + 1)
    return most


def tightest_window(arrivals: list[float], count: int) -> float:
    """The shortest time in which ``count + 1`` requests arrived: the site's window must be shorter than this
    for the last of them to be refused."""
    spans = [arrivals[i + count] - arrivals[i] for i in range(len(arrivals) - count)]
    return round(min(spans), 3) if spans else float("inf")
