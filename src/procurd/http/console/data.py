"""What each console page shows: one function per page, reading through the installation's operations (the
JSON API's, and the console's own reads in :mod:`procurd.operations.console`); the two actions that say what
they did in words (a pass started, a hold released) act through the operations as the JSON API does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Generic, TypeVar

from procurd.config import ProviderSettings, UpstreamSettings
from procurd.core.clock import utcnow
from procurd.core.instances import fold_stopped
from procurd.core.offering import balance_below
from procurd.core.orders import STATUS_MEANINGS, fulfillment_view, iso
from procurd.core.provider import cents_text
from procurd.core.records import OrderSummary
from procurd.core.rollup import DAY_COLUMNS, HOUR, VALUE_COLUMNS, hour_of, hours_from_rows, runway_hours
from procurd.http.console import pulse
from procurd.http.console.charts import Chart
from procurd.http.errors import ApiError
from procurd.operations import Operations
from procurd.operations.alerts import alert_view

T = TypeVar("T")

ORDER_STATUSES = tuple(STATUS_MEANINGS)
AUDIT_PAGE_SIZE = 50
HIDDEN_FULFILLMENT_FIELDS = ("payload", "delivery_data")


@dataclass(frozen=True, slots=True)
class Paged(Generic[T]):
    items: list[T]
    total: int
    page: int
    page_size: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.page_size))

    @property
    def first_index(self) -> int:
        return (self.page - 1) * self.page_size + 1 if self.items else 0

    @property
    def last_index(self) -> int:
        return (self.page - 1) * self.page_size + len(self.items)

    @property
    def has_previous(self) -> bool:
        return self.page > 1

    @property
    def has_next(self) -> bool:
        return self.page * self.page_size < self.total


# --- overview ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UpstreamOverview:
    status: dict[str, Any]
    exceptions_by_reason: dict[str, int]
    low_balance_threshold: str | None
    charts: list[Chart] = field(default_factory=list)  # the shop's pulse (none when asked without)


@dataclass(frozen=True, slots=True)
class Overview:
    generated_at: str
    instance: str
    upstreams: list[UpstreamOverview]
    storefront: dict[str, Any]
    alerts: list[dict[str, Any]]
    instances: list[dict[str, Any]]  # the daemon instances shown: alive, down, stopped within a day
    provider: ProviderOverview | None = None  # when [provider] enabled
    stopped_earlier: list[dict[str, Any]] = field(default_factory=list)  # stopped more than a day ago
    charts: bool = True  # drawn (the page may be asked for without them: ?charts=off)


async def overview(operations: Operations, *, charts: bool = True) -> Overview:
    """Per upstream: the status report (health, balance, runway, queue, oldest queued, last sync, callbacks)
    with its open exceptions by reason and (unless ``charts`` is off) its charts; recent alerts and the
    daemon instances (those stopped cleanly more than a day ago apart)."""
    settings = operations.settings
    report = await operations.housekeeping.status()
    shown, folded = fold_stopped(report["instances"], utcnow())
    pulses = await upstream_pulses(operations, report["upstreams"]) if charts else {}
    upstreams = [
        UpstreamOverview(
            status=entry,
            exceptions_by_reason=dict(sorted(entry["exceptions_by_reason"].items())),
            low_balance_threshold=low_balance_threshold(settings.upstream(entry["name"])),
            charts=pulses.get(entry["name"], []),
        )
        for entry in report["upstreams"]
    ]
    return Overview(
        generated_at=report["generated_at"],
        instance=report["instance"],
        upstreams=upstreams,
        storefront=report["storefront"],
        alerts=await recent_alerts(operations, limit=10),
        instances=[dict(instance) for instance in shown],
        stopped_earlier=[dict(instance) for instance in folded],
        provider=provider_overview(settings.provider, report["provider"]),
        charts=charts,
    )


def _decimal(value: Any) -> Decimal | None:
    try:
        return None if value in (None, "") else Decimal(str(value))
    except InvalidOperation:
        return None


def _balance_hours(
    samples: Sequence[tuple[datetime, str, str | None]], start: datetime
) -> list[Decimal | None]:
    """The last balance known at the end of each hour from ``start`` to the current one."""
    at_hour: dict[datetime, Decimal | None] = {}
    first: Decimal | None = None
    for at, balance, _currency in samples:
        if at < start:
            first = _decimal(balance)
        else:
            at_hour[hour_of(at)] = _decimal(balance)
    hours = [start + HOUR * index for index in range(pulse.BALANCE_DAYS * 24)]
    return pulse.carried([first, *(at_hour.get(hour) for hour in hours)])[1:]


async def upstream_pulses(
    operations: Operations, statuses: Sequence[dict[str, Any]]
) -> dict[str, list[Chart]]:
    """Each upstream's charts: one read of its hourly rollup (30 days) and of its balance (7 days)."""
    now = utcnow()
    hours_since, days_since = pulse.windows(now)
    balance_since = hour_of(now) - HOUR * (pulse.BALANCE_DAYS * 24 - 1)
    names = [entry["name"] for entry in statuses]
    found = await operations.console.upstream_history(names, hours_since, days_since, balance_since)
    pulses = {}
    for entry in statuses:
        history = found[entry["name"]]
        ping = entry["last_ping"]
        facts = pulse.PulseFacts(
            name=entry["name"], now=now, hours=hours_from_rows(history.hours, VALUE_COLUMNS),
            days=hours_from_rows(history.days, DAY_COLUMNS),
            balances=_balance_hours(history.balances, balance_since), balance=_decimal(ping["balance"]),
            currency=ping["currency"], spend_24h=_decimal(entry["spend_24h"]) or Decimal(0),
            runway_hours=entry["runway_hours"], runway_alert_hours=entry["runway_alert_hours"],
        )  # fmt: skip
        pulses[entry["name"]] = pulse.charts(facts)
    return pulses


