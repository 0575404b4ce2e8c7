"""The sandbox site in memory: catalogue, API users and their wallets, procurement orders. No I/O here."""

from __future__ import annotations

import random
import string
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

from procurd.core.addresses import private_url_reason
from procurd.core.procurement import ORDER_STATUSES
from procurd.protocol.dujiao import ErrorAnswer, OrderSubmission, bad_request
from procurd.sandbox.catalog import (
    SKU,
    UNLIMITED,
    Category,
    Product,
    generate_catalogue,
    iso_time,
    money_text,
    precise_iso_time,
)
from procurd.sandbox.config import SandboxConfig
from procurd.sandbox.orders import (
    DELIVERABLE_STATUSES,
    FULFILLED_STATUSES,
    Fulfillment,
    OrderItem,
    SandboxOrder,
)

__all__ = [
    "DELIVERABLE_STATUSES",
    "FULFILLED_STATUSES",
    "ORDER_STATUSES",
    "ApiUser",
    "CreateResult",
    "Fulfillment",
    "NewOrderFlags",
    "NewSku",
    "OrderItem",
    "SandboxOrder",
    "SandboxState",
    "SandboxStateError",
]

FIRST_ORDER_ID = 1001
MEMBER_LEVEL = {
    "id": 2,
    "name": {"zh-CN": "黄金会员", "en-US": "Gold member"},
    "slug": "gold",
    "icon": "https://cdn.sandbox.example/icons/member-gold.png",
}


class SandboxStateError(ValueError):
    """A test or operator asked the sandbox for a change its orders cannot make (for example completing
    an order that was never delivered)."""


@dataclass
class ApiUser:
    """An API key with the user account that owns it and that account's wallet."""

    api_key: str
    api_secret: str = field(repr=False)
    user_id: int
    balance: Decimal
    member_level: dict[str, Any] | None = None
    key_active: bool = True
    user_active: bool = True


@dataclass(frozen=True)
class NewSku:
    """One SKU of a product that a test adds."""

    price_amount: Decimal | str
    stock_quantity: int = UNLIMITED
    is_active: bool = True


def _titles(title: str | Mapping[str, str]) -> dict[str, str]:
    return {"zh-CN": title, "en-US": title} if isinstance(title, str) else dict(title)


@dataclass(frozen=True)
class NewOrderFlags:
    """Fault knobs that shape the next created order."""

    pending_payment: bool = False
    hold_delivery: bool = False


@dataclass(frozen=True)
class CreateResult:
    order: SandboxOrder
    created: bool  # False: an earlier order with the same (API key, downstream_order_no) was answered
    used_pending_payment: bool = False
    used_hold_delivery: bool = False

    @property
    def payment_failed(self) -> bool:
        return self.created and self.order.status == "canceled"


def _decimal(value: Decimal | str | int) -> Decimal:
    try:
        amount = Decimal(value)
    except (InvalidOperation, TypeError, ValueError):
        raise SandboxStateError(f"not a decimal amount: {value!r}") from None
    if not amount.is_finite():
        raise SandboxStateError(f"not a finite amount: {value!r}")
    return amount


