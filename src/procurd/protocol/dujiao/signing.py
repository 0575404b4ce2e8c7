"""Request signing of the site-to-site API (seed 000, part 5), shared by the client and the receivers.

The string to sign is ``METHOD\\nPATH\\nTIMESTAMP\\nmd5hex(body)``; the signature is the lowercase hex
HMAC-SHA256 of it keyed with the API secret. ``PATH`` never carries a query string.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

TIMESTAMP_TOLERANCE_SECONDS = 60
# One optional minus and ASCII digits only: str.isdigit() also accepts "²" and other digits int() refuses.
_TIMESTAMP = re.compile(r"-?[0-9]+")


@dataclass(frozen=True, slots=True)
class HeaderNames:
    """The three signature header names for one header prefix (``Service`` or ``Dujiao-Next``)."""

    api_key: str
    timestamp: str
    signature: str

    @classmethod
    def for_prefix(cls, prefix: str) -> HeaderNames:
        return cls(f"{prefix}-Api-Key", f"{prefix}-Timestamp", f"{prefix}-Signature")


def string_to_sign(method: str, path: str, timestamp: int | str, body: bytes) -> str:
    """The four LF-joined parts that are signed. ``path`` loses any query string."""
    bare_path = urlsplit(path).path if ("?" in path or "://" in path) else path
    digest = hashlib.md5(body, usedforsecurity=False).hexdigest()
    return f"{method.upper()}\n{bare_path}\n{timestamp}\n{digest}"


def sign(secret: str, method: str, path: str, timestamp: int | str, body: bytes) -> str:
    """Lowercase hex HMAC-SHA256 signature of one request."""
    message = string_to_sign(method, path, timestamp, body).encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signature_matches(
    secret: str, method: str, path: str, timestamp: int | str, body: bytes, given: str
) -> bool:
    """Constant-time comparison of ``given`` with the expected signature."""
    expected = sign(secret, method, path, timestamp, body)
    return hmac.compare_digest(expected.encode(), given.strip().lower().encode("ascii", "replace"))


def signed_headers(
    names: HeaderNames, api_key: str, secret: str, method: str, path: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The three headers that authenticate one request."""
    return {
        names.api_key: api_key,
        names.timestamp: str(timestamp),
        names.signature: sign(secret, method, path, timestamp, body),
    }


def parse_timestamp(raw: str) -> int | None:
    """The header's Unix seconds, or ``None`` when it is not a plain integer of ASCII digits."""
    text = raw.strip()
    if len(text) > 12 or not _TIMESTAMP.fullmatch(text):
        return None
    return int(text)


def timestamp_fresh(timestamp: int, now: float, tolerance: int = TIMESTAMP_TOLERANCE_SECONDS) -> bool:
    """True when ``timestamp`` is within ``tolerance`` seconds of ``now`` in either direction.

    Both are compared in whole seconds (``now`` rounded down, as the real sites' ``time.Now().Unix()``), so
    the window is the same on both sides: a timestamp exactly ``tolerance`` seconds old is as fresh as one
    exactly ``tolerance`` seconds ahead, whatever fraction of a second ``now`` is into.
    """
    return abs(math.floor(now) - timestamp) <= tolerance
