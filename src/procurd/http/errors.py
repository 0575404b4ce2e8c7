"""JSON answers and the error handling shared by procurd's two HTTP listeners.

No route ever answers with aiohttp's HTML error pages or a traceback: every failure, including unknown paths
and methods and bodies that are too large, becomes a JSON body. Unexpected exceptions are logged with their
traceback and answered with a fixed ``internal error`` text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from procurd.db.errors import DatabaseUnavailable
from procurd.metrics import Metrics
from procurd.runtime import Runtime

log = structlog.get_logger("procurd.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ErrorBody = Callable[[int, str, str], dict[str, Any]]

MAX_BODY_BYTES = 1024 * 1024
REQUEST_ID_HEADER = "X-Request-Id"
HEALTH_PATH = "/healthz"
RUNTIME = web.AppKey("procurd.runtime", Runtime)

# aiohttp's own HTTP errors (unknown path, wrong method, body too large ...) as error codes.
HTTP_ERROR_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


class ApiError(Exception):
    """A failure answer: HTTP status, error code, a message for a person, and extra fields."""

    def __init__(
        self, status: int, code: str, message: str, *, headers: Mapping[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.extra = extra


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(data: Any) -> str:
    """Compact JSON; exact decimals as their text."""
    return json.dumps(data, default=_default, ensure_ascii=False, separators=(",", ":"))


def json_response(
    data: Mapping[str, Any], status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        text=dumps(data), status=status, content_type="application/json", charset="utf-8", headers=headers
    )


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers (both listeners)."""
    return json_response({"ok": True})


def admin_error_body(status: int, code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error_code": code, "error_message": message}


def public_error_body(status: int, code: str, message: str) -> dict[str, Any]:
    # Seed 000 4.8: the receiver answers {ok: false, message: REASON}; error_code is procurd's addition.
    return {"ok": False, "error_code": code, "message": message}


def error_response(error: ApiError, body: ErrorBody) -> web.Response:
    data = body(error.status, error.code, error.message)
    data.update(error.extra)
    return json_response(data, error.status, error.headers)


def route_name(request: web.Request) -> str:
    """The matched route's template (``/api/v1/orders/{order_no}``), never the raw path."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def error_middleware(
    listener: str, body: ErrorBody, metrics: Metrics, *, database_unavailable_status: int = 500
) -> Middleware:
    """A middleware that turns every failure into a JSON answer and counts every answer.

    A database that cannot be reached is answered ``database_unavailable_status`` (503 on the admin
    listener; the public listener answers every unexpected failure with 500 ``internal error``).
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request_id = request.headers.get(REQUEST_ID_HEADER, "")[:64] or uuid.uuid4().hex[:16]
        with structlog.contextvars.bound_contextvars(request_id=request_id, listener=listener):
            response = await _answer(request, handler, body, database_unavailable_status)
        response.headers[REQUEST_ID_HEADER] = request_id
        metrics.observe_http(listener, route_name(request), response.status)
        return response

    return middleware


async def _answer(
    request: web.Request, handler: Handler, body: ErrorBody, database_unavailable_status: int
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as error:
        return error_response(error, body)
    except web.HTTPException as http_error:
        if http_error.status < 400:
            raise
        code = HTTP_ERROR_CODES.get(http_error.status, "http_error")
        answer = error_response(ApiError(http_error.status, code, _http_error_text(http_error)), body)
        if http_error.status == 405:
            answer.headers["Allow"] = http_error.headers.get("Allow", "")
        return answer
    except DatabaseUnavailable as unavailable:
        # A known condition of the database, not a bug: its cause in one line, no traceback each time.
        log.error(
            "http.database_unavailable",
            method=request.method,
            route=route_name(request),
            reason=unavailable.reason,
        )
        if database_unavailable_status == 500:
            return error_response(ApiError(500, "internal_error", "internal error"), body)
        reason = f"database unavailable: {unavailable.reason}"
        return error_response(ApiError(database_unavailable_status, "database_unavailable", reason), body)
    except Exception:
        log.exception("http.internal_error", method=request.method, route=route_name(request))
        return error_response(ApiError(500, "internal_error", "internal error"), body)


def _http_error_text(error: web.HTTPException) -> str:
    if error.status == 404:
        return "no such path"
    if error.status == 405:
        return "method not allowed on this path"
    if error.status == 413:
        return f"the body is larger than {MAX_BODY_BYTES} bytes"
    return error.reason


def check_content_length(request: web.Request, limit: int = MAX_BODY_BYTES) -> None:
    """Refuse a declared body above ``limit`` before reading any of it."""
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, "payload_too_large", f"the body is larger than {limit} bytes")


async def read_body(request: web.Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The raw body, at most ``limit`` bytes (declared or streamed); 413 beyond."""
    check_content_length(request, limit)
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, "payload_too_large", f"the body is larger than {limit} bytes") from None
