"""What every dialect's client shares on the wire: its HTTP session, budget and observer
(:class:`SessionClient`), the observer told of each request, how a transport failure is described, and the
HTTP headers read beside the body (``Retry-After``; ``Date``, how far this machine's clock is from the
upstream's)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import ClassVar, Self, TypeVar

import aiohttp
import structlog

from procurd import __version__
from procurd.config import UpstreamSettings
from procurd.upstream.errors import (
    DEFAULT_RETRY_AFTER_SECONDS,
    AuthError,
    ProtocolError,
    RateLimited,
    UpstreamError,
)
from procurd.upstream.ratelimit import Priority, PriorityRateLimiter, RateLimiter

LOGGER_NAME = "procurd.upstream"

T = TypeVar("T")

RequestObserver = Callable[[str, str, str, float, UpstreamError | None], None]
"""``observer(upstream, endpoint, outcome, seconds, error)``, once per request: ``outcome`` is ``"ok"``, the
error code, ``"cancelled"``, or ``"error"`` for an unexpected exception; ``error`` is the upstream error."""


def parse_retry_after(value: str | None, now: float | None = None) -> float:
    """Seconds from a Retry-After header (seconds or an HTTP date); 30 s when absent or unreadable."""
    if not value:
        return DEFAULT_RETRY_AFTER_SECONDS
    text = value.strip()
    seconds: float | None
    try:
        seconds = float(text)
    except ValueError:
        seconds = _seconds_until_http_date(text, now)
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return DEFAULT_RETRY_AFTER_SECONDS
    return seconds


def _seconds_until_http_date(text: str, now: float | None) -> float | None:
    at = http_date_timestamp(text)
    if at is None or now is None:
        return None
    return max(0.0, at - now)


def http_date_timestamp(value: str | None) -> float | None:
    """Unix seconds of an HTTP date header, or ``None``."""
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def clock_offset(local_time: float | None, server_date: str | None) -> float | None:
    """How far our clock is ahead of the upstream's (negative: behind), from its Date header."""
    server_time = http_date_timestamp(server_date)
    if local_time is None or server_time is None:
        return None
    return local_time - server_time


def describe_transport_failure(exc: BaseException) -> str:
    """One line about a failed exchange, without secrets: what a person can act on."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"TLS certificate not accepted: {type(exc.certificate_error).__name__}"
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"TLS failure: {exc.os_error.strerror or type(exc.os_error).__name__}"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return f"cannot resolve the host: {exc.os_error.strerror or type(exc.os_error).__name__}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {exc.os_error.strerror or type(exc.os_error).__name__}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection without an answer"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the answer was cut off"
    if isinstance(exc, aiohttp.ClientResponseError):
        return "the answer is not valid HTTP"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


class SessionClient:
    """What a client of one upstream holds whatever its dialect: the upstream's settings, the request budget
    it waits on, one HTTP session opened on first use inside the running loop (``await close()`` or ``async
    with`` releases it), and the observer told of every request with its outcome. A dialect's client sends
    each request through :meth:`_observed`."""

    connection_limit: ClassVar[int] = 8
    keeps_cookies: ClassVar[bool] = True

    def __init__(
        self,
        settings: UpstreamSettings,
        *,
        limiter: RateLimiter | None = None,
        observer: RequestObserver | None = None,
    ) -> None:
        self._settings = settings
        self._limiter: RateLimiter = limiter or PriorityRateLimiter(settings.max_requests_per_second)
        self._observer = observer
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._log = structlog.get_logger(LOGGER_NAME).bind(upstream=settings.name)

    @property
    def name(self) -> str:
        return self._settings.name

    @property
    def settings(self) -> UpstreamSettings:
        return self._settings

    @property
    def limiter(self) -> RateLimiter:
        return self._limiter

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session; the client cannot be used afterwards."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"upstream client {self.name} is closed")

    async def _observed(
        self, endpoint: str, priority: Priority, exchange: Callable[[float], Awaitable[T]]
    ) -> T:
        """Wait for the budget at ``priority``, then ``exchange(started)``; the observer sees the request
        once, with its outcome, and an upstream's refusal is reacted to (a rate limit pauses the budget)."""
        await self._limiter.acquire(priority)
        started = time.perf_counter()
        outcome = "error"
        error: UpstreamError | None = None
        try:
            result = await exchange(started)
            outcome = "ok"
            return result
        except UpstreamError as exc:
            outcome, error = exc.code, exc
            self._react_to(exc)
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._observe(endpoint, outcome, time.perf_counter() - started, error)

    def _open_session(self) -> aiohttp.ClientSession:
        self._check_open()
        if self._session is None:
            limit = self.connection_limit
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=limit, limit_per_host=limit),
                cookie_jar=None if self.keeps_cookies else aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=self._settings.timeout_seconds),
                headers={"User-Agent": f"procurd/{__version__}"},
                raise_for_status=False,
            )
        return self._session

    def _observe(self, endpoint: str, outcome: str, seconds: float, error: UpstreamError | None) -> None:
        if self._observer is None:
            return
        try:
            self._observer(self.name, endpoint, outcome, seconds, error)
        except Exception:  # noqa: BLE001 - a metrics hook must never change the outcome of a request
            self._log.exception("upstream.observer_failed", endpoint=endpoint)

    def _react_to(self, exc: UpstreamError) -> None:
        if isinstance(exc, RateLimited):
            self._limiter.pause_for(exc.retry_after)
            self._log.warning(
                "upstream.rate_limited",
                endpoint=exc.endpoint,
                http_status=exc.http_status,
                retry_after=exc.retry_after,
            )
        elif isinstance(exc, AuthError):
            self._log.error(
                "upstream.auth_refused",
                endpoint=exc.endpoint,
                http_status=exc.http_status,
                code=exc.code,
                hint=exc.hint,
            )

    def _protocol_error(self, endpoint: str, message: str) -> ProtocolError:
        return ProtocolError(message, upstream=self.name, endpoint=endpoint, http_status=200)
