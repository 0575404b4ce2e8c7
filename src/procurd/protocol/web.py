"""What every listener of procurd's shares: request bodies read within bounds, and JSON answers.

aiohttp decodes a body sent with ``Content-Encoding: gzip`` or ``deflate`` as it is read (never further
ahead than its buffer). :func:`read_bounded` stops reading, and so decompressing, as soon as more than
``limit`` bytes have come out of the decoder, so that a small compressed body that inflates to a gigabyte
costs at most ``limit`` bytes of work. A compressed body must declare its length (``Content-Length``, at most
``limit``): one sent in chunks of unknown length could run on forever inflating to nothing (empty deflate
blocks), which no count of its output would ever stop. What a request does not read is never read: the
listeners close such a connection after the answer (:func:`procurd.http.errors.listener_runner`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from aiohttp import hdrs, web


class BodyTooLarge(Exception):
    """More than the limit arrived (or was declared) on the wire, or came out of the decoder."""


class LengthUnknown(Exception):
    """A compressed body sent without ``Content-Length`` (in chunks): refused unread."""


def unknown_length_text(limit: int) -> str:
    return f"a compressed body must declare its Content-Length (at most {limit} bytes)"


async def read_bounded(request: web.BaseRequest, limit: int) -> bytes:
    """The request's body, decoded; :class:`BodyTooLarge` once it (declared, as sent or decoded) passes
    ``limit`` bytes, with the rest left unread; :class:`LengthUnknown` for a compressed body of unknown
    length. aiohttp's own errors pass through (a
    ``RequestPayloadError`` for a broken encoding or framing, ``ConnectionError`` for a client gone)."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    if declared is None and encoding not in ("", "identity") and request.body_exists:
        raise LengthUnknown
    content = request.content
    chunks: list[bytes] = []
    size = 0
    async for chunk in content.iter_any():
        size += len(chunk)
        if size > limit or content.total_raw_bytes > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


class ClientGone(Exception):
    """The client closed its connection before its request's body arrived: nobody is left to answer."""


def _exact(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(data: Any) -> str:
    """Compact JSON, non-ASCII as it is; exact decimals as their text, times in ISO 8601."""
    return json.dumps(data, default=_exact, ensure_ascii=False, separators=(",", ":"))


def dump_json(data: Any) -> bytes:
    """:func:`dumps` as UTF-8 bytes."""
    return dumps(data).encode()


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return raw_json_response(dump_json(data), status, headers)


def raw_json_response(
    body: bytes, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An answer whose JSON is already serialized."""
    return web.Response(
        body=body, status=status, content_type="application/json", charset="utf-8", headers=headers
    )
