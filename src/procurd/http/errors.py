"""JSON answers and the error handling shared by procurd's two HTTP listeners.

No route ever answers with aiohttp's HTML or plain-text error pages or a traceback: every failure, including
unknown paths and methods, bodies that are too large, slow or cannot be decoded, and requests the HTTP parser
refuses, becomes the listener's JSON error body. A client's mistake is logged as one line; only unexpected
exceptions are logged with their traceback (and answered with a fixed ``internal error`` text).

Time limits: a connection whose request headers have not all arrived within ``[server]
header_timeout_seconds`` of its opening (or of the previous answer on it) is closed; a body that has not
arrived within ``body_timeout_seconds`` is answered 408 and the connection closed.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import http_exceptions, web
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestPayloadError

from procurd.config import ServerSettings
from procurd.core.refusals import Refused
from procurd.metrics import Metrics
from procurd.operations import DatabaseUnavailable, Operations
from procurd.operations.runtime import Runtime
from procurd.protocol.web import (
    BodyTooLarge,
    ClientGone,
    LengthUnknown,
    json_response,
    read_bounded,
    unknown_length_text,
)

log = structlog.get_logger("procurd.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ErrorBody = Callable[[int, str, str], dict[str, Any]]

MAX_BODY_BYTES = 1024 * 1024
REQUEST_ID_HEADER = "X-Request-Id"
HEALTH_PATH = "/healthz"
RUNTIME = web.AppKey("procurd.runtime", Runtime)
OPERATIONS = web.AppKey("procurd.operations", Operations)

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


class ApiError(Refused):
    """A failure answer: HTTP status, error code, a message for a person, extra fields, and what the HTTP
    answer needs besides (headers, closing the connection)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        close_connection: bool = False,
        **extra: Any,
    ) -> None:
        super().__init__(status, code, message, **extra)
        self.headers = dict(headers or {})
        self.close_connection = close_connection


# The status counted for a request whose client went away (nginx's "client closed request").
CLIENT_CLOSED_REQUEST = 499


@dataclass(frozen=True)
class Listener:
    """What the edge of one listener needs: its name, error body, metrics and time limits."""

    name: str
    error_body: ErrorBody
    metrics: Metrics
    header_timeout_seconds: float
    body_timeout_seconds: float


LISTENER = web.AppKey("procurd.listener", Listener)


def listener_app(
    name: str,
    body: ErrorBody,
    metrics: Metrics,
    server: ServerSettings,
    *,
    database_unavailable_status: int = 500,
    middlewares: tuple[Middleware, ...] = (),
) -> web.Application:
    """An application for one listener: the error middleware first, then ``middlewares``; serve it with
    :func:`listener_runner`."""
    app = web.Application(
        client_max_size=MAX_BODY_BYTES,
        middlewares=[
            error_middleware(name, body, metrics, database_unavailable_status=database_unavailable_status),
            *middlewares,
        ],
    )
    app[LISTENER] = Listener(name, body, metrics, server.header_timeout_seconds, server.body_timeout_seconds)
    return app


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers (both listeners)."""
    return json_response({"ok": True})


def admin_error_body(status: int, code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error_code": code, "error_message": message}


def public_error_body(status: int, code: str, message: str) -> dict[str, Any]:
    # Seed 000 4.8: the receiver answers {ok: false, message: REASON}; error_code is procurd's addition.
    return {"ok": False, "error_code": code, "message": message}


def error_response(error: Refused, body: ErrorBody) -> web.Response:
    """The answer to a refusal (an operation's, or the HTTP layer's own :class:`ApiError`)."""
    data = body(error.status, error.code, error.message)
    data.update(error.extra)
    headers = error.headers if isinstance(error, ApiError) else None
    response = json_response(data, error.status, headers)
    if isinstance(error, ApiError) and error.close_connection:
        response.force_close()
    return response


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
        request_id = request.headers.get(REQUEST_ID_HEADER, "")[:64] or os.urandom(8).hex()
        with structlog.contextvars.bound_contextvars(request_id=request_id, listener=listener):
            response = await _answer(request, handler, body, database_unavailable_status)
        if not request.content.is_eof():
            # Answered before its body was read (refused, or not needed): the rest is never read or
            # decompressed, and the connection ends with the answer (the runner lingers for nothing).
            response.force_close()
        response.headers[REQUEST_ID_HEADER] = request_id
        metrics.observe_http(listener, route_name(request), response.status)
        return response

    return middleware


async def _answer(
    request: web.Request, handler: Handler, body: ErrorBody, database_unavailable_status: int
) -> web.StreamResponse:
    try:
        return await handler(request)
    except Refused as error:
        return error_response(error, body)
    except ClientGone:
        log.info("http.client_disconnected", method=request.method, route=route_name(request))
        gone = ApiError(CLIENT_CLOSED_REQUEST, "client_closed_request", "the client closed the connection")
        return error_response(gone, body)
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
            detail=unavailable.detail,
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
        raise ApiError(
            413, "payload_too_large", f"the body is larger than {limit} bytes", close_connection=True
        )


async def read_body(request: web.Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The raw body, at most ``limit`` bytes (declared, as sent, or decoded from its ``Content-Encoding``):
    413 beyond, with the rest left unread, 400 when its ``Content-Encoding`` cannot be decoded, its framing
    is broken or it is compressed without a ``Content-Length``, 408 when it is slower than the listener's
    ``body_timeout_seconds``; :class:`ClientGone` when the client hung up meanwhile."""
    check_content_length(request, limit)
    listener = request.app.get(LISTENER)
    deadline = listener.body_timeout_seconds if listener is not None else None
    try:
        async with asyncio.timeout(deadline):
            return await read_bounded(request, limit)
    except BodyTooLarge:
        raise ApiError(
            413, "payload_too_large", f"the body is larger than {limit} bytes", close_connection=True
        ) from None
    except LengthUnknown:
        raise ApiError(400, "bad_request", unknown_length_text(limit), close_connection=True) from None
    except TimeoutError:
        raise ApiError(
            408, "request_timeout", f"the body did not arrive within {deadline:g} s", close_connection=True
        ) from None
    except RequestPayloadError as exc:
        raise body_refusal(request, exc) from None
    except ConnectionError:
        raise ClientGone from None


