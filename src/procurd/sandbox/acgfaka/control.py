"""The sandbox acg-faka shop's unsigned control API under ``/_sandbox/`` (loopback clients only), in the
spirit of the Dujiao-Next sandbox's: JSON bodies, amounts as decimal strings, a bad field named."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from aiohttp import web

from procurd.protocol.acgfaka.ini import IniError, parse_ini
from procurd.protocol.web import json_response
from procurd.sandbox.acgfaka.catalogue import config_text, describe
from procurd.sandbox.acgfaka.shop import Commodity, Member, ShopRefusal, parse_version
from procurd.sandbox.control import _is_loopback
from procurd.sandbox.control_fields import ControlError, Kind, Money, bad_field, checked_fields, json_body

if TYPE_CHECKING:
    from procurd.sandbox.acgfaka.server import AcgFakaSandbox

CONTROL_PREFIX = "/_sandbox"
Handler = Callable[[web.Request], Awaitable[web.Response]]

KNOBS: dict[str, dict[str, Kind]] = {
    "crash_next": {"endpoint": str, "count": int},
    "refuse_next": {"endpoint": str, "count": int, "msg": str},
    "redirect_next": {"endpoint": str, "count": int, "location": str},
    "price_changed_next": {"count": int},
    "sold_out_race_next": {"count": int},
    "lost_answer_next": {"count": int},
    "hang_after_next": {"count": int},
    "error_after_commit_next": {"count": int, "msg": str, "html": bool},
}
CONFIG_KEYS: dict[str, Kind] = {"version": str, "shop_name": str, "balance_payment": bool, "debug": bool}
MEMBER_FIELDS: dict[str, Kind] = {"app_id": int, "app_key": str, "balance": Money}
WALLET_FIELDS: dict[str, Kind] = {"app_id": int, "balance": Money, "top_up": Money, "banned": bool}
CATEGORY_FIELDS: dict[str, Kind] = {"name": str, "sort": int, "pid": int}
COMMODITY_FIELDS: dict[str, Kind] = {
    "name": str,
    "category_id": int,
    "code": str,
    "delivery_way": int,
    "price": Money,
    "user_price": Money,
    "factory_price": Money,
    "races": dict,
    "race_wholesale": dict,
    "wholesale": dict,
    "groups": dict,
    "config": str,
    "widgets": list,
    "stock": int,
    "status": int,
    "api_status": int,
    "hide": int,
    "delivery_message": str,
    "leave_message": str,
    "minimum": int,
    "maximum": int,
    "purchase_count": int,
    "description": str,
    "cover": str,
    "shared_id": int,
}
CARD_FIELDS: dict[str, Kind] = {"secret": str, "race": str, "sku": dict}
CARDS_FIELDS: dict[str, Kind] = {"cards": list}
DELIVER_FIELDS: dict[str, Kind] = {"secret": str}
SCALARS = (
    "name",
    "delivery_way",
    "stock",
    "status",
    "api_status",
    "hide",
    "delivery_message",
    "leave_message",
)
MORE_SCALARS = ("minimum", "maximum", "purchase_count", "description", "cover", "category_id", "shared_id")
PRICES = ("price", "user_price", "factory_price")


def _amounts(name: str, value: Any, depth: int) -> Any:
    """A mapping of names to decimal strings (``depth`` levels deep), as Decimals."""
    if not isinstance(value, dict):
        raise bad_field(name, f"{name} must be an object")
    result: dict[str, Any] = {}
    for key, item in value.items():
        if depth > 1:
            result[key] = _amounts(f"{name}.{key}", item, depth - 1)
            continue
        try:
            amount = Decimal(item) if isinstance(item, str) else None
        except ArithmeticError:
            amount = None
        if amount is None or not amount.is_finite() or amount < 0:
            raise bad_field(f"{name}.{key}", f'{name}.{key} must be a decimal string such as "9.90"')
        result[key] = amount
    return result


def _config(fields: dict[str, Any]) -> str | None:
    """The INI config the fields ask for: ``config`` as given, or built from races, tiers and groups."""
    structured = [name for name in ("races", "race_wholesale", "wholesale", "groups") if name in fields]
    if "config" in fields:
        if structured:
            raise bad_field("config", f"give config or {', '.join(structured)}, not both")
        return str(fields["config"])
    if not structured:
        return None
    return config_text(
        _amounts("races", fields.get("races", {}), 1),
        _amounts("race_wholesale", fields.get("race_wholesale", {}), 2),
        _amounts("wholesale", fields.get("wholesale", {}), 1),
        _amounts("groups", fields.get("groups", {}), 2),
    )


class ShopControl:
    def __init__(self, sandbox: AcgFakaSandbox) -> None:
        self.sandbox = sandbox
        self.shop = sandbox.shop

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "", self.index),
            ("GET", "/state", self.state),
            ("POST", "/config", self.set_config),
            ("POST", "/members", self.add_member),
            ("POST", "/wallet", self.set_wallet),
            ("POST", "/categories", self.add_category),
            ("POST", "/commodities", self.add_commodity),
            ("GET", "/commodities/{code}", self.get_commodity),
            ("POST", "/commodities/{code}", self.update_commodity),
            ("POST", "/commodities/{code}/cards", self.add_cards),
            ("GET", "/orders", self.list_orders),
            ("GET", "/orders/{trade_no}", self.get_order),
            ("POST", "/orders/{trade_no}/deliver", self.deliver),
            ("POST", "/faults", self.add_fault),
            ("POST", "/faults/clear", self.clear_faults),
            ("GET", "/requests", self.list_requests),
            ("POST", "/requests/reset", self.reset_requests),
        ]

    def wrap(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.Response:
            if not _is_loopback(request.remote):
                refused = {"ok": False, "error_code": "forbidden", "error_message": "loopback clients only"}
                return json_response(refused, 403)
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
            except (ValueError, TypeError, ShopRefusal) as error:
                status, code, message = 400, "bad_request", str(error)
            body: dict[str, Any] = {"ok": False, "error_code": code, "error_message": message}
            if field is not None:
                body["field"] = field
            return json_response(body, status)

        return guarded

    async def index(self, request: web.Request) -> web.Response:
        return json_response(
            {"ok": True, "endpoints": [f"{m} {CONTROL_PREFIX}{p}" for m, p, _ in self.routes()]}
        )

    async def state(self, request: web.Request) -> web.Response:
        config = self.sandbox.config
        return json_response(
            {
                "ok": True,
                "protocol": "acg-faka",
                "version": config.version,
                "shop_name": config.shop_name,
                "base_url": str(request.url.origin()),
                "balance_payment": config.balance_payment,
                "members": {
                    str(m.id): {"balance": f"{m.balance:.2f}", "banned": m.banned} for m in self._members()
                },
                "catalogue": {"categories": len(self.shop.categories), **describe(self.shop)},
                "orders": len(self.shop.orders),
                "requests": dict(self.sandbox.request_counts),
                "faults": self.sandbox.faults.describe(),
            }
        )

    def _members(self) -> list[Member]:
        return list(self.shop.members.values())

    async def set_config(self, request: web.Request) -> web.Response:
        fields = checked_fields(await json_body(request), CONFIG_KEYS)
        if "version" in fields:
            try:
                parse_version(fields["version"])
            except ValueError as exc:
                raise bad_field("version", str(exc)) from None
        for name, value in fields.items():
            setattr(self.sandbox.config, name, value)
        return json_response({"ok": True})

    async def add_member(self, request: web.Request) -> web.Response:
        """Another member account with a docking key and a balance of its own (1000.00 unless given)."""
        fields = checked_fields(await json_body(request), MEMBER_FIELDS)
        if not fields.get("app_key"):
            raise bad_field("app_key", "app_key is required")
        app_id = fields.get("app_id", max(self.shop.members) + 1)
        if app_id in self.shop.members or app_id < 1:
            raise bad_field("app_id", f"app_id {app_id} is taken or below 1")
        member = Member(app_id, fields["app_key"], fields.get("balance", Decimal("1000.00")))
        self.shop.members[app_id] = member
        return json_response({"ok": True, "app_id": member.id, "balance": f"{member.balance:.2f}"})

    async def set_wallet(self, request: web.Request) -> web.Response:
        """Set (``balance``) or raise (``top_up``) a member's balance, or ban it (default member: the
        configured one)."""
        fields = checked_fields(await json_body(request), WALLET_FIELDS)
        member = self.shop.members[fields.get("app_id", self.sandbox.config.app_id)]
        if "balance" in fields and "top_up" in fields:
            raise bad_field("balance", "give balance or top_up, not both")
        if "balance" in fields:
            member.balance = fields["balance"]
        if "top_up" in fields:
            member.balance += fields["top_up"]
        if "banned" in fields:
            member.banned = fields["banned"]
        return json_response({"ok": True, "app_id": member.id, "balance": f"{member.balance:.2f}"})

    async def add_category(self, request: web.Request) -> web.Response:
        fields = checked_fields(await json_body(request), CATEGORY_FIELDS)
        category = self.shop.add_category(
            fields.get("name", "新分类"), sort=fields.get("sort", 0), pid=fields.get("pid")
        )
        return json_response({"ok": True, "category": {"id": category.id, "name": category.name}})

    async def add_commodity(self, request: web.Request) -> web.Response:
        """A new commodity: any field of ``COMMODITY_FIELDS`` (a name and a category are required), its
        config as ``config`` text or built from ``races``, ``race_wholesale``, ``wholesale``, ``groups``."""
        fields = checked_fields(await json_body(request), COMMODITY_FIELDS)
        for name in ("name", "category_id"):
            if name not in fields:
                raise bad_field(name, f"{name} is required")
        price = fields.get("price", Decimal("10.00"))
        commodity = Commodity(
            id=self.shop.next_commodity_id(),
            code=fields.get("code") or self.shop.new_code(),
            category_id=fields["category_id"],
            name=fields["name"],
            price=price,
            user_price=fields.get("user_price", price),
        )
        self._apply(commodity, fields)
        self.shop.add_commodity(commodity)
        return json_response({"ok": True, "commodity": self._commodity(commodity)})

    async def get_commodity(self, request: web.Request) -> web.Response:
        return json_response({"ok": True, "commodity": self._commodity(self._find(request))})

    async def update_commodity(self, request: web.Request) -> web.Response:
        commodity = self._find(request)
        fields = checked_fields(await json_body(request), COMMODITY_FIELDS)
        if "code" in fields:
            raise bad_field("code", "a commodity's code does not change")
        self._apply(commodity, fields)
        return json_response({"ok": True, "commodity": self._commodity(commodity)})

    def _apply(self, commodity: Commodity, fields: dict[str, Any]) -> None:
        config = _config(fields)
        if config is not None:
            commodity.config = config
        for name in (*SCALARS, *MORE_SCALARS, *PRICES):
            if name in fields:
                setattr(commodity, name, fields[name])
        if "widgets" in fields:
            if not all(isinstance(widget, dict) for widget in fields["widgets"]):
                raise bad_field("widgets", "widgets must be a list of objects")
            commodity.widgets = fields["widgets"]
        if commodity.category_id not in self.shop.categories:
            raise bad_field("category_id", f"no category {commodity.category_id}")

    def _find(self, request: web.Request) -> Commodity:
        code = request.match_info["code"]
        commodity = self.shop.by_code(code)
        if commodity is None:
            raise KeyError(f"commodity {code}")
        return commodity

    def _commodity(self, commodity: Commodity) -> dict[str, Any]:
        try:
            sections: Any = parse_ini(commodity.config)
        except IniError as exc:
            sections = {"error": str(exc)}
        cards = self.shop.cards.get(commodity.id, [])
        return {
            "id": commodity.id,
            "code": commodity.code,
            "name": commodity.name,
            "category_id": commodity.category_id,
            "delivery_way": commodity.delivery_way,
            "shared_id": commodity.shared_id,
            "price": f"{commodity.price:.2f}",
            "user_price": f"{commodity.user_price:.2f}",
            "status": commodity.status,
            "api_status": commodity.api_status,
            "hide": commodity.hide,
            "stock": commodity.stock,
            "config": commodity.config,
            "config_sections": sections,
            "widgets": commodity.widgets,
            "cards": {"unsold": sum(1 for c in cards if not c.sold), "sold": sum(1 for c in cards if c.sold)},
        }

    async def add_cards(self, request: web.Request) -> web.Response:
        """Cards of a commodity: ``{"cards": [{"secret", "race", "sku": {group: option}}]}``."""
        commodity = self._find(request)
        specs = checked_fields(await json_body(request), CARDS_FIELDS).get("cards", [])
        added = 0
        for index, spec in enumerate(specs):
            card = checked_fields(spec, CARD_FIELDS, f"cards[{index}].")
            if not card.get("secret"):
                raise bad_field(f"cards[{index}].secret", f"cards[{index}].secret is required")
            sku = {str(k): str(v) for k, v in card.get("sku", {}).items()}
            self.shop.add_cards(commodity, [card["secret"]], card.get("race"), sku)
            added += 1
        return json_response({"ok": True, "added": added, "commodity": self._commodity(commodity)})

    async def list_orders(self, request: web.Request) -> web.Response:
        wanted, app_id = request.query.get("request_no"), request.query.get("app_id")
        orders = [
            order.to_control()
            for order in self.shop.orders.values()
            if (wanted is None or order.request_no == wanted)
            and (app_id is None or str(order.owner) == app_id)
        ]
        return json_response({"ok": True, "orders": orders})

    async def get_order(self, request: web.Request) -> web.Response:
        return json_response(
            {"ok": True, "order": self.shop.orders[request.match_info["trade_no"]].to_control()}
        )

    async def deliver(self, request: web.Request) -> web.Response:
        """The seller types a manual order's goods in: ``query`` answers them from now on."""
        fields = checked_fields(await json_body(request), DELIVER_FIELDS)
        if not fields.get("secret"):
            raise bad_field("secret", "secret is required")
        order = self.shop.deliver(request.match_info["trade_no"], fields["secret"])
        return json_response({"ok": True, "order": order.to_control()})

    async def add_fault(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        knob = body.pop("knob", None)
        if knob not in KNOBS:
            raise bad_field("knob", f"knob must be one of {', '.join(KNOBS)}")
        arguments = checked_fields(body, KNOBS[knob])
        if "location" in arguments:
            arguments["location"] = str(arguments["location"])
        getattr(self.sandbox.faults, knob)(**arguments)
        return json_response({"ok": True, "faults": self.sandbox.faults.describe()})

    async def clear_faults(self, request: web.Request) -> web.Response:
        self.sandbox.faults.clear()
        return json_response({"ok": True, "faults": []})

    async def list_requests(self, request: web.Request) -> web.Response:
        records = [record.to_dict() for record in self.sandbox.requests]
        return json_response({"ok": True, "counts": dict(self.sandbox.request_counts), "requests": records})

    async def reset_requests(self, request: web.Request) -> web.Response:
        self.sandbox.reset_requests()
        return json_response({"ok": True})


def add_control_routes(app: web.Application, sandbox: AcgFakaSandbox) -> None:
    control = ShopControl(sandbox)
    for method, path, handler in control.routes():
        app.router.add_route(method, CONTROL_PREFIX + path, control.wrap(handler))