class SandboxState:
    """Catalogue, wallets and orders. Test mutators are synchronous and show in the API at once."""

    def __init__(self, config: SandboxConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock
        catalogue = generate_catalogue(
            seed=config.seed,
            products=config.products,
            skus_per_product=config.skus_per_product,
            manual_ratio=config.manual_ratio,
            inactive_products=config.inactive_products,
        )
        self.categories: dict[int, Category] = catalogue.categories
        self.products: dict[int, Product] = catalogue.products
        self.skus: dict[int, SKU] = catalogue.skus
        self.removed_products: set[int] = set()
        self.users: dict[str, ApiUser] = {}
        self.orders: dict[int, SandboxOrder] = {}
        self._order_index: dict[tuple[str, str], int] = {}
        self._next_order_id = FIRST_ORDER_ID
        self._listing: list[Product] | None = None
        self._everything: list[Product] | None = None
        for product in self.products.values():
            product.attach(self._product_changed)
        self.add_api_key(config.api_key, config.api_secret, config.balance)

    # -- clock and catalogue --------------------------------------------------------------------------

    def now(self) -> float:
        """The sandbox's clock: its wall clock (``time.time`` unless one was given) plus
        ``clock_offset_seconds``."""
        return self._clock() + self.config.clock_offset_seconds

    def _product_changed(self, product: Product) -> None:
        object.__setattr__(product, "updated_at", precise_iso_time(self.now()))
        self._listing = self._everything = None

    def active_products(self) -> list[Product]:
        """What GET /products lists, in id order: active products that were not removed."""
        if self._listing is None:
            self._listing = sorted(
                (p for p in self.products.values() if p.is_active and p.id not in self.removed_products),
                key=lambda p: p.id,
            )
        return self._listing

    def listed_products(self, include_inactive: bool = False) -> list[Product]:
        """What GET /products lists, in id order: the active products, or (``include_inactive``, Dujiao-Next
        since 2026) every product that was not removed."""
        if not include_inactive:
            return self.active_products()
        if self._everything is None:
            self._everything = sorted(
                (p for p in self.products.values() if p.id not in self.removed_products), key=lambda p: p.id
            )
        return self._everything

    def visible_product(self, product_id: int) -> Product | None:
        """The product unless it does not exist or was removed."""
        if product_id in self.removed_products:
            return None
        return self.products.get(product_id)

    def product(self, product_id: int) -> Product:
        return self.products[product_id]

    def sku(self, sku_id: int) -> SKU:
        return self.skus[sku_id]

    def set_sku_price(self, sku_id: int, price: Decimal | str) -> None:
        """Set the price the API user pays (``member_price`` too when the SKU has a member discount)."""
        amount = _decimal(price)
        if amount < 0:
            raise SandboxStateError("a price must not be negative")
        text = money_text(amount)
        sku = self.skus[sku_id]
        sku.price_amount = text
        if sku.member_price is not None:
            sku.member_price = text

    def set_sku_stock(self, sku_id: int, quantity: int) -> None:
        if quantity < UNLIMITED:
            raise SandboxStateError("stock_quantity must be -1 (unlimited) or at least 0")
        self.skus[sku_id].stock_quantity = quantity

    def set_sku_active(self, sku_id: int, active: bool) -> None:
        self.skus[sku_id].is_active = active

    def set_product_active(self, product_id: int, active: bool) -> None:
        self.products[product_id].is_active = active

    def remove_product(self, product_id: int) -> None:
        """The product is gone entirely: not listed, product_not_found, its SKUs sku_unavailable."""
        product = self.products[product_id]
        self.removed_products.add(product_id)
        product.changed()

    def restore_product(self, product_id: int) -> None:
        product = self.products[product_id]
        self.removed_products.discard(product_id)
        product.changed()

    def set_product_category(self, product_id: int, category_id: int) -> None:
        self.products[product_id].category_id = category_id

    def set_product_title(self, product_id: int, title: str | Mapping[str, str]) -> None:
        """A new title: one text for every locale, or a text per locale."""
        self.products[product_id].title = _titles(title)

    def add_category(self, parent_id: int, slug: str, name: Mapping[str, str] | None = None) -> int:
        """Add a category under ``parent_id`` (0 = top level). Nothing is checked, so tests can build
        trees that break the two-level rule."""
        category_id = max(self.categories, default=0) + 1
        self.categories[category_id] = Category(
            category_id, parent_id, slug, dict(name or {"zh-CN": slug, "en-US": slug}), "", 0
        )
        return category_id

    def leaf_categories(self) -> list[Category]:
        parents = {c.parent_id for c in self.categories.values()}
        return [c for c in self.categories.values() if c.id not in parents]

    def add_product(
        self,
        category_id: int | None = None,
        *,
        title: str | Mapping[str, str] | None = None,
        fulfillment_type: str = "auto",
        price: Decimal | str = "9.90",
        stock_quantity: int = UNLIMITED,
        skus: int | Sequence[NewSku] = 1,
        is_active: bool = True,
    ) -> int:
        """Add a product and return its id. ``skus`` is a number of SKUs (priced ``price``, ``2 * price`` ...,
        each with ``stock_quantity``) or the SKUs themselves."""
        product_id = max(self.products, default=0) + 1
        first_sku_id = max(self.skus, default=0) + 1
        if isinstance(skus, int):
            base = _decimal(price)
            skus = [NewSku(base * (index + 1), stock_quantity) for index in range(skus)]
        category = category_id if category_id is not None else self.leaf_categories()[0].id
        titles = _titles(title or f"Sandbox product {product_id}")
        label = titles.get("en-US") or next(iter(titles.values()))
        now = self.now()
        manual = fulfillment_type == "manual"
        new_skus = [
            SKU(
                id=first_sku_id + index,
                product_id=product_id,
                sku_code=f"P{product_id:05d}-{index + 1}",
                spec_values={"edition": f"option {index + 1}"},
                price_amount=money_text(_decimal(spec.price_amount)),
                stock_quantity=spec.stock_quantity,
                is_active=spec.is_active,
            )
            for index, spec in enumerate(skus)
        ]
        product = Product(
            id=product_id,
            slug=f"sandbox-product-{product_id}",
            title=titles,
            description={"zh-CN": label, "en-US": label},
            content={"zh-CN": f"<p>{label}</p>", "en-US": f"<p>{label}</p>"},
            seo_meta={"title": label},
            images=[],
            tags=[],
            fulfillment_type=fulfillment_type,
            manual_form_schema=(
                {
                    "fields": [
                        {
                            "key": "account",
                            "type": "text",
                            "required": True,
                            "label": {"zh-CN": "账号", "en-US": "Account"},
                        }
                    ]
                }
                if manual
                else None
            ),
            is_active=is_active,
            category_id=category,
            created_at=iso_time(now),
            updated_at=precise_iso_time(now),
            skus=new_skus,
        )
        product.attach(self._product_changed)
        self.products[product_id] = product
        for sku in new_skus:
            self.skus[sku.id] = sku
        self._listing = self._everything = None
        return product_id

    def first_sku(self, fulfillment_type: str = "auto", active: bool = True, in_stock: bool = True) -> SKU:
        """The lowest-id SKU of a listed product that matches; ``active=False`` finds an inactive SKU of
        an active product, ``in_stock=False`` one with stock 0."""
        for product in self.active_products():
            if product.fulfillment_type != fulfillment_type:
                continue
            for sku in product.skus:
                if sku.is_active == active and (sku.stock_quantity != 0) == in_stock:
                    return sku
        raise LookupError(f"no {fulfillment_type} SKU with active={active} in_stock={in_stock}")

    # -- API users and wallets ------------------------------------------------------------------------

    def add_api_key(
        self,
        api_key: str,
        api_secret: str,
        balance: Decimal | str = Decimal("1000.00"),
        *,
        member_level: bool | None = None,
    ) -> ApiUser:
        """Another API user (with its own wallet and orders)."""
        if api_key in self.users:
            raise SandboxStateError(f"the API key {api_key!r} exists already")
        has_level = self.config.member_level if member_level is None else member_level
        user = ApiUser(
            api_key=api_key,
            api_secret=api_secret,
            user_id=len(self.users) + 1,
            balance=_decimal(balance),
            member_level=dict(MEMBER_LEVEL) if has_level else None,
        )
        self.users[api_key] = user
        return user

    def user(self, api_key: str | None = None) -> ApiUser:
        return self.users[api_key if api_key is not None else self.config.api_key]

    def balance(self, api_key: str | None = None) -> Decimal:
        return self.user(api_key).balance

    def set_balance(self, amount: Decimal | str, api_key: str | None = None) -> None:
        self.user(api_key).balance = _decimal(amount)

    def top_up(self, amount: Decimal | str, api_key: str | None = None) -> None:
        self.user(api_key).balance += _decimal(amount)

    def disable_api_key(self, key: str) -> None:
        self.users[key].key_active = False

    def enable_api_key(self, key: str) -> None:
        self.users[key].key_active = True

    def disable_user(self, key: str) -> None:
        self.users[key].user_active = False

    def enable_user(self, key: str) -> None:
        self.users[key].user_active = True

    # -- orders ---------------------------------------------------------------------------------------

    def order(self, order_id: int) -> SandboxOrder:
        return self.orders[order_id]

    def orders_for(self, downstream_order_no: str, api_key: str | None = None) -> list[SandboxOrder]:
        return [
            order
            for order in self.orders.values()
            if order.downstream_order_no == downstream_order_no and api_key in (None, order.api_key)
        ]

    def status_counts(self) -> Counter[str]:
        return Counter(order.status for order in self.orders.values())

    def find_order(self, api_key: str, order_id: int) -> SandboxOrder:
        """The caller's own order, or ``order_not_found`` (another key's order is not found either)."""
        order = self.orders.get(order_id)
        if order is None or order.api_key != api_key:
            raise ErrorAnswer(404, "order_not_found", "order not found")
        return order

    def callback_url_problem(self, url: str) -> str | None:
        try:
            parts = urlsplit(url)
            host = parts.hostname
        except ValueError:
            return "not a valid URL"
        if parts.scheme not in ("http", "https") or not host:
            return "must be an http or https URL with a host"
        if self.config.allow_private_callbacks:
            return None
        return private_url_reason(url)

    def existing_order(self, api_key: str, downstream_order_no: str) -> SandboxOrder | None:
        """The order a repeated POST /orders answers: the key's earlier one under that number."""
        existing = self._order_index.get((api_key, downstream_order_no))
        return None if existing is None else self.orders[existing]

    def create_order(
        self, api_key: str, submission: OrderSubmission, flags: NewOrderFlags = NewOrderFlags()
    ) -> CreateResult:
        """POST /orders: idempotency, then validation in the real site's order, then the wallet."""
        user = self.users[api_key]
        downstream_no = submission.downstream_order_no
        if downstream_no:
            existing = self.existing_order(api_key, downstream_no)
            if existing is not None:
                return CreateResult(existing, created=False)
        sku = self.skus.get(submission.sku_id)
        product = self.visible_product(sku.product_id) if sku is not None else None
        if sku is None or product is None or not sku.is_active:
            raise ErrorAnswer(400, "sku_unavailable", "sku is missing or inactive")
        if not product.is_active:
            raise ErrorAnswer(400, "product_unavailable", "product is inactive or unavailable")
        quantity, form = submission.quantity, submission.manual_form_data
        if product.is_manual:
            missing = self._missing_form_fields(product, form)
            if missing:
                raise bad_request(f"manual_form_data is required for this product: missing {missing}")
        callback_url = submission.callback_url
        if callback_url:
            problem = self.callback_url_problem(callback_url)
            if problem is not None:
                raise ErrorAnswer(400, "invalid_callback_url", f"callback_url is not allowed: {problem}")
        self._check_purchase_limits(product, quantity)
        if not sku.in_stock(quantity):
            raise ErrorAnswer(409, "insufficient_stock", "stock is too low for this quantity")
        unit_price = sku.charged_price(quantity) if self.config.speaks_2026 else sku.unit_price
        amount = unit_price * quantity
        short = user.balance < amount
        if short and not flags.pending_payment and self.config.balance_failure == "insufficient_balance":
            raise ErrorAnswer(402, "insufficient_balance", "wallet balance is too low")
        order = self._new_order(
            user, product, sku, quantity, unit_price, downstream_no, submission.trace_id, callback_url
        )
        order.manual_form_data = form
        if flags.pending_payment:
            order.status = "pending_payment"
            self._hold_stock(order)
        elif short:
            order.status = "canceled"
        else:
            self._charge(order)
        used_hold = flags.hold_delivery and not product.is_manual and order.status != "canceled"
        order.hold_delivery = used_hold
        return CreateResult(
            order, created=True, used_pending_payment=flags.pending_payment, used_hold_delivery=used_hold
        )

    def _check_purchase_limits(self, product: Product, quantity: int) -> None:
        """A quantity outside the product's purchase limits: seed 000 names no such refusal (400
        ``bad_request``); Dujiao-Next answers it HTTP 500 ``internal_error``, not a business code."""
        least, most = product.min_purchase_quantity, product.max_purchase_quantity
        if (least is None or quantity >= least) and (most is None or quantity <= most):
            return
        if self.config.speaks_2026:
            raise ErrorAnswer(500, "internal_error", "failed to create order")
        limits = f"{least or 1} to {most}" if most is not None else f"at least {least}"
        raise bad_request(f"quantity must be {limits} for this product")

    @staticmethod
    def _missing_form_fields(product: Product, form: Mapping[str, Any] | None) -> str:
        if not form:
            return "manual_form_data"
        fields = (product.manual_form_schema or {}).get("fields") or []
        missing = [
            str(f.get("key"))
            for f in fields
            if isinstance(f, dict) and f.get("required") and form.get(str(f.get("key"))) in (None, "")
        ]
        return ", ".join(missing)

    def _new_order(
        self,
        user: ApiUser,
        product: Product,
        sku: SKU,
        quantity: int,
        unit_price: Decimal,
        downstream_no: str | None,
        trace_id: str | None,
        callback_url: str | None,
    ) -> SandboxOrder:
        order_id = self._next_order_id
        self._next_order_id += 1
        now = self.now()
        stamp = iso_time(now)
        amount = unit_price * quantity
        listed = sku.unit_price if self.config.speaks_2026 else None
        order = SandboxOrder(
            order_id=order_id,
            order_no=f"DJ{iso_time(now)[:10].replace('-', '')}{order_id:06d}",
            api_key=user.api_key,
            status="paid",
            amount=amount,
            currency=self.config.currency,
            items=[
                OrderItem(
                    product_id=product.id,
                    sku_id=sku.id,
                    title=dict(product.title),
                    quantity=quantity,
                    unit_price=money_text(unit_price),
                    total_price=money_text(amount),
                    fulfillment_type=product.fulfillment_type,
                    original_unit_price=None if listed is None else money_text(listed),
                    original_total_price=None if listed is None else money_text(listed * quantity),
                )
            ],
            downstream_order_no=downstream_no or None,
            trace_id=trace_id,
            callback_url=callback_url or None,
            manual_form_data=None,
            created_at=stamp,
            updated_at=stamp,
        )
        self.orders[order_id] = order
        if downstream_no:
            self._order_index[(user.api_key, downstream_no)] = order_id
        return order

    def _hold_stock(self, order: SandboxOrder) -> None:
        sku = self.skus.get(order.item.sku_id)
        if sku is not None and sku.stock_quantity != UNLIMITED:
            sku.stock_quantity = max(0, sku.stock_quantity - order.item.quantity)
        order.stock_held = True

    def _release_stock(self, order: SandboxOrder) -> None:
        sku = self.skus.get(order.item.sku_id)
        if order.stock_held and sku is not None and sku.stock_quantity != UNLIMITED:
            sku.stock_quantity += order.item.quantity
        order.stock_held = False

    def _charge(self, order: SandboxOrder) -> None:
        self.users[order.api_key].balance -= order.amount
        order.wallet_paid = True
        order.status = "paid"
        if not order.stock_held:
            self._hold_stock(order)

    def _touch(self, order: SandboxOrder, status: str | None = None) -> None:
        if status is not None:
            order.status = status
        order.updated_at = iso_time(self.now())

    def cancel_order(self, api_key: str, order_id: int) -> SandboxOrder:
        """POST /orders/:id/cancel: only ``pending_payment`` orders can be canceled."""
        order = self.find_order(api_key, order_id)
        if order.status != "pending_payment":
            raise ErrorAnswer(
                409, "cancel_not_allowed", f"an order in status {order.status} cannot be canceled"
            )
        self._release_stock(order)
        self._touch(order, "canceled")
        return order

    def pay(self, order_id: int) -> SandboxOrder:
        """Pay a ``pending_payment`` order from the wallet; a short wallet cancels it (payment failed)."""
        order = self.orders[order_id]
        if order.status != "pending_payment":
            raise SandboxStateError(f"order {order_id} is {order.status}, not pending_payment")
        if self.users[order.api_key].balance < order.amount:
            self._release_stock(order)
            self._touch(order, "canceled")
        else:
            self._charge(order)
            self._touch(order)
        return order

    def needs_auto_delivery(self, order: SandboxOrder) -> bool:
        return (
            order.status == "paid"
            and order.fulfillment_type == "auto"
            and self.config.auto_deliver
            and not order.hold_delivery
        )

    def deliver(self, order_id: int, payload: str | None = None) -> SandboxOrder:
        """Deliver a paid order (manual, held, or auto): status ``delivered`` with a fulfillment."""
        order = self.orders[order_id]
        if order.status not in DELIVERABLE_STATUSES:
            raise SandboxStateError(f"order {order_id} is {order.status}; only paid orders can be delivered")
        order.fulfillment = self._fulfillment(order, payload)
        order.hold_delivery = False
        self._touch(order, "delivered")
        return order

    def complete(self, order_id: int) -> SandboxOrder:
        order = self.orders[order_id]
        if order.status != "delivered":
            raise SandboxStateError(f"order {order_id} is {order.status}; only delivered orders complete")
        self._touch(order, "completed")
        return order

    def cancel_upstream(self, order_id: int) -> SandboxOrder:
        """The site cancels the order itself; whatever was paid and not yet refunded goes back to the
        wallet, as a refund record."""
        order = self.orders[order_id]
        if order.status == "canceled":
            return order
        remaining = order.amount - order.refunded_amount
        if order.wallet_paid and remaining > 0:
            self._pay_back(order, remaining, "order canceled by the site")
        order.wallet_paid = False
        if order.fulfillment is None:
            self._release_stock(order)
        self._touch(order, "canceled")
        return order

    def refund(
        self, order_id: int, amount: Decimal | str | None = None, reason: str = "refunded by the site"
    ) -> SandboxOrder:
        """Refund all (``refunded``) or part (``partially_refunded``) of a paid order to the wallet."""
        order = self.orders[order_id]
        if not order.wallet_paid:
            raise SandboxStateError(f"order {order_id} was not paid from the wallet")
        remaining = order.amount - order.refunded_amount
        value = remaining if amount is None else _decimal(amount)
        if value <= 0 or value > remaining:
            raise SandboxStateError(f"refund amount must be above 0 and at most {money_text(remaining)}")
        self._pay_back(order, value, reason)
        self._touch(order, "refunded" if order.refunded_amount == order.amount else "partially_refunded")
        return order

    def _pay_back(self, order: SandboxOrder, amount: Decimal, reason: str) -> None:
        self.users[order.api_key].balance += amount
        order.refunded_amount += amount
        order.refund_records.append(
            {
                "id": len(order.refund_records) + 1,
                "amount": money_text(amount),
                "reason": reason,
                "created_at": iso_time(self.now()),
            }
        )

    def set_status(self, order_id: int, status: str) -> SandboxOrder:
        """Force any status; ``delivered``/``completed`` get a fulfillment if the order has none."""
        if status not in ORDER_STATUSES:
            raise SandboxStateError(f"unknown order status {status!r}")
        order = self.orders[order_id]
        if status in FULFILLED_STATUSES and order.fulfillment is None:
            order.fulfillment = self._fulfillment(order, None)
        self._touch(order, status)
        return order

    def _fulfillment(self, order: SandboxOrder, payload: str | None) -> Fulfillment:
        delivered_at = iso_time(self.now())
        if order.fulfillment_type == "manual":
            account = (order.manual_form_data or {}).get("account", "")
            text = payload if payload is not None else f"Done for account {account}"
            return Fulfillment("manual", text, None, delivered_at)
        codes = self._card_codes(order)
        text = payload if payload is not None else "\n".join(codes)
        return Fulfillment("auto", text, {"cards": codes, "count": len(codes)}, delivered_at)

    def _card_codes(self, order: SandboxOrder) -> list[str]:
        rng = random.Random(f"{self.config.seed}:{order.order_id}")
        alphabet = string.ascii_uppercase + string.digits
        return [
            "SBX-" + "-".join("".join(rng.choices(alphabet, k=4)) for _ in range(3))
            for _ in range(order.item.quantity)
        ]
