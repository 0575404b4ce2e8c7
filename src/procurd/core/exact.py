"""JSON from outside, read exactly: numbers with a fraction or exponent become ``Decimal`` (never a float)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any


def loads_exact(raw: bytes | str) -> Any:
    """Parse JSON keeping every number with a fraction or exponent as an exact ``Decimal``.

    ``NaN`` and ``Infinity``, which Python's parser accepts, are refused like any other invalid JSON.
    """
    return json.loads(raw, parse_float=Decimal, parse_constant=_reject_constant)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")
