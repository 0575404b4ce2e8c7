"""The child processes of ``benchmarks/procurement.py``: the sandbox upstream, a bare aiohttp handler and the
load generators (the storefront's intake requests, signed duplicate callbacks).

Each runs in a process of its own, so none of them shares procurd's event loop or its CPU time.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import time
from collections import Counter
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import aiohttp
from aiohttp import web

from procurd.logs import configure_logging
from procurd.protocol.dujiao.callback import CALLBACK_PATH
from procurd.protocol.dujiao.ratelimit import RateLimiter
from procurd.protocol.dujiao.signing import HeaderNames
from procurd.sandbox import Sandbox, SandboxConfig, SandboxOrder
from procurd.sandbox.callbacks import callback_body
from procurd.sandbox.catalog import UNLIMITED
from procurd.sandbox.state import FULFILLED_STATUSES

API_KEY = "bench-key"
API_SECRET = "bench-secret-0123456789"
HEADER_PREFIX = "Service"
SANDBOX_BALANCE = Decimal("1000000000.00")
STARTUP_DEADLINE_SECONDS = 120.0


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` 0.5 for p50, 0.99 for p99); NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


# --- the sandbox upstream -----------------------------------------------------------------------------------


class CountingRateLimiter(RateLimiter):
    """The sandbox's rate limit, also counting the requests it refused."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__(clock)
        self.refused = 0

    def allow(self, key: str, limit: int, window: float, block: float) -> bool:
        allowed = super().allow(key, limit, window, block)
        if not allowed:
            self.refused += 1
        return allowed


class TimedSandbox(Sandbox):
    """The sandbox, also noting when each order was created on the site's own clock."""

    def __init__(self, config: SandboxConfig) -> None:
        super().__init__(config)
        self.counting_limiter = CountingRateLimiter(time.monotonic)
        self.rate_limiter = self.counting_limiter
        self.created_at: dict[int, float] = {}

    def order_created(self, order: SandboxOrder) -> None:
        self.created_at.setdefault(order.order_id, self.state.now())
        super().order_created(order)


def _sandbox_answer(sandbox: TimedSandbox, command: str, argument: Any) -> Any:
    """What the parent asked for; runs on the sandbox's event loop."""
    if command == "skus":
        # Automatic, orderable, unlimited stock: thousands of orders never run out.
        return [
            sku.id
            for product in sandbox.state.active_products()
            if product.fulfillment_type == "auto"
            for sku in product.skus
            if sku.is_active and sku.stock_quantity == UNLIMITED
        ]
    if command == "counts":
        return {
            "requests": dict(sandbox.request_counts),
            "rate_limited": sandbox.counting_limiter.refused,
            "callbacks": dict(sandbox.callbacks.stats),
            "orders": len(sandbox.state.orders),
        }
    if command == "created":
        return dict(sandbox.created_at)
    if command == "callback_bodies":
        now = int(sandbox.state.now())
        return [
            callback_body(order, now)
            for order in sandbox.state.orders.values()
            if order.status in FULFILLED_STATUSES
        ]
    if command == "set_price":
        sku_id, price = argument
        sandbox.state.set_sku_price(int(sku_id), str(price))
        return None
    if command == "sku_price":
        return sandbox.state.sku(int(argument)).price_amount
    if command == "rate_limit":
        sandbox.config.rate_limit = bool(argument)
        sandbox.rate_limiter.reset()
        sandbox.request_counts.clear()
        return None
    raise ValueError(f"unknown sandbox command {command!r}")


def _serve_sandbox(options: dict[str, Any], conn: multiprocessing.connection.Connection) -> None:
    """Child process: run a sandbox, answer the parent's commands until ``stop``."""
    configure_logging("warning", "json")

    async def serve() -> None:
        config = SandboxConfig(
            api_key=API_KEY,
            api_secret=API_SECRET,
            header_prefix=HEADER_PREFIX,
            balance=SANDBOX_BALANCE,
            seed=7,
            allow_private_callbacks=True,
            **options,
        )
        sandbox = TimedSandbox(config)
        async with sandbox:
            conn.send(sandbox.base_url)
            loop = asyncio.get_running_loop()
            while True:
                command, argument = await loop.run_in_executor(None, conn.recv)
                if command == "stop":
                    break
                conn.send(_sandbox_answer(sandbox, command, argument))
        conn.send(None)

    asyncio.run(serve())


class SandboxProcess:
    """The parent's handle on a sandbox child: start, ask, stop."""

    def __init__(self, context: multiprocessing.context.SpawnContext, **options: Any) -> None:
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(target=_serve_sandbox, args=(options, child_conn), daemon=True)
        self.base_url = ""

    def start(self) -> str:
        self._process.start()
        if not self._conn.poll(STARTUP_DEADLINE_SECONDS):
            raise SystemExit("the sandbox did not start in time")
        self.base_url = self._conn.recv()
        return self.base_url

    def _exchange(self, command: str, argument: Any) -> Any:
        self._conn.send((command, argument))
        return self._conn.recv()

    async def ask(self, command: str, argument: Any = None) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, self._exchange, command, argument)

    def stop(self) -> None:
        if self._process.is_alive():
            try:
                self._conn.send(("stop", None))
                if self._conn.poll(30):
                    self._conn.recv()
            except (BrokenPipeError, EOFError):
                pass
            self._process.join(30)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()


