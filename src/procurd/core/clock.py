"""The clock procurd writes by: aware UTC datetimes bound from Python, never the database's clock."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    """Now, as an aware UTC datetime bound from Python (never the database's clock)."""
    return datetime.now(UTC)
