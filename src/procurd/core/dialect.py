"""What an upstream speaks, free of I/O: the points on which Dujiao-Next as it runs since mid-2026 differs
from seed 000, as an upstream's answers showed them, the dialect they add up to, and what procurd does about
each (what ``procurd probe``, ``procurd doctor`` and the status report say).

- a listing asked ``include_inactive=true``: seed 000 lists what is on sale and says nothing; Dujiao-Next
  lists what it took off sale too (``is_active: false``) and answers ``includes_inactive: true``;
- page size: seed 000 1 to 100, 20 by default; Dujiao-Next 1 to 50, 50 by default (anything else read as 50);
- over its limit: HTTP 200 with the storefront envelope; Dujiao-Next HTTP 429 with the same envelope;
- an inactive product's detail: 404 ``product_unavailable``; Dujiao-Next 200 with ``is_active: false``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

SEED: Final = "seed"
DUJIAO_2026: Final = "2026"
Dialect = Literal["seed", "2026"]
DIALECT_NAMES: Final[dict[str, str]] = {SEED: "seed 000", DUJIAO_2026: "Dujiao-Next of 2026"}
SUPPORTED_PROTOCOL: Final = "1.0"
SEED_PAGE_SIZE_MAX: Final = 100  # seed 000's page_size: 1 to 100; nothing may allow more
CLOCK_TOLERANCE_SECONDS: Final = 30.0  # upstreams refuse a timestamp 60 s off; warn well before
InactiveDetail = Literal["404", "200"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Learned:
    """What an upstream's answers showed (``None``: not seen yet), and when each was last seen."""

    upstream: str
    includes_inactive: bool | None = None
    page_size_asked: int | None = None
    page_size: int | None = None
    listing_at: datetime | None = None
    limiter_status: int | None = None
    limiter_at: datetime | None = None
    inactive_detail: str | None = None
    inactive_detail_at: datetime | None = None
    clock_offset_seconds: float | None = None
    updated_at: datetime | None = None

    @property
    def page_size_max(self) -> int | None:
        """The largest page it serves, when an answer showed it: a page size below the one asked, or what
        it answered to seed 000's largest (100)."""
        asked, answered = self.page_size_asked, self.page_size
        if asked is None or answered is None:
            return None
        return answered if answered < asked or asked >= SEED_PAGE_SIZE_MAX else None

    @property
    def dialect(self) -> Dialect | None:
        """``2026`` when any answer was Dujiao-Next's since 2026 (a listing that says
        ``includes_inactive: true``, HTTP 429 over its limit, 200 for an inactive product's detail), ``seed``
        when answers were seen and none was, ``None`` before any was seen."""
        if self.includes_inactive or self.limiter_status == 429 or self.inactive_detail == "200":
            return DUJIAO_2026
        if self.includes_inactive is False or self.limiter_status is not None or self.inactive_detail:
            return SEED
        return None


def dialect_text(learned: Learned) -> str:
    """The dialect in words with the points that show it: ``Dujiao-Next of 2026 (includes_inactive, ...)``."""
    name = learned.dialect
    if name is None:
        return "not learned yet (a catalogue pass or `procurd probe` learns it)"
    shown = []
    if learned.includes_inactive is not None:
        shown.append("includes_inactive" if learned.includes_inactive else "no includes_inactive")
    if learned.page_size is not None:
        shown.append(f"page size {learned.page_size}")
    if learned.limiter_status is not None:
        shown.append(f"limiter HTTP {learned.limiter_status}")
    if learned.inactive_detail is not None:
        shown.append(f"inactive detail {learned.inactive_detail}")
    return f"{DIALECT_NAMES[name]} ({', '.join(shown)})"


