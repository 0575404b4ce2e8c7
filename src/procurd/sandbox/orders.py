"""The sandbox's procurement orders as it keeps them (seed 000, 2.4 and 2.5), and the answers they give."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from procurd.core.procurement import DELIVERED_STATUSES
from procurd.sandbox.catalog import money_text

FULFILLED_STATUSES = DELIVERED_STATUSES
DELIVERABLE_STATUSES = frozenset({"paid", "fulfilling", "partially_delivered"})


@dataclass
class OrderItem:
    product_id: int
    sku_id: int
    title: dict[str, str]
    quantity: int
    unit_price: str
    total_price: str
    fulfillment_type: str
    # What the list price would have been (Dujiao-Next since 2026, whose charge may be below it)
    original_unit_price: str | None = None
    original_total_price: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "product_id": self.product_id,
            "sku_id": self.sku_id,
            "title": self.title,
            "quantity": self.quantity,
        }
        if self.original_unit_price is not None:
            data["original_unit_price"] = self.original_unit_price
        data["unit_price"] = self.unit_price
        if self.original_total_price is not None:
            data["original_total_price"] = self.original_total_price
        data["total_price"] = self.total_price
        data["fulfillment_type"] = self.fulfillment_type
        return data


@dataclass
class Fulfillment:
    type: str
    payload: str = field(repr=False)
    delivery_data: dict[str, Any] | None = field(repr=False)
    delivered_at: str
    status: str = "delivered"

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status,
            "payload": self.payload,
            "delivery_data": self.delivery_data,
            "delivered_at": self.delivered_at,
        }


@dataclass
class SandboxOrder:
    order_id: int
    order_no: str
    api_key: str
    status: str
    amount: Decimal
    currency: str
    items: list[OrderItem]
    downstream_order_no: str | None
    trace_id: str | None
    callback_url: str | None
    manual_form_data: dict[str, Any] | None = field(repr=False)
    created_at: str
    updated_at: str
    fulfillment: Fulfillment | None = None
    refunded_amount: Decimal = Decimal("0.00")
    refund_records: list[dict[str, Any]] = field(default_factory=list)
    wallet_paid: bool = False  # the amount was debited from the wallet (and is what refunds give back)
    hold_delivery: bool = False  # an auto order kept from automatic delivery until deliver()
    stock_held: bool = False  # its quantity is taken out of the SKU's stock

    @property
    def item(self) -> OrderItem:
        return self.items[0]

    @property
    def fulfillment_type(self) -> str:
        return self.item.fulfillment_type

    def summary(self) -> dict[str, Any]:
        """The answer of POST /orders: ok, order_id, order_no, status, amount, currency."""
        return {
            "ok": True,
            "order_id": self.order_id,
            "order_no": self.order_no,
            "status": self.status,
            "amount": money_text(self.amount),
            "currency": self.currency,
        }

    def to_api(self) -> dict[str, Any]:
        """The answer of GET /orders/:id (seed 000, 2.4), plus the refund fields real sites add."""
        data = self.summary()
        data["items"] = [item.to_dict() for item in self.items]
        if self.fulfillment is not None:
            data["fulfillment"] = self.fulfillment.to_dict()
        if self.refund_records:
            data["refunded_amount"] = money_text(self.refunded_amount)
            data["refund_records"] = [dict(record) for record in self.refund_records]
        data["downstream_order_no"] = self.downstream_order_no or ""
        data["trace_id"] = self.trace_id or ""
        data["created_at"] = self.created_at
        data["updated_at"] = self.updated_at
        return data

    def to_control(self) -> dict[str, Any]:
        """Everything the control API shows about the order."""
        data = self.to_api()
        data.update(
            api_key=self.api_key,
            callback_url=self.callback_url,
            manual_form_data=self.manual_form_data,
            hold_delivery=self.hold_delivery,
        )
        return data
