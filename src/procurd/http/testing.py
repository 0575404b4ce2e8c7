"""Helpers for tests that drive procurd's HTTP listeners over real sockets (no pytest import here).

- :func:`serve`: an aiohttp application on 127.0.0.1 (a free port, or a socket reserved beforehand).
- :func:`procurd_stack`: the sandbox upstream, a :class:`~procurd.operations.runtime.Runtime` on a given
  database, both listeners, mirrored catalogues and submission workers driven by hand.
- :func:`eventually`: poll an async probe with a deadline.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from procurd.catalog.sync import SyncReport
from procurd.config import Settings
from procurd.http.admin import make_admin_app
from procurd.http.errors import LISTENER, listener_runner
from procurd.http.public import make_public_app
from procurd.operations import Operations
from procurd.operations.runtime import Runtime
from procurd.procurement.submitter import Submitter
from procurd.protocol.dujiao.callback import CALLBACK_PATH
from procurd.protocol.dujiao.signing import HeaderNames, signed_headers
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.config import DEFAULT_API_KEY, DEFAULT_API_SECRET
from procurd.sandbox.testing import LARGE_BODY_BYTES, SignedClient
from procurd.upstream.errors import AuthError

T = TypeVar("T")

SECOND_API_KEY = "second-key"
SECOND_API_SECRET = "second-secret-value"  # noqa: S105 - a fixed test credential of the sandbox


async def eventually(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout: float = 5.0, interval: float = 0.01
) -> T:
    """Call ``probe`` until ``done`` accepts its result; raise TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if done(value):
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"condition not met in time; last value: {value!r}")
        await asyncio.sleep(interval)


def reserve_port(host: str = "127.0.0.1") -> socket.socket:
    """A listening-ready socket bound to a free port of ``host`` (hand it to :func:`serve`)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"


@asynccontextmanager
async def serve(app: web.Application, sock: socket.socket | None = None) -> AsyncIterator[str]:
    """Run ``app`` on 127.0.0.1 (on ``sock`` when given) and yield its base URL; one of procurd's listeners
    runs as the daemon runs it (:func:`~procurd.http.errors.listener_runner`)."""
    runner = (
        listener_runner(app, shutdown_timeout=1.0)
        if LISTENER in app
        else web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    )
    await runner.setup()
    try:
        site: web.BaseSite = (
            web.SockSite(runner, sock) if sock is not None else web.TCPSite(runner, "127.0.0.1", 0)
        )
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@dataclass
class Answer:
    """An HTTP answer as a test sees it."""

    status: int
    body: Any
    headers: Mapping[str, str] = field(repr=False)
    text: str = field(repr=False, default="")


@dataclass
class Stack:
    """A running procurd (both listeners) in front of the sandbox upstream."""

    sandbox: Sandbox
    operations: Operations
    admin_url: str
    public_url: str
    admin_token: str
    session: aiohttp.ClientSession

    @property
    def runtime(self) -> Runtime:
        return self.operations.runtime

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    async def admin(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """Call the admin API (with the configured token unless ``token`` is given)."""
        request_headers = dict(headers or {})
        bearer = self.admin_token if token is None else token
        if bearer:
            request_headers.setdefault("Authorization", f"Bearer {bearer}")
        data = raw if raw is not None else (None if body is None else json.dumps(body, default=str).encode())
        if data is not None:
            request_headers.setdefault("Content-Type", "application/json")
        return await self.request(method, self.admin_url + path, data, request_headers)

    async def request(
        self, method: str, url: str, data: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> Answer:
        # aiohttp wants large bodies as a stream.
        payload: bytes | io.BytesIO | None = (
            io.BytesIO(data) if data and len(data) > LARGE_BODY_BYTES else data
        )
        async with self.session.request(method, url, data=payload, headers=headers) as response:
            text = await response.text()
            try:
                parsed: Any = json.loads(text, parse_float=Decimal)
            except ValueError:
                parsed = None
            return Answer(response.status, parsed, CIMultiDict(response.headers), text)

    async def order(self, order_no: str) -> dict[str, Any]:
        """The order view straight from the operations' reads."""
        view = await self.operations.views.order(order_no)
        assert view is not None, f"no order {order_no}"
        return view

    async def submit_due(self, upstream: str = "main") -> int:
        """Claim and send one due procurement of ``upstream`` and record the answer; how many were sent."""
        return await submit_due(self.runtime, upstream)

    async def sync(self, upstream: str = "main") -> SyncReport:
        """One catalogue pass of ``upstream`` into the mirror, as configured (pricing included)."""
        return await self.operations.catalog.sync(upstream)

    async def post_signed(
        self, url: str, body: bytes, *, sign_path: str = CALLBACK_PATH, upstream: str = "main"
    ) -> Answer:
        """POST ``body`` to ``url`` signed with ``upstream``'s credentials over ``sign_path``."""
        config = self.settings.upstream(upstream)
        stamp = int(time.time())
        names = HeaderNames.for_prefix(config.header_prefix)
        headers = signed_headers(names, config.api_key, config.secret(), "POST", sign_path, stamp, body)
        headers["Content-Type"] = "application/json"
        return await self.request("POST", url, body, headers)

    def signer(self, upstream: str = "main") -> SignedClient:
        """Posts callbacks to the public listener signed with ``upstream``'s credentials."""
        config = self.settings.upstream(upstream)
        return SignedClient(self.public_url, config.api_key, config.secret(), config.header_prefix)