# --- exceptions -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExceptionsPage:
    items: Paged[dict[str, Any]]
    reasons: dict[str, int]  # open exceptions per reason, over the upstream filter
    upstreams: list[str]


async def exceptions_page(
    operations: Operations, upstream: str | None, reason: str | None, page: int, page_size: int
) -> ExceptionsPage:
    total, items = await operations.views.exceptions(upstream, reason, page, page_size)
    by_upstream = await operations.console.exception_reasons()
    reasons: dict[str, int] = {}
    for name, counts in by_upstream.items():
        if upstream is None or name == upstream:
            for key, count in counts.items():
                reasons[key] = reasons.get(key, 0) + count
    upstreams = operations.runtime.service.upstream_names
    return ExceptionsPage(Paged(items, total, page, page_size), dict(sorted(reasons.items())), upstreams)


# --- orders -----------------------------------------------------------------------------------------------


async def orders_page(
    operations: Operations, text: str | None, status: str | None, page: int, page_size: int
) -> Paged[OrderSummary]:
    """Orders, newest first; ``text`` matches an order number (or its start), a downstream number, an upstream
    order id or an upstream order number."""
    total, items = await operations.console.orders(text, status, page, page_size)
    return Paged(items, total, page, page_size)


@dataclass(frozen=True, slots=True)
class OrderDetail:
    order: dict[str, Any]
    audit: Paged[dict[str, Any]]
    revealed: int | None  # the procurement whose delivered goods are shown


async def order_detail(
    operations: Operations, order_no: str, *, reveal: int | None = None, audit_page: int = 1
) -> OrderDetail | None:
    """The order view and (a page of) the audit trail of the JSON API; delivered goods (payload, delivery
    data) only for the procurement ``reveal``: the others' never reach the template."""
    view = await operations.views.order(order_no)
    if view is None:
        return None
    procurements = [_goods_hidden(item) if item["id"] != reveal else item for item in view["procurements"]]
    revealed = reveal if any(item["id"] == reveal for item in view["procurements"]) else None
    trail = await operations.views.audit(order_no)
    start = (audit_page - 1) * AUDIT_PAGE_SIZE
    audit = Paged(trail[start : start + AUDIT_PAGE_SIZE], len(trail), audit_page, AUDIT_PAGE_SIZE)
    return OrderDetail(dict(view, procurements=procurements), audit, revealed)


def _goods_hidden(item: Mapping[str, Any]) -> dict[str, Any]:
    fulfillment = item.get("fulfillment")
    if not fulfillment:
        return dict(item)
    hidden = dict.fromkeys(HIDDEN_FULFILLMENT_FIELDS)
    return dict(item, fulfillment=dict(fulfillment, **hidden, hidden=True))


# --- catalogue --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CatalogPage:
    products: Paged[dict[str, Any]]
    skus: dict[tuple[str, int], list[dict[str, Any]]]
    upstreams: list[str]


async def catalog_page(
    operations: Operations, text: str | None, upstream: str | None, page: int, page_size: int
) -> CatalogPage:
    found = await operations.console.catalog(text, upstream, page, page_size)
    return CatalogPage(
        Paged(found.products, found.total, page, page_size),
        found.skus,
        upstreams=operations.runtime.service.upstream_names,
    )


# --- sync runs --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyncPage:
    runs: Paged[dict[str, Any]]
    upstreams: list[str]


