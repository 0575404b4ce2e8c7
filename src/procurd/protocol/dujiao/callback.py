"""Callbacks (seed 000, 4.8 and part 5): the signed push of an order's status, both ways.

Received from an upstream: :class:`CallbackVerifier` checks the signature headers of a configured header
prefix, the timestamp (60 s either way), the key (a configured upstream's) and then the signature over the
raw body, with ``POST`` and the fixed path ``/api/v1/upstream/callback`` (what real upstreams sign, whatever
URL they post to) or else the path of the receiver's own callback URL; :func:`parse_callback` reads the body
strictly into an :class:`UpstreamReport`. Sent to a downstream site (procurd's provider):
:func:`callback_body` writes it, :class:`CallbackPoster` signs and posts it to public addresses only, and
reads the answer (delivered on HTTP 2xx with ``"ok": true``).

The body, required: ``order_id`` (an integer, not a boolean or a string), ``downstream_order_no`` and
``status`` (non-empty strings). Optional: ``event``, ``order_no``, ``fulfillment`` (an object with seed 000
2.5's fields), ``timestamp`` (a number). Fields an upstream adds beyond these are tolerated and ignored. No
text procurd keeps may hold a NUL character or an unpaired surrogate, and a fulfillment nests at most 32
levels.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver
from pydantic import ValidationError

from procurd import __version__
from procurd.core.addresses import private_url_reason
from procurd.core.exact import loads_exact
from procurd.core.json_limits import json_problem, raw_json_is_plain, text_problem
from procurd.core.numbers import MAX_ID
from procurd.core.procurement import DELIVERED_STATUSES, UpstreamReport
from procurd.core.provider import ProviderOrder
from procurd.protocol.destinations import NotPublic, PublicResolver
from procurd.protocol.dujiao.signing import (
    HeaderNames,
    parse_timestamp,
    signature_matches,
    signed_headers,
    timestamp_fresh,
)
from procurd.upstream.errors import truncate
from procurd.upstream.models import Fulfillment

CALLBACK_PATH = "/api/v1/upstream/callback"  # what every callback is signed over, whatever URL it goes to

MAX_NUMBER_CHARS = 96  # the longest downstream / upstream order number procurd stores
MAX_STATUS_CHARS = 32
MAX_EVENT_CHARS = 64
FULFILLMENT_TEXT_FIELDS = ("type", "status", "payload", "delivered_at")


class CallbackBodyError(Exception):
    """The body is not a callback procurd can read; the message names the field, never its content."""


@dataclass(frozen=True, slots=True)
class Callback:
    downstream_order_no: str
    report: UpstreamReport
    event: str | None


def parse_callback(raw: bytes) -> Callback:
    """Parse and check one callback body; raise :class:`CallbackBodyError` on any problem."""
    try:
        data = loads_exact(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise CallbackBodyError("the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise CallbackBodyError("the body must be a JSON object")
    walk = not raw_json_is_plain(raw)
    order_id = data.get("order_id")
    if isinstance(order_id, bool) or not isinstance(order_id, int):
        raise CallbackBodyError("order_id is required and must be an integer")
    if not 0 < order_id <= MAX_ID:
        raise CallbackBodyError("order_id is out of range")
    number = _text(data, "downstream_order_no", MAX_NUMBER_CHARS, walk, required=True)
    status = _text(data, "status", MAX_STATUS_CHARS, walk, required=True)
    assert number is not None
    assert status is not None
    event = _text(data, "event", MAX_EVENT_CHARS, walk)
    order_no = _text(data, "order_no", MAX_NUMBER_CHARS, walk) or None
    timestamp = data.get("timestamp")
    if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, int | Decimal)):
        raise CallbackBodyError("timestamp must be a number")
    fulfillment = _fulfillment(data.get("fulfillment"), walk)
    report = UpstreamReport(order_id=order_id, status=status, order_no=order_no, fulfillment=fulfillment)
    return Callback(number, report, event)


def _text(data: dict[str, Any], key: str, limit: int, walk: bool, *, required: bool = False) -> str | None:
    value = data.get(key)
    if value is None:
        if required:
            raise CallbackBodyError(f"{key} is required")
        return None
    if not isinstance(value, str):
        raise CallbackBodyError(f"{key} must be a string")
    if required and not value.strip():
        raise CallbackBodyError(f"{key} must not be empty")
    if len(value) > limit:
        raise CallbackBodyError(f"{key} is longer than {limit} characters")
    problem = text_problem(value) if walk else None
    if problem is not None:
        raise CallbackBodyError(f"{key} {problem}")
    return value


def _fulfillment(value: Any, walk: bool) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CallbackBodyError("fulfillment must be an object")
    for key in FULFILLMENT_TEXT_FIELDS:
        if value.get(key) is not None and not isinstance(value[key], str):
            raise CallbackBodyError(f"fulfillment.{key} must be a string")
    delivery_data = value.get("delivery_data")
    if delivery_data is not None and not isinstance(delivery_data, dict):
        raise CallbackBodyError("fulfillment.delivery_data must be an object or null")
    problem = json_problem(value) if walk else None
    if problem is not None:
        raise CallbackBodyError(f"fulfillment cannot be stored: {problem}")
    try:
        # The same normalisation as a polled order's fulfillment, so both paths store identical data.
        return Fulfillment.model_validate(value).to_json()
    except ValidationError:
        raise CallbackBodyError("fulfillment has fields of the wrong type") from None


# --- received: who sent it -----------------------------------------------------------------------------


class CallbackRefused(Exception):
    """A callback whose credentials do not hold: HTTP status, code, and a message for the sender."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class CallbackKey:
    """What a configured upstream signs its callbacks with."""

    upstream: str
    api_key: str
    header_prefix: str
    secret: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class Credentials:
    """A callback's signature headers, under one header prefix."""

    prefix: str
    api_key: str
    timestamp: str
    signature: str = field(repr=False)


