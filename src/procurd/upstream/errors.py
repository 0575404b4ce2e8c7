"""Every way a call to an upstream can fail, whatever protocol it speaks, and the codes procurd reads.

``retryable`` says whether sending the same request again may succeed: transport failures, timeouts, server
errors, rate limiting and answers we cannot understand (the outcome is unknown) are retryable; authentication
and business errors are not. Messages name the upstream, the endpoint, the HTTP status and what the upstream
said (truncated); they never contain secrets, signatures or delivered goods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

MAX_MESSAGE_CHARS = 200
DEFAULT_RETRY_AFTER_SECONDS = 30.0

AUTH_ERROR_CODES = frozenset(
    {
        "missing_auth_headers",
        "invalid_timestamp",
        "timestamp_expired",
        "invalid_signature",
        "invalid_api_key",
        "user_disabled",
    }
)
CLOCK_ERROR_CODES = frozenset({"invalid_timestamp", "timestamp_expired"})
BUSINESS_ERROR_CODES = frozenset(
    {
        "bad_request",
        "invalid_callback_url",
        "sku_unavailable",
        "product_unavailable",
        "product_not_found",
        "order_not_found",
        "insufficient_balance",
        "insufficient_stock",
        "cancel_not_allowed",
        "payment_failed",
    }
)
SERVER_ERROR_CODES = frozenset({"internal_error"})
# What a person fixes when an acg-faka supplier refuses the account (its codes are procurd's own names for the
# supplier's texts).
ACG_FAKA_AUTH_HINTS = {
    "app_id_unknown": "check app_id of {name}: the supplier has no member with that id (商户ID不存在)",
    "app_key_wrong": (
        "check app_key of {name}: the supplier refused the signature (密钥错误); the member's docking key "
        "changes when it is reset in the member centre"
    ),
    "account_banned": "the supplier has banned the member account of {name} (You have been banned)",
    "account_missing": "the supplier no longer has the member account of {name} (用户不存在)",
}


class UpstreamError(Exception):
    """Base of every upstream failure."""

    retryable: ClassVar[bool] = False
    default_code: ClassVar[str] = "upstream_error"

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        http_status: int | None = None,
        upstream: str = "",
        endpoint: str = "",
    ) -> None:
        self.code = code or self.default_code
        self.message = truncate(message)
        self.http_status = http_status
        self.upstream = upstream
        self.endpoint = endpoint
        super().__init__(self._describe())

    def _describe(self) -> str:
        where = " ".join(part for part in (self.upstream, self.endpoint) if part) or "upstream"
        status = f"HTTP {self.http_status} " if self.http_status is not None else ""
        text = f": {self.message}" if self.message else ""
        return f"{where}: {status}{self.code}{text}"

    def __str__(self) -> str:
        return self._describe()

    @property
    def hint(self) -> str:
        """What a person should check to fix this, when the failure says ("" when it does not)."""
        return ""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, http_status={self.http_status!r}, "
            f"upstream={self.upstream!r}, endpoint={self.endpoint!r}, message={self.message!r})"
        )


class UpstreamUnavailable(UpstreamError):
    """The upstream could not be reached or did not answer usefully; trying again later may work."""

    retryable = True
    default_code = "unavailable"


class TransportError(UpstreamUnavailable):
    """Connection refused or reset, DNS or TLS failure."""

    default_code = "network_error"


class ConnectFailed(TransportError):
    """No connection could be opened (refused, DNS, TLS handshake): the request was never sent."""


class UpstreamTimeout(UpstreamUnavailable):
    """No complete answer within the configured timeout; the request may or may not have been applied."""

    default_code = "timeout"


class ServerError(UpstreamUnavailable):
    """HTTP 5xx or ``internal_error``."""

    default_code = "internal_error"


class RateLimited(UpstreamUnavailable):
    """The upstream refused the request for sending too much; nobody should send before ``retry_after``."""

    default_code = "rate_limited"

    def __init__(
        self,
        message: str = "",
        *,
        retry_after: float = DEFAULT_RETRY_AFTER_SECONDS,
        code: str | None = None,
        http_status: int | None = None,
        upstream: str = "",
        endpoint: str = "",
    ) -> None:
        self.retry_after = retry_after
        super().__init__(message, code=code, http_status=http_status, upstream=upstream, endpoint=endpoint)

    def _describe(self) -> str:
        return f"{super()._describe()} (retry after {self.retry_after:g} s)"


class ProtocolError(UpstreamUnavailable):
    """An answer that is not what the protocol promises; whether the request took effect is unknown."""

    default_code = "bad_response"


class AuthError(UpstreamError):
    """The upstream refused our credentials or signature; a person has to fix the configuration."""

    default_code = "auth_error"

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        http_status: int | None = None,
        upstream: str = "",
        endpoint: str = "",
        header_prefix: str | None = None,
        clock_offset_seconds: float | None = None,
    ) -> None:
        self.header_prefix = header_prefix
        self.clock_offset_seconds = clock_offset_seconds
        super().__init__(message, code=code, http_status=http_status, upstream=upstream, endpoint=endpoint)

    @property
    def hint(self) -> str:
        """What a person should check to fix this."""
        name = self.upstream or "this upstream"
        prefix = self.header_prefix or "the configured prefix"
        if self.code == "missing_auth_headers":
            return (
                f"the upstream did not find the signature headers: check header_prefix of {name} "
                f"(headers sent as {prefix}-Api-Key, {prefix}-Timestamp, {prefix}-Signature) and that no "
                "proxy strips them"
            )
        if self.code in CLOCK_ERROR_CODES:
            return f"check this machine's clock (NTP) and header_prefix of {name}; {self._offset_text()}"
        if self.code == "invalid_signature":
            return (
                f"check api_secret of {name} (it is shown once, when the key is created) and that base_url "
                "is the site root without /api/v1/upstream"
            )
        if self.code == "invalid_api_key":
            return f"check api_key of {name}: it must exist, be approved and be active on the upstream"
        if self.code == "user_disabled":
            return f"the upstream account that owns the api_key of {name} is disabled: contact the upstream"
        if self.code in ACG_FAKA_AUTH_HINTS:
            return ACG_FAKA_AUTH_HINTS[self.code].format(name=name)
        return f"check api_key, api_secret and header_prefix of {name}"

    def _offset_text(self) -> str:
        offset = self.clock_offset_seconds
        if offset is None:
            return "the upstream sent no Date header to measure the offset"
        direction = "ahead of" if offset >= 0 else "behind"
        return f"this machine's clock is about {abs(offset):.0f} s {direction} the upstream's"


class ClockSkew(AuthError):
    """``invalid_timestamp`` or ``timestamp_expired``: the timestamp is unreadable or outside 60 s."""


class BusinessError(UpstreamError):
    """The upstream understood the request and refused it; sending it again will not help."""

    default_code = "business_error"

    @property
    def hint(self) -> str:
        """What a person should check, for a refusal whose cause is on this side ("" for the others)."""
        return BUSINESS_HINTS.get(self.code, "")

    def described(self) -> str:
        """The upstream's message, with the hint when there is one (what the exception queue shows)."""
        hint = self.hint
        return f"{self.message}; {hint}" if hint else self.message


