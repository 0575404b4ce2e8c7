"""Classification of upstream answers into success or the right error, without any I/O."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from procurd.protocol.dujiao.answers import classify_response, error_class_for
from procurd.protocol.transport import clock_offset, parse_retry_after
from procurd.upstream.errors import (
    DEFAULT_RETRY_AFTER_SECONDS,
    AuthError,
    BusinessError,
    ClockSkew,
    EndpointNotFound,
    PaymentFailed,
    ProtocolError,
    RateLimited,
    ServerError,
    TransportError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)

SECRET = "s3cr3t-value"
SIGNATURE = "ab" * 32


def failure(code: str, message: str = "refused", **extra: Any) -> bytes:
    return json.dumps({"ok": False, "error_code": code, "error_message": message, **extra}).encode()


def classify(status: int, body: bytes, **kwargs: Any) -> dict[str, Any] | UpstreamError:
    kwargs.setdefault("upstream", "main")
    kwargs.setdefault("endpoint", "orders.create")
    return classify_response(http_status=status, body=body, **kwargs)


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("missing_auth_headers", 401, AuthError),
        ("invalid_timestamp", 401, ClockSkew),
        ("timestamp_expired", 401, ClockSkew),
        ("invalid_signature", 401, AuthError),
        ("invalid_api_key", 403, AuthError),
        ("user_disabled", 403, AuthError),
        ("bad_request", 400, BusinessError),
        ("invalid_callback_url", 400, BusinessError),
        ("sku_unavailable", 400, BusinessError),
        ("product_unavailable", 400, BusinessError),
        ("product_unavailable", 404, BusinessError),
        ("product_not_found", 404, BusinessError),
        ("order_not_found", 404, BusinessError),
        ("insufficient_balance", 402, BusinessError),
        ("insufficient_stock", 409, BusinessError),
        ("cancel_not_allowed", 409, BusinessError),
        ("payment_failed", 200, PaymentFailed),
        ("internal_error", 500, ServerError),
        ("some_new_rule", 422, BusinessError),
        ("some_new_auth_rule", 401, AuthError),
    ],
)
def test_every_seed_error_code_maps_to_its_class(
    code: str, status: int, expected: type[UpstreamError]
) -> None:
    """Each error_code of seed part 7, at its HTTP status, becomes exactly the expected error class."""
    error = classify(status, failure(code, "what happened"))
    assert type(error) is expected
    assert isinstance(error, UpstreamError)
    assert error.code == code
    assert error.http_status == status
    assert error.message == "what happened"
    assert error.upstream == "main"
    assert error.endpoint == "orders.create"
    assert error.retryable is (expected is ServerError)


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("invalid_signature", 401, AuthError),
        ("payment_failed", 200, PaymentFailed),
        ("bad_request", 200, BusinessError),
        ("unheard_of", 200, ProtocolError),
        (None, 200, ProtocolError),
        (None, 400, ProtocolError),
        (None, 401, AuthError),
        ("bad_request", 503, ServerError),
        ("bad_request", 429, RateLimited),
        (None, 502, ServerError),
    ],
)
def test_error_class_for_status_and_code(
    code: str | None, status: int, expected: type[UpstreamError]
) -> None:
    """The pure code-and-status table behind the classification."""
    assert error_class_for(code, status) is expected


def test_success_body_is_returned_with_exact_amounts() -> None:
    """HTTP 200 with ok true is a success; amounts and float numbers come back as exact Decimals or text."""
    body = b'{"ok": true, "balance": "100.10", "price": 9.9, "user_id": 7}'
    result = classify(200, body)
    assert result == {"ok": True, "balance": "100.10", "price": Decimal("9.9"), "user_id": 7}


def test_payment_failed_with_http_200_is_never_success() -> None:
    """payment_failed arrives as HTTP 200 with ok false and carries the auto-canceled order."""
    body = failure("payment_failed", "wallet payment failed", order_id=55, order_no="DJ55", status="canceled")
    error = classify(200, body)
    assert isinstance(error, PaymentFailed)
    assert isinstance(error, BusinessError)
    assert not error.retryable
    assert (error.order_id, error.order_no, error.status) == (55, "DJ55", "canceled")


def test_rate_limit_envelope_with_http_200() -> None:
    """The real site's HTTP 200 storefront envelope with status_code 429 is a rate limit, 30 s by default."""
    body = json.dumps({"status_code": 429, "msg": "too many requests", "data": None}).encode()
    error = classify(200, body)
    assert isinstance(error, RateLimited)
    assert error.retryable
    assert error.retry_after == DEFAULT_RETRY_AFTER_SECONDS
    assert error.message == "too many requests"