class CallbackVerifier:
    """Checks who sent a callback: first the headers (:meth:`claimed`: prefix, timestamp, key), so that a
    callback refused for them is never read, then the body's signature (:meth:`check_signature`)."""

    def __init__(
        self,
        keys: Sequence[CallbackKey],
        signed_paths: Sequence[str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = {key.api_key: key for key in keys}
        prefixes = dict.fromkeys(key.header_prefix for key in keys)
        self.header_names = [(prefix, HeaderNames.for_prefix(prefix)) for prefix in prefixes]
        self.signed_paths = tuple(dict.fromkeys(signed_paths))
        self.clock = clock

    def credentials(self, headers: Mapping[str, str]) -> Credentials:
        """The signature headers (``missing_auth_headers`` when no prefix has all three)."""
        complete = []
        for prefix, names in self.header_names:
            values = [headers.get(name, "").strip() for name in (names.api_key, names.timestamp)]
            signature = headers.get(names.signature, "").strip()
            if all(values) and signature:
                complete.append(Credentials(prefix, values[0], values[1], signature))
        if not complete:
            raise CallbackRefused(401, "missing_auth_headers", "the signature headers are missing")
        # Several prefixes at once is odd; prefer the set whose key is configured under that prefix.
        return next((c for c in complete if self.key_of(c) is not None), complete[0])

    def key_of(self, credentials: Credentials) -> CallbackKey | None:
        """The configured upstream whose key and header prefix the credentials carry, or ``None``."""
        key = self.keys.get(credentials.api_key)
        if key is None or key.header_prefix.lower() != credentials.prefix.lower():
            return None
        return key

    def check_timestamp(self, raw: str) -> None:
        timestamp = parse_timestamp(raw)
        if timestamp is None:
            raise CallbackRefused(401, "invalid_timestamp", "the timestamp is not Unix seconds")
        now = self.clock()
        if not timestamp_fresh(timestamp, now):
            offset = timestamp - now
            direction = "ahead of" if offset > 0 else "behind"
            raise CallbackRefused(
                401,
                "timestamp_expired",
                f"the timestamp is {abs(offset):.0f} s {direction} our clock (60 s allowed): "
                "a replayed request, or a clock that is off (check NTP on both sides)",
            )

    def check_signature(self, key: CallbackKey, credentials: Credentials, raw: bytes) -> None:
        for path in self.signed_paths:
            if signature_matches(key.secret, "POST", path, credentials.timestamp, raw, credentials.signature):
                return
        raise CallbackRefused(401, "invalid_signature", "the signature does not match")


# --- sent: to a downstream site ------------------------------------------------------------------------

ANSWER_BYTES = 64 * 1024  # of a downstream's answer, read
MESSAGE_CHARS = 300


def callback_event(status: str) -> str:
    """The callback's ``event``, as the real sites name them."""
    return "order.fulfilled" if status in DELIVERED_STATUSES else "order.status_changed"


def callback_body(order: ProviderOrder, now: datetime) -> dict[str, Any]:
    """The signed push of seed 000 4.8 telling a downstream site its order's current status."""
    body: dict[str, Any] = {
        "event": callback_event(order.status),
        "order_id": order.id,
        "order_no": order.order_no,
        "downstream_order_no": order.downstream_order_no or "",
        "status": order.status,
        "timestamp": int(now.timestamp()),
    }
    if order.fulfillment is not None and order.status in DELIVERED_STATUSES:
        body["fulfillment"] = dict(order.fulfillment)
    return body


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one try of a callback got back (``refused``: not sent, its address is not public; the message
    says why)."""

    ok: bool
    http_status: int | None
    message: str | None
    refused: bool = False


class CallbackPoster:
    """Posts signed callbacks (one HTTP session, opened on first use); with ``public_only``, to public
    addresses only: the URL's host is checked as written and a name is resolved by ``resolver`` (the system's
    by default) through :class:`PublicResolver`, which hands the connection only public addresses
    (:mod:`procurd.protocol.destinations`); a refused try sends nothing. Redirects are never followed."""

    def __init__(
        self,
        header_prefix: str,
        timeout_seconds: float,
        *,
        public_only: bool = True,
        resolver: AbstractResolver | None = None,
    ) -> None:
        self.names = HeaderNames.for_prefix(header_prefix)
        self.timeout_seconds = timeout_seconds
        self.public_only = public_only
        self.resolver = resolver
        self._session: aiohttp.ClientSession | None = None

    async def send(
        self, url: str, api_key: str, api_secret: str, body: Mapping[str, Any], now: datetime
    ) -> Delivery:
        """Post ``body`` to ``url``, signed with the key and secret at ``now``."""
        if self.public_only:
            problem = private_url_reason(url)
            if problem is not None:
                return Delivery(False, None, problem, refused=True)
        raw = json.dumps(dict(body), separators=(",", ":"), ensure_ascii=False).encode()
        headers = signed_headers(
            self.names, api_key, api_secret, "POST", CALLBACK_PATH, int(now.timestamp()), raw
        )
        headers["Content-Type"] = "application/json"
        try:
            async with self._opened().post(url, data=raw, headers=headers, allow_redirects=False) as response:
                return _delivery(response.status, await _answer(response))
        except TimeoutError:
            return Delivery(False, None, f"no answer within {self.timeout_seconds:g} s")
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, NotPublic):
                return Delivery(False, None, str(exc.os_error), refused=True)
            return Delivery(False, None, f"cannot reach it: {type(exc).__name__}")
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return Delivery(False, None, f"cannot reach it: {type(exc).__name__}")

    def _opened(self) -> aiohttp.ClientSession:
        if self._session is None:
            resolver = self.resolver or aiohttp.ThreadedResolver()
            connector = aiohttp.TCPConnector(
                resolver=PublicResolver(resolver) if self.public_only else resolver,
                use_dns_cache=False,  # each new connection resolves (and checks) the name afresh
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout_seconds),
                headers={"User-Agent": f"procurd/{__version__}"},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _answer(response: aiohttp.ClientResponse) -> bytes:
    """The answer's body to its end, however many pieces it comes in, up to ``ANSWER_BYTES``."""
    raw = b""
    while len(raw) < ANSWER_BYTES:
        piece = await response.content.read(ANSWER_BYTES - len(raw))
        if not piece:
            break
        raw += piece
    return raw


def _delivery(status: int, raw: bytes) -> Delivery:
    """HTTP 2xx with ``"ok": true`` is delivered; the answer's ``message`` (or why it is unusable) is kept."""
    try:
        answer = json.loads(raw) if raw.strip() else None
    except (ValueError, RecursionError):
        answer = None
    if not isinstance(answer, dict):
        return Delivery(False, status, "the answer is not a JSON object")
    ok = answer.get("ok") is True and 200 <= status < 300
    message = answer.get("message")
    text = truncate(message if isinstance(message, str) else json.dumps(message), MESSAGE_CHARS)
    return Delivery(ok, status, text if message is not None else None)
