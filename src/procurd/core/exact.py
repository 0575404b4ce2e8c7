"""JSON from outside, read exactly: numbers with a fraction or exponent become ``Decimal`` (never a float)."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import orjson

# An object member whose value is a number with a fraction or an exponent (amounts are always members).
_FRACTIONAL_MEMBER = re.compile(rb":\s*-?[0-9]+[.eE]")


def loads_exact(raw: bytes | str) -> Any:
    """Parse JSON keeping every number with a fraction or exponent as an exact ``Decimal``.

    ``NaN`` and ``Infinity``, which Python's parser accepts, are refused like any other invalid JSON.
    """
    return json.loads(raw, parse_float=Decimal, parse_constant=_reject_constant)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_listing(raw: bytes) -> Any:
    """Parse a large JSON answer fast, keeping every object member that is a number with a fraction or an
    exponent exact: such a body is parsed by :func:`loads_exact`, any other by orjson (numbers in arrays may
    then be floats)."""
    if _FRACTIONAL_MEMBER.search(raw) is not None:
        return loads_exact(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return loads_exact(raw)