async def submit_due(runtime: Runtime, upstream: str = "main", limit: int = 1) -> int:
    """Claim up to ``limit`` due procurements of ``upstream``, send them and record the answers (a submitter
    driven by hand); how many were sent."""
    submitter = Submitter(
        runtime.service,
        runtime.client(upstream),
        runtime.instance,
        limit,
        runtime.settings.server.callback_url,
        on_answer=lambda upstream, outcome: _record_auth_failure(runtime, upstream, outcome),
    )
    await submitter.step()
    sent = len(submitter.in_flight)
    await submitter.drain()
    return sent


async def _record_auth_failure(runtime: Runtime, upstream: str, outcome: object) -> None:
    if isinstance(outcome, AuthError):
        await runtime.record_auth_failure(upstream, outcome)


def stack_settings(
    database_url: str,
    sandbox_url: str,
    callback_url: str,
    *,
    admin_token: str = "",
    upstreams: Sequence[str] = ("main", "second"),
    webhook_url: str = "",
    pricing: Mapping[str, Any] | None = None,
) -> Settings:
    """Settings of procurd against the sandbox: ``main`` with the sandbox's key, ``second`` with another."""
    credentials = {
        "main": (DEFAULT_API_KEY, DEFAULT_API_SECRET),
        "second": (SECOND_API_KEY, SECOND_API_SECRET),
    }
    storefront = {"webhook_url": webhook_url, "webhook_secret": "storefront-secret"} if webhook_url else {}
    return Settings(
        database={"url": database_url},
        server={"callback_url": callback_url, "allow_private_callback_url": True, "admin_token": admin_token},
        upstreams=[
            {
                "name": name,
                "base_url": sandbox_url,
                "api_key": credentials[name][0],
                "api_secret": credentials[name][1],
                "timeout_seconds": 5,
                "max_requests_per_second": 1000,
            }
            for name in upstreams
        ],
        procurement={"max_attempts": 2, "retry_base_seconds": 0.01, "retry_max_seconds": 0.05},
        storefront=storefront,
        pricing=dict(pricing or {}),
    )


@asynccontextmanager
async def procurd_stack(
    database_url: str,
    *,
    admin_token: str = "",
    upstreams: Sequence[str] = ("main", "second"),
    sandbox_config: SandboxConfig | None = None,
    callback_url: str | None = None,
    callback_path: str = CALLBACK_PATH,
    pricing: Mapping[str, Any] | None = None,
    webhook_url: str = "",
) -> AsyncIterator[Stack]:
    """The sandbox, a runtime on ``database_url`` and both listeners; stops everything on exit.

    ``callback_url`` defaults to the public listener's URL with ``callback_path``; give another one to put
    something (a reverse proxy) in front of it.
    """
    config = sandbox_config or SandboxConfig(products=4, skus_per_product=2, allow_private_callbacks=True)
    public_sock = reserve_port()
    try:
        async with Sandbox(config) as sandbox:
            sandbox.state.add_api_key(SECOND_API_KEY, SECOND_API_SECRET)
            public_base = url_of(public_sock)
            settings = stack_settings(
                database_url,
                sandbox.base_url,
                callback_url or public_base + callback_path,
                admin_token=admin_token,
                upstreams=upstreams,
                pricing=pricing,
                webhook_url=webhook_url,
            )
            operations = Operations(Runtime.build(settings, instance="test-instance"))
            try:
                await operations.runtime.start()
                async with (
                    serve(make_public_app(operations), public_sock) as public_url,
                    serve(make_admin_app(operations)) as admin_url,
                    aiohttp.ClientSession() as session,
                ):
                    yield Stack(sandbox, operations, admin_url, public_url, admin_token, session)
                    await sandbox.close()
            finally:
                await operations.close()
    finally:
        public_sock.close()
