"""How a configuration problem is told: one line per problem, naming the file (or the environment variable),
the section and key, and the reason."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from procurd.config.catalog import RULES_LABEL
from procurd.config.settings import Origins, Settings, origin_of


class ConfigError(Exception):
    """A configuration problem; ``str()`` is the message for a person."""


def format_validation_error(
    where: str, exc: ValidationError, data: Mapping[str, Any], origins: Origins | None = None
) -> str:
    """One line per problem: ``FILE: [section] key: reason``, or ``environment variable NAME: ...`` for a
    value the environment set."""
    lines = []
    for error in exc.errors(include_url=False):
        location = _describe_location(error["loc"], data)
        loc = tuple(error["loc"])
        source = origin_of(origins or {}, loc) or where
        message = str(error["msg"])
        if error["type"] == "extra_forbidden":
            if len(loc) == 1:
                # A section of no known name: the variables that made it up are to blame, if any did.
                named = sorted(name for at, name in (origins or {}).items() if at[:1] == loc)
                source = f"environment variable {named[0]}" if named else where
            noun = "section" if len(loc) == 1 and loc != ("upstreams",) else "key"
            message = f"unknown {noun}{_did_you_mean(loc)}"
        elif error["type"] == "missing":
            message = "required key is missing"
        elif error["type"] == "too_short" and error["loc"] == ("upstreams",):
            message = "at least one [[upstreams]] block is required"
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if error["loc"] == ("pricing",):
            # The section's own checks name the rule (or the key) themselves.
            prefix = "" if message.startswith(RULES_LABEL) else "[pricing] "
            lines.append(f"{source}: {prefix}{message}")
        elif not location:
            lines.append(f"{source}: {message}")
        elif error["type"] == "value_error" and len(error["loc"]) == 1 and location.startswith("["):
            # A check of the whole section: its message starts with the keys it concerns.
            lines.append(f"{source}: {location} {message}")
        else:
            lines.append(f"{source}: {location}: {message}")
    return "\n".join(lines)


def _did_you_mean(loc: tuple[int | str, ...]) -> str:
    """`` (did you mean api_secret?)`` for an unknown key close to a known one of its section, else ``""``."""
    model: type[BaseModel] = Settings
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # a block of an array of tables: its model is the section's
        field = model.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        sections = [
            argument
            for argument in (*typing.get_args(annotation), annotation)
            if isinstance(argument, type) and issubclass(argument, BaseModel)
        ]
        if not sections:
            return ""
        model = sections[0]
    key = loc[-1]
    if not isinstance(key, str):
        return ""
    close = difflib.get_close_matches(key.lower(), list(model.model_fields), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _describe_location(loc: tuple[int | str, ...], data: Mapping[str, Any]) -> str:
    if not loc:
        return ""
    head, *rest = loc
    if head == "pricing" and len(rest) >= 2 and rest[0] == "rules" and isinstance(rest[1], int):
        key = ".".join(str(part) for part in rest[2:])
        return f"{RULES_LABEL} #{rest[1] + 1}" + (f": {key}" if key else "")
    if head == "upstreams" and rest and isinstance(rest[0], int):
        index = rest[0]
        name = ""
        blocks = data.get("upstreams")
        if isinstance(blocks, list) and index < len(blocks) and isinstance(blocks[index], dict):
            name = f" ({blocks[index].get('name', '?')})"
        key = ".".join(str(part) for part in rest[1:])
        return f"upstreams[{index}]{name}" + (f".{key}" if key else "")
    if rest:
        return f"[{head}] " + ".".join(str(part) for part in rest)
    return str(head) if head == "upstreams" else f"[{head}]"
