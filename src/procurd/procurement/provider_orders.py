"""The provider role's part of the one state path: a downstream site's order is checked, priced, charged to
its wallet and taken in for procurement in one transaction, and its status then follows the procurement.

Used by :func:`procurd.procurement.transitions.apply_batch`. The wallets a batch touches are locked (in id
order, after the orders) and their balances decided in memory, like every other change of the batch:

* an order whose ``(account, downstream_order_no)`` exists answers that order, whatever it asks now;
* else it is checked once, against the offered SKU and its mirror row as the transaction reads them
  (:func:`placement_intake`): the SKU and its product on sale, the manual form, the stock; and priced at what
  the account's level is shown (never under cost), with the most a unit may cost upstream;
* one the wallet can pay is charged (ledger ``order``), becomes ``paid`` and is procured;
* one it cannot is recorded ``canceled`` (seed 000's ``payment_failed``) and bought nowhere;
* when its procurement changes, the order shows :func:`procurd.core.provider.provider_status`, keeps the
  upstream's fulfillment as it came, is refunded when it ends canceled (ledger ``refund``), and its new
  status is queued for the downstream's callback.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import ROUND_UP, Decimal
from typing import Any

from procurd.core.intake import IntakeError, ItemRequest, OrderRequest
from procurd.core.orders import Order
from procurd.core.pricing import PricingRule, SkuFacts, cost_limit, exchange_rate_of
from procurd.core.procurement import MirroredSku, Procurement, required_form_fields, unfilled_form
from procurd.core.provider import (
    CANCELED,
    CENT,
    PAID,
    Account,
    ProviderIntake,
    ProviderOrder,
    ProviderTerms,
    member_price,
    price_cents,
    provider_status,
)
from procurd.core.refusals import Refused
from procurd.db.offered_store import SkuSource
from procurd.db.views import WithOffered, WithProvider
from procurd.procurement.commands import ProviderPlacement


def bad_request(message: str) -> Refused:
    return Refused(400, "bad_request", message)


def sku_unavailable() -> Refused:
    return Refused(400, "sku_unavailable", "sku is missing or inactive")


def product_unavailable() -> Refused:
    return Refused(400, "product_unavailable", "product is inactive or unavailable")


def insufficient_stock() -> Refused:
    return Refused(409, "insufficient_stock", "stock is too low for this quantity")


def offered_sources(tx: WithOffered, sku_ids: Collection[int]) -> dict[int, SkuSource]:
    """What each offered SKU id stands for, in one statement (an id the provider never offered is left
    out)."""
    return tx.offered.sku_sources(sku_ids) if sku_ids else {}


def placement_intake(
    placement: ProviderPlacement,
    source: SkuSource | None,
    skus: Mapping[tuple[str, int], MirroredSku],
    account: Account | None,
    terms: ProviderTerms,
    pricing: Sequence[PricingRule],
) -> tuple[OrderRequest, ProviderIntake]:
    """A downstream's new order checked against the offered SKU's ``source`` and its mirror row in ``skus``,
    priced for ``account`` (as its locked row says now): the local order that buys it and the provider order
    to charge. :class:`Refused` with what the downstream is told when it cannot be sold as asked."""
    if placement.callback_problem is not None:
        raise Refused(400, "invalid_callback_url", placement.callback_problem)
    if source is None or source.upstream not in terms.upstreams:
        raise sku_unavailable()
    mirrored = skus.get((source.upstream, source.upstream_id))
    if (
        mirrored is None
        or source.product_id is None
        or mirrored.sku_removed
        or not mirrored.sku_active
        or mirrored.sell_price is None
        or mirrored.sell_currency != terms.currency
    ):
        raise sku_unavailable()
    if not mirrored.product_known or mirrored.product_removed or not mirrored.product_active:
        raise product_unavailable()
    form = placement.manual_form_data
    if mirrored.fulfillment_type == "manual":
        missing = unfilled_form(mirrored.manual_form_schema, form)
        if missing is not None:
            missing = missing or required_form_fields(mirrored.manual_form_schema)
            raise bad_request(
                "manual_form_data is required for this product"
                + (f": missing {', '.join(missing)}" if missing else "")
            )
    if mirrored.stock_problem(placement.quantity) is not None:
        raise insufficient_stock()
    discount = None if account is None else terms.discounts.get(account.level or "")
    unit, limit = unit_price(source.upstream, mirrored, discount, pricing)
    request = OrderRequest(
        order_no=placement.order_no,
        trace_id=placement.trace_id,
        items=[
            ItemRequest(
                upstream=source.upstream,
                sku_id=mirrored.id,
                quantity=placement.quantity,
                manual_form_data=form,
                max_unit_price=limit,
            )
        ],
    )
    intake = ProviderIntake(
        account_id=placement.account_id, order_no=placement.order_no,
        downstream_order_no=placement.downstream_order_no, trace_id=placement.trace_id,
        callback_url=placement.callback_url, upstream=source.upstream, product_id=source.product_id,
        sku_id=placement.sku_id, upstream_sku_id=mirrored.id, title=source.title,
        fulfillment_type=mirrored.fulfillment_type, quantity=placement.quantity, unit_price=unit,
        amount_cents=price_cents(unit) * placement.quantity, currency=terms.currency,
    )  # fmt: skip
    return request, intake


def unit_price(
    upstream: str, sku: MirroredSku, discount: Decimal | None, pricing: Sequence[PricingRule]
) -> tuple[str, str | None]:
    """The unit price an account is shown (its level's member price, never under cost; ``discount`` None: no
    level), and the most a unit may cost upstream for it not to be a loss."""
    assert sku.sell_price is not None
    offered = format(Decimal(sku.sell_price).quantize(CENT, rounding=ROUND_UP), "f")
    facts = SkuFacts(
        id=sku.id, product_id=sku.product_id, category_id=sku.category_id, cost=sku.price_amount,
        live=True, sell_price=sku.sell_price, sell_currency=sku.sell_currency, held=False,
    )  # fmt: skip
    rate = exchange_rate_of(upstream, facts, pricing)
    unit = offered
    if discount is not None:
        floor = None if rate is None else format(Decimal(sku.price_amount) * rate, "f")
        unit = member_price(offered, discount, floor)
    limit = None if rate is None else cost_limit(unit, rate, sku.price_amount)
    return unit, limit


def intake_refusal(exc: IntakeError) -> Refused:
    """What a downstream is told when intake refuses its order (the account disabled since its request was
    authenticated, or what intake checks of every order)."""
    if exc.code in ("sku_not_found", "sku_inactive"):
        return sku_unavailable()
    if exc.code == "account_disabled":
        return Refused(401, "invalid_api_key", "API key is invalid or disabled")
    if exc.code in ("product_not_found", "product_inactive"):
        return product_unavailable()
    if exc.code == "insufficient_stock":
        return insufficient_stock()
    return bad_request(exc.message)


@dataclass
class ProviderBatch:
    """What a batch knows and decides of provider orders and wallets."""

    accounts: dict[int, Account] = field(default_factory=dict)  # locked for the transaction
    balances: dict[int, int] = field(default_factory=dict)  # as the batch left them
    orders: dict[str, ProviderOrder] = field(default_factory=dict)  # by order_no, new ones included
    by_downstream: dict[tuple[int, str], ProviderOrder] = field(default_factory=dict)
    new: list[str] = field(default_factory=list)  # order_nos inserted by this batch
    changed: set[str] = field(default_factory=set)  # order_nos updated by this batch
    ledger: list[dict[str, Any]] = field(default_factory=list)  # rows; ``order_no`` names the order
    tell: dict[str, str] = field(default_factory=dict)  # order_no: the status its downstream is told

    @classmethod
    def load(
        cls, tx: WithProvider, orders: Mapping[str, Order], placements: Sequence[ProviderPlacement]
    ) -> ProviderBatch:
        """Lock the wallets of the provider orders among ``orders`` and of ``placements``; read those orders,
        and the ones ``placements`` may repeat."""
        batch = cls()
        provider_nos = [order_no for order_no, order in orders.items() if order.provider]
        if not provider_nos and not placements:
            return batch
        store = tx.provider
        batch.orders = store.orders_by_no(provider_nos)
        keys = [(p.account_id, p.downstream_order_no) for p in placements if p.downstream_order_no]
        batch.by_downstream = store.orders_by_downstream(keys)
        wallets = {order.account_id for order in batch.orders.values()} | {p.account_id for p in placements}
        batch.accounts = store.lock_accounts(wallets)
        batch.balances = {account_id: account.balance_cents for account_id, account in batch.accounts.items()}
        return batch

    def existing(self, placement: ProviderPlacement) -> ProviderOrder | None:
        """The order ``placement`` repeats: the account's earlier one under the same ``downstream_order_no``
        (an earlier command of the batch included)."""
        if not placement.downstream_order_no:
            return None
        return self.by_downstream.get((placement.account_id, placement.downstream_order_no))

    def wallet(self, account_id: int) -> Account | None:
        """The account as the batch leaves it (its balance after the batch's charges and refunds)."""
        account = self.accounts.get(account_id)
        return None if account is None else replace(account, balance_cents=self.balances[account_id])

    def active(self, intake: ProviderIntake) -> bool:
        """The account placing ``intake`` is active as its locked row says now (it may have been disabled
        since its request was authenticated)."""
        account = self.accounts.get(intake.account_id)
        return account is not None and account.active

    def can_pay(self, intake: ProviderIntake) -> bool:
        account = self.accounts.get(intake.account_id)
        return account is not None and self.balances[intake.account_id] >= intake.amount_cents

    def record(self, intake: ProviderIntake, now: datetime, *, paid: bool) -> ProviderOrder:
        """A new provider order: ``paid`` and charged, or ``canceled`` because the wallet was short."""
        order = ProviderOrder(
            id=0,
            order_no=intake.order_no,
            account_id=intake.account_id,
            downstream_order_no=intake.downstream_order_no,
            trace_id=intake.trace_id,
            callback_url=intake.callback_url,
            upstream=intake.upstream,
            product_id=intake.product_id,
            sku_id=intake.sku_id,
            upstream_sku_id=intake.upstream_sku_id,
            title=intake.title,
            fulfillment_type=intake.fulfillment_type,
            quantity=intake.quantity,
            unit_price=intake.unit_price,
            amount_cents=intake.amount_cents,
            currency=intake.currency,
            status=PAID if paid else CANCELED,
            fulfillment=None,
            refunded_cents=0,
            created_at=now,
            updated_at=now,
        )
        self.orders[order.order_no] = order
        self.new.append(order.order_no)
        if intake.downstream_order_no:
            self.by_downstream[(intake.account_id, intake.downstream_order_no)] = order
        if paid:
            self._move(order, -intake.amount_cents, "order", now)
        return order

    def follow(
        self, order_no: str, items: Sequence[Procurement], now: datetime, *, tell: bool = True
    ) -> None:
        """The provider order bought by ``order_no``'s procurement shows what that procurement says now (its
        downstream is called back with a new status, unless ``tell`` is false)."""
        order = self.orders.get(order_no)
        if order is None or not items:
            return
        (item,) = items[:1]
        status = provider_status(item)
        fulfillment = (
            dict(item.fulfillment) if item.holds_fulfillment and item.fulfillment else order.fulfillment
        )
        if status == order.status and fulfillment == order.fulfillment:
            return
        updated = replace(order, status=status, fulfillment=fulfillment, updated_at=now)
        if status == CANCELED and order.refunded_cents == 0:
            updated = replace(updated, refunded_cents=order.amount_cents)
            self._move(updated, order.amount_cents, "refund", now)
        self.orders[order_no] = updated
        if order_no not in self.new:
            self.changed.add(order_no)
        if tell and updated.callback_url and status != order.status:
            self.tell[order_no] = status

    def _move(self, order: ProviderOrder, cents: int, kind: str, now: datetime) -> None:
        balance = self.balances[order.account_id] + cents
        self.balances[order.account_id] = balance
        self.ledger.append(
            {"account_id": order.account_id, "amount_cents": cents, "kind": kind, "order_no": order.order_no,
             "note": None, "balance_after_cents": balance, "created_at": now}
        )  # fmt: skip

    def flush(self, tx: WithProvider, now: datetime) -> dict[str, int]:
        """Write what the batch decided; the ids of the provider orders it created, by order_no."""
        if not self.orders:
            return {}
        store = tx.provider
        created = [self.orders[order_no] for order_no in self.new]
        ids = dict(
            zip(
                [order.order_no for order in created],
                store.insert_orders([_insert_values(order) for order in created]),
                strict=True,
            )
        )
        store.update_orders(
            [
                {"b_order_no": order_no, "status": order.status, "fulfillment": order.fulfillment,
                 "refunded_cents": order.refunded_cents, "updated_at": order.updated_at}
                for order_no in sorted(self.changed)
                if (order := self.orders[order_no])
            ]
        )  # fmt: skip
        changed_wallets = {row["account_id"] for row in self.ledger}
        store.write_balances({account_id: self.balances[account_id] for account_id in changed_wallets}, now)
        store.insert_ledger(
            [
                {**{key: value for key, value in row.items() if key != "order_no"},
                 "order_id": ids.get(row["order_no"]) or self.orders[row["order_no"]].id}
                for row in self.ledger
            ]
        )  # fmt: skip
        store.tell(
            [
                (ids.get(order_no) or self.orders[order_no].id, self.orders[order_no].account_id, status)
                for order_no, status in self.tell.items()
            ],
            now,
        )
        return ids


def _insert_values(order: ProviderOrder) -> dict[str, Any]:
    return {name: getattr(order, name) for name in ProviderOrder.__slots__ if name != "id"}
