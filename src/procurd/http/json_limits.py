"""Limits on JSON from outside that the JSON parser does not enforce, but a database or an answer would trip
over (pure).

``json.loads`` accepts ``"\\u0000"`` (PostgreSQL text and JSONB refuse it), an unpaired surrogate such as
``"\\ud800"`` (not valid UTF-8: no driver can send it, no answer can be encoded), and nesting as deep as the
interpreter's recursion limit (which then trips whatever walks the value next).
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 32


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored and echoed as it is, or ``None``."""
    if "\x00" in text:
        return "has a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (an unpaired surrogate)"
    return None


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
