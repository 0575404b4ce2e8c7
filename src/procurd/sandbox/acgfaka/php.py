"""What the sandbox shop does as PHP does: parse a form into ``$_POST``, cast, compare, sanitise, and write
JSON with PHP's numbers. Only what the shared API's behaviour depends on."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any
from urllib.parse import unquote_plus

from procurd.protocol.acgfaka.signing import php_key

PostValue = str | dict[Any, "PostValue"]
Post = dict[Any, PostValue]
MAX_FIELDS = 1000  # PHP's max_input_vars
_LEADING_INTEGER = re.compile(r"[ \t\n\r\v\f]*([+-]?[0-9]+)")
_NUMERIC = re.compile(
    r"[ \t\n\r\v\f]*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t\n\r\v\f]*"
)
_TAG = re.compile(r"<[^>]*>?")


def form_pairs(body: bytes) -> list[tuple[str, str]]:
    """The ``name=value`` pairs of an ``application/x-www-form-urlencoded`` body, decoded."""
    text = body.decode("utf-8", "replace")
    pairs = []
    for part in text.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        pairs.append((unquote_plus(name), unquote_plus(value)))
    return pairs


def _register(post: Post, name: str, value: str) -> None:
    """One variable as PHP's ``php_register_variable_ex`` stores it."""
    name = name.lstrip(" ").split("\x00", 1)[0]
    bracket = name.find("[")
    base = name if bracket < 0 else name[:bracket]
    indices: list[str] = []
    if bracket >= 0:
        rest = name[bracket:]
        while rest.startswith("["):
            close = rest.find("]")
            if close < 0:
                if not indices:  # an unmatched "[" in the base name becomes "_", the rest is kept
                    base = name[:bracket] + "_" + name[bracket + 1 :]
                break
            indices.append(rest[1:close])
            rest = rest[close + 1 :]
    base = base.replace(" ", "_").replace(".", "_")
    if not base:
        return
    keys: list[Any] = [php_key(base), *indices]
    target: Any = post
    for position, key in enumerate(keys):
        last = position == len(keys) - 1
        if key == "" and position > 0:
            numbers = [k for k in target if isinstance(k, int)]
            key = max(numbers) + 1 if numbers else 0
        elif position > 0:
            key = php_key(key)
        if last:
            target[key] = value
        else:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]


def parse_post(pairs: Iterable[tuple[str, str]]) -> Post:
    """``$_POST`` of these pairs: names rewritten and nested as PHP does, a repeated name overwriting."""
    post: Post = {}
    for count, (name, value) in enumerate(pairs):
        if count >= MAX_FIELDS:
            break
        _register(post, name, value)
    return post


def flat_values(value: PostValue) -> list[str]:
    if isinstance(value, dict):
        return [text for item in value.values() for text in flat_values(item)]
    return [value]


def php_int(value: Any) -> int:
    """PHP's ``(int)`` of a posted value: the leading integer, 0 when there is none."""
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return 0
    match = _LEADING_INTEGER.match(value)
    return int(match.group(1)) if match else 0


def text(value: Any) -> str:
    """PHP's ``(string)`` of a posted value (an array is ``Array``, missing is "")."""
    if value is None:
        return ""
    if isinstance(value, dict):
        return "Array"
    return str(value)


def is_numeric(value: str) -> bool:
    return _NUMERIC.fullmatch(value) is not None


def loose_equal(first: str, second: str) -> bool:
    """PHP 8's ``==`` of two strings: numerically when both are numeric strings (``"0e1" == "0e2"``)."""
    if is_numeric(first) and is_numeric(second):
        return float(first) == float(second)
    return first == second


def sanitised(value: str, *, escape: bool = False) -> str:
    """What the shop's input filter makes of a value: trimmed; with ``escape`` also tags stripped and
    HTML special characters escaped (as ``valuation``, ``inventory`` and ``inventoryState`` read values)."""
    value = value.strip(" \t\n\r\x00\x0b")
    if escape:
        value = html.escape(_TAG.sub("", value), quote=True).replace("&#x27;", "&#039;")
    return value


def legacy_sanitised(value: str) -> str:
    """3.0.0 - 3.1.0's filter, which the signature was computed over: also URL-decoded a second time."""
    return sanitised(unquote_plus(value), escape=True)


def sanitised_post(post: Mapping[Any, PostValue]) -> Post:
    result: Post = {}
    for key, value in post.items():
        result[key] = sanitised_post(value) if isinstance(value, dict) else legacy_sanitised(value)
    return result


def _number(value: Decimal) -> str:
    """A PHP float as ``json_encode`` writes it (``10.0``, ``9.9``)."""
    if value == value.to_integral_value():
        return f"{value.quantize(Decimal(1)):f}.0"
    return f"{value.normalize():f}"


def php_json(data: Any) -> bytes:
    """``json_encode`` with unescaped Unicode and slashes; a ``Decimal`` is a PHP float (a JSON number)."""
    marks: list[str] = []

    def mark(value: Any) -> Any:
        if isinstance(value, Decimal):
            marks.append(_number(value))
            return f"\x00{len(marks) - 1}\x00"
        if isinstance(value, dict):
            return {str(key): mark(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [mark(item) for item in value]
        return value

    encoded = json.dumps(mark(data), ensure_ascii=False, separators=(",", ":"))
    encoded = re.sub(r'"\\u0000([0-9]+)\\u0000"', lambda found: marks[int(found.group(1))], encoded)
    return encoded.encode()