# --- the bare aiohttp handler -------------------------------------------------------------------------------


async def bare_callback(request: web.Request) -> web.Response:
    """Reads the body and says ``received``: what any aiohttp handler costs, with no work of its own."""
    await request.read()
    return web.json_response({"ok": True, "message": "received"})


def _serve_bare(ready: multiprocessing.connection.Connection, stop: Any) -> None:
    async def serve() -> None:
        app = web.Application()
        app.router.add_post(CALLBACK_PATH, bare_callback)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        ready.send(int(runner.addresses[0][1]))
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await runner.cleanup()

    asyncio.run(serve())


class BareServer:
    """``with BareServer(context) as port:`` a bare aiohttp handler in a child process."""

    def __init__(self, context: multiprocessing.context.SpawnContext) -> None:
        receiver, sender = context.Pipe(duplex=False)
        self._receiver = receiver
        self._stop = context.Event()
        self._process = context.Process(target=_serve_bare, args=(sender, self._stop), daemon=True)

    def __enter__(self) -> int:
        self._process.start()
        if not self._receiver.poll(STARTUP_DEADLINE_SECONDS):
            raise SystemExit("the bare aiohttp server did not start in time")
        return int(self._receiver.recv())

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._process.join(30)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()


# --- load generators (run in a worker process) --------------------------------------------------------------


def storefront_load(
    admin_url: str, upstream: str, orders: list[tuple[str, int]], concurrency: int
) -> dict[str, Any]:
    """POST every order (number, SKU of ``upstream``) to the admin API, ``concurrency`` at a time; the
    latencies are the storefront's."""
    return asyncio.run(_storefront_load(admin_url, upstream, orders, concurrency))


async def _storefront_load(
    admin_url: str, upstream: str, orders: list[tuple[str, int]], concurrency: int
) -> dict[str, Any]:
    pending = iter(orders)
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    refusals: list[str] = []
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def storefront_client() -> None:
            for order_no, sku_id in pending:
                body = json.dumps(
                    {"order_no": order_no, "items": [{"upstream": upstream, "sku_id": sku_id, "quantity": 1}]}
                )
                sent = time.perf_counter()
                async with session.post(admin_url, data=body, headers=headers) as response:
                    answer = await response.read()
                latencies.append(time.perf_counter() - sent)
                statuses[response.status] += 1
                if response.status != 202 and len(refusals) < 3:
                    refusals.append(answer.decode(errors="replace")[:300])

        started = time.time()
        await asyncio.gather(*(storefront_client() for _ in range(concurrency)))
        finished = time.time()
    return {
        "started": started,
        "finished": finished,
        "latencies": latencies,
        "statuses": dict(statuses),
        "refusals": refusals,
    }


def callback_load(
    port: int, bodies: list[bytes], connections: int, warmup: float, seconds: float
) -> dict[str, Any]:
    """Signed callback POSTs over ``connections`` keep-alive connections; counts answers in the window."""
    return asyncio.run(_callback_load(port, bodies, connections, warmup, seconds))


def _callback_requests(port: int, bodies: list[bytes]) -> Callable[[], bytes]:
    """Builds the next raw HTTP request, cycling through ``bodies``, signed with the current second."""
    names = HeaderNames.for_prefix(HEADER_PREFIX)
    digests = [hashlib.md5(body, usedforsecurity=False).hexdigest() for body in bodies]
    secret = API_SECRET.encode()
    head = (
        f"POST {CALLBACK_PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"{names.api_key}: {API_KEY}\r\n"
    )
    counter = itertools.count()

    def next_request() -> bytes:
        index = next(counter) % len(bodies)
        timestamp = int(time.time())
        message = f"POST\n{CALLBACK_PATH}\n{timestamp}\n{digests[index]}".encode()
        signature = hmac.new(secret, message, hashlib.sha256).hexdigest()
        body = bodies[index]
        return (
            f"{head}Content-Length: {len(body)}\r\n{names.timestamp}: {timestamp}\r\n"
            f"{names.signature}: {signature}\r\n\r\n"
        ).encode() + body

    return next_request


async def _callback_load(
    port: int, bodies: list[bytes], connections: int, warmup: float, seconds: float
) -> dict[str, Any]:
    next_request = _callback_requests(port, bodies)
    measure_from = time.monotonic() + warmup
    measure_until = measure_from + seconds
    latencies: list[float] = []
    failures: Counter[str] = Counter()

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while (sent := time.monotonic()) < measure_until:
                writer.write(next_request())
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                answer = await reader.readexactly(length)
                done = time.monotonic()
                if not measure_from <= done < measure_until:
                    continue
                if head.startswith(b"HTTP/1.1 200") and b"true" in answer:
                    latencies.append(done - sent)
                else:
                    failures[head.split(b"\r\n", 1)[0].decode(errors="replace")] += 1
        finally:
            writer.close()
            await writer.wait_closed()

    await asyncio.gather(*(connection() for _ in range(connections)))
    return {
        "ok": len(latencies),
        "failures": dict(failures),
        "seconds": seconds,
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
    }