KNOWN_ENCODINGS = frozenset({"gzip", "deflate", "br", "zstd", "identity"})


def body_refusal(request: web.Request, exc: RequestPayloadError) -> ApiError:
    """The 400 for a body aiohttp could not read: undecodable ``Content-Encoding`` or broken framing."""
    cause = exc.__cause__
    if isinstance(cause, http_exceptions.ContentEncodingError):
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        named = f" ({encoding})" if encoding in KNOWN_ENCODINGS else ""
        return ApiError(
            400, "bad_content_encoding", f"the body cannot be decoded as its Content-Encoding{named} says"
        )
    return ApiError(400, "bad_request", "the body is malformed (its length or chunked framing is broken)")


# --- the connection level ---------------------------------------------------------------------------------

# Why aiohttp's HTTP parser refused a request, by the exception it raised (most specific first).
PARSER_REFUSALS: tuple[tuple[type[Exception], str, str], ...] = (
    (http_exceptions.ContentEncodingError, "bad_content_encoding",
     "the Content-Encoding cannot be decoded here (gzip and deflate can)"),
    (http_exceptions.TransferEncodingError, "bad_request", "malformed request: broken chunked encoding"),
    (http_exceptions.ContentLengthError, "bad_request", "malformed request: broken Content-Length"),
    (http_exceptions.LineTooLong, "bad_request", "malformed request: a request line or header is too long"),
    (http_exceptions.InvalidHeader, "bad_request", "malformed request: an invalid header"),
    (http_exceptions.BadHttpMethod, "bad_request", "malformed request: not an HTTP method"),
    (http_exceptions.BadStatusLine, "bad_request", "malformed request: an invalid request line"),
)  # fmt: skip
PARSER_REASON = re.compile(r"[A-Za-z][A-Za-z ]{0,59}")
# A client's broken request or connection: worth one line in the log, not a traceback.
CLIENT_FAULTS = (http_exceptions.HttpProcessingError, RequestPayloadError, ConnectionError)


def parser_refusal(exc: BaseException | None) -> tuple[str, str]:
    """The error code and message for a request the HTTP parser refused, never echoing what was sent."""
    for kind, code, message in PARSER_REFUSALS:
        if isinstance(exc, kind):
            return code, message
    # llhttp's own reason ("Invalid character in chunk size") comes before the bytes it quotes.
    reason = str(getattr(exc, "message", "")).split(":", 1)[0].strip()
    if PARSER_REASON.fullmatch(reason):
        return "bad_request", f"malformed request: {reason[0].lower()}{reason[1:]}"
    return "bad_request", "malformed request"


class JsonErrorRequestHandler(web.RequestHandler):
    """aiohttp's connection handler, answering what its HTTP parser refuses (a broken request line, header,
    chunk size or Content-Encoding) with the listener's JSON error body and logging it as one line.

    aiohttp answers these itself, before any application code: the status line says HTTP/1.0 because the
    request's own version could not be read.
    """

    def __init__(self, manager: web.Server, *, listener: Listener, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.listener = listener

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500 and not isinstance(exc, CLIENT_FAULTS):
            log.error("http.internal_error", listener=self.listener.name, exc_info=exc)
            code, text = "internal_error", "internal error"
        else:
            code, text = parser_refusal(exc)
            log.info("http.request_refused", listener=self.listener.name, status=status, reason=text,
                     remote=request.remote)  # fmt: skip
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was already being sent; the connection is broken")
        self.listener.metrics.observe_http(self.listener.name, "unparsed", status)
        response = json_response(self.listener.error_body(status, code, text), status)
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, CLIENT_FAULTS):
            # Typically the rest of a body that could not be read, drained after the answer went out.
            log.info("http.connection_dropped", listener=self.listener.name, reason=type(exc).__name__)
            return
        log.error("http.connection_error", listener=self.listener.name, detail=str(args[0]) if args else "",
                  exc_info=exc)  # fmt: skip


class JsonErrorServer(web.Server):
    """aiohttp's server, with :class:`JsonErrorRequestHandler` for each connection."""

    def __init__(self, handler: Any, *, listener: Listener, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.listener = listener

    def __call__(self) -> web.RequestHandler:
        return JsonErrorRequestHandler(self, loop=self._loop, listener=self.listener, **self._kwargs)


class ListenerRunner(web.AppRunner):
    """An :class:`aiohttp.web.AppRunner` whose connections answer parser refusals in JSON."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # runs the application's start-up, freezes it
        return JsonErrorServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            listener=self.app[LISTENER],
            **server._kwargs,
        )


def listener_runner(app: web.Application, *, shutdown_timeout: float) -> web.AppRunner:
    """The runner for a listener's application (see :func:`listener_app`): JSON for every refusal, a
    connection whose request headers are slower than ``header_timeout_seconds`` closed (aiohttp's
    keep-alive timer also runs while a request's headers are still coming), and a request answered before
    its body was read (a refusal: no or a wrong signature, an unknown key, an address that waits, an unknown
    path, a wrong admin token, a body too large) closed with its answer, the rest of its body neither read
    nor decompressed (aiohttp's lingering read after the answer would decompress all of it, at any cost)."""
    return ListenerRunner(
        app,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=app[LISTENER].header_timeout_seconds,
        lingering_time=0,
    )
