"""The upstream client against a canned HTTP server on 127.0.0.1: signing, parsing, transport failures."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import structlog
from aiohttp import web
from pydantic import SecretStr
from pytest_aiohttp import AiohttpServer
from structlog.testing import capture_logs

from procurd.config import UpstreamSettings
from procurd.protocol.dujiao.client import UpstreamClient
from procurd.protocol.dujiao.signing import signature_matches
from procurd.upstream import (
    BusinessError,
    ClockSkew,
    ConnectFailed,
    PaymentFailed,
    Priority,
    PriorityRateLimiter,
    ProtocolError,
    RateLimited,
    ServerError,
    TransportError,
    UpstreamTimeout,
)
from procurd.upstream.models import CreateOrderRequest

SECRET = "canned-secret-value"
API_KEY = "canned-key"
NOW = 1772366400.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
def debug_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every structlog line, debug included, whatever logging configuration other tests left behind."""
    previous = structlog.get_config()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG), cache_logger_on_first_use=False
    )
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(**previous)


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class CannedUpstream:
    """Answers each request with the next queued answer and records what it received."""

    answers: deque[Handler] = field(default_factory=deque)
    requests: list[Recorded] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def reply(self, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        async def handler(_: web.Request) -> web.StreamResponse:
            return web.json_response(body, status=status, headers=headers)

        self.answers.append(handler)

    def reply_raw(self, body: bytes, status: int = 200, content_type: str = "application/json") -> None:
        async def handler(_: web.Request) -> web.StreamResponse:
            return web.Response(body=body, status=status, content_type=content_type)

        self.answers.append(handler)

    def hang(self) -> None:
        async def handler(_: web.Request) -> web.StreamResponse:
            await self.release.wait()
            return web.json_response({"ok": True})

        self.answers.append(handler)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            Recorded(request.method, request.path, dict(request.query), dict(request.headers), body)
        )
        return await self.answers.popleft()(request)


@pytest.fixture
async def canned(aiohttp_server: AiohttpServer) -> AsyncIterator[tuple[CannedUpstream, str]]:
    """A canned upstream mounted under a path prefix, and its base URL."""
    upstream = CannedUpstream()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", upstream.handle)
    server = await aiohttp_server(app)
    yield upstream, f"http://127.0.0.1:{server.port}/shop"
    upstream.release.set()


def settings_for(base_url: str, **overrides: Any) -> UpstreamSettings:
    values: dict[str, Any] = {
        "name": "main",
        "base_url": base_url,
        "api_key": API_KEY,
        "api_secret": SecretStr(SECRET),
        "timeout_seconds": 5,
        "max_requests_per_second": 1000,
    }
    values.update(overrides)
    return UpstreamSettings(**values)


@pytest.fixture
async def client(canned: tuple[CannedUpstream, str]) -> AsyncIterator[UpstreamClient]:
    """A client of the canned upstream with a fixed clock."""
    async with UpstreamClient(settings_for(canned[1]), clock=lambda: NOW) as client:
        yield client


def assert_signed(request: Recorded, method: str, path: str) -> None:
    assert request.method == method
    assert request.path == path
    assert request.headers["Service-Api-Key"] == API_KEY
    assert request.headers["Service-Timestamp"] == str(int(NOW))
    assert signature_matches(
        SECRET, method, path, int(NOW), request.body, request.headers["Service-Signature"]
    )


PING = {
    "ok": True,
    "site_name": "Canned",
    "protocol_version": "1.0",
    "user_id": 7,
    "balance": "1000.00",
    "currency": "CNY",
    "member_level": None,
}


async def test_ping_is_signed_over_the_full_path_and_empty_body(
    canned: tuple[CannedUpstream, str], client: UpstreamClient
) -> None:
    """POST /ping signs the empty body over the path with base_url's prefix and /api/v1/upstream."""
    upstream, _ = canned
    upstream.reply(PING)
    result = await client.ping()
    request = upstream.requests[0]
    assert_signed(request, "POST", "/shop/api/v1/upstream/ping")
    assert request.body == b""
    assert request.headers["Content-Type"] == "application/json"
    assert (result.site_name, result.user_id, result.currency) == ("Canned", 7, "CNY")
    assert str(result.balance) == "1000.00"
    assert result.latency_ms >= 0
    assert "ok" not in (result.model_extra or {})


