"""``procurd probe``: a read-only conversation with an upstream that finds out which dialect it speaks.

At most four signed requests, each through the request budget every process shares (at ping priority): the
installation's own ping (protocol version, clock offset, currency, member level; recorded as every ping
is), one listing asked ``include_inactive=true`` and the largest page seed 000 allows (whether the answer
says ``includes_inactive: true``, the page size it answers), and the detail of at most two products known to
be off sale (one the listing shows inactive, else those the mirror holds inactive or removed): 200 with
``is_active: false`` or 404 ``product_unavailable``. Nothing is ordered. What it learns is recorded beside
what catalogue passes learn (``upstream_dialects``); what it could not see this time (the limiter's answer,
which only sending too much shows) comes from what earlier answers showed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

from procurd.core.clock import utcnow
from procurd.core.dialect import (
    DIALECT_NAMES,
    SEED_PAGE_SIZE_MAX,
    InactiveDetail,
    Learned,
    Point,
    detail_answer,
    dialect_text,
    points,
)
from procurd.db.views import WithDialects
from procurd.operations.pings import describe_failure, ping_upstream
from procurd.operations.runtime import Runtime
from procurd.upstream.errors import BusinessError, UpstreamError
from procurd.upstream.models import CatalogPage, PingResult
from procurd.upstream.ratelimit import Priority

log = structlog.get_logger("procurd.probe")

DETAILS_ASKED = 2  # products off sale whose detail is asked, at most


@dataclass
class Probe:
    """What one probe of an upstream found."""

    upstream: str
    base_url: str
    learned: Learned
    ping: PingResult | None = None
    error: UpstreamError | None = None
    requests: int = 0
    notes: list[str] = field(default_factory=list)  # what could not be asked, and why

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def member_level(self) -> dict[str, Any] | None:
        if self.ping is None or self.ping.member_level is None:
            return None
        return self.ping.member_level.to_json()

    def member_level_name(self) -> str | None:
        level = self.ping.member_level if self.ping is not None else None
        if level is None:
            return None
        names = level.name or {}
        return next(iter(names.values()), None) or level.slug or f"level {level.id}"

    def points(self) -> list[Point]:
        return points(
            self.learned,
            protocol_version=self.ping.protocol_version if self.ping else None,
            currency=self.ping.currency if self.ping else None,
            member_level=self.member_level_name(),
        )

    def as_json(self) -> dict[str, Any]:
        """The probe as ``procurd probe --json`` prints it."""
        learned = self.learned
        ping = self.ping
        return {
            "upstream": self.upstream,
            "base_url": self.base_url,
            "ok": self.ok,
            "error": None if self.error is None else describe_failure(self.error),
            "site_name": ping.site_name if ping else None,
            "protocol_version": ping.protocol_version if ping else None,
            "clock_offset_seconds": learned.clock_offset_seconds if ping else None,
            "include_inactive": learned.includes_inactive is True,
            "page_size_max": learned.page_size_max,
            "inactive_detail": learned.inactive_detail,
            "limiter_status": learned.limiter_status,
            "currency": ping.currency if ping else None,
            "member_level": self.member_level,
            "dialect": learned.dialect,
            "dialect_name": DIALECT_NAMES.get(learned.dialect or "", None),
            "summary": dialect_text(learned),
            "requests": self.requests,
            "points": [point.as_json() for point in self.points()],
        }


async def probe(runtime: Runtime, upstream: str) -> Probe:
    """Probe ``upstream`` once (see the module): what it speaks, as learned now and before."""
    settings = runtime.settings.upstream(upstream)
    earlier = await runtime.database.read(lambda tx: tx.dialects.of(upstream))
    found = Probe(upstream, settings.base_url, earlier, requests=1)
    ping = await ping_upstream(runtime, upstream)
    if isinstance(ping, UpstreamError):
        found.error = ping
        return found
    found.ping = ping
    client = runtime.client(upstream)
    learned: dict[str, Any] = {}
    now = utcnow()
    try:
        found.requests += 1
        page = await client.catalog_page(1, SEED_PAGE_SIZE_MAX, priority=Priority.PING)
    except UpstreamError as exc:
        found.notes.append(f"the listing could not be read: {describe_failure(exc)}")
        page = None
    if page is not None:
        learned.update(
            includes_inactive=page.includes_inactive is True,
            page_size_asked=SEED_PAGE_SIZE_MAX,
            page_size=page.page_size,
            listing_at=now,
        )
        answer = await _inactive_detail(runtime, upstream, page, found)
        if answer is not None:
            learned.update(inactive_detail=answer, inactive_detail_at=now)

    def record(tx: WithDialects) -> Learned:
        if learned:
            tx.dialects.learn(upstream, learned, now)
        return tx.dialects.of(upstream)

    await runtime.save_dialects()
    found.learned = await runtime.database.write(record)
    log.info("upstream.probed", upstream=upstream, dialect=found.learned.dialect, requests=found.requests)
    return found


async def _inactive_detail(
    runtime: Runtime, upstream: str, page: CatalogPage, found: Probe
) -> InactiveDetail | None:
    """What the upstream's detail answers for a product off sale: one the listing shows inactive, else one
    the mirror holds inactive or removed (a product deleted since tells nothing: the next is asked)."""
    listed = [item["id"] for item in page.items if item.get("is_active") is False]
    candidates = listed[:DETAILS_ASKED]
    if not candidates:
        candidates = await runtime.database.read(lambda tx: tx.dialects.off_sale(upstream, DETAILS_ASKED))
    if not candidates:
        found.notes.append("no product off sale is known: what its detail answers was not asked")
        return None
    client = runtime.client(upstream)
    for product_id in candidates:
        found.requests += 1
        try:
            product = await client.product(product_id, priority=Priority.PING)
        except BusinessError as exc:
            answer = detail_answer(exc.http_status or 0, exc.code, None)
        except UpstreamError as exc:
            found.notes.append(f"product {product_id}'s detail could not be read: {describe_failure(exc)}")
            continue
        else:
            answer = detail_answer(200, None, product.to_json())
        if answer is not None:
            return answer
    found.notes.append("the products off sale asked for were deleted or back on sale: nothing shown")
    return None
