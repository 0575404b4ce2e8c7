"""The asyncio client of one upstream's signed procurement API (seed 000)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, TypeVar, overload
from urllib.parse import urlsplit

import aiohttp
from pydantic import ValidationError

from procurd.config import UpstreamSettings
from procurd.core.catalog import rfc3339
from procurd.core.exact import loads_exact, loads_listing
from procurd.core.problems import problems
from procurd.protocol.dujiao.answers import classify_response
from procurd.protocol.dujiao.signing import HeaderNames, signed_headers
from procurd.protocol.transport import (
    RequestObserver,
    SessionClient,
    clock_offset,
    describe_transport_failure,
)
from procurd.upstream.errors import (
    ConnectFailed,
    TransportError,
    UpstreamError,
    UpstreamTimeout,
    truncate,
)
from procurd.upstream.models import (
    CancelResult,
    CatalogPage,
    Category,
    CreateOrderRequest,
    OrderCreated,
    PingResult,
    Product,
    ProductPage,
    SeenPage,
    UpstreamModel,
    UpstreamOrder,
)
from procurd.upstream.ratelimit import Priority, RateLimiter

API_PREFIX = "/api/v1/upstream"
MAX_PAGE_SIZE = 100
INCLUDE_INACTIVE = {"include_inactive": "true"}
"""Asked of every listing: a site that serves it lists inactive products too, and says so."""

ModelT = TypeVar("ModelT", bound=UpstreamModel)


@dataclass(frozen=True, slots=True)
class _Call:
    endpoint: str
    method: str
    path: str
    priority: Priority
    query: Mapping[str, str] | None = None
    body: bytes = b""
    decode: Callable[[bytes], Any] = field(default=loads_exact)
    seen: Container[bytes] | None = None
    """Digests of success bodies the caller knows: such a body is answered as seen, not decoded."""


@dataclass(frozen=True, slots=True)
class _Answer:
    body: dict[str, Any]
    seconds: float
    body_digest: bytes = b""
    seen: bool = False
    server_date: str | None = None  # the answer's Date header


class UpstreamClient(SessionClient):
    """Talks to one upstream: signs every request, honours the shared rate limit, maps every failure.

    One HTTP session per client, opened on first use inside the running loop; ``await close()`` or
    ``async with`` releases it. Every method raises an :class:`~procurd.upstream.errors.UpstreamError`
    subclass on failure.
    """

    def __init__(
        self,
        settings: UpstreamSettings,
        *,
        limiter: RateLimiter | None = None,
        clock: Callable[[], float] = time.time,
        observer: RequestObserver | None = None,
    ) -> None:
        super().__init__(settings, limiter=limiter, observer=observer)
        self._clock = clock
        self._header_names = HeaderNames.for_prefix(settings.header_prefix)
        self._api_root = settings.api_root
        self._path_root = urlsplit(self._api_root).path

    def __repr__(self) -> str:
        return f"UpstreamClient(name={self.name!r}, api_root={self._api_root!r})"

    @property
    def protocol(self) -> str:
        return "dujiao"

    async def ping(self, *, priority: Priority = Priority.PING) -> PingResult:
        """Connectivity check: site, protocol version, the API user's balance and member level."""
        answer = await self._send(_Call("ping", "POST", "/ping", priority))
        offset = clock_offset(self._clock(), answer.server_date)
        body = {**answer.body, "latency_ms": round(answer.seconds * 1000, 1), "clock_offset_seconds": offset}
        return self._model(PingResult, body, "ping")

    async def categories(self, *, priority: Priority = Priority.CATALOG) -> list[Category]:
        """Every category."""
        answer = await self._send(_Call("categories", "GET", "/categories", priority))
        items = answer.body.get("categories")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise self._protocol_error("categories", "categories is not a list")
        return [self._model(Category, item, "categories") for item in items]

    async def products(
        self, page: int = 1, page_size: int = 20, *, priority: Priority = Priority.CATALOG
    ) -> ProductPage:
        """One page of products, asked with ``include_inactive=true`` (see :meth:`catalog_page`); the answer
        says which page size the upstream actually used and whether it lists inactive products too."""
        if page < 1 or not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page must be at least 1 and page_size 1 to {MAX_PAGE_SIZE}")
        query = {"page": str(page), "page_size": str(page_size), **INCLUDE_INACTIVE}
        answer = await self._send(_Call("products", "GET", "/products", priority, query=query))
        return self._model(ProductPage, answer.body, "products")

    async def catalog_categories(self, *, priority: Priority = Priority.CATALOG) -> list[dict[str, Any]]:
        """Every category as decoded JSON, each checked to be an object with an integer ``id``."""
        answer = await self._send(_Call("categories", "GET", "/categories", priority))
        items = answer.body.get("categories")
        if items is None:
            return []
        if not isinstance(items, list):
            raise self._protocol_error("categories", "categories is not a list")
        for index, item in enumerate(items):
            self._check_entity("categories", item, f"categories[{index}]")
        return items

    @overload
    async def catalog_page(
        self,
        page: int = ...,
        page_size: int = ...,
        *,
        updated_after: datetime | None = ...,
        priority: Priority = ...,
        seen: None = ...,
    ) -> CatalogPage: ...

    @overload
    async def catalog_page(
        self,
        page: int = ...,
        page_size: int = ...,
        *,
        updated_after: datetime | None = ...,
        priority: Priority = ...,
        seen: Container[bytes],
    ) -> CatalogPage | SeenPage: ...

    async def catalog_page(
        self,
        page: int = 1,
        page_size: int = 20,
        *,
        updated_after: datetime | None = None,
        priority: Priority = Priority.CATALOG,
        seen: Container[bytes] | None = None,
    ) -> CatalogPage | SeenPage:
        """One page of products as decoded JSON (parsed once, amounts exact), for the mirror;
        ``updated_after`` asks for products updated since then only (upstreams may ignore it).

        Every page is asked with ``include_inactive=true``, as Dujiao-Next's own downstream asks: a site that
        serves it lists the products it took off sale too (``is_active: false``) and says so in
        ``includes_inactive`` (:attr:`CatalogPage.includes_inactive`); a site that does not ignores it.

        With ``seen`` (SHA-256 digests of earlier success bodies) the page carries its body's digest, and a
        success body whose digest is in ``seen`` is not decoded at all: the answer is a :class:`SeenPage`."""
        if page < 1 or not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page must be at least 1 and page_size 1 to {MAX_PAGE_SIZE}")
        query = {"page": str(page), "page_size": str(page_size), **INCLUDE_INACTIVE}
        if updated_after is not None:
            query["updated_after"] = rfc3339(updated_after)
        call = _Call("products", "GET", "/products", priority, query=query, decode=loads_listing, seen=seen)
        answer = await self._send(call)
        if answer.seen:
            return SeenPage(answer.body_digest)
        body = answer.body
        numbers = {}
        for name in ("total", "page", "page_size"):
            value = body.get(name)
            if type(value) is not int or value < 0:
                raise self._protocol_error("products", f"{name} is not a non-negative integer")
            numbers[name] = value
        items = body.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise self._protocol_error("products", "items is not a list")
        for index, item in enumerate(items):
            self._check_entity("products", item, f"items[{index}]")
            skus = item.get("skus")
            if skus is None:
                continue
            if not isinstance(skus, list):
                raise self._protocol_error("products", f"items[{index}].skus is not a list")
            for position, sku in enumerate(skus):
                self._check_entity("products", sku, f"items[{index}].skus[{position}]")
        echo = body.get("includes_inactive")
        return CatalogPage(
            items,
            numbers["total"],
            numbers["page"],
            numbers["page_size"],
            answer.body_digest,
            echo if isinstance(echo, bool) else None,
        )

    def _check_entity(self, endpoint: str, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise self._protocol_error(endpoint, f"{where} is not an object")
        identity = item.get("id")
        if type(identity) is not int or not 0 <= identity < 2**63:
            raise self._protocol_error(endpoint, f"{where}.id is not a non-negative integer")

    async def product(self, product_id: int, *, priority: Priority = Priority.CATALOG) -> Product:
        """One product with its SKUs (``is_active`` may be false)."""
        answer = await self._send(_Call("product", "GET", f"/products/{int(product_id)}", priority))
        return self._model(Product, answer.body.get("product"), "product")

    async def create_order(
        self, request: CreateOrderRequest, *, priority: Priority = Priority.ORDER
    ) -> OrderCreated:
        """Create and pay a procurement order; :class:`PaymentFailed` when the wallet payment failed."""
        call = _Call("orders.create", "POST", "/orders", priority, body=request.body())
        answer = await self._send(call)
        return self._model(OrderCreated, answer.body, "orders.create")

    async def get_order(self, order_id: int, *, priority: Priority = Priority.POLL) -> UpstreamOrder:
        """The order's current status, and its delivery once delivered."""
        answer = await self._send(_Call("orders.get", "GET", f"/orders/{int(order_id)}", priority))
        return self._model(UpstreamOrder, answer.body, "orders.get")

    async def cancel_order(self, order_id: int, *, priority: Priority = Priority.ORDER) -> CancelResult:
        """Cancel an order; ``cancel_not_allowed`` (a :class:`BusinessError`) when it is past that."""
        call = _Call("orders.cancel", "POST", f"/orders/{int(order_id)}/cancel", priority)
        answer = await self._send(call)
        return self._model(CancelResult, answer.body, "orders.cancel")

    async def _send(self, call: _Call) -> _Answer:
        self._check_open()
        if self._settings.protocol != "dujiao":
            # Nothing is sent: this client speaks seed 000 only (acg-faka: procurd.protocol.acgfaka).
            raise UpstreamError(
                f"this upstream speaks {self._settings.protocol}, not the Dujiao-Next API this call needs",
                code="wrong_protocol",
                upstream=self.name,
                endpoint=call.endpoint,
            )
        return await self._observed(call.endpoint, call.priority, partial(self._exchange, call))

    async def _exchange(self, call: _Call, started: float) -> _Answer:
        session = self._open_session()
        path = self._path_root + call.path
        headers = signed_headers(
            self._header_names,
            self._settings.api_key,
            self._settings.secret(),
            call.method,
            path,
            int(self._clock()),
            call.body,
        )
        headers["Accept"] = "application/json"
        if call.method != "GET":
            headers["Content-Type"] = "application/json"
        status: int | None = None
        digest = b""
        server_date: str | None = None
        try:
            async with session.request(
                call.method,
                self._api_root + call.path,
                params=call.query,
                data=call.body if call.method != "GET" else None,
                headers=headers,
                allow_redirects=False,
            ) as response:
                status = response.status
                server_date = response.headers.get("Date")
                raw = await response.read()
                if call.seen is not None:
                    digest = hashlib.sha256(raw).digest()
                    if 200 <= status < 300 and digest in call.seen:
                        return _Answer({}, time.perf_counter() - started, digest, seen=True)
                result = classify_response(
                    http_status=response.status,
                    body=raw,
                    upstream=self.name,
                    endpoint=call.endpoint,
                    content_type=response.headers.get("Content-Type"),
                    retry_after=response.headers.get("Retry-After"),
                    server_date=server_date,
                    local_time=self._clock(),
                    header_prefix=self._settings.header_prefix,
                    sensitive=(self._settings.secret(), headers[self._header_names.signature]),
                    decode=call.decode,
                )
        except TimeoutError:
            raise UpstreamTimeout(
                f"no complete answer within {self._settings.timeout_seconds:g} s",
                upstream=self.name,
                endpoint=call.endpoint,
                http_status=status,
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            # A connector error happens before the request goes out (a reused connection never raises it).
            failure = ConnectFailed if isinstance(exc, aiohttp.ClientConnectorError) else TransportError
            raise failure(
                describe_transport_failure(exc),
                upstream=self.name,
                endpoint=call.endpoint,
                http_status=status,
            ) from None
        finally:
            seconds = time.perf_counter() - started
            self._log.debug(
                "upstream.request",
                method=call.method,
                path=path,
                status=status,
                ms=round(seconds * 1000, 1),
            )
        if isinstance(result, UpstreamError):
            raise result
        return _Answer(result, seconds, digest, server_date=server_date)

    def _model(self, model: type[ModelT], data: Any, endpoint: str) -> ModelT:
        if not isinstance(data, dict):
            raise self._protocol_error(endpoint, f"expected an object for {model.__name__}")
        fields = {key: value for key, value in data.items() if key != "ok"}
        try:
            return model.model_validate(fields)
        except ValidationError as exc:
            raise self._protocol_error(endpoint, _describe_validation(model, exc)) from None


def _describe_validation(model: type[UpstreamModel], exc: ValidationError) -> str:
    found = problems(exc, root="(body)")
    suffix = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return truncate(f"invalid {model.__name__}: {'; '.join(found[:3])}{suffix}")