def test_plain_http_429_uses_retry_after_header() -> None:
    """HTTP 429 is a rate limit whatever the body; Retry-After seconds are honoured."""
    error = classify(429, b"slow down", retry_after="12")
    assert isinstance(error, RateLimited)
    assert error.retry_after == 12.0


def test_retry_after_as_http_date() -> None:
    """A Retry-After given as an HTTP date counts from the local time."""
    assert parse_retry_after("Sun, 01 Mar 2026 12:00:45 GMT", now=1772366400.0) == 45.0
    assert parse_retry_after("garbage") == DEFAULT_RETRY_AFTER_SECONDS
    assert parse_retry_after("-5") == DEFAULT_RETRY_AFTER_SECONDS
    assert parse_retry_after(None) == DEFAULT_RETRY_AFTER_SECONDS


def test_other_storefront_envelope_is_a_protocol_error() -> None:
    """A storefront envelope with another status_code is not understood and is retryable."""
    body = json.dumps({"status_code": 401, "msg": "login required"}).encode()
    error = classify(200, body)
    assert isinstance(error, ProtocolError)
    assert error.code == "bad_response"
    assert "login required" in error.message


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_server_errors_without_json(status: int) -> None:
    """Any 5xx, even with an HTML body, is a retryable server error."""
    error = classify(status, b"<html>Bad Gateway</html>", content_type="text/html")
    assert isinstance(error, ServerError)
    assert error.retryable
    assert error.code == "internal_error"


@pytest.mark.parametrize(
    ("body", "content_type", "fragment"),
    [
        (b"<html><body>maintenance</body></html>", "text/html", "not JSON"),
        (b"", None, "empty body"),
        (b"   ", "application/json", "empty body"),
        (b"[1, 2, 3]", "application/json", "JSON list"),
        (b'"ok"', "application/json", "JSON str"),
        (b'{"site_name": "x"}', "application/json", "without ok"),
        (b'{"ok": "yes"}', "application/json", "without ok"),
        (b'{"ok": NaN}', "application/json", "not JSON"),
        (b"\xff\xfe\x00", "application/json", "not JSON"),
    ],
)
def test_malformed_success_answers_are_protocol_errors(
    body: bytes, content_type: str | None, fragment: str
) -> None:
    """HTML, empty bodies, JSON arrays and objects without ok are retryable protocol errors."""
    error = classify(200, body, content_type=content_type)
    assert isinstance(error, ProtocolError)
    assert error.retryable
    assert error.code == "bad_response"
    assert fragment in error.message


def test_ok_true_with_an_error_status_is_not_success() -> None:
    """ok true under a 4xx status is contradictory and is not taken as success."""
    assert isinstance(classify(404, b'{"ok": true}'), ProtocolError)


def test_redirect_is_a_protocol_error() -> None:
    """A redirect (for example to a login page) is not followed and not taken as success."""
    assert isinstance(classify(302, b""), ProtocolError)


@pytest.mark.parametrize(
    "body",
    [b"<html>Not Found</html>", b"404 page not found", b'{"ok": false, "error_code": "not_found"}', b""],
)
def test_a_404_for_the_endpoint_itself_says_to_check_base_url(body: bytes) -> None:
    """A 404 that is none of the protocol's own refusals (an HTML page, a router's text, a site's
    ``not_found``: a base_url that ends in /api/v1/upstream, or is not the site root) is an endpoint the site
    does not serve: not retried, and it says what to check, as the signature error does."""
    error = classify(404, body, content_type="text/html")
    assert isinstance(error, EndpointNotFound)
    assert not error.retryable
    assert error.code == "endpoint_not_found"
    assert "base_url of main is the site root without /api/v1/upstream" in error.hint
    signature = classify(401, b'{"ok": false, "error_code": "invalid_signature"}')
    assert isinstance(signature, AuthError)
    assert "base_url is the site root without /api/v1/upstream" in signature.hint


