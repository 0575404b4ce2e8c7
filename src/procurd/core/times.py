"""Times and lengths of time as a person reads them: one implementation for the command line (terse: ``3 min
ago``, ``2 h 5 min``) and the web console (in words: ``3 minutes ago``, ``2 hours 5 minutes``). Every time
is shown in UTC; a time stored without a zone is UTC, as procurd stores it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

_UNITS = (("day", 86_400), ("hour", 3_600), ("minute", 60))


def parse_time(value: Any) -> datetime | None:
    """An aware UTC datetime from a datetime or an ISO 8601 text (``...Z`` too); ``None`` for anything
    else."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and value:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def utc_text(value: Any) -> str | None:
    """``2026-11-23 15:09:54`` (UTC); ``None`` when ``value`` is no time."""
    moment = parse_time(value)
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment is not None else None


def iso_z(value: Any) -> str | None:
    """``2026-11-23T15:09:54Z``; ``None`` when ``value`` is no time."""
    moment = parse_time(value)
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 minute``, ``2 minutes``, ``0 items``."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def count(number: int, noun: str) -> str:
    """``1 exception``, ``2 exceptions``, ``0 exceptions``; ``2 mismatches``, ``2 categories``."""
    if number == 1:
        return f"{number} {noun}"
    if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u"):
        return f"{number} {noun[:-1]}ies"
    return f"{number} {noun}{'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else 's'}"


def terse_duration(seconds: float) -> str:
    """A length of time for a terminal: ``12 s``, ``3 min``, ``2 h 5 min``, ``4 days``."""
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 90:
        return f"{minutes:.0f} min"
    hours = minutes / 60
    if hours < 48:
        whole = int(hours)
        rest = round((hours - whole) * 60)
        return f"{whole} h {rest} min" if rest else f"{whole} h"
    return count(round(hours / 24), "day")


def terse_ago(value: Any, now: datetime | None = None) -> str | None:
    """``just now``, ``12 s ago``, ``3 min ago``, ``in 5 s``; ``None`` when ``value`` is no time."""
    moment = parse_time(value)
    if moment is None:
        return None
    delta = ((now or datetime.now(UTC)) - moment).total_seconds()
    if abs(delta) < 1:
        return "just now"
    return f"{terse_duration(delta)} ago" if delta > 0 else f"in {terse_duration(delta)}"


def worded_duration(seconds: float) -> str:
    """A length of time in its largest two units: ``3 minutes 20 seconds``, ``2 days 1 hour``."""
    remaining = max(0, int(seconds))
    if remaining < 60:
        return plural(remaining, "second")
    parts = []
    for name, size in (*_UNITS, ("second", 1)):
        if remaining >= size:
            parts.append(plural(remaining // size, name))
            remaining %= size
        if len(parts) == 2 or (parts and remaining == 0):
            break
    return " ".join(parts)


def worded_ago(value: Any, now: datetime | None = None) -> str | None:
    """``just now``, ``5 minutes ago``, ``1 hour ago``, ``in 3 minutes``; ``None`` when ``value`` is no
    time."""
    moment = parse_time(value)
    if moment is None:
        return None
    seconds = int(((now or datetime.now(UTC)) - moment).total_seconds())
    if abs(seconds) < 60:
        return "just now"
    for name, size in _UNITS:
        if abs(seconds) >= size:
            text = plural(abs(seconds) // size, name)
            return f"{text} ago" if seconds > 0 else f"in {text}"
    return "just now"