BUSINESS_HINTS = {
    "invalid_callback_url": (
        "the upstream refuses this site's [server] callback_url as the address to call it back at. Give "
        "callback_url a public address (behind your TLS proxy); for a chain on one machine the upstream's "
        "operator allows private addresses there ([provider] allow_private_callback_url = true in a procurd "
        "upstream's configuration: this site's own [server] allow_private_callback_url does not change what "
        "the upstream accepts)"
    ),
}


class PriceChanged(UpstreamError):
    """The upstream refused a purchase because the goods' price or settings changed while it was being made;
    nothing was bought. Sending it again may succeed, but only after asking the price again and checking it
    against the order's limit (acg-faka's text: see ``procurd.protocol.acgfaka.refusals.PRICE_CHANGED``)."""

    retryable = True
    default_code = "price_changed"


class OutcomeUnknown(UpstreamError):
    """A purchase was sent and nobody can tell whether the upstream made it: the answer was lost, was not the
    protocol's, or said something that proves neither. Money may have moved. It is never sent again by itself:
    a person settles it with what ``details`` names (the upstream's purchase records, the balance before and
    after, the request number).

    ``cause`` says why the outcome is unknown: ``lost_answer`` (no complete answer), ``not_json`` (an HTML
    page or another body), ``http_status`` (an answer other than HTTP 200), ``malformed`` (JSON that is not
    the protocol's), ``unrecognised_refusal`` (a refusal text that proves nothing), ``inconclusive_retry`` (a
    repeated request refused by a check that runs before the duplicate check), ``duplicate_request`` (the
    upstream holds an order under this request number already: bought, by this or an earlier try)."""

    retryable = False
    default_code = "outcome_unknown"

    def __init__(
        self,
        message: str = "",
        *,
        cause: str,
        details: Mapping[str, str] | None = None,
        code: str | None = None,
        http_status: int | None = None,
        upstream: str = "",
        endpoint: str = "",
    ) -> None:
        self.cause = cause
        self.details = dict(details or {})
        super().__init__(message, code=code, http_status=http_status, upstream=upstream, endpoint=endpoint)

    def _describe(self) -> str:
        return f"{super()._describe()} ({self.cause})"


