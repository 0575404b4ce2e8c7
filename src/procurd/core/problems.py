"""Validation failures (pydantic's) as short lines for a person: ``where: what``."""

from __future__ import annotations

from pydantic import ValidationError
from pydantic_core import ErrorDetails


def message(error: ErrorDetails) -> str:
    """What is wrong, without pydantic's ``Value error, `` prefix."""
    return str(error["msg"]).removeprefix("Value error, ")


def problems(exc: ValidationError, *, root: str = "body") -> list[str]:
    """One ``location: message`` line per problem; the location's parts joined with dots (``root`` when
    the problem is with the whole value). Never the offending input: it may be a secret or goods."""
    return [
        f"{'.'.join(str(part) for part in error['loc']) or root}: {message(error)}"
        for error in exc.errors(include_url=False, include_input=False, include_context=False)
    ]
