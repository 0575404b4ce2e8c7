"""The INI text of an acg-faka commodity's ``config``, read exactly as the supplier reads it.

The supplier's grammar is small and strict: the text is trimmed and cut into lines at every run of line
breaks; an empty line (or one that is exactly ``0``) is skipped; a line ending in ``[name]`` opens the
section ``name`` (whatever comes before the bracket); any other line must be ``key=value`` with exactly one
``=`` and inside a section, else the supplier itself refuses the config. Keys and values are not trimmed. A
dotted key nests (``a.b=v`` is ``{"a": {"b": "v"}}``), a part ending in ``[]`` appends to a list, and when a
key comes twice the first one wins. Sections and keys that are whole numbers are numbers to PHP; they are
kept here as their text.

:func:`parse_ini` gives the same nested mapping of text, or an :class:`IniError` naming the line; it never
raises anything else, whatever the text.
"""

from __future__ import annotations

import re
from typing import Any

MAX_CONFIG_CHARS = 1_000_000
MAX_DEPTH = 8
_LINE_BREAKS = re.compile(r"[\r\n]+")
_SECTION = re.compile(r"\[(.*?)\]$", re.DOTALL)
# PHP's trim(): space, tab, newline, carriage return, NUL, vertical tab.
_TRIMMED = " \t\n\r\x00\x0b"

IniValue = str | dict[str, "IniValue"] | list["IniValue"]


class IniError(ValueError):
    """A config the supplier's own parser refuses (or one too large or deep to be a real one)."""


def _merged(first: Any, second: Any) -> Any:
    """PHP's ``$first + $second`` of two arrays, merged again where both hold an array at one key: the
    first value wins (a list is an array keyed 0, 1, ...)."""
    if isinstance(first, list) and isinstance(second, list):
        both = [_merged(a, b) if _array(a) and _array(b) else a for a, b in zip(first, second, strict=False)]
        return both + first[len(second) :] + second[len(first) :]
    if not (isinstance(first, dict) and isinstance(second, dict)):
        return first
    result = dict(first)
    for key, value in second.items():
        if key not in result:
            result[key] = value
        elif _array(result[key]) and _array(value):
            result[key] = _merged(result[key], value)
    return result


def _array(value: Any) -> bool:
    return isinstance(value, dict | list)


def _nested(parts: list[str], value: str) -> IniValue:
    if not parts:
        return value
    head, rest = parts[0], parts[1:]
    if "[]" in head:
        return {head.replace("[]", ""): [_nested(rest, value)]}
    return {head: _nested(rest, value)}


def parse_ini(text: str) -> dict[str, dict[str, IniValue]]:
    """The sections of ``text`` as the supplier parses them."""
    if len(text) > MAX_CONFIG_CHARS:
        raise IniError(f"the config is longer than {MAX_CONFIG_CHARS} characters")
    sections: dict[str, dict[str, IniValue]] = {}
    section: str | None = None
    for number, line in enumerate(_LINE_BREAKS.split(text.strip(_TRIMMED)), start=1):
        if line in ("", "0"):
            continue
        header = _SECTION.search(line)
        if header is not None:
            section = header.group(1)
            sections.setdefault(section, {})
            continue
        if section is None or section in ("", "0"):  # PHP's empty(): no section yet, or "" or "0"
            raise IniError(f"line {number} ({_shown(line)}) is outside any section")
        parts = line.split("=")
        if len(parts) != 2:
            raise IniError(f"line {number} ({_shown(line)}) is not one key=value")
        path = parts[0].split(".")
        if len(path) > MAX_DEPTH:
            raise IniError(f"line {number} ({_shown(line)}) nests deeper than {MAX_DEPTH} levels")
        entry = _nested(path, parts[1])
        assert isinstance(entry, dict)
        sections[section] = _merged(sections[section], entry)
    return sections


def _shown(line: str) -> str:
    return repr(line if len(line) <= 60 else line[:59] + "…")