async def sync_page(operations: Operations, upstream: str | None, page: int, page_size: int) -> SyncPage:
    total, runs = await operations.console.sync_runs(upstream, page, page_size)
    return SyncPage(
        Paged(runs, total, page, page_size),
        operations.runtime.service.upstream_names,
    )


async def start_sync(operations: Operations, upstream: str, *, full: bool) -> str:
    """Start a catalogue pass of ``upstream`` now, as ``POST /api/v1/catalog/sync`` does; what was done, for a
    person."""
    if upstream not in operations.runtime.service.upstream_names:
        raise ApiError(400, "unknown_upstream", f"no upstream {upstream!r}")
    if not operations.catalog.start_sync(upstream, full=full):
        raise ApiError(409, "sync_in_progress", f"a pass of {upstream} is already running in this instance")
    kind = "full" if full else "catalogue"
    return f"A {kind} pass of {upstream} starts now; it shows here once it has begun."


# --- parts fed by the alerting, scale-out, reconciliation and pricing work ----------------------------


def low_balance_threshold(upstream: UpstreamSettings) -> str | None:
    """``[upstreams] low_balance_threshold`` ("" = off → ``None``)."""
    return upstream.low_balance_threshold or None


async def recent_alerts(operations: Operations, limit: int) -> list[dict[str, Any]]:
    """The latest alerts (the rows of ``GET /api/v1/alerts``)."""
    return (await alerts_page(operations, 1, limit)).items


async def alerts_page(operations: Operations, page: int, page_size: int) -> Paged[dict[str, Any]]:
    total, found = await operations.runtime.alerts.recent(page, page_size)
    return Paged([alert_view(alert) for alert in found], total, page, page_size)


async def offers_page(operations: Operations, page: int, page_size: int) -> Paged[dict[str, Any]]:
    """Offers with their sources in priority order and the source in use (``GET /api/v1/offers``)."""
    total, items = await operations.offers.page(page, page_size)
    return Paged(items, total, page, page_size)


async def reconcile_page(operations: Operations, page: int, page_size: int) -> Paged[dict[str, Any]]:
    """Reconciliation findings, newest first."""
    total, found = await operations.console.findings(page, page_size)
    items = [
        {
            "found_at": iso(finding.found_at),
            "upstream": finding.upstream,
            "order_no": finding.order_no,
            "field": finding.field,
            "local": finding.local_value,
            "remote": finding.upstream_value,
            "repaired": finding.repair,
        }
        for finding in found
    ]
    return Paged(items, total, page, page_size)


async def release_hold(operations: Operations, upstream: str, sku_id: int) -> str:
    """Release the price hold of a SKU (what ``POST /api/v1/catalog/holds/{upstream}/{sku_id}/release``
    does); what was done, for a person."""
    released = await operations.catalog.release_hold(upstream, sku_id)
    price = f"{released.sell_price} {released.sell_currency}" if released.sell_price else "no price"
    return f"The hold on {upstream} SKU {sku_id} is released; it now sells at {price}."


# --- provider ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProviderOverview:
    """The provider's part of the overview: the status report's ``provider`` with the accounts whose
    wallet is below the threshold."""

    facts: dict[str, Any]
    low_balance_threshold: str | None
    low_accounts: list[str]


def provider_overview(settings: ProviderSettings, facts: dict[str, Any]) -> ProviderOverview | None:
    if not settings.enabled or not facts.get("enabled"):
        return None
    threshold = settings.low_balance_threshold or None
    low = [entry["name"] for entry in facts["balances"] if balance_below(entry["balance"], threshold)]
    return ProviderOverview(facts, threshold, low)


@dataclass(frozen=True, slots=True)
class ProviderAccounts:
    items: list[dict[str, Any]]  # the admin API's account views (never a secret), each with "low"
    currency: str
    low_balance_threshold: str | None


async def provider_accounts(operations: Operations) -> ProviderAccounts:
    """Every account by name: status, level, balance (marked when low), orders by status."""
    settings = operations.settings.provider
    threshold = settings.low_balance_threshold or None
    items = [
        dict(view, low=balance_below(view["balance"], threshold))
        for view in await operations.provider.accounts.list()
    ]
    return ProviderAccounts(items, settings.currency, threshold)


@dataclass(frozen=True, slots=True)
class ProviderLevel:
    slug: str
    name: dict[str, str]
    discount_percent: str


@dataclass(frozen=True, slots=True)
class ProviderAccountPage:
    account: dict[str, Any]  # the admin API's account view (never its secret)
    ledger: Paged[dict[str, Any]]  # the newest movement first
    low: bool
    low_balance_threshold: str | None
    levels: list[ProviderLevel]  # the configured levels, to choose from
    charts: list[Chart] = field(default_factory=list)  # the account's pulse