async def test_products_query_is_not_signed_and_page_size_is_as_answered(
    canned: tuple[CannedUpstream, str], client: UpstreamClient
) -> None:
    """GET /products sends page, page_size and include_inactive=true as a query, signs the bare path,
    reports the answered size and whether the answer lists inactive products too."""
    upstream, _ = canned
    upstream.reply(
        {"ok": True, "items": [{"id": 1, "price_amount": "9.90"}], "total": 1, "page": 2, "page_size": 50}
    )
    page = await client.products(page=2, page_size=100)
    request = upstream.requests[0]
    assert_signed(request, "GET", "/shop/api/v1/upstream/products")
    assert request.query == {"page": "2", "page_size": "100", "include_inactive": "true"}
    assert request.body == b""
    assert (page.page_size, page.includes_inactive) == (50, None)
    assert page.items[0].price_amount == "9.90"


async def test_every_catalogue_page_asks_for_inactive_products_and_reads_the_echo(
    canned: tuple[CannedUpstream, str], client: UpstreamClient
) -> None:
    """The mirror's pages ask include_inactive=true (beside updated_after when incremental) and carry the
    answer's includes_inactive: true, false, or None when the answer does not say (or says it oddly)."""
    upstream, _ = canned
    page = {"ok": True, "items": [{"id": 1, "is_active": False}], "total": 1, "page": 1, "page_size": 50}
    for echo in (True, False, "yes", None):
        upstream.reply(page if echo is None else {**page, "includes_inactive": echo})
    since = datetime(2026, 11, 23, 15, 27, 29, tzinfo=UTC)
    echoed = [await client.catalog_page(1, 50, updated_after=since)]
    echoed += [await client.catalog_page(1, 50) for _ in range(3)]
    assert [found.includes_inactive for found in echoed] == [True, False, None, None]
    queries = [request.query for request in upstream.requests]
    assert queries[0] == {
        "page": "1", "page_size": "50", "include_inactive": "true", "updated_after": "2026-11-23T15:27:29Z"
    }  # fmt: skip
    assert all(query["include_inactive"] == "true" for query in queries)


async def test_create_order_signs_the_exact_bytes_sent(
    canned: tuple[CannedUpstream, str], client: UpstreamClient
) -> None:
    """POST /orders sends compact JSON and signs exactly those bytes."""
    upstream, _ = canned
    upstream.reply(
        {"ok": True, "order_id": 5, "order_no": "DJ5", "status": "paid", "amount": "9.90", "currency": "CNY"}
    )
    request = CreateOrderRequest(sku_id=101, quantity=1, downstream_order_no="A1001-1")
    created = await client.create_order(request)
    recorded = upstream.requests[0]
    assert_signed(recorded, "POST", "/shop/api/v1/upstream/orders")
    assert recorded.body == b'{"sku_id":101,"quantity":1,"downstream_order_no":"A1001-1"}'
    assert recorded.headers["Content-Type"] == "application/json"
    assert (created.order_id, created.order_no, created.status, created.amount) == (5, "DJ5", "paid", "9.90")


