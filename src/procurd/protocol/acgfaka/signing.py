"""acg-faka's request signature, and the form body that carries exactly what was signed.

The supplier signs the form fields as PHP parsed them (``$_POST``, without ``sign``):

1. sort the top-level keys as PHP's ``ksort`` does (PHP 8 rules: a purely decimal name such as ``10`` is an
   integer key and compares with other numbers numerically; numeric strings compare numerically; everything
   else byte by byte, and a number against a non-numeric name as its decimal text);
2. drop every top-level entry whose value is the empty string (``"0"`` stays; an empty string inside a
   nested array stays, ``sku[颜色]=``);
3. write ``key=value`` for each remaining entry, a nested array as ``key[sub]=value`` per element in its own
   (body) order, keys and values raw (no percent-encoding), joined by ``&``;
4. append ``&key=`` and the app_key (URL-decoded, as the supplier's last step decodes the whole string);
5. the signature is the lower-case hex MD5 of those UTF-8 bytes.

:func:`form_body` writes the ``application/x-www-form-urlencoded`` body of the same fields: top-level fields
in the order given, nested ones as ``name[sub]`` in their own order, so the supplier parses back exactly the
fields that were signed. :func:`check_field_name` refuses names that PHP would rewrite on parsing (the
signature would then fail, or a buyer input would not be found).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote_plus, unquote_plus

FieldValue = str | int | bool | None | Mapping[Any, "FieldValue"] | Sequence["FieldValue"]
Fields = Mapping[Any, FieldValue]  # names are text, or integers as PHP holds decimal names
Key = str | int

SIGNATURE_FIELD = "sign"
_PHP_INT_MIN, _PHP_INT_MAX = -(2**63), 2**63 - 1
_INTEGER_KEY = re.compile(r"0|-?[1-9][0-9]*")
# PHP 8's numeric strings: optional white space around, a sign, digits with a point, an exponent.
_WHITESPACE = " \t\n\r\v\f"
_NUMERIC = re.compile(
    rf"[{_WHITESPACE}]*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[{_WHITESPACE}]*"
)
_INTEGER_LITERAL = re.compile(r"[+-]?[0-9]+")
# Characters PHP rewrites (or stops at) in a top-level field name, and in a name inside brackets.
_TOP_LEVEL_REWRITTEN = frozenset(" .[]\x00")
_NESTED_REWRITTEN = frozenset("[]\x00")


class SigningError(ValueError):
    """Fields that cannot be signed so that the supplier computes the same signature."""


def php_key(key: Key) -> Key:
    """The key as a PHP array holds it: a purely decimal name within PHP's integer range is an integer."""
    if isinstance(key, bool):
        raise SigningError(f"a field name must be text or an integer, not {key!r}")
    if isinstance(key, int):
        return key
    if _INTEGER_KEY.fullmatch(key) and _PHP_INT_MIN <= int(key) <= _PHP_INT_MAX:
        return int(key)
    return key


def _numeric(text: str) -> tuple[int | float, bool] | None:
    """PHP's reading of a numeric string: ``(value, overflowed)``, or ``None`` when it is not numeric."""
    match = _NUMERIC.fullmatch(text)
    if match is None:
        return None
    literal = match.group(1)
    if _INTEGER_LITERAL.fullmatch(literal):
        number = int(literal)
        if _PHP_INT_MIN <= number <= _PHP_INT_MAX:
            return number, False
        return float(number), True
    return float(literal), False


def _three_way(first: float, second: float) -> int:
    return (first > second) - (first < second)


def _bytes_compare(first: str, second: str) -> int:
    left, right = first.encode(), second.encode()
    return (left > right) - (left < right)


def compare_keys(first: Key, second: Key) -> int:
    """PHP 8's ``ksort`` comparison of two array keys (negative, zero or positive)."""
    if isinstance(first, int) and isinstance(second, int):
        return _three_way(first, second)
    if isinstance(first, str) and isinstance(second, str):
        left, right = _numeric(first), _numeric(second)
        if left is None or right is None:
            return _bytes_compare(first, second)
        (left_value, left_over), (right_value, right_over) = left, right
        if left_over and right_over and (left_value > 0) == (right_value > 0):
            return _bytes_compare(first, second)  # both beyond the integers, the same way: PHP gives up
        return _three_way(left_value, right_value)
    if isinstance(first, str):
        return -compare_keys(second, first)
    assert isinstance(first, int)
    assert isinstance(second, str)
    number = _numeric(second)
    if number is None:
        return _bytes_compare(str(first), second)
    return _three_way(first, number[0])


