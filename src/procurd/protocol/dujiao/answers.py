"""What a Dujiao-Next answer means: its success body, or the :mod:`procurd.upstream.errors` error it stands
for (pure: everything the decision needs is passed in)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from procurd.core.exact import loads_exact
from procurd.protocol.transport import clock_offset, parse_retry_after
from procurd.upstream.errors import (
    AUTH_ERROR_CODES,
    BUSINESS_ERROR_CODES,
    CLOCK_ERROR_CODES,
    SERVER_ERROR_CODES,
    AuthError,
    BusinessError,
    ClockSkew,
    EndpointNotFound,
    PaymentFailed,
    ProtocolError,
    RateLimited,
    ServerError,
    UpstreamError,
    redact,
    truncate,
)


def error_class_for(error_code: str | None, http_status: int | None) -> type[UpstreamError]:
    """The error class for a failure answer with this ``error_code`` and HTTP status."""
    if http_status == 429:
        return RateLimited
    if http_status is not None and http_status >= 500:
        return ServerError
    if error_code == "payment_failed":
        return PaymentFailed
    if error_code in CLOCK_ERROR_CODES:
        return ClockSkew
    if error_code in AUTH_ERROR_CODES:
        return AuthError
    if error_code in BUSINESS_ERROR_CODES:
        return BusinessError
    if error_code in SERVER_ERROR_CODES:
        return ServerError
    if http_status in (401, 403):
        return AuthError
    if http_status is not None and 400 <= http_status < 500 and error_code:
        return BusinessError
    return ProtocolError


def classify_response(
    *,
    http_status: int,
    body: bytes,
    upstream: str = "",
    endpoint: str = "",
    content_type: str | None = None,
    retry_after: str | None = None,
    server_date: str | None = None,
    local_time: float | None = None,
    header_prefix: str | None = None,
    sensitive: Sequence[str] = (),
    decode: Callable[[bytes], Any] = loads_exact,
) -> dict[str, Any] | UpstreamError:
    """The success body of an answer (``ok`` true, HTTP 2xx), or the error it stands for.

    Pure: everything the decision needs is passed in. ``local_time`` and ``server_date`` measure the
    clock offset reported by authentication errors; ``sensitive`` values are scrubbed from messages.
    ``decode`` parses the body (exact by default).
    """
    where = _Where(upstream=upstream, endpoint=endpoint, http_status=http_status)
    parsed = _parse_json(body, decode)
    if http_status == 429 or _is_rate_limit_envelope(parsed):
        return RateLimited(
            _failure_text(parsed, sensitive) or "too many requests",
            retry_after=parse_retry_after(retry_after, local_time),
            **where,
        )
    if http_status == 404 and _endpoint_missing(parsed):
        said = _failure_text(parsed, sensitive) if isinstance(parsed, dict) else ""
        code = parsed.get("error_code") if isinstance(parsed, dict) else None
        what = f"{code}: {said}" if isinstance(code, str) and code and said else (said or code)
        return EndpointNotFound(str(what) if what else _describe_body(body, content_type), **where)
    if not isinstance(parsed, dict):
        if http_status >= 500:
            return ServerError(_describe_body(body, content_type), **where)
        return ProtocolError(_describe_body(body, content_type), **where)
    ok = parsed.get("ok")
    if ok is True and 200 <= http_status < 300:
        return parsed
    error_code = parsed.get("error_code")
    code = error_code if isinstance(error_code, str) and error_code else None
    message = _failure_text(parsed, sensitive)
    if ok is not False and http_status < 500:
        if ok is True:
            return ProtocolError(f"ok true with a non-success status{_suffix(message)}", **where)
        if "status_code" in parsed:
            return ProtocolError(f"unexpected storefront envelope{_suffix(message)}", **where)
        return ProtocolError(f"answer without ok true or false{_suffix(message)}", **where)
    error_class = error_class_for(code, http_status)
    if error_class is ProtocolError:
        what = f"unexpected error_code {code}" if code else "failure without error_code"
        return ProtocolError(f"{what}{_suffix(message)}", **where)
    if error_class is PaymentFailed:
        return PaymentFailed(
            message,
            code=code,
            order_id=_int_or_none(parsed.get("order_id")),
            order_no=_str_or_none(parsed.get("order_no")),
            status=_str_or_none(parsed.get("status")),
            **where,
        )
    if issubclass(error_class, AuthError):
        return error_class(
            message,
            code=code,
            header_prefix=header_prefix,
            clock_offset_seconds=clock_offset(local_time, server_date),
            **where,
        )
    return error_class(message, code=code, **where)


class _Where(TypedDict):
    upstream: str
    endpoint: str
    http_status: int | None


def _parse_json(body: bytes, decode: Callable[[bytes], Any]) -> Any:
    if not body.strip():
        return None
    try:
        return decode(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _endpoint_missing(parsed: Any) -> bool:
    """A 404 whose body is not one of the protocol's own refusals (``order_not_found`` ...): the path
    itself is not served."""
    if not isinstance(parsed, dict):
        return True
    if parsed.get("ok") is True:  # not a refusal at all: an answer that breaks the protocol
        return False
    code = parsed.get("error_code")
    return not (
        isinstance(code, str) and code in BUSINESS_ERROR_CODES | AUTH_ERROR_CODES | SERVER_ERROR_CODES
    )


def _is_rate_limit_envelope(parsed: Any) -> bool:
    if not isinstance(parsed, dict) or "ok" in parsed:
        return False
    status_code = parsed.get("status_code")
    return not isinstance(status_code, bool) and status_code in (429, "429")


def _failure_text(parsed: Any, sensitive: Sequence[str]) -> str:
    if not isinstance(parsed, Mapping):
        return ""
    for key in ("error_message", "msg", "message"):
        value = parsed.get(key)
        if isinstance(value, str) and value:
            return truncate(redact(value, sensitive))
    return ""


def _describe_body(body: bytes, content_type: str | None) -> str:
    kind = content_type or "no content type"
    if not body.strip():
        return f"empty body ({kind})"
    try:
        parsed = loads_exact(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return f"body is not JSON ({kind}, {len(body)} bytes)"
    return f"body is a JSON {type(parsed).__name__}, not an object ({kind})"


def _suffix(message: str) -> str:
    return f": {message}" if message else ""


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    return None
