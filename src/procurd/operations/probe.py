"""``procurd probe``: a read-only conversation with an upstream that finds out which dialect it speaks.

At most four signed requests, each through the request budget every process shares (at ping priority): the
installation's own ping (protocol version, clock offset, currency, member level; recorded as every ping
is), one listing asked ``include_inactive=true`` and the largest page seed 000 allows (whether the answer
says ``includes_inactive: true``, the page size it answers), and the detail of at most two products known to
be off sale (one the listing shows inactive, else those the mirror holds inactive or removed): 200 with
``is_active: false`` or 404 ``product_unavailable``. Nothing is ordered. What it learns is recorded beside
what catalogue passes learn (``upstream_dialects``); what it could not see this time (the limiter's answer,
which only sending too much shows) comes from what earlier answers showed.

An acg-faka supplier has no dialects of seed 000 to learn but a version it never reports: its probe is the
ping (``connect``) and the four requests of
:meth:`~procurd.protocol.acgfaka.client.AcgFakaClient.features`, each asking a later endpoint about nothing
(a code and a trade number no shop uses), and says which of them the version has.
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
from procurd.protocol.acgfaka.client import Features
from procurd.protocol.acgfaka.upstream import AcgFakaUpstream
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
    protocol: str = "dujiao"
    features: Features | None = None  # acg-faka: which later endpoints the version has

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
        if self.protocol == "acg-faka":
            return acg_faka_points(self.features, self.ping)
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
        if self.protocol == "acg-faka":
            return self._acg_faka_json()
        return {
            "upstream": self.upstream,
            "protocol": self.protocol,
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

    def _acg_faka_json(self) -> dict[str, Any]:
        """An acg-faka supplier's probe: the keys of a Dujiao-Next one where they apply (the others null),
        and which features its version has."""
        ping, features = self.ping, self.features
        return {
            "upstream": self.upstream,
            "protocol": self.protocol,
            "base_url": self.base_url,
            "ok": self.ok,
            "error": None if self.error is None else describe_failure(self.error),
            "site_name": ping.site_name if ping else None,
            "protocol_version": None,
            "clock_offset_seconds": None,
            "include_inactive": False,
            "page_size_max": None,
            "inactive_detail": None,
            "limiter_status": self.learned.limiter_status,
            "currency": ping.currency if ping else None,
            "member_level": None,
            "dialect": None,
            "dialect_name": None,
            "summary": acg_faka_summary(features),
            "requests": self.requests,
            "points": [point.as_json() for point in self.points()],
            "features": None
            if features is None
            else {
                "valuation": features.valuation,
                "stock": features.stock,
                "query": features.query,
                "item": features.item,
            },
            "version_range": None if features is None else features.version_range,
        }


def acg_faka_summary(features: Features | None) -> str:
    if features is None:
        return "acg-faka (its version not read)"
    has = [name for name in ("valuation", "stock", "query") if getattr(features, name)]
    if features.item is not None:
        has.append(f"item by {features.item}")
    return f"acg-faka {features.version_range} ({', '.join(has) or 'none of the later endpoints'})"


def acg_faka_points(features: Features | None, ping: PingResult | None) -> list[Point]:
    """What an acg-faka supplier's version has, each with what procurd does about it."""
    found: list[Point] = []
    if ping is not None:
        found.append(
            Point("currency", ping.currency, "taken from the block's currency: acg-faka reports none")
        )
    if features is None:
        return found
    found.append(
        Point("version", features.version_range, "read from which endpoints answer: acg-faka reports none")
    )
    if features.valuation:
        found.append(Point("valuation", "yes", "each choice priced as a trade charges it"))
    else:
        source = "inventory's" if features.price_source.value == "inventory" else "the listing's"
        found.append(
            Point(
                "valuation",
                "no",
                f"prices from {source} cost fields, which can miss a member group's discount",
                False,
            )
        )
    if features.stock:
        found.append(Point("stock", "yes", "stock read per choice"))
    else:
        found.append(
            Point("stock", "no", "stock from inventory's count (card goods) or the listing's counter", False)
        )
    item = {"code": "by code (3.1.3 on)", "sharedCode": "by sharedCode (1.3.9 to 3.1.0)"}
    found.append(
        Point("item", item.get(features.item or "", "no"), "not needed by the mirror (items lists all)")
    )
    if features.query:
        found.append(Point("query", "yes", "a trade's goods are read again by its trade number"))
    else:
        found.append(
            Point(
                "query",
                "no",
                "a lost trade answer cannot be looked up, and the shop may ignore request_no: "
                "a repeated trade could buy again",
                False,
            )
        )
    return found


async def probe(runtime: Runtime, upstream: str) -> Probe:
    """Probe ``upstream`` once (see the module): what it speaks, as learned now and before."""
    settings = runtime.settings.upstream(upstream)
    earlier = await runtime.database.read(lambda tx: tx.dialects.of(upstream))
    found = Probe(upstream, settings.base_url, earlier, requests=1, protocol=settings.protocol)
    ping = await ping_upstream(runtime, upstream)
    if isinstance(ping, UpstreamError):
        found.error = ping
        return found
    found.ping = ping
    client = runtime.client(upstream)
    if isinstance(client, AcgFakaUpstream):
        found.requests += 4
        try:
            found.features = await client.features(priority=Priority.PING)
        except UpstreamError as exc:
            found.error = exc
        log.info("upstream.probed", upstream=upstream, protocol="acg-faka", requests=found.requests)
        return found
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
