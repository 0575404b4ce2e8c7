"""What every dialect's client shares on the wire: the observer told of each request, how a transport
failure is described, and the HTTP headers read beside the body (``Retry-After``; ``Date``, how far this
machine's clock is from the upstream's)."""

from __future__ import annotations

import math
from collections.abc import Callable
from email.utils import parsedate_to_datetime

import aiohttp

from procurd.upstream.errors import DEFAULT_RETRY_AFTER_SECONDS, UpstreamError

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
