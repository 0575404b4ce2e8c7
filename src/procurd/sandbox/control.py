"""The unsigned control API under ``/_sandbox/`` for people and out-of-process tests (loopback only)."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from procurd.protocol.web import json_response
from procurd.sandbox.catalog import UNLIMITED, money_text
from procurd.sandbox.config import DIALECTS
from procurd.sandbox.control_fields import (
    ControlError,
    Kind,
    Money,
    Title,
    at_least,
    bad_field,
    checked_fields,
    json_body,
    path_id,
    query_number,
    typed,
)
from procurd.sandbox.faults import ENDPOINTS
from procurd.sandbox.site import SandboxSite
from procurd.sandbox.state import ORDER_STATUSES, NewSku, SandboxStateError
from procurd.sandbox.traffic import tally

CONTROL_PREFIX = "/_sandbox"
Handler = Callable[[web.Request], Awaitable[web.Response]]


# knob name -> its parameters and their JSON types (``bytes`` arrives as a string)
KNOBS: dict[str, dict[str, Kind]] = {
    "fail_next": {"endpoint": str, "count": int, "status": int, "error_code": str},
    "fail_after_next": {"endpoint": str, "count": int},
    "drop_next": {"endpoint": str, "count": int},
    "delay_next": {"endpoint": str, "count": int, "seconds": float},
    "hang_next": {"endpoint": str, "count": int},
    "malformed_next": {"endpoint": str, "count": int, "body": bytes, "status": int, "content_type": str},
    "pending_payment_next": {"count": int},
    "hold_delivery_next": {"count": int},
    "drop_callbacks_next": {"count": int},
    "duplicate_callbacks_next": {"count": int},
    "delay_callbacks": {"seconds": float},
    "empty_listing_next": {"count": int},
    "list_only": {"products": int, "fraction": float},
    "clear": {},
}
ORDER_ACTIONS: dict[str, dict[str, Kind]] = {
    "deliver": {"payload": str},
    "complete": {},
    "cancel": {},
    "refund": {"amount": Money, "reason": str},
    "pay": {},
    "status": {"status": ORDER_STATUSES, "callback": bool},
}
WALLET_FIELDS: dict[str, Kind] = {"api_key": str, "balance": Money, "top_up": Money}
API_KEY_FIELDS: dict[str, Kind] = {"api_key": str, "api_secret": str, "balance": Money, "member_level": bool}
SKU_FIELDS: dict[str, Kind] = {"price_amount": Money, "stock_quantity": int, "is_active": bool}
PRODUCT_FIELDS: dict[str, Kind] = {
    "title": Title,
    "category_id": int,
    "is_active": bool,
    "removed": bool,
    "min_purchase_quantity": int,
    "max_purchase_quantity": int,
}
PURCHASE_LIMITS = ("min_purchase_quantity", "max_purchase_quantity")  # null lifts the limit
NEW_PRODUCT_FIELDS: dict[str, Kind] = {
    "title": Title,
    "category_id": int,
    "fulfillment_type": ("auto", "manual"),
    "is_active": bool,
    "skus": list,
}
CONFIG_KEYS: dict[str, Kind] = {
    "auto_deliver": bool,
    "allow_private_callbacks": bool,
    "balance_failure": ("payment_failed", "insufficient_balance"),
    "callback_retry_delays": list,
    "callback_timeout_seconds": float,
    "clock_offset_seconds": float,
    "dialect": DIALECTS,
    "honour_updated_after": bool,
    "inactive_product_detail": ("404", "200", None),
    "page_size_max": int,
    "site_name": str,
}
RATE_LIMIT_KEYS: dict[str, Kind] = {
    "enabled": bool,
    "requests": int,
    "window_seconds": float,
    "block_seconds": float,
}


def _new_skus(specs: list[Any]) -> list[NewSku]:
    if not specs:
        raise bad_field("skus", "skus must hold at least one SKU")
    skus = []
    for index, spec in enumerate(specs):
        prefix = f"skus[{index}]."
        fields = checked_fields(spec, SKU_FIELDS, prefix)
        if "price_amount" not in fields:
            raise bad_field(prefix + "price_amount", f"{prefix}price_amount is required")
        at_least(fields, "stock_quantity", UNLIMITED, prefix=prefix)
        skus.append(NewSku(**fields))
    return skus


def _is_loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        return ipaddress.ip_address(remote.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class ControlApi:
    def __init__(self, site: SandboxSite) -> None:
        self.site = site
        self.state = site.state

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "", self.index),
            ("GET", "/state", self.get_state),
            ("GET", "/orders", self.list_orders),
            ("GET", "/orders/{id}", self.get_order),
            ("GET", "/callbacks", self.list_callbacks),
            ("POST", "/faults", self.add_fault),
            ("POST", "/faults/clear", self.clear_faults),
            ("POST", "/orders/{id}/{action}", self.order_action),
            ("POST", "/wallet", self.set_wallet),
            ("POST", "/api_keys", self.add_api_key),
            ("POST", "/skus/{id}", self.update_sku),
            ("POST", "/products", self.add_product),
            ("POST", "/products/{id}", self.update_product),
            ("DELETE", "/products/{id}", self.delete_product),
            ("POST", "/rate_limit", self.set_rate_limit),
            ("POST", "/config", self.set_config),
            ("GET", "/requests", self.list_requests),
            ("POST", "/requests/reset", self.reset_requests),
        ]

    def wrap(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.Response:
            if not _is_loopback(request.remote):
                return json_response(
                    {"ok": False, "error_code": "forbidden", "error_message": "loopback clients only"}, 403
                )
            field: str | None = None
            try:
                return await handler(request)
            except ControlError as error:
                status, code, message, field = error.status, error.code, error.message, error.field
            except KeyError as error:
                status, code, message = (
                    404,
                    "not_found",
                    f"no such item: {error.args[0] if error.args else ''}",
                )
            except SandboxStateError as error:
                status, code, message = 409, "conflict", str(error)
            except (ValueError, TypeError) as error:
                status, code, message = 400, "bad_request", str(error)
            body = {"ok": False, "error_code": code, "error_message": message}
            if field is not None:
                body["field"] = field
            return json_response(body, status)

        return guarded

    async def index(self, request: web.Request) -> web.Response:
        return json_response(
            {"ok": True, "endpoints": [f"{m} {CONTROL_PREFIX}{p}" for m, p, _ in self.routes()]}
        )

    async def get_state(self, request: web.Request) -> web.Response:
        site = self.site
        config = site.config
        stats = site.callbacks.stats
        return json_response(
            {
                "ok": True,
                "site_name": config.site_name,
                "dialect": config.dialect,
                "base_url": str(request.url.origin()),
                "api_key": config.api_key,
                "orders": {"total": len(self.state.orders), "by_status": dict(self.state.status_counts())},
                "balance": money_text(self.state.balance()),
                "currency": config.currency,
                "wallets": {key: money_text(user.balance) for key, user in self.state.users.items()},
                "requests": {name: site.request_counts.get(name, 0) for name in (*ENDPOINTS, "*")},
                "callbacks": {
                    "sent": stats["attempts"],
                    "delivered": stats["delivered"],
                    "failed": stats["failed"],
                    "dropped": stats["dropped"],
                    "abandoned": stats["abandoned"],
                    "in_progress": site.callbacks.tasks.busy,
                },
                "faults": site.faults.describe(),
                "rate_limit": self._rate_limit(),
                "catalogue": {
                    "categories": len(self.state.categories),
                    "products": len(self.state.products),
                    "listed_products": len(self.state.active_products()),
                    "skus": len(self.state.skus),
                },
            }
        )

    async def list_orders(self, request: web.Request) -> web.Response:
        wanted = request.query.get("downstream_order_no")
        api_key = request.query.get("api_key")
        orders = (
            self.state.orders_for(wanted, api_key)
            if wanted is not None
            else [o for o in self.state.orders.values() if api_key in (None, o.api_key)]
        )
        return json_response({"ok": True, "orders": [order.to_control() for order in orders]})

    async def get_order(self, request: web.Request) -> web.Response:
        return json_response({"ok": True, "order": self.state.order(path_id(request)).to_control()})

    async def list_callbacks(self, request: web.Request) -> web.Response:
        attempts = [
            {
                "order_id": a.order_id,
                "downstream_order_no": a.downstream_order_no,
                "status": a.status,
                "event": a.event,
                "attempt": a.attempt,
                "url": a.url,
                "http_status": a.http_status,
                "ok": a.ok,
                "error": a.error,
                "at": a.at,
            }
            for a in self.site.callback_log
        ]
        return json_response({"ok": True, "callbacks": attempts})

    async def add_fault(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        knob = typed("knob", body.pop("knob", None), tuple(KNOBS))
        arguments = checked_fields(body, KNOBS[knob])
        getattr(self.site.faults, knob)(**arguments)
        return json_response({"ok": True, "faults": self.site.faults.describe()})

    async def clear_faults(self, request: web.Request) -> web.Response:
        self.site.faults.clear()
        return json_response({"ok": True, "faults": self.site.faults.describe()})

    async def order_action(self, request: web.Request) -> web.Response:
        """deliver, complete, cancel (by the site), refund, pay or status, each with its own fields."""
        order_id = path_id(request)
        action = request.match_info["action"]
        if action not in ORDER_ACTIONS:
            raise ControlError(404, "not_found", f"unknown order action {action!r}")
        fields = checked_fields(await json_body(request), ORDER_ACTIONS[action])
        self.state.order(order_id)
        site = self.site
        if action == "deliver":
            order = await site.deliver(order_id, fields.get("payload"))
        elif action == "complete":
            order = await site.complete(order_id)
        elif action == "cancel":
            order = site.cancel_upstream(order_id)
        elif action == "refund":
            order = site.refund(
                order_id, fields.get("amount"), fields.get("reason") or "refunded by the site"
            )
        elif action == "pay":
            order = await site.pay(order_id)
        else:
            if "status" not in fields:
                raise bad_field("status", "status is required")
            order = await site.set_status(order_id, fields["status"], fields.get("callback", True))
        return json_response({"ok": True, "order": order.to_control()})

    async def set_wallet(self, request: web.Request) -> web.Response:
        """Set (``balance``) or raise (``top_up``) the wallet of ``api_key`` (default: the configured key)."""
        fields = checked_fields(await json_body(request), WALLET_FIELDS)
        api_key = fields.get("api_key")
        if ("balance" in fields) == ("top_up" in fields):
            raise bad_field("balance", "give balance or top_up (one of them)")
        if "balance" in fields:
            self.state.set_balance(fields["balance"], api_key)
        else:
            self.state.top_up(fields["top_up"], api_key)
        user = self.state.user(api_key)
        return json_response({"ok": True, "api_key": user.api_key, "balance": money_text(user.balance)})

    async def add_api_key(self, request: web.Request) -> web.Response:
        """Another API key with a user account and a wallet of its own (1000.00 unless ``balance``)."""
        fields = checked_fields(await json_body(request), API_KEY_FIELDS)
        for name in ("api_key", "api_secret"):
            if not fields.get(name):
                raise bad_field(name, f"{name} is required")
        user = self.state.add_api_key(**fields)
        return json_response(
            {
                "ok": True,
                "api_key": user.api_key,
                "user_id": user.user_id,
                "balance": money_text(user.balance),
            }
        )

    async def update_sku(self, request: web.Request) -> web.Response:
        """Change a SKU's price, stock or active flag; its product's updated_at moves to now."""
        sku_id = path_id(request)
        sku = self.state.sku(sku_id)
        fields = checked_fields(await json_body(request), SKU_FIELDS)
        at_least(fields, "stock_quantity", UNLIMITED)
        if "price_amount" in fields:
            self.state.set_sku_price(sku_id, fields["price_amount"])
        if "stock_quantity" in fields:
            self.state.set_sku_stock(sku_id, fields["stock_quantity"])
        if "is_active" in fields:
            self.state.set_sku_active(sku_id, fields["is_active"])
        product = self.state.product(sku.product_id)
        return json_response({"ok": True, "sku": sku.to_dict(), "product_updated_at": product.updated_at})

    async def update_product(self, request: web.Request) -> web.Response:
        """Change a product's title, category, active flag or purchase limits, or remove (``removed``) and
        restore it."""
        product_id = path_id(request)
        product = self.state.product(product_id)
        body = await json_body(request)
        lifted = [name for name in PURCHASE_LIMITS if name in body and body[name] is None]
        for name in lifted:
            del body[name]
        fields = checked_fields(body, PRODUCT_FIELDS)
        for name in PURCHASE_LIMITS:
            at_least(fields, name, 1)
            if name in fields or name in lifted:
                setattr(product, name, fields.get(name))
        if "title" in fields:
            self.state.set_product_title(product_id, fields["title"])
        if "category_id" in fields:
            self.state.set_product_category(product_id, fields["category_id"])
        if "is_active" in fields:
            self.state.set_product_active(product_id, fields["is_active"])
        if fields.get("removed") is True:
            self.state.remove_product(product_id)
        elif fields.get("removed") is False:
            self.state.restore_product(product_id)
        return self._product_answer(product_id)

    async def add_product(self, request: web.Request) -> web.Response:
        """A new product with its SKUs (one 9.90 SKU of unlimited stock unless ``skus`` says otherwise)."""
        fields = checked_fields(await json_body(request), NEW_PRODUCT_FIELDS)
        if "skus" in fields:
            fields["skus"] = _new_skus(fields["skus"])
        return self._product_answer(self.state.add_product(**fields))

    async def delete_product(self, request: web.Request) -> web.Response:
        """The product is gone from the site: unlisted, product_not_found (``removed: false`` restores it)."""
        product_id = path_id(request)
        self.state.remove_product(product_id)
        return self._product_answer(product_id)

    def _product_answer(self, product_id: int) -> web.Response:
        product = self.state.product(product_id)
        return json_response(
            {
                "ok": True,
                "product": product.to_dict(include_inactive_skus=True),
                "removed": product_id in self.state.removed_products,
                "min_purchase_quantity": product.min_purchase_quantity,
                "max_purchase_quantity": product.max_purchase_quantity,
            }
        )

    def _rate_limit(self) -> dict[str, Any]:
        config = self.site.config
        return {
            "enabled": config.rate_limit,
            "requests": config.rate_limit_requests,
            "window_seconds": config.rate_limit_window_seconds,
            "block_seconds": config.rate_limit_block_seconds,
        }

    async def set_rate_limit(self, request: web.Request) -> web.Response:
        """Switch the limit and set its numbers; every key starts with an empty window."""
        fields = checked_fields(await json_body(request), RATE_LIMIT_KEYS)
        at_least(fields, "requests", 1)
        at_least(fields, "window_seconds", 0, above=True)
        at_least(fields, "block_seconds", 0)
        config = self.site.config
        config.rate_limit = fields.get("enabled", config.rate_limit)
        config.rate_limit_requests = fields.get("requests", config.rate_limit_requests)
        config.rate_limit_window_seconds = fields.get("window_seconds", config.rate_limit_window_seconds)
        config.rate_limit_block_seconds = fields.get("block_seconds", config.rate_limit_block_seconds)
        self.site.rate_limiter.reset()
        return json_response({"ok": True, **self._rate_limit()})

    async def set_config(self, request: web.Request) -> web.Response:
        fields = checked_fields(await json_body(request), CONFIG_KEYS)
        if "callback_retry_delays" in fields:
            delays = fields["callback_retry_delays"]
            fields["callback_retry_delays"] = tuple(typed("callback_retry_delays", d, float) for d in delays)
            if any(delay < 0 for delay in fields["callback_retry_delays"]):
                raise bad_field("callback_retry_delays", "callback_retry_delays must not be negative")
        at_least(fields, "page_size_max", 1)
        at_least(fields, "callback_timeout_seconds", 0, above=True)
        for name, value in fields.items():
            setattr(self.site.config, name, value)
        return json_response({"ok": True})

    async def list_requests(self, request: web.Request) -> web.Response:
        """The signed API's requests at or after ``since`` (the site's Unix seconds), per key and endpoint."""
        since = request.query.get("since")
        api_key = request.query.get("api_key")
        start = None if since is None else typed("since", query_number(since), float)
        records = self.site.requests.select(start, api_key)
        return json_response(
            {
                "ok": True,
                "now": self.state.now(),
                "since": start,
                "total": {"requests": len(records), "rate_limited": sum(r.rate_limited for r in records)},
                "by_key": tally(records),
                "requests": [record.to_dict() for record in records],
            }
        )

    async def reset_requests(self, request: web.Request) -> web.Response:
        self.site.reset_requests()
        return json_response({"ok": True, "now": self.state.now()})


def add_control_routes(app: web.Application, site: SandboxSite) -> None:
    control = ControlApi(site)
    for method, path, handler in control.routes():
        app.router.add_route(method, CONTROL_PREFIX + path, control.wrap(handler))
