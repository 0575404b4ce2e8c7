"""Helpers for tests that drive the sandbox over real sockets (no pytest import here).

- :class:`SignedClient`: a minimal signed client of the upstream API, independent of procurd's own.
- :class:`ControlClient`: the sandbox's unsigned control API under ``/_sandbox``.
- :class:`CallbackReceiver`: a downstream callback endpoint on 127.0.0.1 that records and verifies pushes.
- :func:`wait_until`: poll a condition with a deadline.
- :class:`ManualClock`: a clock for ``Sandbox(config, clock=...)`` that moves only when told to.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiohttp import web

from procurd.protocol.dujiao.callback import CALLBACK_PATH
from procurd.protocol.dujiao.signing import HeaderNames, parse_timestamp, sign, signature_matches
from procurd.sandbox.config import DEFAULT_API_KEY, DEFAULT_API_SECRET
from procurd.sandbox.listener import listen

API_PREFIX = "/api/v1/upstream"
LARGE_BODY_BYTES = 1024 * 1024  # aiohttp wants bigger bodies as a stream


async def wait_until(
    predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01, message: str = ""
) -> None:
    """Return once ``predicate()`` is true; raise TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(message or "condition not met in time")
        await asyncio.sleep(interval)


class ManualClock:
    """Unix seconds that start at the wall clock's and move only by :meth:`advance`."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class ApiResponse:
    status: int
    body: bytes
    content_type: str
    headers: Mapping[str, str] = field(repr=False)

    def json(self) -> Any:
        return json.loads(self.body, parse_float=Decimal)

    @property
    def error_code(self) -> str | None:
        data = self.json()
        return data.get("error_code") if isinstance(data, dict) else None


class _SessionClient:
    """An HTTP client whose session opens on the first request and closes with ``close`` or ``async with``."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session


class SignedClient(_SessionClient):
    """Signs requests to ``base_url`` + ``/api/v1/upstream`` exactly as seed 000 part 5 says.

    Every part can be overridden per request to build broken requests on purpose.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str = DEFAULT_API_KEY,
        api_secret: str = DEFAULT_API_SECRET,
        header_prefix: str = "Service",
        timeout: float = 10.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.api_secret = api_secret
        self.names = HeaderNames.for_prefix(header_prefix)
        self.timeout = timeout
        super().__init__()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        body: bytes | None = None,
        params: Mapping[str, str | int] | None = None,
        timestamp: int | str | None = None,
        api_key: str | None = None,
        api_secret: str | None = None,
        signature: str | None = None,
        sign_path: str | None = None,
        omit_headers: Iterable[str] = (),
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ApiResponse:
        """``path`` is relative to the API root ("/ping") unless it starts with ``/api/``."""
        full_path = path if path.startswith("/api/") else API_PREFIX + path
        if body is None:
            body = b"" if json_body is None else json.dumps(json_body, separators=(",", ":")).encode()
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        key = self.api_key if api_key is None else api_key
        secret = self.api_secret if api_secret is None else api_secret
        signed = sign(secret, method, sign_path or full_path, stamp, body) if signature is None else signature
        request_headers = {self.names.api_key: key, self.names.timestamp: stamp, self.names.signature: signed}
        for name in omit_headers:
            request_headers.pop(name, None)
        if json_body is not None:
            request_headers["Content-Type"] = "application/json"
        request_headers.update(headers or {})
        async with self._client().request(
            method,
            self.base_url + full_path,
            params=params,
            data=io.BytesIO(body) if len(body) > LARGE_BODY_BYTES else body,
            headers=request_headers,
            timeout=aiohttp.ClientTimeout(total=timeout or self.timeout),
        ) as response:
            raw = await response.read()
            return ApiResponse(response.status, raw, response.content_type, dict(response.headers))

    async def get(self, path: str, params: Mapping[str, str | int] | None = None, **kw: Any) -> ApiResponse:
        return await self.request("GET", path, params=params, **kw)

    async def post(self, path: str, json_body: Any = None, **kw: Any) -> ApiResponse:
        return await self.request("POST", path, json_body=json_body, **kw)

    async def create_order(self, sku_id: int, quantity: int = 1, **fields: Any) -> ApiResponse:
        return await self.post("/orders", {"sku_id": sku_id, "quantity": quantity, **fields})

    async def list_all_products(self, page_size: int = 50, **params: str) -> list[dict[str, Any]]:
        """Every product GET /products lists (with ``params`` such as ``updated_after``), page by page."""
        items: list[dict[str, Any]] = []
        page = 1
        while True:
            data = (await self.get("/products", {**params, "page": page, "page_size": page_size})).json()
            items.extend(data["items"])
            if page * data["page_size"] >= data["total"]:
                return items
            page += 1


class ControlClient(_SessionClient):
    """Calls the control API of the sandbox at ``base_url``; each call checks the HTTP status it expects."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.root = base_url.rstrip("/") + "/_sandbox"
        self.timeout = timeout
        super().__init__()

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        expect: int = 200,
    ) -> dict[str, Any]:
        """The JSON answer of ``method /_sandbox{path}``; AssertionError when its status is not ``expect``."""
        async with self._client().request(
            method,
            self.root + path,
            json=body,
            params=params,
            timeout=aiohttp.ClientTimeout(total=self.timeout),
        ) as response:
            data: dict[str, Any] = json.loads(await response.read())  # amounts are strings; times floats
            if response.status != expect:
                raise AssertionError(f"{method} {path}: HTTP {response.status}, expected {expect}: {data}")
            return data

    async def get(
        self, path: str, params: Mapping[str, str] | None = None, expect: int = 200
    ) -> dict[str, Any]:
        return await self.call("GET", path, params=params, expect=expect)

    async def post(self, path: str, body: Any = None, expect: int = 200) -> dict[str, Any]:
        return await self.call("POST", path, body, expect=expect)


