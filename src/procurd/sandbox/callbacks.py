"""Signed callbacks to the downstream site (seed 000, 4.8) with the real sites' retry schedule."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from procurd.protocol.dujiao.callback import CALLBACK_PATH, callback_event
from procurd.protocol.dujiao.signing import HeaderNames, signed_headers
from procurd.protocol.web import dump_json
from procurd.sandbox.config import SandboxConfig
from procurd.sandbox.faults import FaultPlan
from procurd.sandbox.state import SandboxOrder, SandboxState

log = structlog.get_logger("procurd.sandbox")


@dataclass(frozen=True)
class CallbackAttempt:
    """One try at delivering one callback."""

    order_id: int
    downstream_order_no: str
    status: str
    event: str
    attempt: int  # 1 for the first try
    url: str
    http_status: int | None
    ok: bool
    error: str | None
    at: float  # the sandbox clock when the try finished


@dataclass(frozen=True)
class _Job:
    order_id: int
    downstream_order_no: str
    status: str
    event: str
    api_key: str
    url: str
    body: bytes


class TaskTracker:
    """Background tasks we own: spawned, awaited until idle, cancelled on close."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("sandbox.task_failed", error=type(task.exception()).__name__)
        if not self._tasks:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def callback_body(order: SandboxOrder, timestamp: int) -> bytes:
    """The JSON body of the callback for the order as it is now."""
    payload: dict[str, Any] = {
        "event": callback_event(order.status),
        "order_id": order.order_id,
        "order_no": order.order_no,
        "downstream_order_no": order.downstream_order_no or "",
        "status": order.status,
    }
    if order.fulfillment is not None:
        payload["fulfillment"] = order.fulfillment.to_dict()
    payload["timestamp"] = timestamp
    return dump_json(payload)


def _answer_is_ok(raw: bytes) -> bool:
    try:
        answer = json.loads(raw)
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("ok") is True


class CallbackSender:
    """Sends each callback with up to ``len(callback_retry_delays) + 1`` tries.

    Callbacks of one order leave in the order they were produced: a newer one waits for the first try
    of the one before it.
    """

    def __init__(self, config: SandboxConfig, state: SandboxState, faults: FaultPlan) -> None:
        self.config = config
        self.state = state
        self.faults = faults
        self.log: list[CallbackAttempt] = []
        self.stats: Counter[str] = Counter()
        self.tasks = TaskTracker()
        self._session: aiohttp.ClientSession | None = None
        self._first_try_done: dict[int, asyncio.Event] = {}

    def notify(self, order: SandboxOrder) -> None:
        """Queue the callback for the order's current status (nothing when it has no callback_url)."""
        if not order.callback_url:
            return
        if self.faults.take_callback_drop():
            self.stats["dropped"] += 1
            log.info("sandbox.callback_dropped", order_id=order.order_id, status=order.status)
            return
        job = _Job(
            order_id=order.order_id,
            downstream_order_no=order.downstream_order_no or "",
            status=order.status,
            event=callback_event(order.status),
            api_key=order.api_key,
            url=order.callback_url,
            body=callback_body(order, int(self.state.now())),
        )
        copies = 2 if self.faults.take_callback_duplicate() else 1
        for _ in range(copies):
            previous = self._first_try_done.get(order.order_id)
            first_try_done = asyncio.Event()
            self._first_try_done[order.order_id] = first_try_done
            self.stats["queued"] += 1
            self.tasks.spawn(self._deliver(job, previous, first_try_done))

    async def _deliver(
        self, job: _Job, previous: asyncio.Event | None, first_try_done: asyncio.Event
    ) -> None:
        try:
            if previous is not None:
                await previous.wait()
            if self.faults.callback_delay_seconds > 0:
                await asyncio.sleep(self.faults.callback_delay_seconds)
            attempt = 1
            while True:
                ok = await self._attempt(job, attempt)
                first_try_done.set()
                if ok:
                    return
                delays = self.config.callback_retry_delays
                if attempt > len(delays):
                    self.stats["abandoned"] += 1
                    log.warning("sandbox.callback_abandoned", order_id=job.order_id, attempts=attempt)
                    return
                await asyncio.sleep(delays[attempt - 1])
                attempt += 1
        finally:
            first_try_done.set()
            if self._first_try_done.get(job.order_id) is first_try_done:
                del self._first_try_done[job.order_id]

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def _attempt(self, job: _Job, attempt: int) -> bool:
        user = self.state.users[job.api_key]
        headers = signed_headers(
            HeaderNames.for_prefix(self.config.header_prefix),
            user.api_key,
            user.api_secret,
            "POST",
            CALLBACK_PATH,
            int(self.state.now()),
            job.body,
        )
        headers["Content-Type"] = "application/json"
        http_status: int | None = None
        error: str | None = None
        ok = False
        timeout = aiohttp.ClientTimeout(total=self.config.callback_timeout_seconds)
        try:
            async with self._client().post(
                job.url, data=job.body, headers=headers, timeout=timeout, allow_redirects=False
            ) as response:
                raw = await response.read()
                http_status = response.status
        except TimeoutError:
            error = "timed out"
        except aiohttp.ClientError as exc:
            error = type(exc).__name__
        else:
            ok = http_status == 200 and _answer_is_ok(raw)
            if not ok:
                error = f"HTTP {http_status}" if http_status != 200 else "the answer is not ok: true"
        self.stats["attempts"] += 1
        self.stats["delivered" if ok else "failed"] += 1
        self.log.append(
            CallbackAttempt(
                order_id=job.order_id,
                downstream_order_no=job.downstream_order_no,
                status=job.status,
                event=job.event,
                attempt=attempt,
                url=job.url,
                http_status=http_status,
                ok=ok,
                error=error,
                at=self.state.now(),
            )
        )
        log.info(
            "sandbox.callback",
            order_id=job.order_id,
            status=job.status,
            attempt=attempt,
            http_status=http_status,
            ok=ok,
            error=error,
        )
        return ok

    async def wait_idle(self) -> None:
        await self.tasks.wait_idle()

    async def close(self) -> None:
        await self.tasks.cancel_all()
        if self._session is not None:
            await self._session.close()
            self._session = None