def detail_answer(
    status: int, error_code: str | None, product: Mapping[str, Any] | None
) -> InactiveDetail | None:
    """What a product detail asked of a product known to be inactive tells of the dialect: ``200`` (answered
    with ``is_active: false``, Dujiao-Next since May 2026), ``404`` (``product_unavailable``, seed 000), or
    ``None`` (deleted, back on sale, or anything else: nothing shown)."""
    if status == 200 and product is not None and product.get("is_active") is False:
        return "200"
    if status == 404 and error_code == "product_unavailable":
        return "404"
    return None


@dataclass(frozen=True, slots=True)
class Point:
    """One point of an upstream's dialect: what it is, what was found, and what procurd does about it."""

    point: str
    found: str
    procurd: str
    ok: bool = True  # False: something a person should look at

    def as_json(self) -> dict[str, Any]:
        return {"point": self.point, "found": self.found, "procurd": self.procurd, "ok": self.ok}


def points(
    learned: Learned,
    *,
    protocol_version: str | None,
    currency: str | None,
    member_level: str | None,
) -> list[Point]:
    """Each point of ``learned`` (with what a ping answered), and what procurd does about it."""
    found: list[Point] = []
    if protocol_version is None:
        found.append(Point("protocol version", "not seen", "a ping answers it"))
    elif protocol_version == SUPPORTED_PROTOCOL:
        found.append(Point("protocol version", protocol_version, "spoken"))
    else:
        speaks = f"procurd speaks {SUPPORTED_PROTOCOL}: check it"
        found.append(Point("protocol version", protocol_version, speaks, False))
    offset = learned.clock_offset_seconds
    if offset is None:
        found.append(Point("clock offset", "not measured", "the upstream sends no Date header"))
    else:
        direction = "ahead of" if offset >= 0 else "behind"
        text = f"this machine {abs(offset):.0f} s {direction} it"
        if abs(offset) > CLOCK_TOLERANCE_SECONDS:
            found.append(
                Point("clock offset", text, "synchronise this machine's clock: it refuses 60 s off", False)
            )
        else:
            found.append(Point("clock offset", text, "signed requests are within its 60 s window"))
    if learned.includes_inactive is None:
        found.append(Point("include_inactive", "not seen", "every listing asks it; a pass learns the answer"))
    elif learned.includes_inactive:
        found.append(
            Point(
                "include_inactive",
                "served (includes_inactive: true)",
                "what it takes off sale is made inactive by the next pass, incremental ones included",
            )
        )
    else:
        found.append(
            Point(
                "include_inactive",
                "not served",
                "what it takes off sale stays on sale here until the next full pass "
                "(full_sync_interval_seconds)",
            )
        )
    size, limit = learned.page_size, learned.page_size_max
    if size is None:
        found.append(Point("page size", "not seen", "the page size it answers is followed"))
    else:
        shown = f"at most {limit}" if limit is not None else f"{size} when asked {learned.page_size_asked}"
        found.append(Point("page size", shown, "the page size it answers is followed"))
    if learned.limiter_status is None:
        found.append(
            Point("limiter", "not seen", "HTTP 429 and HTTP 200 with status_code 429 are both waited out")
        )
    else:
        found.append(
            Point(
                "limiter",
                f"HTTP {learned.limiter_status} with the envelope",
                "waited out (never counted as an attempt); the shared budget keeps under its limit",
            )
        )
    if learned.inactive_detail is None:
        found.append(
            Point("inactive product detail", "not seen", "200 with is_active false and 404 read as inactive")
        )
    elif learned.inactive_detail == "200":
        found.append(Point("inactive product detail", "200 with is_active: false", "read as inactive"))
    else:
        found.append(Point("inactive product detail", "404 product_unavailable", "read as inactive"))
    found.append(
        Point(
            "currency",
            currency or "not seen",
            'costs are mirrored in it; selling prices are in [pricing] currency ("": this one)',
        )
    )
    found.append(
        Point(
            "member level",
            member_level or "none",
            "the prices it lists are what this key pays (its member prices)",
        )
    )
    return found
