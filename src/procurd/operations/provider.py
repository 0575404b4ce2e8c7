"""The provider role's operations: the offered catalogue, orders from downstream sites, their callbacks.

An order from a downstream site is checked against the mirror (what the offered catalogue shows), priced at
what its account is shown, then charged and taken in for procurement in one transaction through the one
state path; its status then follows the procurement. A cancel from the downstream is upstream-first, as a
person's is. The signed API (:mod:`procurd.http.provider`), the admin API, the console and the command line
all act through here.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass
from datetime import timedelta
from decimal import ROUND_UP, Decimal
from typing import Any
from urllib.parse import urlsplit

import structlog

from procurd.config import ProviderLevelSettings
from procurd.core.addresses import private_url_reason
from procurd.core.alerts import Kind, Occurrence
from procurd.core.intake import MAX_QUANTITY, IntakeError, ItemRequest, OrderRequest
from procurd.core.json_limits import json_problem, text_problem
from procurd.core.offering import OfferFacts
from procurd.core.orders import iso
from procurd.core.pricing import SkuFacts, cost_limit, exchange_rate_of
from procurd.core.procurement import MirroredSku, Source, required_form_fields, unfilled_form
from procurd.core.provider import (
    CANCELED,
    CENT,
    ORDER_STATUSES,
    Account,
    ProviderIntake,
    ProviderOrder,
    cents_text,
    member_document,
    member_price,
    price_cents,
)
from procurd.core.refusals import Refused
from procurd.db.errors import Conflict
from procurd.db.offered_store import VERSION_QUERY
from procurd.db.types import utcnow
from procurd.operations.orders import OrderOperations
from procurd.operations.provider_accounts import ProviderAccountOperations
from procurd.operations.runtime import Runtime
from procurd.protocol.dujiao import listing_answer
from procurd.provider.callbacks import CallbackSender, record_try
from procurd.provider.catalog import OfferedCatalog, RefreshReport
from procurd.provider.pages import Page, PageCache

log = structlog.get_logger("procurd.provider")

MAX_DOWNSTREAM_NO_CHARS = 128
MAX_TRACE_CHARS = 128
MAX_URL_CHARS = 2048
NUMBER_TRIES = 3


def bad_request(message: str) -> Refused:
    return Refused(400, "bad_request", message)


def order_view(order: ProviderOrder, account: str | None = None) -> dict[str, Any]:
    """A provider order as the admin API shows it."""
    return {
        "id": order.id,
        "order_no": order.order_no,
        "procured": order.charged,
        "account": account,
        "account_id": order.account_id,
        "downstream_order_no": order.downstream_order_no,
        "trace_id": order.trace_id,
        "callback_url": order.callback_url,
        "status": order.status,
        "upstream": order.upstream,
        "product_id": order.product_id,
        "sku_id": order.sku_id,
        "upstream_sku_id": order.upstream_sku_id,
        "title": order.title,
        "quantity": order.quantity,
        "unit_price": order.unit_price,
        "amount": cents_text(order.amount_cents),
        "refunded": cents_text(order.refunded_cents),
        "currency": order.currency,
        "fulfillment": order.fulfillment,
        "created_at": iso(order.created_at),
        "updated_at": iso(order.updated_at),
    }


@dataclass(frozen=True, slots=True)
class OrderFacts:
    """What a downstream's order is checked against: the account's earlier order under the same
    ``downstream_order_no``, or the upstream, mirrored SKU, offered product id and title of the SKU."""

    existing: ProviderOrder | None
    upstream: str | None = None
    mirrored: MirroredSku | None = None
    product_id: int | None = None
    title: dict[str, Any] | None = None


class ProviderOperations:
    def __init__(self, runtime: Runtime, orders: OrderOperations) -> None:
        self.runtime = runtime
        self.settings = runtime.settings.provider
        self.local_orders = orders
        self.accounts = ProviderAccountOperations(runtime)
        self.catalog = OfferedCatalog(runtime.database, runtime.settings, runtime.instance)
        self.sender = CallbackSender(self.settings, metrics=runtime.metrics)
        self.pages = PageCache()
        # A downstream's cancels in flight, by provider order: the lock they take turns on, and how many.
        self._cancels: dict[int, tuple[asyncio.Lock, int]] = {}

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def level(self, account: Account) -> ProviderLevelSettings | None:
        return self.settings.level(account.level)

    # --- the offered catalogue ------------------------------------------------------------------------

    async def offer_facts(self) -> OfferFacts:
        """What the mirror holds for the provider to offer (``procurd doctor`` asks why it offers nothing)."""
        settings = self.runtime.settings
        upstreams = tuple(settings.offered_upstreams())
        selling = await self.runtime.database.read(lambda tx: tx.offered.selling_currencies(upstreams))
        return OfferFacts(settings.provider.currency, upstreams, selling, len(settings.pricing.rules))

    async def refresh(
        self, upstreams: list[str] | None = None, *, full: bool = False
    ) -> RefreshReport | None:
        """Bring the offered catalogue in step with the mirror (nothing when the provider is off)."""
        if not self.enabled:
            return None
        return await self.catalog.refresh(upstreams, full=full)

    async def categories(self) -> list[dict[str, Any]]:
        """The offered upstreams' categories under their offered ids."""
        offered = self.runtime.settings.offered_upstreams()
        rows, ids = await self.runtime.database.read(
            lambda tx: (tx.offered.categories(offered), tx.offered.upstream_ids("category", offered))
        )
        shown = []
        for row in rows:
            identity = ids.get((row["upstream"], int(row["id"])))
            if identity is None:
                continue  # not offered yet: the next refresh gives it an id
            parent = int(row["parent_id"])
            shown.append(
                {
                    "id": identity,
                    "parent_id": 0 if parent == 0 else ids.get((row["upstream"], parent), 0),
                    "slug": row["slug"],
                    "name": row["name"],
                    "icon": row["icon"],
                    "sort_order": row["sort_order"],
                }
            )
        return shown

    async def products(
        self,
        account: Account,
        page: int,
        page_size: int,
        category_id: int | None,
        updated_after: Any,
        include_inactive: bool = False,
    ) -> Page:
        """A page of the offered products as ``account`` sees them (``GET /products``'s whole answer, kept
        gzip-compressed): from the pages kept for its tier while the offered catalogue is at the version read
        first (:mod:`procurd.provider.pages`), else built now.

        ``include_inactive`` (asked by Dujiao-Next's own downstream): every product offered before that is no
        longer on sale is listed too, with ``is_active: false``, and the answer says ``includes_inactive:
        true``; without it only products on sale are listed and the answer says nothing of it."""
        offered = self.runtime.settings.offered_upstreams()
        level = self.level(account)
        key = (
            None if level is None else level.slug,
            page,
            page_size,
            category_id,
            updated_after,
            include_inactive,
        )
        echo = True if include_inactive else None

        async def build() -> tuple[int, Page]:
            version, (total, rows) = await self.runtime.database.read(
                lambda tx: (
                    tx.offered.version(),
                    tx.offered.listing(
                        offered, page, page_size, category_id, updated_after, include_inactive
                    ),
                )
            )
            if level is None:
                documents = [row.document.encode() for row in rows]
            else:
                discount = level.discount()
                documents = [
                    _dump(member_document(json.loads(row.document), discount, row.floors or {}))
                    for row in rows
                ]
            return version, Page.of(total, listing_answer(documents, total, page, page_size, echo))

        version = int(await self.runtime.database.glance(VERSION_QUERY) or 0)
        return await self.pages.get(version, key, build)

    async def product(self, account: Account, product_id: int) -> bytes:
        """One offered product; 404 ``product_not_found``, or ``product_unavailable`` when it is not offered
        now (inactive, removed, nothing left to sell)."""
        row = await self.runtime.database.read(lambda tx: tx.offered.product(product_id))
        if row is None:
            raise Refused(404, "product_not_found", "product not found")
        if not row.listed or row.upstream not in self.runtime.settings.offered_upstreams():
            raise Refused(404, "product_unavailable", "product is inactive")
        level = self.level(account)
        if level is None:
            return row.document.encode()
        return _dump(member_document(json.loads(row.document), level.discount(), row.floors or {}))

    # --- orders from downstream sites -------------------------------------------------------------------

    async def existing_order(self, account: Account, downstream_order_no: str) -> ProviderOrder | None:
        """The account's order under ``downstream_order_no``, if it has one."""
        key = (account.id, downstream_order_no)
        found = await self.runtime.database.read(lambda tx: tx.provider.orders_by_downstream([key]))
        return found.get(key)

    async def create_order(
        self,
        account: Account,
        *,
        sku_id: int,
        quantity: int,
        manual_form_data: dict[str, Any] | None,
        downstream_order_no: str | None,
        trace_id: str | None,
        callback_url: str | None,
    ) -> tuple[ProviderOrder, bool]:
        """A downstream site's order, checked, priced, charged and taken in for procurement: the provider
        order and whether it is new (a repeat of ``downstream_order_no`` answers the earlier one, whatever
        it asks now). An order the wallet cannot pay is recorded ``canceled``: seed 000's ``payment_failed``.

        What the checks need (the earlier order, the SKU, its product) is read in one transaction."""
        _check_fields(quantity, manual_form_data, downstream_order_no, trace_id, callback_url)
        facts = await self.runtime.database.read(self._order_facts, account.id, downstream_order_no, sku_id)
        if facts.existing is not None:
            self.runtime.metrics.provider_orders.labels(account.name, "repeat").inc()
            return facts.existing, False
        if callback_url:
            self._check_callback_url(callback_url)
        upstream, mirrored, product_id = self._offered(facts)
        if mirrored.fulfillment_type == "manual":
            missing = unfilled_form(mirrored.manual_form_schema, manual_form_data)
            if missing is not None:
                missing = missing or required_form_fields(mirrored.manual_form_schema)
                raise bad_request(
                    "manual_form_data is required for this product"
                    + (f": missing {', '.join(missing)}" if missing else "")
                )
        if mirrored.stock_problem(quantity) is not None:
            raise Refused(409, "insufficient_stock", "stock is too low for this quantity")
        unit, limit = self._price(account, upstream, mirrored)
        for _ in range(NUMBER_TRIES):
            order_no = f"P{account.id}-{secrets.token_hex(6)}"
            request = OrderRequest(
                order_no=order_no,
                trace_id=trace_id or None,
                items=[
                    ItemRequest(
                        upstream=upstream,
                        sku_id=mirrored.id,
                        quantity=quantity,
                        manual_form_data=manual_form_data,
                        max_unit_price=limit,
                    )
                ],
            )
            intake = ProviderIntake(
                account_id=account.id, order_no=order_no, downstream_order_no=downstream_order_no or None,
                trace_id=trace_id or None, callback_url=callback_url or None, upstream=upstream,
                product_id=product_id, sku_id=sku_id, upstream_sku_id=mirrored.id, title=facts.title,
                fulfillment_type=mirrored.fulfillment_type, quantity=quantity, unit_price=unit,
                amount_cents=price_cents(unit) * quantity, currency=self.settings.currency,
            )  # fmt: skip
            try:
                result = await self.runtime.service.submit(request, intake)
            except Conflict:
                continue  # another process took this number, or this downstream number, at the same moment
            except IntakeError as exc:
                raise _intake_refusal(exc) from None
            break
        else:
            raise Refused(503, "busy", "the order could not be numbered; try again")
        order = result.provider
        assert order is not None
        outcome = "repeat" if not result.created else "payment_failed" if order.status == CANCELED else "paid"
        self.runtime.metrics.provider_orders.labels(account.name, outcome).inc()
        if result.created:
            log.info(
                "provider.order_received",
                account=account.name,
                provider_order_id=order.id,
                order_no=order.order_no,
                downstream_order_no=order.downstream_order_no,
                trace_id=order.trace_id,
                amount=cents_text(order.amount_cents),
                outcome=outcome,
            )
            if outcome == "paid" and self.settings.low_balance_threshold:
                after = await self.accounts.get(account.name)
                await self.accounts.check_balance(after, after.balance_cents)
        return order, result.created

    def _check_callback_url(self, url: str) -> None:
        try:
            parts = urlsplit(url)
        except ValueError:  # a bracketed host that is not one ("http://[::1"): no URL at all
            parts = urlsplit("")
        # urlsplit drops surrounding spaces and any tab or newline: a URL holding them is refused, not mended.
        unclean = any(char.isspace() or char < " " or char == "\x7f" for char in url)
        if unclean or parts.scheme not in ("http", "https") or not parts.hostname:
            raise Refused(
                400,
                "invalid_callback_url",
                "callback_url must be an http or https URL with a host, without spaces or control characters",
            )
        if not self.settings.allow_private_callback_url:
            problem = private_url_reason(url)
            if problem is not None:
                raise Refused(400, "invalid_callback_url", refused_callback_url(problem))

    def _order_facts(
        self, tx: Any, account_id: int, downstream_order_no: str | None, sku_id: int
    ) -> OrderFacts:
        """What an order of ``sku_id`` is checked against, read in one transaction."""
        existing = None
        if downstream_order_no:
            key = (account_id, downstream_order_no)
            existing = tx.provider.orders_by_downstream([key]).get(key)
            if existing is not None:
                return OrderFacts(existing)
        source = tx.offered.sku_source(sku_id)
        if source is None or source.upstream not in self.runtime.settings.offered_upstreams():
            return OrderFacts(None)
        key = (source.upstream, source.upstream_id)
        mirrored = tx.procurements.mirrored_skus([key]).get(key)
        return OrderFacts(None, source.upstream, mirrored, source.product_id, source.title)

    def _offered(self, facts: OrderFacts) -> tuple[str, MirroredSku, int]:
        """The upstream, the mirrored SKU and the offered product id an offered SKU id stands for; 400
        ``sku_unavailable`` / ``product_unavailable`` when it cannot be sold now."""
        mirrored = facts.mirrored
        if (
            facts.upstream is None
            or mirrored is None
            or facts.product_id is None
            or mirrored.sku_removed
            or not mirrored.sku_active
            or mirrored.sell_price is None
            or mirrored.sell_currency != self.settings.currency
        ):
            raise Refused(400, "sku_unavailable", "sku is missing or inactive")
        if not mirrored.product_known or mirrored.product_removed or not mirrored.product_active:
            raise Refused(400, "product_unavailable", "product is inactive or unavailable")
        return facts.upstream, mirrored, facts.product_id

    def _price(self, account: Account, upstream: str, sku: MirroredSku) -> tuple[str, str | None]:
        """The unit price ``account`` is shown (its tier's member price, never under cost), and the most a
        unit may cost upstream for it not to be a loss."""
        assert sku.sell_price is not None
        offered = format(Decimal(sku.sell_price).quantize(CENT, rounding=ROUND_UP), "f")
        facts = SkuFacts(
            id=sku.id, product_id=sku.product_id, category_id=sku.category_id, cost=sku.price_amount,
            live=True, sell_price=sku.sell_price, sell_currency=sku.sell_currency, held=False,
        )  # fmt: skip
        rate = exchange_rate_of(upstream, facts, self.runtime.settings.pricing.compiled().rules)
        unit = offered
        level = self.level(account)
        if level is not None:
            floor = None if rate is None else format(Decimal(sku.price_amount) * rate, "f")
            unit = member_price(offered, level.discount(), floor)
        limit = None if rate is None else cost_limit(unit, rate, sku.price_amount)
        return unit, limit

    async def order_of(self, account: Account, order_id: int) -> ProviderOrder:
        """The account's own order; 404 ``order_not_found`` for any other."""
        order = await self.runtime.database.read(lambda tx: tx.provider.order(order_id, account.id))
        if order is None:
            raise Refused(404, "order_not_found", "order not found")
        return order

    async def cancel(self, account: Account, order_id: int) -> ProviderOrder:
        """A downstream's cancel, upstream-first: allowed only when nothing was bought yet or the upstream
        cancels; then the order is canceled and refunded. 409 ``cancel_not_allowed`` otherwise.

        A cancel of an order that is canceled already answers it, canceled, as a repeated order answers the
        existing one: a downstream that lost the first answer and asks again learns that the cancel
        happened. Cancels of one order on one instance wait for each other, so that a second one, sent
        while the first was still asking the upstream, sees the first one's outcome."""
        lock, users = self._cancels.get(order_id, (asyncio.Lock(), 0))
        self._cancels[order_id] = (lock, users + 1)
        try:
            async with lock:
                return await self._cancel(account, order_id)
        finally:
            lock, users = self._cancels[order_id]
            if users == 1:
                del self._cancels[order_id]
            else:
                self._cancels[order_id] = (lock, users - 1)

    async def _cancel(self, account: Account, order_id: int) -> ProviderOrder:
        order = await self.order_of(account, order_id)
        if order.status == CANCELED:
            return order
        if order.status not in ("paid", "fulfilling", "partially_delivered"):
            raise Refused(409, "cancel_not_allowed", f"an order in status {order.status} cannot be canceled")
        try:
            await self.local_orders.cancel(order.order_no, source=Source.DOWNSTREAM)
        except Refused as refused:
            if refused.code != "cancel_not_allowed":
                raise
            # Another instance's cancel of the same order may have won meanwhile: then it is canceled.
            now = await self.order_of(account, order_id)
            if now.status == CANCELED:
                return now
            raise Refused(
                409, "cancel_not_allowed", "the upstream does not allow canceling this order"
            ) from None
        log.info("provider.order_canceled", account=account.name, provider_order_id=order.id)
        return await self.order_of(account, order_id)

    # --- for operators --------------------------------------------------------------------------------

    async def orders(
        self, account_name: str | None, status: str | None, page: int, page_size: int
    ) -> tuple[int, list[dict[str, Any]]]:
        """Orders received from downstream sites, the newest first (of one account, in one status)."""
        if status is not None and status not in ORDER_STATUSES:
            raise Refused(400, "invalid_query", f"status must be one of {', '.join(ORDER_STATUSES)}")
        account_id = None if account_name is None else (await self.accounts.get(account_name)).id
        total, found, accounts = await self.runtime.database.read(
            lambda tx: (*tx.provider.orders(account_id, status, page, page_size), tx.provider.accounts())
        )
        names = {account.id: account.name for account in accounts}
        return total, [order_view(order, names.get(order.account_id)) for order in found]

    async def order_detail(self, order_id: int) -> dict[str, Any]:
        """One order with the procurement behind it and its callback delivery log."""

        def read(tx: Any) -> Any:
            order = tx.provider.order(order_id)
            if order is None:
                return None
            account = tx.provider.account(id=order.account_id)
            return order, account, tx.provider.callback_state(order_id), tx.provider.attempts(order_id)

        found = await self.runtime.database.read(read)
        if found is None:
            raise Refused(404, "order_not_found", f"no provider order {order_id}")
        order, account, state, attempts = found
        view = order_view(order, account.name if account else None)
        view["procurement"] = await self.local_orders.views.order(order.order_no)
        view["callback"] = None if state is None else {
            "status": state.status,
            "pending": state.pending,
            "attempts": state.attempts,
            "first_attempt_at": iso(state.first_attempt_at),
            "next_attempt_at": iso(state.next_attempt_at),
            "delivered_at": iso(state.delivered_at),
            "given_up_at": iso(state.given_up_at),
            "last_error": state.last_error,
        }  # fmt: skip
        view["callback_log"] = [
            {"at": iso(a.at), "status": a.status, "http_status": a.http_status, "ok": a.ok,
             "message": a.message, "replay": a.replay, "outcome": a.outcome}
            for a in attempts
        ]  # fmt: skip
        return view

    async def replay(self, order_id: int) -> dict[str, Any]:
        """Tell the order's latest status to its downstream now, signed afresh (idempotent for the
        receiver); the order with its delivery log."""

        def read(tx: Any) -> tuple[ProviderOrder | None, Account | None]:
            order = tx.provider.order(order_id)
            return order, None if order is None else tx.provider.account(id=order.account_id)

        order, account = await self.runtime.database.read(read)
        if order is None or account is None:
            raise Refused(404, "order_not_found", f"no provider order {order_id}")
        if not order.callback_url:
            raise Refused(
                409, "no_callback_url", f"provider order {order_id} was placed without a callback_url"
            )
        delivery = await self.sender.send(account, order)
        await record_try(self.runtime.database, self.settings, order, order.status, delivery, owner=None)
        return await self.order_detail(order_id)

    # --- checks -----------------------------------------------------------------------------------------

    async def check(self) -> None:
        """Alert ``provider_low_balance`` for wallets below the threshold and ``provider_callbacks_failing``
        for accounts whose callbacks keep failing (or were given up)."""
        if not self.enabled:
            return
        settings = self.runtime.settings
        since = utcnow() - timedelta(seconds=settings.alerts.unhealthy_after_seconds)
        failing, accounts = await self.runtime.database.read(
            lambda tx: (tx.provider.failing_callbacks(since), tx.provider.accounts())
        )
        by_id = {account.id: account for account in accounts}
        occurrences = []
        for account_id, (still_failing, given_up) in failing.items():
            account = by_id.get(account_id)
            if account is None or not (still_failing or given_up):
                continue
            parts = []
            if still_failing:
                parts.append(
                    f"{still_failing} still failing after {settings.alerts.unhealthy_after_seconds:g} s"
                )
            if given_up:
                parts.append(f"{given_up} given up after {self.settings.callback_give_up_seconds:g} s")
            message = (
                f"callbacks to provider account {account.name}: {'; '.join(parts)}. Check the downstream's "
                "callback receiver; the order's delivery log shows each try "
                "(procurd provider orders --account NAME); replay it with "
                "POST /api/v1/provider/orders/ID/callback."
            )
            occurrences.append(Occurrence(Kind.PROVIDER_CALLBACKS_FAILING, account.name, message))
        await self.runtime.alerts.raise_(*occurrences)
        for account in accounts:
            await self.accounts.check_balance(account, account.balance_cents)


