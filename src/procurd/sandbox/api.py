"""The signed site-to-site API under ``/api/v1/upstream`` (seed 000, parts 4, 5 and 7)."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from email.utils import formatdate
from typing import Any

import structlog
from aiohttp import hdrs, web

from procurd.sandbox.catalog import dump_json, money_text, parse_instant
from procurd.sandbox.faults import AFTER_KINDS, BEFORE_KINDS, RequestFault
from procurd.sandbox.site import SandboxSite
from procurd.sandbox.state import ApiError, ApiUser, bad_request
from procurd.sandbox.traffic import UNKNOWN_ENDPOINT
from procurd.signing import HeaderNames, parse_timestamp, signature_matches, timestamp_fresh

API_PREFIX = "/api/v1/upstream"
PROTOCOL_VERSION = "1.0"
DEFAULT_PAGE_SIZE = 20
DRAIN_LIMIT_BYTES = 64 * 1024 * 1024  # an oversized body is read and thrown away up to here, then cut off

log = structlog.get_logger("procurd.sandbox")


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    endpoint: str


ROUTES = (
    Route("POST", re.compile(r"/ping"), "ping"),
    Route("GET", re.compile(r"/categories"), "categories"),
    Route("GET", re.compile(r"/products"), "products"),
    Route("GET", re.compile(r"/products/(?P<id>[^/]+)"), "product"),
    Route("POST", re.compile(r"/orders"), "orders.create"),
    Route("GET", re.compile(r"/orders/(?P<id>[^/]+)"), "orders.get"),
    Route("POST", re.compile(r"/orders/(?P<id>[^/]+)/cancel"), "orders.cancel"),
)


def match_route(subpath: str, method: str) -> tuple[Route | None, dict[str, str], bool]:
    """The route for ``method subpath``, its path parameters, and whether the path exists at all."""
    path_known = False
    for route in ROUTES:
        found = route.pattern.fullmatch(subpath)
        if found is None:
            continue
        path_known = True
        if route.method == method:
            return route, found.groupdict(), True
    return None, {}, path_known


@dataclass
class ApiCall:
    request: web.Request
    endpoint: str
    user: ApiUser
    body: bytes
    params: dict[str, str] = field(default_factory=dict)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=dump_json(data), status=status, content_type="application/json", charset="utf-8")


def raw_json_response(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json", charset="utf-8")


def abort_connection(request: web.Request) -> web.Response:
    """Close the connection without an answer (the returned response is never written)."""
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=500)


def _path_id(call: ApiCall, what: str) -> int:
    raw = call.params.get("id", "")
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise bad_request(f"{what} id must be a positive integer")
    return int(raw)


def _query_int(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise bad_request(f"{name} must be an integer") from None


class SignedApi:
    """Routing, authentication, rate limit and fault knobs around the seven endpoints."""

    def __init__(self, site: SandboxSite) -> None:
        self.site = site
        self.state = site.state
        self.config = site.config
        self.faults = site.faults
        self._handlers: dict[str, Callable[[ApiCall], Awaitable[web.Response]]] = {
            "ping": self.ping,
            "categories": self.categories,
            "products": self.products,
            "product": self.product,
            "orders.create": self.create_order,
            "orders.get": self.get_order,
            "orders.cancel": self.cancel_order,
        }

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        started = asyncio.get_running_loop().time()
        route, params, path_known = match_route(request.path[len(API_PREFIX) :], request.method)
        try:
            response = await self._handle(request, route, params, path_known)
        except ApiError as error:
            response = json_response(error.body(), error.status)
        except Exception:  # any bug becomes the API's own 500 body, and is logged
            log.exception("sandbox.request_failed", path=request.path)
            response = json_response(ApiError(500, "internal_error", "internal server error").body(), 500)
        # The site's own clock, offset included, as a real site's Date header shows it.
        response.headers[hdrs.DATE] = formatdate(self.state.now(), usegmt=True)
        log.debug(
            "sandbox.request",
            method=request.method,
            path=request.path,
            endpoint=route.endpoint if route else None,
            status=response.status,
            api_key=request.headers.get(self._names().api_key),
            duration_ms=round((asyncio.get_running_loop().time() - started) * 1000, 2),
        )
        return response

    def _names(self) -> HeaderNames:
        return HeaderNames.for_prefix(self.config.header_prefix)

    async def _handle(
        self, request: web.Request, route: Route | None, params: dict[str, str], path_known: bool
    ) -> web.Response:
        api_key = request.headers.get(self._names().api_key, "").strip()
        if route is None:
            self.site.record_request(UNKNOWN_ENDPOINT, api_key, False, await self._signed(request))
            if path_known:
                raise ApiError(405, "method_not_allowed", f"{request.method} is not allowed here")
            raise ApiError(404, "not_found", "no such endpoint")
        endpoint = route.endpoint
        rate_limited = self.config.rate_limit and bool(api_key) and not self._rate_limit_allows(api_key)
        if rate_limited:
            self.site.record_request(endpoint, api_key, rate_limited)
            return json_response(
                {"status_code": 429, "msg": "too many requests", "data": {"request_id": uuid.uuid4().hex}}
            )
        try:
            user, body = await self.authenticate(request)
        except ApiError:
            self.site.record_request(endpoint, api_key, False, authenticated=False)
            raise
        self.site.record_request(endpoint, api_key, False, authenticated=True)
        early = await self._before(request, endpoint)
        if early is not None:
            return early
        call = ApiCall(request, endpoint, user, body, params)
        try:
            response = await self._handlers[endpoint](call)
        except ApiError as error:
            response = json_response(error.body(), error.status)
        after = self.faults.take(endpoint, AFTER_KINDS)
        if after is None:
            return response
        if after.kind == "drop":
            return abort_connection(request)
        return json_response(ApiError(500, "internal_error", "internal server error").body(), 500)

    async def _signed(self, request: web.Request) -> bool:
        """Whether a request carries signature headers that verify for an active key (what a strict site
        checks of every request, whatever its path)."""
        try:
            await self.authenticate(request)
        except ApiError:
            return False
        return True

    def _rate_limit_allows(self, api_key: str) -> bool:
        return self.site.rate_limiter.allow(
            api_key,
            self.config.rate_limit_requests,
            self.config.rate_limit_window_seconds,
            self.config.rate_limit_block_seconds,
        )

    async def _before(self, request: web.Request, endpoint: str) -> web.Response | None:
        """Apply the knobs that act before the work: delay, then fail, hang or malformed."""
        delay = self.faults.take(endpoint, ("delay",))
        if delay is not None and await self.site.wait_closing(delay.seconds):
            return abort_connection(request)
        fault = self.faults.take(endpoint, BEFORE_KINDS)
        if fault is None:
            return None
        return await self._apply_before(request, fault)

    async def _apply_before(self, request: web.Request, fault: RequestFault) -> web.Response:
        if fault.kind == "hang":
            await self.site.wait_closing(None)
            return abort_connection(request)
        if fault.kind == "malformed":
            return web.Response(
                body=fault.body, status=fault.status, headers={"Content-Type": fault.content_type}
            )
        message = "too many requests" if fault.status == 429 else "injected failure"
        return json_response(ApiError(fault.status, fault.error_code, message).body(), fault.status)

    async def authenticate(self, request: web.Request) -> tuple[ApiUser, bytes]:
        """Check order of the real sites: headers, timestamp, credential, body size, signature."""
        names = self._names()
        api_key = request.headers.get(names.api_key, "").strip()
        raw_timestamp = request.headers.get(names.timestamp, "").strip()
        signature = request.headers.get(names.signature, "").strip()
        if not api_key or not raw_timestamp or not signature:
            raise ApiError(401, "missing_auth_headers", "signature headers are missing")
        timestamp = parse_timestamp(raw_timestamp)
        if timestamp is None:
            raise ApiError(401, "invalid_timestamp", "timestamp is not a Unix time in seconds")
        if not timestamp_fresh(timestamp, self.state.now()):
            raise ApiError(401, "timestamp_expired", "timestamp is outside the 60 second tolerance")
        user = self.state.users.get(api_key)
        if user is None or not user.key_active:
            raise ApiError(403, "invalid_api_key", "API key is invalid or disabled")
        if not user.user_active:
            raise ApiError(403, "user_disabled", "the user account is disabled")
        body = await self._read_body(request)
        path = request.raw_path.split("?", 1)[0]
        if not signature_matches(user.api_secret, request.method, path, raw_timestamp, body, signature):
            raise ApiError(401, "invalid_signature", "signature check failed")
        return user, body

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        too_large = ApiError(413, "request_too_large", f"request body is larger than {limit} bytes")
        declared = request.content_length
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > DRAIN_LIMIT_BYTES:
                break
            if size <= limit and (declared is None or declared <= limit):
                chunks.append(chunk)
        if size > limit or (declared is not None and declared > limit):
            raise too_large
        return b"".join(chunks)

    # -- endpoints --------------------------------------------------------------------------------------

    async def ping(self, call: ApiCall) -> web.Response:
        user = call.user
        return json_response(
            {
                "ok": True,
                "site_name": self.config.site_name,
                "protocol_version": PROTOCOL_VERSION,
                "user_id": user.user_id,
                "balance": money_text(user.balance),
                "currency": self.config.currency,
                "member_level": user.member_level,
            }
        )

    async def categories(self, call: ApiCall) -> web.Response:
        categories = [self.state.categories[key].to_dict() for key in sorted(self.state.categories)]
        return json_response({"ok": True, "categories": categories})

    async def products(self, call: ApiCall) -> web.Response:
        page = max(1, _query_int(call.request, "page", 1))
        page_size = _query_int(call.request, "page_size", DEFAULT_PAGE_SIZE)
        if page_size < 1:
            page_size = DEFAULT_PAGE_SIZE
        page_size = min(page_size, self.config.page_size_max)
        updated_after = self._updated_after(call.request)
        listed = self.faults.listing(self.state.active_products())
        if updated_after is not None:
            listed = [product for product in listed if product.updated_instant() >= updated_after]
        start = (page - 1) * page_size
        items = b",".join(product.listing_json() for product in listed[start : start + page_size])
        tail = f'],"total":{len(listed)},"page":{page},"page_size":{page_size}}}'.encode()
        return raw_json_response(b'{"ok":true,"items":[' + items + tail)

    def _updated_after(self, request: web.Request) -> datetime | None:
        """The ``updated_after`` instant asked for; None when absent or when the site ignores it."""
        raw = request.query.get("updated_after", "")
        if not raw or not self.config.honour_updated_after:
            return None
        instant = parse_instant(raw)
        if instant is None:
            raise bad_request("updated_after must be an RFC 3339 timestamp such as 2026-01-02T15:04:05+08:00")
        return instant

    async def product(self, call: ApiCall) -> web.Response:
        product = self.state.visible_product(_path_id(call, "product"))
        if product is None:
            raise ApiError(404, "product_not_found", "product not found")
        if not product.is_active and self.config.inactive_product_detail == "404":
            raise ApiError(404, "product_unavailable", "product is inactive")
        return raw_json_response(b'{"ok":true,"product":' + product.detail_json() + b"}")

    async def create_order(self, call: ApiCall) -> web.Response:
        try:
            payload = json.loads(call.body, parse_float=Decimal) if call.body.strip() else None
        except (ValueError, RecursionError):
            raise bad_request("the body is not valid JSON") from None
        if payload is None:
            raise bad_request("the body must be a JSON object")
        flags = self.faults.new_order_flags()
        result = self.state.create_order(call.user.api_key, payload, flags)
        self.faults.used_new_order_flags(result.used_pending_payment, result.used_hold_delivery)
        order = result.order
        if result.created:
            self.site.order_created(order)
        if result.payment_failed:
            return json_response(
                {
                    "ok": False,
                    "order_id": order.order_id,
                    "order_no": order.order_no,
                    "status": order.status,
                    "error_code": "payment_failed",
                    "error_message": "wallet payment failed: the balance is too low",
                }
            )
        return json_response(order.summary())

    async def get_order(self, call: ApiCall) -> web.Response:
        order = self.state.find_order(call.user.api_key, _path_id(call, "order"))
        return json_response(order.to_api())

    async def cancel_order(self, call: ApiCall) -> web.Response:
        order = self.state.cancel_order(call.user.api_key, _path_id(call, "order"))
        return json_response(
            {"ok": True, "order_id": order.order_id, "order_no": order.order_no, "status": order.status}
        )
