"""The signed API under ``/api/v1/upstream`` as an aiohttp handler, over a site's :class:`Backend`.

A request goes through, in this order: routing (404 ``not_found``, 405 ``method_not_allowed`` with
``Allow``), the
backend's gate before authentication (a site that limits raw keys, as Dujiao-Next does), authentication
in the real sites' order (headers, timestamp, credential, body size, signature: 401/403 with seed 000's
codes), the backend's gate after it (a site that limits verified callers only), then the endpoint: queries
and bodies are read and checked here (400 ``bad_request`` naming the field), what they ask is the
backend's. Every answer carries the site's clock in ``Date``; a bug in a backend answers 500
``internal_error`` and is logged, never a traceback.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from email.utils import formatdate
from typing import Any, TypeGuard

import structlog
from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestPayloadError

from procurd.core.json_limits import text_problem
from procurd.protocol.dujiao.backend import (
    Backend,
    Caller,
    OrderSubmission,
    ProductQuery,
)
from procurd.protocol.dujiao.failures import (
    AUTH_FAILURE_STATUS,
    ErrorAnswer,
    auth_failure,
    bad_request,
    internal_error,
)
from procurd.protocol.dujiao.signing import HeaderNames, parse_timestamp, signature_matches, timestamp_fresh
from procurd.protocol.web import (
    BodyTooLarge,
    ClientGone,
    LengthUnknown,
    json_response,
    raw_json_response,
    read_bounded,
    unknown_length_text,
)

API_PREFIX = "/api/v1/upstream"
PROTOCOL_VERSION = "1.0"
MAX_QUERY_ID = 2**63 - 1

log = structlog.get_logger("procurd.protocol")


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
ENDPOINTS = tuple(route.endpoint for route in ROUTES)


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


def allowed_methods(subpath: str) -> list[str]:
    """The methods the API takes at ``subpath`` (a 405's ``Allow``)."""
    return [route.method for route in ROUTES if route.pattern.fullmatch(subpath)]


def listing_answer(
    items: Sequence[bytes], total: int, page: int, page_size: int, includes_inactive: bool | None = None
) -> bytes:
    """``GET /products``'s answer: the serialized products, how many match in all, the page asked for, and
    (unless ``None``) ``includes_inactive``: whether inactive products are listed too."""
    echo = "" if includes_inactive is None else f',"includes_inactive":{str(includes_inactive).lower()}'
    tail = f'],"total":{total},"page":{page},"page_size":{page_size}{echo}}}'.encode()
    return b"".join((b'{"ok":true,"items":[', b",".join(items), tail))


def accepts_gzip(request: web.Request) -> bool:
    """Whether the client's ``Accept-Encoding`` takes gzip (a weight of 0 refuses it)."""
    for part in request.headers.get(hdrs.ACCEPT_ENCODING, "").split(","):
        coding, _, weight = part.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            return weight.replace(" ", "").lower() not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


def gzip_json_response(request: web.Request, compressed: bytes) -> web.Response:
    """An answer kept gzip-compressed: sent as it is to a client that takes gzip, decompressed otherwise."""
    if accepts_gzip(request):
        response = raw_json_response(compressed)
        response.headers[hdrs.CONTENT_ENCODING] = "gzip"
    else:
        response = raw_json_response(gzip.decompress(compressed))
    response.headers[hdrs.VARY] = hdrs.ACCEPT_ENCODING
    return response


def rate_limited_response(
    request_id: str, retry_after: float | None = None, status: int = 200
) -> web.Response:
    """The answer the real sites give a key over its limit: their storefront envelope, with HTTP 200 (sites
    before July 2026) or ``status`` (429 since)."""
    response = json_response(
        {"status_code": 429, "msg": "too many requests", "data": {"request_id": request_id}}, status
    )
    if retry_after is not None:
        response.headers[hdrs.RETRY_AFTER] = str(max(1, round(retry_after)))
    return response


def parse_instant(text: str) -> datetime | None:
    """An ISO 8601 / RFC 3339 timestamp with a time zone (``Z`` or an offset); None for anything else."""
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        return None
    return instant if instant.tzinfo is not None else None


def _path_id(params: Mapping[str, str], what: str) -> int:
    raw = params.get("id", "")
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


def _optional_text(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string")
    return value


def _not_json(constant: str) -> Any:
    """``NaN`` and ``Infinity`` are not JSON (RFC 8259), whatever Python's reader lets through."""
    raise ValueError(f"{constant} is not JSON")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class SignedApi:
    """The seven endpoints of one site, served from its :class:`Backend` (mount :meth:`dispatch` at
    ``/api/v1/upstream{tail}``)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._names = HeaderNames.for_prefix(backend.header_prefix)
        self._handlers: dict[
            str, Callable[[web.Request, Caller, dict[str, str], bytes], Awaitable[web.Response]]
        ] = {
            "ping": self._ping,
            "categories": self._categories,
            "products": self._products,
            "product": self._product,
            "orders.create": self._create_order,
            "orders.get": self._get_order,
            "orders.cancel": self._cancel_order,
        }

    def header_names(self) -> HeaderNames:
        if self._names.api_key != f"{self.backend.header_prefix}-Api-Key":
            self._names = HeaderNames.for_prefix(self.backend.header_prefix)
        return self._names

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        route, params, path_known = match_route(request.path[len(API_PREFIX) :], request.method)
        endpoint = route.endpoint if route else None
        caller: Caller | None = None
        outcome = "ok"
        try:
            if route is None:
                await self.backend.unrouted(request, lambda: self.signed(request))
                if path_known:
                    raise ErrorAnswer(405, "method_not_allowed", f"{request.method} is not allowed here")
                raise ErrorAnswer(404, "not_found", "no such endpoint")
            response, caller, outcome = await self._handle(request, route, params)
        except ErrorAnswer as error:
            response = json_response(error.body(), error.status)
            if error.status in (408, 413):
                response.force_close()  # what is left of the body is not read: it would be the next request
            if error.status == 405:
                response.headers[hdrs.ALLOW] = ", ".join(allowed_methods(request.path[len(API_PREFIX) :]))
            outcome = error.code
        except ClientGone:  # nobody is left to read an answer: one line, no traceback
            log.info("protocol.client_disconnected", path=request.path, endpoint=endpoint)
            gone = ErrorAnswer(499, "client_closed_request", "the client closed the connection")
            response = json_response(gone.body(), gone.status)
            outcome = gone.code
        except Exception:  # any bug becomes the API's own 500 body, and is logged
            log.exception("protocol.request_failed", path=request.path, endpoint=endpoint)
            response = json_response(internal_error().body(), 500)
            outcome = "internal_error"
        response.headers[hdrs.DATE] = formatdate(self.backend.now(), usegmt=True)
        self.backend.answered(request, endpoint, caller, response.status, outcome)
        return response

    async def _handle(
        self, request: web.Request, route: Route, params: dict[str, str]
    ) -> tuple[web.Response, Caller | None, str]:
        """The answer, the caller once known, and the outcome (``ok``, an error code, ``rate_limited``)."""
        backend = self.backend
        endpoint = route.endpoint
        api_key = request.headers.get(self.header_names().api_key, "").strip()
        early = await backend.before_authentication(request, endpoint, api_key)
        if early is not None:
            return early, None, "rate_limited"
        try:
            caller, body = await self.authenticate(request)
        except ErrorAnswer as error:
            if error.code in AUTH_FAILURE_STATUS:
                backend.authentication_failed(request, endpoint, api_key, error)
            raise
        early = await backend.after_authentication(request, endpoint, caller)
        if early is not None:
            return early, caller, "rate_limited"
        instead = await backend.around(request, endpoint)
        if instead is not None:
            return instead, caller, "fault"
        outcome = "ok"
        try:
            response = await self._handlers[endpoint](request, caller, params, body)
        except ErrorAnswer as error:
            response = json_response(error.body(), error.status)
            outcome = error.code
        return await backend.after(request, endpoint, response), caller, outcome

    async def authenticate(self, request: web.Request) -> tuple[Caller, bytes]:
        """The real sites' order: headers, timestamp, credential, body size, signature (the key's secret, or
        one of its previous secrets still in its overlap after a rotation)."""
        names = self.header_names()
        api_key = request.headers.get(names.api_key, "").strip()
        raw_timestamp = request.headers.get(names.timestamp, "").strip()
        signature = request.headers.get(names.signature, "").strip()
        if not api_key or not raw_timestamp or not signature:
            raise auth_failure("missing_auth_headers", "signature headers are missing")
        timestamp = parse_timestamp(raw_timestamp)
        if timestamp is None:
            raise auth_failure("invalid_timestamp", "timestamp is not a Unix time in seconds")
        if not timestamp_fresh(timestamp, self.backend.now()):
            raise auth_failure("timestamp_expired", "timestamp is outside the 60 second tolerance")
        credential = await self.backend.credential(api_key)
        if credential is None:
            raise auth_failure("invalid_api_key", "API key is invalid or disabled")
        if not credential.key_active:
            raise ErrorAnswer(
                self.backend.disabled_key_status, "invalid_api_key", "API key is invalid or disabled"
            )
        if not credential.user_active:
            raise auth_failure("user_disabled", "the user account is disabled")
        body = await self._read_body(request)
        path = request.raw_path.split("?", 1)[0]
        caller = Caller(api_key, credential.account)
        if signature_matches(credential.secret, request.method, path, raw_timestamp, body, signature):
            return caller, body
        now = self.backend.now()
        for previous in credential.previous:  # the overlap after a rotation
            if previous.valid_until > now and signature_matches(
                previous.secret, request.method, path, raw_timestamp, body, signature
            ):
                await self.backend.previous_secret_used(caller, previous)
                return caller, body
        raise auth_failure("invalid_signature", "signature check failed")

    async def signed(self, request: web.Request) -> bool:
        """Whether a request carries signature headers that verify for an active key (what a strict site
        checks of every request, whatever its path)."""
        try:
            await self.authenticate(request)
        except ErrorAnswer:
            return False
        return True

    async def _read_body(self, request: web.Request) -> bytes:
        """The body, decoded, at most the backend's ``max_body_bytes`` (declared, as sent or decoded): 413
        beyond, the rest left unread (see :mod:`procurd.protocol.web`)."""
        limit = self.backend.max_body_bytes
        deadline = self.backend.body_timeout_seconds
        try:
            async with asyncio.timeout(deadline):
                return await read_bounded(request, limit)
        except BodyTooLarge:
            raise ErrorAnswer(
                413, "request_too_large", f"request body is larger than {limit} bytes"
            ) from None
        except LengthUnknown:
            raise bad_request(unknown_length_text(limit)) from None
        except TimeoutError:
            raise ErrorAnswer(
                408, "request_timeout", f"the body did not arrive within {deadline:g} s"
            ) from None
        except RequestPayloadError:  # a Content-Encoding its bytes do not match, or broken framing
            raise bad_request(
                "the body cannot be read: its Content-Encoding or its framing is broken"
            ) from None
        except ConnectionError:
            raise ClientGone from None

    # -- endpoints --------------------------------------------------------------------------------------

    async def _ping(
        self, request: web.Request, caller: Caller, params: dict[str, str], body: bytes
    ) -> web.Response:
        fields = await self.backend.ping(caller)
        return json_response({"ok": True, "protocol_version": PROTOCOL_VERSION, **fields})

    async def _categories(
        self, request: web.Request, caller: Caller, params: dict[str, str], body: bytes
    ) -> web.Response:
        listed = await self.backend.categories(caller)
        return raw_json_response(b'{"ok":true,"categories":' + listed + b"}")

    async def _products(
        self, request: web.Request, caller: Caller, params: dict[str, str], body: bytes
    ) -> web.Response:
        query = self.product_query(request)
        page = await self.backend.products(caller, query)
        if page.gzip_answer is not None:
            return gzip_json_response(request, page.gzip_answer)
        answer = listing_answer(page.items, page.total, query.page, query.page_size, page.includes_inactive)
        return raw_json_response(answer)

    def product_query(self, request: web.Request) -> ProductQuery:
        """``page`` (from 1), ``page_size`` (the backend's clamp: :meth:`Backend.page_size`),
        ``category_id``, ``updated_after`` (RFC 3339; ignored by a site that does not honour it) and
        ``include_inactive`` (``true`` asks for inactive products too, as Dujiao-Next's own downstream
        does)."""
        page = max(1, _query_int(request, "page", 1))
        asked = _query_int(request, "page_size", 0) if request.query.get("page_size") else None
        page_size = self.backend.page_size(asked)
        category = request.query.get("category_id", "")
        category_id = None
        if category != "":
            if not (category.isascii() and category.isdigit()) or int(category) > MAX_QUERY_ID:
                raise bad_request("category_id must be a non-negative integer")
            category_id = int(category)
        updated_after = None
        raw = request.query.get("updated_after", "")
        if raw and self.backend.honours_updated_after:
            updated_after = parse_instant(raw)
            if updated_after is None:
                raise bad_request(
                    "updated_after must be an RFC 3339 timestamp such as 2026-01-02T15:04:05+08:00"
                )
        include_inactive = request.query.get("include_inactive") == "true"
        return ProductQuery(page, page_size, category_id, updated_after, include_inactive)

    async def _product(
        self, request: web.Request, caller: Caller, params: dict[str, str], body: bytes
    ) -> web.Response:
        product = await self.backend.product(caller, _path_id(params, "product"))
        return raw_json_response(b'{"ok":true,"product":' + product + b"}")

    async def _create_order(
        self, request: web.Request, caller: Caller, params: dict[str, str], body: bytes
    ) -> web.Response:
        try:
            payload = (
                json.loads(body, parse_float=Decimal, parse_constant=_not_json) if body.strip() else None
            )
        except (ValueError, RecursionError):
            raise bad_request("the body is not valid JSON") from None
        if not isinstance(payload, dict):
            raise bad_request("the body must be a JSON object")
        downstream_no = _optional_text(payload, "downstream_order_no")
        # A number no order can be stored under (a NUL, an unpaired surrogate) has no earlier order: the
        # backend's checks of the order say what is wrong with it.
        if downstream_no and text_problem(downstream_no) is None:
            existing = await self.backend.existing_order(caller, downstream_no)
            if existing is not None:
                return json_response(existing)
        submission = self.order_submission(payload, downstream_no)
        try:
            answer = await self.backend.create_order(caller, submission)
        except ErrorAnswer as error:
            if error.code == "payment_failed":  # the order exists, canceled: HTTP 200, as seed 000 says
                return json_response(error.body(), 200)
            raise
        return json_response(answer)

    @staticmethod
    def order_submission(payload: Mapping[str, Any], downstream_no: str | None) -> OrderSubmission:
        """The body's fields, each checked for its type (``bad_request`` naming the first that is not)."""
        sku_id = payload.get("sku_id")
        if not _is_int(sku_id) or not 0 <= sku_id <= MAX_QUERY_ID:
            raise bad_request("sku_id is required and must be an integer")
        quantity = payload.get("quantity")
        if not _is_int(quantity) or quantity < 1:
            raise bad_request("quantity is required and must be an integer of at least 1")
        form = payload.get("manual_form_data")
        if form is not None and not isinstance(form, dict):
            raise bad_request("manual_form_data must be an object")
        return OrderSubmission(
            sku_id=sku_id,
            quantity=quantity,
            manual_form_data=form,
            downstream_order_no=downstream_no or None,
            trace_id=_optional_text(payload, "trace_id"),
            callback_url=_optional_text(payload, "callback_url") or None,
        )

    async def _get_order(
        self, request: web.Request, caller: Caller, params: dict[str, str], body: bytes
    ) -> web.Response:
        return json_response(await self.backend.order(caller, _path_id(params, "order")))

    async def _cancel_order(
        self, request: web.Request, caller: Caller, params: dict[str, str], body: bytes
    ) -> web.Response:
        return json_response(await self.backend.cancel_order(caller, _path_id(params, "order")))
