"""Fault knobs for tests: each one applies to the next ``count`` matching requests or orders, then expires."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from procurd.sandbox.state import NewOrderFlags

ENDPOINTS = (
    "ping",
    "categories",
    "products",
    "product",
    "orders.create",
    "orders.get",
    "orders.cancel",
)
ANY_ENDPOINT = "*"

# Request knobs applied before the request is handled, and after the work is done.
BEFORE_KINDS = ("fail", "hang", "malformed")
AFTER_KINDS = ("fail_after", "drop")
EMPTY_LISTING = "empty_listing"

Listed = TypeVar("Listed")


@dataclass
class RequestFault:
    kind: str
    endpoint: str
    remaining: int
    status: int = 500
    error_code: str = "internal_error"
    seconds: float = 0.0
    body: bytes = b""
    content_type: str = "text/html"

    def matches(self, endpoint: str) -> bool:
        return self.endpoint in (ANY_ENDPOINT, endpoint)

    def describe(self) -> dict[str, Any]:
        data: dict[str, Any] = {"knob": self.kind, "endpoint": self.endpoint, "remaining": self.remaining}
        if self.kind == "fail":
            data.update(status=self.status, error_code=self.error_code)
        elif self.kind == "delay":
            data["seconds"] = self.seconds
        elif self.kind == "malformed":
            data.update(status=self.status, content_type=self.content_type)
        return data


def _check_count(count: int) -> int:
    if count < 1:
        raise ValueError("count must be at least 1")
    return count


def _check_endpoint(endpoint: str) -> str:
    if endpoint != ANY_ENDPOINT and endpoint not in ENDPOINTS:
        raise ValueError(f"unknown endpoint {endpoint!r}; use one of {', '.join((*ENDPOINTS, ANY_ENDPOINT))}")
    return endpoint


@dataclass(frozen=True)
class ListingShare:
    """How much of the catalogue GET /products shows: the first ``products``, or that ``fraction``."""

    products: int | None = None
    fraction: float | None = None

    def count(self, listed: int) -> int:
        if self.products is not None:
            return min(self.products, listed)
        return math.floor(listed * (self.fraction or 0.0))

    def describe(self) -> dict[str, Any]:
        return {"products": self.products} if self.products is not None else {"fraction": self.fraction}


@dataclass
class FaultPlan:
    """Knobs consumed by the sandbox's request handling, order creation and callback sending."""

    request_faults: list[RequestFault] = field(default_factory=list)
    listing_share: ListingShare | None = None
    pending_payment_orders: int = 0
    held_deliveries: int = 0
    dropped_callbacks: int = 0
    duplicated_callbacks: int = 0
    callback_delay_seconds: float = 0.0

    def _add(self, fault: RequestFault) -> None:
        _check_endpoint(fault.endpoint)
        _check_count(fault.remaining)
        self.request_faults.append(fault)

    def fail_next(
        self, endpoint: str, count: int = 1, status: int = 500, error_code: str = "internal_error"
    ) -> None:
        """Answer ``status`` with an error body without doing anything."""
        self._add(RequestFault("fail", endpoint, count, status=status, error_code=error_code))

    def fail_after_next(self, endpoint: str, count: int = 1) -> None:
        """Do the work (create and pay the order ...), then answer 500 as if the response were lost."""
        self._add(RequestFault("fail_after", endpoint, count))

    def drop_next(self, endpoint: str, count: int = 1) -> None:
        """Do the work, then abort the connection without any answer."""
        self._add(RequestFault("drop", endpoint, count))

    def delay_next(self, endpoint: str, count: int = 1, seconds: float = 1.0) -> None:
        """Wait ``seconds`` before handling the request."""
        if seconds < 0:
            raise ValueError("seconds must not be negative")
        self._add(RequestFault("delay", endpoint, count, seconds=seconds))

    def hang_next(self, endpoint: str, count: int = 1) -> None:
        """Never answer: the connection stays open until the client gives up or the sandbox closes."""
        self._add(RequestFault("hang", endpoint, count))

    def malformed_next(
        self,
        endpoint: str,
        count: int = 1,
        body: bytes = b"<html>bad gateway</html>",
        status: int = 200,
        content_type: str = "text/html",
    ) -> None:
        """Answer ``body`` as it is (not the API's JSON) with ``status`` and ``content_type``."""
        self._add(
            RequestFault("malformed", endpoint, count, status=status, body=body, content_type=content_type)
        )

    def empty_listing_next(self, count: int = 1) -> None:
        """GET /products answers an empty catalogue (no items, total 0) for the next ``count`` requests."""
        self._add(RequestFault(EMPTY_LISTING, "products", count))

    def list_only(self, products: int | None = None, fraction: float | None = None) -> None:
        """Until cleared, GET /products lists only the first ``products`` products (in id order), or that
        ``fraction`` of them (rounded down), as if the rest had vanished from the site's listing."""
        if (products is None) == (fraction is None):
            raise ValueError("give either products or fraction")
        if products is not None and products < 0:
            raise ValueError("products must be at least 0")
        if fraction is not None and not 0 <= fraction <= 1:
            raise ValueError("fraction must be from 0 to 1")
        self.listing_share = ListingShare(products, fraction)

    def pending_payment_next(self, count: int = 1) -> None:
        """The next created orders stay ``pending_payment`` until ``Sandbox.pay``."""
        self.pending_payment_orders += _check_count(count)

    def hold_delivery_next(self, count: int = 1) -> None:
        """The next paid auto orders are not delivered until ``Sandbox.deliver``."""
        self.held_deliveries += _check_count(count)

    def drop_callbacks_next(self, count: int = 1) -> None:
        """The next callbacks are never sent."""
        self.dropped_callbacks += _check_count(count)

    def duplicate_callbacks_next(self, count: int = 1) -> None:
        """The next callbacks are sent twice."""
        self.duplicated_callbacks += _check_count(count)

    def delay_callbacks(self, seconds: float) -> None:
        """Every callback waits this long before its first try (0 turns it off)."""
        if seconds < 0:
            raise ValueError("seconds must not be negative")
        self.callback_delay_seconds = seconds

    def clear(self) -> None:
        """Remove every knob."""
        self.request_faults.clear()
        self.listing_share = None
        self.pending_payment_orders = 0
        self.held_deliveries = 0
        self.dropped_callbacks = 0
        self.duplicated_callbacks = 0
        self.callback_delay_seconds = 0.0

    # -- consumption (by the sandbox) ----------------------------------------------------------------

    def take(self, endpoint: str, kinds: tuple[str, ...]) -> RequestFault | None:
        """The first live knob of one of ``kinds`` for ``endpoint``, with one use taken off it."""
        for fault in self.request_faults:
            if fault.kind in kinds and fault.matches(endpoint):
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self.request_faults.remove(fault)
                return fault
        return None

    def listing(self, products: Sequence[Listed]) -> Sequence[Listed]:
        """What GET /products shows of ``products`` under the listing knobs (one request's worth)."""
        if self.take("products", (EMPTY_LISTING,)) is not None:
            return []
        if self.listing_share is None:
            return products
        return products[: self.listing_share.count(len(products))]

    def new_order_flags(self) -> NewOrderFlags:
        """What the next created order would get; consume with :meth:`used_new_order_flags`."""
        return NewOrderFlags(
            pending_payment=self.pending_payment_orders > 0, hold_delivery=self.held_deliveries > 0
        )

    def used_new_order_flags(self, pending_payment: bool, hold_delivery: bool) -> None:
        if pending_payment:
            self.pending_payment_orders = max(0, self.pending_payment_orders - 1)
        if hold_delivery:
            self.held_deliveries = max(0, self.held_deliveries - 1)

    def take_callback_drop(self) -> bool:
        if self.dropped_callbacks > 0:
            self.dropped_callbacks -= 1
            return True
        return False

    def take_callback_duplicate(self) -> bool:
        if self.duplicated_callbacks > 0:
            self.duplicated_callbacks -= 1
            return True
        return False

    def describe(self) -> dict[str, Any]:
        return {
            "requests": [fault.describe() for fault in self.request_faults],
            "list_only": self.listing_share.describe() if self.listing_share is not None else None,
            "pending_payment_next": self.pending_payment_orders,
            "hold_delivery_next": self.held_deliveries,
            "drop_callbacks_next": self.dropped_callbacks,
            "duplicate_callbacks_next": self.duplicated_callbacks,
            "delay_callbacks_seconds": self.callback_delay_seconds,
        }
