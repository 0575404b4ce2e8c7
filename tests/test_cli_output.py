"""The pieces of the command line's human output: times, ages and counted nouns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from procurd.core.times import count
from procurd.output import ago, cell, when

NOW = datetime(2026, 11, 23, 15, 12, 0, tzinfo=UTC)


def test_counts_agree_with_their_nouns() -> None:
    """One exception, two exceptions, no exceptions."""
    assert [count(n, "exception") for n in (0, 1, 2)] == ["0 exceptions", "1 exception", "2 exceptions"]


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0.4, "just now"), (12, "12 s ago"), (180, "3 min ago"), (2 * 3600 + 300, "2 h 5 min ago"),
     (4 * 86400, "4 days ago"), (-30, "in 30 s")],
)  # fmt: skip
def test_ages_read_like_a_person_says_them(seconds: float, expected: str) -> None:
    """How long ago a moment was, in the unit a person would use; a moment ahead says so."""
    assert ago(NOW - timedelta(seconds=seconds), NOW) == expected


def test_every_time_is_shown_in_utc() -> None:
    """Times from another zone, in UTC, and without a zone (as stored) are all shown in UTC with their age."""
    assert when("2026-11-23T23:09:00+08:00", NOW) == "3 min ago (2026-11-23 15:09:00 UTC)"
    assert when("2026-11-23T15:09:00Z", NOW) == "3 min ago (2026-11-23 15:09:00 UTC)"
    assert when("2026-11-23T15:09:00", NOW) == "3 min ago (2026-11-23 15:09:00 UTC)"
    assert when(None, NOW) == "never"


def test_structures_are_shown_as_words() -> None:
    """Objects become key=value pairs, lists a comma list, booleans yes/no: never a Python literal."""
    assert (
        cell({"order_id": 1001, "status": "paid", "tags": ["a", "b"]})
        == 'order_id=1001 status=paid tags=["a","b"]'
    )
    assert (cell(True), cell(None), cell(["x", 2])) == ("yes", "", "x, 2")
