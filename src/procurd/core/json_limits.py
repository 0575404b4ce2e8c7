"""Limits on JSON from outside that the JSON parser does not enforce, but a database or an answer would trip
over (pure).

``json.loads`` accepts ``"\\u0000"`` (PostgreSQL text and JSONB refuse it), an unpaired surrogate such as
``"\\ud800"`` (not valid UTF-8: no driver can send it, no answer can be encoded), and nesting as deep as the
interpreter's recursion limit (which then trips whatever walks the value next).
"""

from __future__ import annotations

import re
from typing import Any

MAX_DEPTH = 32

# Read left to right, the escapes and bytes of a raw JSON document that matter here: an escaped backslash and
# an escaped surrogate pair (both harmless, matched so that what follows them is read correctly), and what
# may decode to a NUL or a lone surrogate: an escape of either, a surrogate encoded as UTF-8 bytes (the
# decoder lets them pass), a NUL byte (also in any UTF-16 or UTF-32 document, which the decoder accepts).
_ESCAPES = re.compile(
    rb"(\\\\)|(\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|\\u(?:0000|[dD][89a-fA-F])|\xed[\xa0-\xbf]|\x00"
)


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored and echoed as it is, or ``None``."""
    if "\x00" in text:
        return "has a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (an unpaired surrogate)"
    return None


def raw_json_is_plain(raw: bytes, max_depth: int = MAX_DEPTH) -> bool:
    """Whether :func:`json_problem` and :func:`text_problem` can find nothing in any part of the JSON document
    ``raw``: nothing in it can decode to a NUL or a surrogate, and it has too few brackets to nest deeper
    than ``max_depth``. A quick look at the bytes that spares walking the decoded value (``False`` only
    means "walk it")."""
    if raw.count(b"{") + raw.count(b"[") > max_depth:
        return False
    if b"\\u" not in raw and b"\xed" not in raw and b"\x00" not in raw:
        return True  # the usual case, found without the slower regular expression
    return all(match.lastindex is not None for match in _ESCAPES.finditer(raw))


def json_problem(value: Any, max_depth: int = MAX_DEPTH) -> str | None:
    """Why decoded JSON ``value`` cannot be stored and echoed as it is, or ``None``: a text (a key included)
    with a NUL character or an unpaired surrogate, or objects and arrays nested deeper than ``max_depth``.
    Walks the value without recursion."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return f"a text {problem}"
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                return f"it is nested deeper than {max_depth} levels"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return None
