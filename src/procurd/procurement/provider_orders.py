"""The provider role's part of the one state path: a downstream site's order is charged to its wallet and
taken in for procurement in the same transaction, and its status then follows the procurement.

Used by :func:`procurd.procurement.transitions.apply_batch`. The wallets a batch touches are locked (in id
order, after the orders) and their balances decided in memory, like every other change of the batch:

* an intake whose ``(account, downstream_order_no)`` exists answers that order;
* one the wallet can pay is charged (ledger ``order``), becomes ``paid`` and is procured;
* one it cannot is recorded ``canceled`` (seed 000's ``payment_failed``) and bought nowhere;
* when its procurement changes, the order shows :func:`procurd.core.provider.provider_status`, keeps the
  upstream's fulfillment as it came, is refunded when it ends canceled (ledger ``refund``), and its new
  status is queued for the downstream's callback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from procurd.core.orders import Order
from procurd.core.procurement import Procurement
from procurd.core.provider import CANCELED, PAID, Account, ProviderIntake, ProviderOrder, provider_status
from procurd.db.stores import Tx


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
    def load(cls, tx: Tx, orders: Mapping[str, Order], intakes: Sequence[ProviderIntake]) -> ProviderBatch:
        """Lock the wallets of the provider orders among ``orders`` and of ``intakes``; read those orders."""
        batch = cls()
        provider_nos = [order_no for order_no, order in orders.items() if order.provider]
        if not provider_nos and not intakes:
            return batch
        store = tx.provider
        batch.orders = store.orders_by_no(provider_nos)
        keys = [(i.account_id, i.downstream_order_no) for i in intakes if i.downstream_order_no]
        batch.by_downstream = store.orders_by_downstream(keys)
        wallets = {order.account_id for order in batch.orders.values()} | {i.account_id for i in intakes}
        batch.accounts = store.lock_accounts(wallets)
        batch.balances = {account_id: account.balance_cents for account_id, account in batch.accounts.items()}
        return batch

    def existing(self, intake: ProviderIntake) -> ProviderOrder | None:
        """The order an intake repeats: the account's earlier one under the same ``downstream_order_no``."""
        if not intake.downstream_order_no:
            return None
        return self.by_downstream.get((intake.account_id, intake.downstream_order_no))

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

    def flush(self, tx: Tx, now: datetime) -> dict[str, int]:
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