async def account_pulse(operations: Operations, account: Mapping[str, Any]) -> list[Chart]:
    """A downstream account's charts: its share of the hourly rollup (its orders, on every upstream), and
    its wallet from its ledger (one index seek per hour) with its runway at the last 24 h's spend."""
    now = utcnow()
    start = hour_of(now) - HOUR * (pulse.BALANCE_DAYS * 24 - 1)
    ends = [min(start + HOUR * (index + 1), now) for index in range(pulse.BALANCE_DAYS * 24)]
    upstreams = [upstream.name for upstream in operations.settings.upstreams]
    account_id = int(account["id"])
    history = await operations.console.account_history(
        account_id, upstreams, pulse.windows(now), ends, now - timedelta(hours=24)
    )
    balance = _decimal(account["balance"])
    spent = Decimal(cents_text(history.spent_cents))
    facts = pulse.PulseFacts(
        name=f"account-{account_id}", now=now, hours=hours_from_rows(history.hours, VALUE_COLUMNS),
        days=hours_from_rows(history.days, DAY_COLUMNS),
        balances=[None if cents is None else Decimal(cents_text(cents)) for cents in history.wallet],
        balance=balance, currency=account["currency"], spend_24h=spent,
        runway_hours=runway_hours(balance, spent), runway_alert_hours=None, wallet="account's wallet",
        wallet_spent="Charged to the account's wallet for its orders in the last 24 h (refunds deducted)",
        upstream_spent="Paid upstream for its orders",
    )  # fmt: skip
    return pulse.charts(facts)


async def provider_account(
    operations: Operations, name: str, page: int, page_size: int
) -> ProviderAccountPage:
    """An account with a page of its ledger (``GET /api/v1/provider/accounts/{name}``) and its charts."""
    settings = operations.settings.provider
    view = await operations.provider.accounts.show(name, page, page_size)
    ledger = view.pop("ledger")
    threshold = settings.low_balance_threshold or None
    levels = [ProviderLevel(level.slug, dict(level.name), str(level.discount())) for level in settings.levels]
    return ProviderAccountPage(
        account=view,
        ledger=Paged(ledger["items"], ledger["total"], page, page_size),
        low=balance_below(view["balance"], threshold),
        low_balance_threshold=threshold,
        levels=levels,
        charts=await account_pulse(operations, view),
    )


@dataclass(frozen=True, slots=True)
class ProviderOrdersPage:
    orders: Paged[dict[str, Any]]
    accounts: list[str]  # every account's name, to filter by


async def provider_orders_page(
    operations: Operations, account: str | None, status: str | None, page: int, page_size: int
) -> ProviderOrdersPage:
    """Orders received from downstream sites, the newest first (``GET /api/v1/provider/orders``); their
    delivered goods never reach the template."""
    total, items = await operations.provider.orders(account, status, page, page_size)
    names = [view["name"] for view in await operations.provider.accounts.list()]
    orders = [dict(item, fulfillment=None) for item in items]
    return ProviderOrdersPage(Paged(orders, total, page, page_size), names)


@dataclass(frozen=True, slots=True)
class ProviderOrderDetail:
    order: dict[str, Any]  # the admin API's order view; fulfillment as the local order page shows it
    procurement: dict[str, Any] | None  # the local order that buys it, its goods hidden
    callback: dict[str, Any] | None  # the callback's state: status told, pending, tries, errors
    callback_log: list[dict[str, Any]]  # every try, the newest first
    revealed: bool  # the delivered goods are shown


async def provider_order_detail(
    operations: Operations, order_id: int, *, reveal: bool = False
) -> ProviderOrderDetail:
    """A provider order with the procurement behind it and its callback delivery log
    (``GET /api/v1/provider/orders/{id}``). Its delivered goods (payload, delivery data) reach the template
    only when ``reveal``; the procurement's never (its own order page reveals them)."""
    view = await operations.provider.order_detail(order_id)
    procurement = view.pop("procurement")
    callback = view.pop("callback")
    attempts = view.pop("callback_log")
    fulfillment = fulfillment_view(view["fulfillment"])
    if fulfillment is not None and not reveal:
        fulfillment = _goods_hidden({"fulfillment": fulfillment})["fulfillment"]
    if procurement is not None:
        procurement = dict(procurement, procurements=[_goods_hidden(p) for p in procurement["procurements"]])
    return ProviderOrderDetail(
        order=dict(view, fulfillment=fulfillment),
        procurement=procurement,
        callback=callback,
        callback_log=attempts,
        revealed=reveal and fulfillment is not None,
    )