def sorted_keys(keys: Sequence[Key]) -> list[Key]:
    """``keys`` (already PHP keys, in body order) in ``ksort`` order.

    PHP's comparison is not a total order for every mix of names (``9``, ``10`` and ``1a`` form a cycle):
    such a mix has no order every sort agrees on, so it is refused rather than signed by guess. Keys that
    compare equal keep their body order, as PHP's stable sort keeps them.
    """
    positions = {key: index for index, key in enumerate(keys)}
    ordered = sorted(keys, key=functools.cmp_to_key(compare_keys))
    for index, key in enumerate(ordered):
        for later in ordered[index + 1 :]:
            outcome = compare_keys(key, later)
            if outcome > 0 or (outcome == 0 and positions[key] > positions[later]):
                names = ", ".join(repr(str(k)) for k in keys)
                raise SigningError(f"the field names {names} have no order PHP's ksort agrees on")
    return ordered


def _top_level(fields: Fields) -> dict[Key, FieldValue]:
    """The fields as PHP's top level holds them, ``sign`` left out; two names for one key are refused."""
    result: dict[Key, FieldValue] = {}
    for name, value in fields.items():
        if name == SIGNATURE_FIELD:
            continue
        key = php_key(name)
        if key in result:
            raise SigningError(f"the field names {key!r} and {name!r} are one field to PHP")
        result[key] = value
    return result


def _pairs(prefix: str, value: FieldValue) -> list[tuple[str, str]]:
    """``(name, value)`` pairs of one field as ``http_build_query`` writes them (nothing for ``None`` or an
    empty array; ``true``/``false`` as ``1``/``0``)."""
    if value is None:
        return []
    if isinstance(value, bool):
        return [(prefix, "1" if value else "0")]
    if isinstance(value, int):
        return [(prefix, str(value))]
    if isinstance(value, str):
        return [(prefix, value)]
    if isinstance(value, Mapping):
        pairs: list[tuple[str, str]] = []
        seen: set[Key] = set()
        for sub, item in value.items():
            key = php_key(sub)
            if key in seen:
                raise SigningError(f"{prefix}: the names {key!r} and {sub!r} are one field to PHP")
            seen.add(key)
            pairs += _pairs(f"{prefix}[{key}]", item)
        return pairs
    if isinstance(value, Sequence):
        return [pair for index, item in enumerate(value) for pair in _pairs(f"{prefix}[{index}]", item)]
    raise SigningError(f"{prefix}: cannot sign a value of type {type(value).__name__}")


def signing_string(fields: Fields, app_key: str) -> str:
    """The text whose MD5 is the signature of ``fields`` (every field but ``sign``) under ``app_key``."""
    top = _top_level(fields)
    parts: list[str] = []
    for key in sorted_keys(list(top)):
        value = top[key]
        if isinstance(value, str) and value == "":
            continue
        parts += [f"{name}={text}" for name, text in _pairs(str(key), value)]
    return "&".join([*parts, f"key={unquote_plus(app_key)}"])


def sign(fields: Fields, app_key: str) -> str:
    """The lower-case hex MD5 signature of ``fields`` under ``app_key``."""
    return hashlib.md5(signing_string(fields, app_key).encode(), usedforsecurity=False).hexdigest()


def check_field_name(name: str, *, nested: bool = False) -> str | None:
    """Why PHP would not hand ``name`` back unchanged (so it cannot be signed and found), or ``None``.

    A top-level name loses leading spaces and has ``.`` and spaces turned into ``_``; ``[`` and ``]`` start
    or end a nested name; a name inside brackets (``sku[<group>]``) ends at the first ``]``."""
    if name == "":
        return "the name is empty"
    rewritten = _NESTED_REWRITTEN if nested else _TOP_LEVEL_REWRITTEN
    found = sorted({character for character in name if character in rewritten})
    if found:
        shown = ", ".join("NUL" if character == "\x00" else repr(character) for character in found)
        return f"the name holds {shown}, which PHP rewrites when it parses a form"
    return None


def form_body(fields: Fields) -> bytes:
    """The ``application/x-www-form-urlencoded`` body of ``fields``, nested fields in their own order.

    Every field is sent as given, empty strings included (the supplier drops top-level empty strings from
    the signature just as :func:`signing_string` does)."""
    pairs: list[tuple[str, str]] = []
    for name, value in fields.items():
        if isinstance(value, str):
            pairs.append((str(name), value))  # an empty string is sent too
        else:
            pairs += _pairs(str(name), value)
    return "&".join(f"{quote_plus(name)}={quote_plus(value)}" for name, value in pairs).encode("ascii")