@dataclass
class ReceivedCallback:
    path: str
    headers: Mapping[str, str] = field(repr=False)
    body: bytes = field(repr=False)
    signature_valid: bool
    timestamp: int | None

    def json(self) -> Any:
        return json.loads(self.body, parse_float=Decimal)


@dataclass
class _PlannedAnswer:
    status: int
    body: bytes
    remaining: int


class CallbackReceiver:
    """A downstream site's callback endpoint on 127.0.0.1 (any path). It records every push and checks
    its signature over POST and the fixed path ``/api/v1/upstream/callback``.

    It answers ``{"ok": true, "message": "received"}`` unless :meth:`answer_next` planned otherwise.
    """

    def __init__(
        self,
        api_key: str = DEFAULT_API_KEY,
        api_secret: str = DEFAULT_API_SECRET,
        header_prefix: str = "Service",
        path: str = "/hooks/upstream",
    ) -> None:
        self.api_key = api_key
        self.api_secret = api_secret
        self.names = HeaderNames.for_prefix(header_prefix)
        self.path = path
        self.received: list[ReceivedCallback] = []
        self.url = ""
        self._planned: list[_PlannedAnswer] = []
        self._hang = 0
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None

    def answer_next(self, status: int = 500, body: Any = None, count: int = 1) -> None:
        """The next ``count`` pushes get ``status`` with ``body`` (JSON unless bytes)."""
        raw = (
            body if isinstance(body, bytes) else json.dumps(body or {"ok": False, "message": "busy"}).encode()
        )
        self._planned.append(_PlannedAnswer(status, raw, count))

    def hang_next(self, count: int = 1) -> None:
        """The next ``count`` pushes get no answer until the receiver closes (the sender times out)."""
        self._hang += count

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner, root = await listen(app, "127.0.0.1", 0, shutdown_timeout=1.0)
        self.url = root + self.path
        return self.url

    async def close(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> CallbackReceiver:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def verify(self, headers: Mapping[str, str], body: bytes) -> bool:
        stamp = headers.get(self.names.timestamp, "")
        return headers.get(self.names.api_key) == self.api_key and signature_matches(
            self.api_secret, "POST", CALLBACK_PATH, stamp, body, headers.get(self.names.signature, "")
        )

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = dict(request.headers)
        self.received.append(
            ReceivedCallback(
                path=request.path,
                headers=headers,
                body=body,
                signature_valid=self.verify(headers, body),
                timestamp=parse_timestamp(headers.get(self.names.timestamp, "")),
            )
        )
        if self._hang > 0:
            self._hang -= 1
            await self._release.wait()
        if self._planned:
            planned = self._planned[0]
            planned.remaining -= 1
            if planned.remaining <= 0:
                self._planned.pop(0)
            return web.Response(body=planned.body, status=planned.status, content_type="application/json")
        return web.json_response({"ok": True, "message": "received"})

    def payloads(self) -> list[Any]:
        return [callback.json() for callback in self.received]

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[ReceivedCallback]:
        """Wait until at least ``count`` pushes arrived; return them all."""
        await wait_until(lambda: len(self.received) >= count, timeout, message=f"{count} callbacks expected")
        return list(self.received)