@pytest.mark.parametrize("code", ["order_not_found", "product_not_found", "product_unavailable"])
def test_a_404_with_the_protocols_own_code_is_that_refusal(code: str) -> None:
    """An order or product the upstream does not have is its 404 refusal, not a missing endpoint."""
    error = classify(404, json.dumps({"ok": False, "error_code": code}).encode())
    assert type(error) is BusinessError
    assert (error.code, error.hint) == (code, "")


def test_clock_skew_hint_reports_the_measured_offset() -> None:
    """timestamp_expired names the clock and the offset measured from the upstream's Date header."""
    error = classify(
        401,
        failure("timestamp_expired", "timestamp expired"),
        server_date="Sun, 01 Mar 2026 12:00:00 GMT",
        local_time=1772366400.0 + 93,
        header_prefix="Service",
    )
    assert isinstance(error, ClockSkew)
    assert error.clock_offset_seconds == 93.0
    assert "clock" in error.hint
    assert "93 s ahead" in error.hint


def test_clock_offset_negative_when_behind() -> None:
    """Our clock behind the upstream's gives a negative offset; no Date header gives none."""
    assert clock_offset(1772366400.0 - 90, "Sun, 01 Mar 2026 12:00:00 GMT") == -90.0
    assert clock_offset(1772366400.0, None) is None
    assert clock_offset(None, "Sun, 01 Mar 2026 12:00:00 GMT") is None


@pytest.mark.parametrize(
    ("code", "status", "fragment"),
    [
        ("missing_auth_headers", 401, "header_prefix"),
        ("invalid_timestamp", 401, "clock"),
        ("invalid_signature", 401, "api_secret"),
        ("invalid_api_key", 403, "api_key"),
        ("user_disabled", 403, "account"),
    ],
)
def test_auth_hints_name_what_to_check(code: str, status: int, fragment: str) -> None:
    """Each authentication error points a person at the setting or account to check."""
    error = classify(status, failure(code), header_prefix="Dujiao-Next")
    assert isinstance(error, AuthError)
    assert not error.retryable
    assert fragment in error.hint


def test_missing_headers_hint_names_the_prefix_sent() -> None:
    """The hint for missing headers shows the header names we actually sent."""
    error = classify(401, failure("missing_auth_headers"), header_prefix="Dujiao-Next")
    assert isinstance(error, AuthError)
    assert "Dujiao-Next-Signature" in error.hint


def test_messages_are_scrubbed_and_truncated() -> None:
    """An upstream message echoing a secret or signature is redacted, and long messages are cut."""
    body = failure("invalid_signature", f"expected {SIGNATURE} with key {SECRET} " + "x" * 500)
    error = classify(401, body, sensitive=(SECRET, SIGNATURE))
    assert isinstance(error, AuthError)
    for text in (str(error), repr(error), error.message):
        assert SECRET not in text
        assert SIGNATURE not in text
    assert len(error.message) <= 200


def test_message_names_upstream_endpoint_status_and_code() -> None:
    """str() of an error names the upstream, the endpoint, the HTTP status, the code and the message."""
    error = classify(409, failure("insufficient_stock", "only 2 left"))
    assert str(error) == "main orders.create: HTTP 409 insufficient_stock: only 2 left"


def test_hierarchy_and_retryability() -> None:
    """Unavailable errors are retryable; authentication and business errors are not."""
    for unavailable in (TransportError, UpstreamTimeout, ServerError, RateLimited, ProtocolError):
        assert issubclass(unavailable, UpstreamUnavailable)
        assert unavailable("x").retryable
    assert TransportError("x").code == "network_error"
    assert UpstreamTimeout("x").code == "timeout"
    assert ProtocolError("x").code == "bad_response"
    assert issubclass(ClockSkew, AuthError)
    assert issubclass(PaymentFailed, BusinessError)
    for final in (AuthError, ClockSkew, BusinessError, PaymentFailed):
        assert not final("x").retryable