class NotDelivered(UpstreamError):
    """The upstream made and charged the order but delivered nothing usable in its answer (acg-faka: the
    notice that another buyer took the cards while this order was paid, or fewer lines of goods than units
    bought). Nothing will come by itself: a person settles it with the upstream. ``order_id`` and
    ``order_no`` name the upstream's order, ``amount`` what it charged, ``details`` what a person needs (as
    :class:`OutcomeUnknown`'s)."""

    retryable = False
    default_code = "not_delivered"

    def __init__(
        self,
        message: str = "",
        *,
        order_id: int,
        order_no: str,
        amount: str | None = None,
        currency: str | None = None,
        details: Mapping[str, str] | None = None,
        upstream: str = "",
        endpoint: str = "",
    ) -> None:
        self.order_id = order_id
        self.order_no = order_no
        self.amount = amount
        self.currency = currency
        self.details = dict(details or {})
        super().__init__(message, upstream=upstream, endpoint=endpoint)


class EndpointNotFound(BusinessError):
    """HTTP 404 for an endpoint of the protocol, without one of the protocol's own codes (such as
    ``order_not_found``): the site does not serve the API where procurd asked, usually because ``base_url`` is
    not the site root. Nothing was created; sending it again will not help until a person fixes it."""

    default_code = "endpoint_not_found"

    @property
    def hint(self) -> str:
        name = self.upstream or "this upstream"
        return (
            f"check that base_url of {name} is the site root without /api/v1/upstream (procurd appends that "
            "path to it) and that the site serves the signed API there"
        )


class PaymentFailed(BusinessError):
    """The order was created but the wallet payment failed, so the upstream canceled it (HTTP 200)."""

    default_code = "payment_failed"

    def __init__(
        self,
        message: str = "",
        *,
        order_id: int | None = None,
        order_no: str | None = None,
        status: str | None = None,
        code: str | None = None,
        http_status: int | None = None,
        upstream: str = "",
        endpoint: str = "",
    ) -> None:
        self.order_id = order_id
        self.order_no = order_no
        self.status = status
        super().__init__(message, code=code, http_status=http_status, upstream=upstream, endpoint=endpoint)


def truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """One line of at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def redact(text: str, sensitive: Sequence[str]) -> str:
    """``text`` with every occurrence of a sensitive value replaced."""
    for value in sensitive:
        if value:
            text = text.replace(value, "[redacted]")
    return text