def refused_callback_url(problem: str) -> str:
    """The message of a refused ``callback_url``: what is wrong, and the setting that decides it, which is
    this provider's (a downstream's own ``[server] allow_private_callback_url`` does not change it)."""
    return (
        f"callback_url is not allowed: {problem}. This upstream calls back public addresses only; for a "
        "chain on one machine its operator sets [provider] allow_private_callback_url = true in the "
        "upstream's configuration"
    )


def _dump(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode()


def _check_fields(
    quantity: int,
    form: dict[str, Any] | None,
    downstream_order_no: str | None,
    trace_id: str | None,
    callback_url: str | None,
) -> None:
    """Bounds a request's fields must keep (400 ``bad_request`` naming the field)."""
    if quantity > MAX_QUANTITY:
        raise bad_request(f"quantity must be at most {MAX_QUANTITY}")
    for name, value, limit in (
        ("downstream_order_no", downstream_order_no, MAX_DOWNSTREAM_NO_CHARS),
        ("trace_id", trace_id, MAX_TRACE_CHARS),
        ("callback_url", callback_url, MAX_URL_CHARS),
    ):
        if value is None:
            continue
        if len(value) > limit:
            raise bad_request(f"{name} is longer than {limit} characters")
        problem = text_problem(value)
        if problem is not None:
            raise bad_request(f"{name} {problem}")
    if form is not None:
        problem = json_problem(form)
        if problem is not None:
            raise bad_request(f"manual_form_data cannot be accepted: {problem}")


def _intake_refusal(exc: IntakeError) -> Refused:
    """What a downstream is told when its order, checked against the mirror a moment ago, can no longer be
    taken in (the mirror changed meanwhile)."""
    if exc.code in ("sku_not_found", "sku_inactive"):
        return Refused(400, "sku_unavailable", "sku is missing or inactive")
    if exc.code == "account_disabled":
        return Refused(401, "invalid_api_key", "API key is invalid or disabled")
    if exc.code in ("product_not_found", "product_inactive"):
        return Refused(400, "product_unavailable", "product is inactive or unavailable")
    if exc.code == "insufficient_stock":
        return Refused(409, "insufficient_stock", "stock is too low for this quantity")
    return bad_request(exc.message)
