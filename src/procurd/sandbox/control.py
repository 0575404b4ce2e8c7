"""The unsigned control API under ``/_sandbox/`` for people and out-of-process tests (loopback only)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from aiohttp import web

from procurd.sandbox.api import json_response
from procurd.sandbox.catalog import money_text
from procurd.sandbox.faults import ENDPOINTS
from procurd.sandbox.state import SandboxStateError

if TYPE_CHECKING:
    from procurd.sandbox.server import Sandbox

CONTROL_PREFIX = "/_sandbox"
Handler = Callable[[web.Request], Awaitable[web.Response]]


class ControlError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


# knob name -> its parameters and their JSON types (``bytes`` arrives as a string)
KNOBS: dict[str, dict[str, type]] = {
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
    "clear": {},
}
CONFIG_KEYS: dict[str, type] = {
    "auto_deliver": bool,
    "allow_private_callbacks": bool,
    "callback_timeout_seconds": float,
    "clock_offset_seconds": float,
    "honour_updated_after": bool,
    "page_size_max": int,
    "site_name": str,
}


def _is_loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        return ipaddress.ip_address(remote.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _typed(name: str, value: Any, expected: type) -> Any:
    if expected is bool:
        if isinstance(value, bool):
            return value
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif expected is float:
        if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
            return float(value)
    elif expected is bytes:
        if isinstance(value, str):
            return value.encode()
    elif isinstance(value, expected):
        return value
    raise ControlError(400, "bad_request", f"{name} has the wrong type")


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw, parse_float=Decimal)
    except ValueError:
        raise ControlError(400, "bad_request", "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ControlError(400, "bad_request", "the body must be a JSON object")
    return data


def _id(request: web.Request) -> int:
    raw = request.match_info["id"]
    if not (raw.isascii() and raw.isdigit()):
        raise ControlError(400, "bad_request", "the id must be a number")
    return int(raw)


class ControlApi:
    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.state = sandbox.state

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
            ("POST", "/skus/{id}", self.update_sku),
            ("POST", "/products/{id}", self.update_product),
            ("POST", "/rate_limit", self.set_rate_limit),
            ("POST", "/config", self.set_config),
        ]

    def wrap(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.Response:
            if not _is_loopback(request.remote):
                return json_response(
                    {"ok": False, "error_code": "forbidden", "error_message": "loopback clients only"}, 403
                )
            try:
                return await handler(request)
            except ControlError as error:
                status, code, message = error.status, error.code, error.message
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
            return json_response({"ok": False, "error_code": code, "error_message": message}, status)

        return guarded

    async def index(self, request: web.Request) -> web.Response:
        return json_response(
            {"ok": True, "endpoints": [f"{m} {CONTROL_PREFIX}{p}" for m, p, _ in self.routes()]}
        )

    async def get_state(self, request: web.Request) -> web.Response:
        sandbox = self.sandbox
        config = sandbox.config
        stats = sandbox.callbacks.stats
        return json_response(
            {
                "ok": True,
                "site_name": config.site_name,
                "base_url": sandbox.base_url,
                "api_key": config.api_key,
                "orders": {"total": len(self.state.orders), "by_status": dict(self.state.status_counts())},
                "balance": money_text(self.state.balance()),
                "currency": config.currency,
                "wallets": {key: money_text(user.balance) for key, user in self.state.users.items()},
                "requests": {name: sandbox.request_counts.get(name, 0) for name in (*ENDPOINTS, "*")},
                "callbacks": {
                    "sent": stats["attempts"],
                    "delivered": stats["delivered"],
                    "failed": stats["failed"],
                    "dropped": stats["dropped"],
                    "abandoned": stats["abandoned"],
                    "in_progress": sandbox.callbacks.tasks.busy,
                },
                "faults": sandbox.faults.describe(),
                "rate_limit": {
                    "enabled": config.rate_limit,
                    "requests": config.rate_limit_requests,
                    "window_seconds": config.rate_limit_window_seconds,
                    "block_seconds": config.rate_limit_block_seconds,
                },
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
        return json_response({"ok": True, "order": self.state.order(_id(request)).to_control()})

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
            for a in self.sandbox.callback_log
        ]
        return json_response({"ok": True, "callbacks": attempts})

    async def add_fault(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        knob = body.pop("knob", None)
        if not isinstance(knob, str) or knob not in KNOBS:
            raise ControlError(400, "bad_request", f"knob must be one of {', '.join(KNOBS)}")
        allowed = KNOBS[knob]
        unknown = sorted(set(body) - set(allowed))
        if unknown:
            raise ControlError(400, "bad_request", f"unknown parameters for {knob}: {', '.join(unknown)}")
        arguments = {name: _typed(name, value, allowed[name]) for name, value in body.items()}
        getattr(self.sandbox.faults, knob)(**arguments)
        return json_response({"ok": True, "faults": self.sandbox.faults.describe()})

    async def clear_faults(self, request: web.Request) -> web.Response:
        self.sandbox.faults.clear()
        return json_response({"ok": True, "faults": self.sandbox.faults.describe()})

    async def order_action(self, request: web.Request) -> web.Response:
        order_id = _id(request)
        action = request.match_info["action"]
        body = await _json_body(request)
        sandbox = self.sandbox
        if action == "deliver":
            payload = body.get("payload")
            order = await sandbox.deliver(order_id, _typed("payload", payload, str) if payload else None)
        elif action == "complete":
            order = await sandbox.complete(order_id)
        elif action == "cancel":
            order = sandbox.cancel_upstream(order_id)
        elif action == "refund":
            amount = body.get("amount")
            order = sandbox.refund(order_id, None if amount is None else str(amount))
        elif action == "pay":
            order = await sandbox.pay(order_id)
        elif action == "status":
            status = _typed("status", body.get("status"), str)
            callback = _typed("callback", body.get("callback", True), bool)
            order = await sandbox.set_status(order_id, status, callback)
        else:
            raise ControlError(404, "not_found", f"unknown order action {action!r}")
        return json_response({"ok": True, "order": order.to_control()})

    async def set_wallet(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        api_key = body.get("api_key")
        if api_key is not None:
            _typed("api_key", api_key, str)
        if "balance" in body:
            self.state.set_balance(str(body["balance"]), api_key)
        elif "top_up" in body:
            self.state.top_up(str(body["top_up"]), api_key)
        else:
            raise ControlError(400, "bad_request", "give balance or top_up")
        return json_response({"ok": True, "balance": money_text(self.state.balance(api_key))})

    async def update_sku(self, request: web.Request) -> web.Response:
        sku_id = _id(request)
        sku = self.state.sku(sku_id)
        body = await _json_body(request)
        if "price_amount" in body:
            self.state.set_sku_price(sku_id, str(body["price_amount"]))
        if "stock_quantity" in body:
            self.state.set_sku_stock(sku_id, _typed("stock_quantity", body["stock_quantity"], int))
        if "is_active" in body:
            self.state.set_sku_active(sku_id, _typed("is_active", body["is_active"], bool))
        return json_response({"ok": True, "sku": sku.to_dict()})

    async def update_product(self, request: web.Request) -> web.Response:
        product_id = _id(request)
        product = self.state.product(product_id)
        body = await _json_body(request)
        if "is_active" in body:
            self.state.set_product_active(product_id, _typed("is_active", body["is_active"], bool))
        if "removed" in body:
            if _typed("removed", body["removed"], bool):
                self.state.remove_product(product_id)
            else:
                self.state.restore_product(product_id)
        if "category_id" in body:
            self.state.set_product_category(product_id, _typed("category_id", body["category_id"], int))
        return json_response(
            {
                "ok": True,
                "product": product.to_dict(include_inactive_skus=True),
                "removed": product_id in self.state.removed_products,
            }
        )

    async def set_rate_limit(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        config = self.sandbox.config
        if "enabled" in body:
            config.rate_limit = _typed("enabled", body["enabled"], bool)
        if "requests" in body:
            config.rate_limit_requests = _typed("requests", body["requests"], int)
        if "window_seconds" in body:
            config.rate_limit_window_seconds = _typed("window_seconds", body["window_seconds"], float)
        if "block_seconds" in body:
            config.rate_limit_block_seconds = _typed("block_seconds", body["block_seconds"], float)
        self.sandbox.rate_limiter.reset()
        return json_response({"ok": True, "enabled": config.rate_limit})

    async def set_config(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        config = self.sandbox.config
        for name, value in body.items():
            if name == "callback_retry_delays":
                if not isinstance(value, list):
                    raise ControlError(400, "bad_request", "callback_retry_delays must be a list of seconds")
                config.callback_retry_delays = tuple(_typed(name, item, float) for item in value)
            elif name == "balance_failure" and value in ("payment_failed", "insufficient_balance"):
                config.balance_failure = value
            elif name == "inactive_product_detail" and value in ("404", "200"):
                config.inactive_product_detail = value
            elif name in CONFIG_KEYS:
                setattr(config, name, _typed(name, value, CONFIG_KEYS[name]))
            else:
                raise ControlError(400, "bad_request", f"{name} cannot be set here (or has a bad value)")
        return json_response({"ok": True})


def add_control_routes(app: web.Application, sandbox: Sandbox) -> None:
    control = ControlApi(sandbox)
    for method, path, handler in control.routes():
        app.router.add_route(method, CONTROL_PREFIX + path, control.wrap(handler))