async def test_order_query_cancel_categories_and_product_paths(
    canned: tuple[CannedUpstream, str], client: UpstreamClient
) -> None:
    """Every endpoint uses its documented method and path and parses its answer."""
    upstream, _ = canned
    upstream.reply({"ok": True, "order_id": 5, "order_no": "DJ5", "status": "refunded", "amount": "9.90"})
    upstream.reply({"ok": True, "order_id": 5, "order_no": "DJ5", "status": "canceled"})
    upstream.reply({"ok": True, "categories": [{"id": 1, "parent_id": 0, "slug": "games"}]})
    upstream.reply({"ok": True, "product": {"id": 9, "is_active": False, "skus": []}})
    order = await client.get_order(5)
    cancel = await client.cancel_order(5)
    categories = await client.categories()
    product = await client.product(9)
    paths = [(r.method, r.path) for r in upstream.requests]
    assert paths == [
        ("GET", "/shop/api/v1/upstream/orders/5"),
        ("POST", "/shop/api/v1/upstream/orders/5/cancel"),
        ("GET", "/shop/api/v1/upstream/categories"),
        ("GET", "/shop/api/v1/upstream/products/9"),
    ]
    for recorded in upstream.requests:
        assert_signed(recorded, recorded.method, recorded.path)
    assert order.status == "refunded"
    assert cancel.status == "canceled"
    assert categories[0].slug == "games"
    assert product.is_active is False


async def test_payment_failed_raises_with_the_canceled_order(
    canned: tuple[CannedUpstream, str], client: UpstreamClient
) -> None:
    """HTTP 200 with ok false payment_failed raises PaymentFailed, never returns an order."""
    upstream, _ = canned
    upstream.reply(
        {
            "ok": False,
            "order_id": 6,
            "order_no": "DJ6",
            "status": "canceled",
            "error_code": "payment_failed",
            "error_message": "wallet payment failed",
        }
    )
    with pytest.raises(PaymentFailed) as caught:
        await client.create_order(CreateOrderRequest(sku_id=1, quantity=1))
    assert (caught.value.order_id, caught.value.status, caught.value.http_status) == (6, "canceled", 200)


async def test_business_error_is_raised_with_code_and_status(
    canned: tuple[CannedUpstream, str], client: UpstreamClient
) -> None:
    """A 409 cancel_not_allowed raises a non-retryable BusinessError."""
    upstream, _ = canned
    upstream.reply({"ok": False, "error_code": "cancel_not_allowed", "error_message": "paid"}, status=409)
    with pytest.raises(BusinessError) as caught:
        await client.cancel_order(5)
    assert (caught.value.code, caught.value.http_status, caught.value.retryable) == (
        "cancel_not_allowed",
        409,
        False,
    )
    assert caught.value.endpoint == "orders.cancel"


async def test_rate_limit_envelope_pauses_the_limiter(canned: tuple[CannedUpstream, str]) -> None:
    """The HTTP 200 429 envelope raises RateLimited and pauses the shared limiter for retry_after."""
    upstream, base_url = canned
    limiter = PriorityRateLimiter(1000)
    upstream.reply(
        {"status_code": 429, "msg": "too many requests", "data": None}, headers={"Retry-After": "7"}
    )
    async with UpstreamClient(settings_for(base_url), limiter=limiter) as client:
        with pytest.raises(RateLimited) as caught:
            await client.categories()
    assert caught.value.retry_after == 7.0
    assert 0 < limiter.paused_for <= 7.0


async def test_server_error_is_retryable(canned: tuple[CannedUpstream, str], client: UpstreamClient) -> None:
    """A 502 HTML page raises a retryable ServerError."""
    upstream, _ = canned
    upstream.reply_raw(b"<html>bad gateway</html>", status=502, content_type="text/html")
    with pytest.raises(ServerError) as caught:
        await client.ping()
    assert caught.value.retryable


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"<html>maintenance</html>", "text/html"),
        (b"", "application/json"),
        (b"[]", "application/json"),
        (b'{"site_name": "x"}', "application/json"),
        (b'{"ok": true, "order_no": "DJ5", "status": "paid"}', "application/json"),
        (b'{"ok": true, "order_id": "five", "order_no": "DJ5", "status": "paid"}', "application/json"),
    ],
)
async def test_malformed_answers_raise_protocol_errors(
    canned: tuple[CannedUpstream, str], client: UpstreamClient, body: bytes, content_type: str
) -> None:
    """Non-JSON, empty, array, ok-less and field-less answers raise a retryable ProtocolError."""
    upstream, _ = canned
    upstream.reply_raw(body, content_type=content_type)
    with pytest.raises(ProtocolError) as caught:
        await client.create_order(CreateOrderRequest(sku_id=1, quantity=1))
    assert caught.value.code == "bad_response"
    assert caught.value.retryable


async def test_missing_product_object_is_a_protocol_error(
    canned: tuple[CannedUpstream, str], client: UpstreamClient
) -> None:
    """An ok answer to the product detail without a product object is not understood."""
    upstream, _ = canned
    upstream.reply({"ok": True})
    with pytest.raises(ProtocolError):
        await client.product(3)


async def test_redirect_is_not_followed(canned: tuple[CannedUpstream, str], client: UpstreamClient) -> None:
    """A redirect raises a ProtocolError instead of replaying a signed POST elsewhere."""
    upstream, _ = canned

    async def redirect(_: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/elsewhere")

    upstream.answers.append(redirect)
    with pytest.raises(ProtocolError):
        await client.ping()
    assert len(upstream.requests) == 1


async def test_timeout_raises_upstream_timeout(canned: tuple[CannedUpstream, str]) -> None:
    """An upstream that does not answer within timeout_seconds raises UpstreamTimeout."""
    upstream, base_url = canned
    upstream.hang()
    outcomes: list[str] = []
    observer = lambda _u, _e, outcome, _s, _error: outcomes.append(outcome)  # noqa: E731
    async with UpstreamClient(settings_for(base_url, timeout_seconds=0.2), observer=observer) as client:
        with pytest.raises(UpstreamTimeout) as caught:
            await client.ping()
    assert caught.value.code == "timeout"
    assert caught.value.retryable
    assert outcomes == ["timeout"]


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A port bound on 127.0.0.1 but not listening: connections to it are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def test_connection_refused_is_a_transport_error(refusing_port: int) -> None:
    """Nothing listening raises a retryable ConnectFailed (a TransportError, code network_error): the
    request was never sent."""
    async with UpstreamClient(settings_for(f"http://127.0.0.1:{refusing_port}")) as client:
        with pytest.raises(ConnectFailed) as caught:
            await client.ping()
    assert isinstance(caught.value, TransportError)
    assert caught.value.code == "network_error"
    assert caught.value.retryable
    assert caught.value.http_status is None


@pytest.fixture
async def resetting_server() -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 that reads the request and resets the connection."""

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_connection_reset_is_a_transport_error(resetting_server: int) -> None:
    """A connection reset after the request went out raises a retryable TransportError, not ConnectFailed:
    the upstream may have acted on it."""
    async with UpstreamClient(settings_for(f"http://127.0.0.1:{resetting_server}")) as client:
        with pytest.raises(TransportError) as caught:
            await client.ping()
    assert not isinstance(caught.value, ConnectFailed)
    assert caught.value.code == "network_error"


async def test_observer_sees_every_request_once(canned: tuple[CannedUpstream, str]) -> None:
    """The observer is called once per request with the endpoint and "ok" or the error code."""
    upstream, base_url = canned
    calls: list[tuple[str, str, str]] = []

    def observe(name: str, endpoint: str, outcome: str, seconds: float, error: object) -> None:
        assert seconds >= 0
        assert (error is None) == (outcome == "ok")
        calls.append((name, endpoint, outcome))

    upstream.reply(PING)
    upstream.reply({"ok": False, "error_code": "order_not_found", "error_message": "no"}, status=404)
    async with UpstreamClient(settings_for(base_url), observer=observe) as client:
        await client.ping()
        with pytest.raises(BusinessError):
            await client.get_order(404)
    assert calls == [("main", "ping", "ok"), ("main", "orders.get", "order_not_found")]


async def test_logs_and_errors_never_carry_secrets(
    canned: tuple[CannedUpstream, str], debug_logs: list[MutableMapping[str, Any]]
) -> None:
    """A debug line per request and a warning on auth errors, never with the secret or the signature."""
    upstream, base_url = canned
    upstream.reply(PING)
    upstream.reply(
        {"ok": False, "error_code": "timestamp_expired", "error_message": f"bad {SECRET}"},
        status=401,
        headers={"Date": "Sun, 01 Mar 2026 11:58:30 GMT"},
    )
    async with UpstreamClient(settings_for(base_url), clock=lambda: NOW) as client:
        await client.ping()
        with pytest.raises(ClockSkew) as caught:
            await client.ping()
    logs = debug_logs
    signatures = [r.headers["Service-Signature"] for r in upstream.requests]
    debug_lines = [line for line in logs if line["log_level"] == "debug"]
    assert [(line["method"], line["path"], line["status"]) for line in debug_lines] == [
        ("POST", "/shop/api/v1/upstream/ping", 200),
        ("POST", "/shop/api/v1/upstream/ping", 401),
    ]
    assert any(line["log_level"] == "error" and line.get("code") == "timestamp_expired" for line in logs)
    assert caught.value.clock_offset_seconds == 90.0
    texts = [json.dumps(logs, default=str), str(caught.value), repr(caught.value), caught.value.hint]
    for text in texts:
        assert SECRET not in text
        for signature in signatures:
            assert signature not in text
    assert SECRET not in repr(client)


async def test_priority_is_passed_to_the_limiter(canned: tuple[CannedUpstream, str]) -> None:
    """A caller's priority decides its place in the shared limiter's queue."""
    upstream, base_url = canned
    limiter = PriorityRateLimiter(1000)
    limiter.pause_for(30)
    async with UpstreamClient(settings_for(base_url), limiter=limiter) as client:
        task = asyncio.create_task(client.products(priority=Priority.ORDER))
        deadline = asyncio.get_running_loop().time() + 5
        while limiter.waiting[Priority.ORDER] == 0:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert upstream.requests == []


async def test_closed_client_refuses_to_send(canned: tuple[CannedUpstream, str]) -> None:
    """After close() the client raises instead of opening a new session."""
    _, base_url = canned
    client = UpstreamClient(settings_for(base_url))
    await client.close()
    with pytest.raises(RuntimeError, match="closed"):
        await client.ping()


async def test_invalid_page_arguments_are_refused(client: UpstreamClient) -> None:
    """page below 1 or page_size outside 1 to 100 is refused before anything is sent."""
    with pytest.raises(ValueError, match="page"):
        await client.products(page=0)
    with pytest.raises(ValueError, match="page"):
        await client.products(page_size=101)


async def test_failing_observer_does_not_change_the_outcome(
    canned: tuple[CannedUpstream, str], debug_logs: list[MutableMapping[str, Any]]
) -> None:
    """An observer that raises neither hides a success nor replaces the upstream's error."""
    upstream, base_url = canned

    def broken(_name: str, _endpoint: str, _outcome: str, _seconds: float, _error: object) -> None:
        raise RuntimeError("metrics are broken")

    upstream.reply(PING)
    upstream.reply({"ok": False, "error_code": "order_not_found", "error_message": "no"}, status=404)
    async with UpstreamClient(settings_for(base_url), observer=broken) as client:
        assert (await client.ping()).user_id == 7
        with pytest.raises(BusinessError):
            await client.get_order(1)
    assert [line["event"] for line in debug_logs if line["log_level"] == "error"] == [
        "upstream.observer_failed"
    ] * 2


async def test_cancelled_request_is_observed_as_cancelled(canned: tuple[CannedUpstream, str]) -> None:
    """A caller cancelling a request in flight gets CancelledError and the observer sees "cancelled"."""
    upstream, base_url = canned
    upstream.hang()
    outcomes: list[str] = []

    def observe(_name: str, _endpoint: str, outcome: str, _seconds: float, _error: object) -> None:
        outcomes.append(outcome)

    async with UpstreamClient(settings_for(base_url), observer=observe) as client:
        task = asyncio.create_task(client.ping())
        deadline = asyncio.get_running_loop().time() + 5
        while not upstream.requests:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert outcomes == ["cancelled"]
