"""procurd's acg-faka client against the sandbox acg-faka shop over real sockets: every endpoint, feature
detection by version, each refusal classified, and the trades whose outcome the protocol cannot tell."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, MutableMapping
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qsl

import pytest
import structlog
from aiohttp import web
from pytest_aiohttp import AiohttpServer
from structlog.testing import capture_logs

from procurd.protocol.acgfaka import (
    AcgFakaClient,
    EndpointAbsent,
    Features,
    TradeRequest,
    delivered_later,
    interpret_delivery,
    request_no,
)
from procurd.protocol.acgfaka.envelope import StockReading
from procurd.protocol.acgfaka.refusals import MANUAL_NOTICE, SOLD_OUT_NOTICE
from procurd.protocol.acgfaka.signing import sign
from procurd.sandbox.acgfaka import DEFAULT_APP_ID, AcgFakaSandbox, ShopConfig
from procurd.sandbox.acgfaka.testing import ControlClient, shop_settings
from procurd.sandbox.testing import wait_until
from procurd.upstream.errors import (
    AuthError,
    BusinessError,
    OutcomeUnknown,
    PriceChanged,
    ProtocolError,
    UpstreamError,
)

CARD = "C0000000000000A1"  # variants 月卡 / 年卡, add-on group 区服
PLAIN = "C0000000000000B2"  # no variants, a wholesale tier at 10
MANUAL = "C0000000000000C3"  # delivered by hand, with buyer inputs
EMPTY = "C0000000000000D4"  # no cards left
HIDDEN = "C0000000000000E5"  # hide = 1
GAME_UID = {
    "cn": "游戏ID",
    "name": "game_uid",
    "type": "text",
    "regex": "^[0-9]{5,12}$",
    "error": "游戏ID格式错误",
}


async def build_shop(control: ControlClient) -> None:
    category = (await control.post("/categories", {"name": "测试"}))["category"]["id"]

    async def add(code: str, **spec: Any) -> None:
        await control.post("/commodities", {"code": code, "name": code, "category_id": category, **spec})

    await add(
        CARD,
        price="12.00",
        user_price="10.00",
        races={"月卡": "10.00", "年卡": "100.00"},
        groups={"区服": {"一区": "0", "二区": "1.50"}},
    )
    cards = [{"secret": f"M-{n}", "race": "月卡", "sku": {"区服": "一区"}} for n in range(3)]
    cards.append({"secret": "Y-1", "race": "年卡", "sku": {"区服": "二区"}})
    await control.post(f"/commodities/{CARD}/cards", {"cards": cards})
    await add(PLAIN, price="5.00", wholesale={"10": "4.50"})
    await control.post(f"/commodities/{PLAIN}/cards", {"cards": [{"secret": f"P-{n}"} for n in range(12)]})
    await add(MANUAL, price="30.00", delivery_way=1, stock=5, widgets=[GAME_UID])
    await add(EMPTY, price="1.00")
    await add(HIDDEN, price="2.00", hide=1)
    await control.post(f"/commodities/{HIDDEN}/cards", {"cards": [{"secret": "H-1"}]})


@pytest.fixture
async def shop() -> AsyncIterator[AcgFakaSandbox]:
    async with AcgFakaSandbox(ShopConfig(commodities=0)) as sandbox:
        async with ControlClient(sandbox.base_url) as control:
            await build_shop(control)
        yield sandbox


@pytest.fixture
def debug_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every structlog line, debug included, whatever logging configuration other tests left behind."""
    previous = structlog.get_config()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG), cache_logger_on_first_use=False
    )
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(**previous)


@pytest.fixture
async def control(shop: AcgFakaSandbox) -> AsyncIterator[ControlClient]:
    async with ControlClient(shop.base_url) as control:
        yield control


Observed = list[tuple[str, str, str, UpstreamError | None]]


@pytest.fixture
def observed() -> Observed:
    return []


@pytest.fixture
async def client(shop: AcgFakaSandbox, observed: Observed) -> AsyncIterator[AcgFakaClient]:
    def observe(
        upstream: str, endpoint: str, outcome: str, seconds: float, error: UpstreamError | None
    ) -> None:
        observed.append((upstream, endpoint, outcome, error))

    async with AcgFakaClient(shop_settings(shop.base_url), observer=observe) as client:
        yield client


def balance(shop: AcgFakaSandbox) -> Decimal:
    return shop.shop.members[DEFAULT_APP_ID].balance


def orders_under(shop: AcgFakaSandbox, number: str) -> list[Any]:
    return [order for order in shop.shop.orders.values() if order.request_no == number]


def buy(code: str, number: str, quantity: int = 1, race: str | None = None, **kw: Any) -> TradeRequest:
    return TradeRequest(code, quantity, request_no(number, str(DEFAULT_APP_ID)), race, **kw)


async def test_every_endpoint(client: AcgFakaClient, shop: AcgFakaSandbox, observed: Observed) -> None:
    """connect, items, item (hidden goods too), inventory, stock, valuation, trade and query, each read
    exactly; the observer sees every request once, by endpoint and outcome."""
    connected = await client.connect()
    assert (connected.shop_name, connected.balance) == ("procurd acg-faka sandbox", Decimal("1000.0"))
    listing = await client.items()
    assert sorted(c.code for c in listing.commodities) == sorted([CARD, PLAIN, MANUAL, EMPTY])
    card = next(c for c in listing.commodities if c.code == CARD)
    assert card.config.races == {"月卡": Decimal("10.00"), "年卡": Decimal("100.00")}
    assert card.config.groups == {"区服": {"一区": Decimal("0"), "二区": Decimal("1.50")}}
    assert (await client.item(HIDDEN)).code == HIDDEN  # item finds what items hides
    inventory = await client.inventory(PLAIN)
    assert (inventory["count"], inventory["factory_price"]) == (12, Decimal("5.0"))
    assert (await client.stock(CARD, "月卡", {"区服": "一区"})).quantity == 3
    assert (await client.stock(CARD, "年卡", {"区服": "一区"})).quantity == 0
    assert await client.valuation(CARD, 2, "年卡", {"区服": "二区"}) == Decimal("203.00")
    assert await client.valuation(PLAIN, 10) == Decimal("45.00")
    result = await client.trade(buy(PLAIN, "every-1", 2))
    assert (result.amount, result.secret) == (Decimal("10.0"), "P-0\nP-1")
    assert result.stock == await client.stock(PLAIN) == StockReading(10)
    assert result.trade_no.isdigit()
    assert len(result.trade_no) == 18
    assert balance(shop) == Decimal("990.00")
    queried = await client.query(result.trade_no)
    assert (queried.secret, queried.status) == ("P-0\nP-1", 1)
    assert await client.features() == Features(valuation=True, stock=True, item="code", query=True)
    assert {endpoint for _, endpoint, _, _ in observed} >= {
        "connect",
        "items",
        "item",
        "inventory",
        "stock",
        "valuation",
        "trade",
        "query",
    }
    assert all(upstream == "acg" for upstream, *_ in observed)
    assert [o for _, e, o, _ in observed if e == "trade"] == ["ok"]


@pytest.mark.parametrize(
    ("version", "features", "span"),
    [
        ("3.6.0", Features(True, True, "code", True), "3.4.6 or later"),
        ("3.2.0", Features(False, True, "code", True), "3.1.3 to 3.4.5"),
        ("3.0.5", Features(False, False, "sharedCode", True), "1.3.9 to 3.1.0"),
        ("1.3.6", Features(False, False, None, True), "1.3.6 to 1.3.8"),
        ("1.2.0", Features(False, False, None, False), "before 1.3.6"),
    ],
)
async def test_features_by_version(
    client: AcgFakaClient, shop: AcgFakaSandbox, version: str, features: Features, span: str
) -> None:
    """An endpoint a version lacks answers the shop's HTML page: not there. Nothing is bought or changed."""
    shop.config.version = version
    found = await client.features()
    assert found == features
    assert found.version_range == span
    assert found.request_no_certain is features.query
    if not features.valuation:
        with pytest.raises(EndpointAbsent):
            await client.valuation(PLAIN)
    assert shop.shop.orders == {}


async def test_an_old_item_answer_is_the_listing(client: AcgFakaClient, shop: AcgFakaSandbox) -> None:
    """1.3.9 - 3.1.0 answer item with the listing of that code (listed goods only)."""
    shop.config.version = "3.0.5"
    assert (await client.item(PLAIN)).code == PLAIN
    with pytest.raises(BusinessError) as caught:
        await client.item(HIDDEN)
    assert caught.value.code == "product_unavailable"


async def test_refusals_are_classified(
    client: AcgFakaClient, shop: AcgFakaSandbox, control: ControlClient
) -> None:
    """Each refusal the shop answers is the error procurd names it by, and nothing was bought or charged."""
    cases: list[tuple[TradeRequest, type[UpstreamError], str]] = [
        (buy(EMPTY, "r-1"), BusinessError, "insufficient_stock"),
        (buy("NOSUCHCODE000000", "r-2"), BusinessError, "product_unavailable"),
        (buy(CARD, "r-3", options=(("区服", "一区"),)), BusinessError, "sku_unavailable"),
        (buy(CARD, "r-4", race="周卡", options=(("区服", "一区"),)), BusinessError, "sku_unavailable"),
        (buy(CARD, "r-5", race="月卡", options=(("区服", "三区"),)), BusinessError, "sku_unavailable"),
        (buy(CARD, "r-6", race="月卡"), BusinessError, "sku_unavailable"),
        (buy(MANUAL, "r-7", inputs={"game_uid": "12"}), BusinessError, "input_rejected"),
        (buy(MANUAL, "r-8", inputs={"game_uid": "select * from users"}), BusinessError, "firewall_refused"),
        (buy(PLAIN, "r-9", 13), BusinessError, "insufficient_stock"),
    ]
    before = balance(shop)
    for request, kind, code in cases:
        with pytest.raises(kind) as caught:
            await client.trade(request, input_errors={"游戏ID格式错误"})
        assert caught.value.code == code, request
    await control.post("/commodities/" + PLAIN, {"status": 0})
    with pytest.raises(BusinessError, match="product_unavailable"):
        await client.trade(buy(PLAIN, "r-10"))
    await control.post("/commodities/" + PLAIN, {"status": 1})
    await control.post("/wallet", {"balance": "1.00"})
    with pytest.raises(BusinessError, match="insufficient_balance"):
        await client.trade(buy(PLAIN, "r-11"))
    await control.post("/wallet", {"balance": str(before), "banned": True})
    with pytest.raises(AuthError, match="account_banned"):
        await client.trade(buy(PLAIN, "r-12"))
    await control.post("/wallet", {"banned": False})
    await control.post("/config", {"balance_payment": False})
    with pytest.raises(BusinessError, match="balance_payment_disabled"):
        await client.trade(buy(PLAIN, "r-13"))
    await control.post("/config", {"balance_payment": True})
    await control.post("/faults", {"knob": "price_changed_next"})
    with pytest.raises(PriceChanged) as changed:
        await client.trade(buy(PLAIN, "r-14"))
    assert changed.value.retryable
    assert shop.shop.orders == {}
    assert balance(shop) == before
    result = await client.trade(buy(PLAIN, "r-14"))  # nothing was bought: the same number buys now
    assert result.secret == "P-0"


async def test_credentials_refused(shop: AcgFakaSandbox) -> None:
    """A wrong key and an unknown member are auth errors naming the key to fix, on every endpoint."""
    for overrides, code, key in (
        ({"app_key": "FFFFFFFFFFFFFFFF"}, "app_key_wrong", "app_key"),
        ({"app_id": "9999"}, "app_id_unknown", "app_id"),
    ):
        async with AcgFakaClient(shop_settings(shop.base_url, **overrides)) as client:
            for call in (client.connect(), client.features(), client.trade(buy(PLAIN, "auth-1"))):
                with pytest.raises(AuthError) as caught:
                    await call
                assert caught.value.code == code
                assert f"check {key} of acg" in caught.value.hint
    assert shop.shop.orders == {}


async def test_lost_answer_after_commit(
    client: AcgFakaClient, shop: AcgFakaSandbox, control: ControlClient
) -> None:
    """The shop commits the trade and the connection drops: the outcome is unknown, with the request number
    and the balance after it; trying again under the same number is refused as a duplicate (still
    unknown), and the shop holds exactly one order, charged once."""
    request = buy(PLAIN, "lost-1")
    await control.post("/faults", {"knob": "lost_answer_next"})
    with pytest.raises(OutcomeUnknown) as lost:
        await client.trade(request, balance_before=Decimal("1000.00"))
    assert lost.value.cause == "lost_answer"
    assert not lost.value.retryable
    assert lost.value.details["request_no"] == request.request_no
    assert lost.value.details["balance_before"] == "1000.00"
    assert lost.value.details["balance_after"] == "995.0"
    assert lost.value.details["purchase_records"] == shop.base_url + "/user/personal/purchaseRecord"
    with pytest.raises(OutcomeUnknown) as again:
        await client.trade(request, repeated=True)
    assert again.value.cause == "duplicate_request"
    assert again.value.details["supplier_said"] == "The request ID already exists"
    assert len(orders_under(shop, request.request_no)) == 1
    assert len(shop.shop.orders) == 1
    assert balance(shop) == Decimal("995.00")


async def test_an_answer_that_never_comes(shop: AcgFakaSandbox, control: ControlClient) -> None:
    """The trade committed but no answer came within trade_timeout_seconds: unknown, one order."""
    await control.post("/faults", {"knob": "hang_after_next"})
    async with AcgFakaClient(shop_settings(shop.base_url, trade_timeout_seconds=0.3)) as client:
        with pytest.raises(OutcomeUnknown) as caught:
            await client.trade(buy(PLAIN, "hang-1"))
    assert caught.value.cause == "lost_answer"
    assert len(shop.shop.orders) == 1


@pytest.mark.parametrize(
    ("knob", "cause", "orders"),
    [
        ({"knob": "crash_next", "endpoint": "trade"}, "not_json", 0),
        ({"knob": "error_after_commit_next"}, "unrecognised_refusal", 1),
        ({"knob": "error_after_commit_next", "html": True}, "not_json", 1),
        ({"knob": "refuse_next", "msg": "插件拦截了本次下单"}, "unrecognised_refusal", 0),
    ],
)
async def test_answers_that_prove_nothing(
    client: AcgFakaClient,
    shop: AcgFakaSandbox,
    control: ControlClient,
    knob: dict[str, Any],
    cause: str,
    orders: int,
) -> None:
    """An HTML crash page (rolled back), an error after the shop committed, a text procurd does not know:
    the client cannot tell them apart from a purchase, so each is an unknown outcome."""
    await control.post("/faults", knob)
    with pytest.raises(OutcomeUnknown) as caught:
        await client.trade(buy(PLAIN, "unknown-1"))
    assert caught.value.cause == cause
    assert len(shop.shop.orders) == orders
    assert caught.value.details["balance_after"] == ("995.0" if orders else "1000.0")


async def test_sold_out_while_paying(
    client: AcgFakaClient, shop: AcgFakaSandbox, control: ControlClient
) -> None:
    """Another buyer takes the cards while the order is paid: the trade succeeds and is charged, and its
    secret is the sold-out notice, which procurd reads as paid and not delivered."""
    await control.post("/faults", {"knob": "sold_out_race_next"})
    result = await client.trade(buy(CARD, "race-1", race="月卡", options=(("区服", "一区"),)))
    assert result.secret == SOLD_OUT_NOTICE
    assert result.amount == Decimal("10.0")
    assert balance(shop) == Decimal("990.00")
    delivery = interpret_delivery(result.secret, quantity=1, manual=False)
    assert delivery.kind == "not_delivered"
    assert "sold out" in (delivery.reason or "")


async def test_manual_order_delivered_later(
    client: AcgFakaClient, shop: AcgFakaSandbox, control: ControlClient
) -> None:
    """A manual trade answers the delivery notice; query answers it until the seller delivers, then the
    goods; the buyer inputs are kept with the order."""
    result = await client.trade(buy(MANUAL, "manual-1", inputs={"game_uid": "1008611"}))
    assert result.secret == MANUAL_NOTICE
    assert interpret_delivery(result.secret, quantity=1, manual=True).kind == "pending"
    before = await client.query(result.trade_no)
    assert before.secret == MANUAL_NOTICE
    assert before.inputs == {"game_uid": {"value": "1008611", "cn": "游戏ID"}}
    assert not delivered_later(result.secret, before.secret)
    await control.post(f"/orders/{result.trade_no}/deliver", {"secret": "已充值 100 钻石"})
    after = await client.query(result.trade_no)
    assert after.secret == "已充值 100 钻石"
    assert delivered_later(result.secret, after.secret)
    assert (
        shop.shop.commodities[next(c.id for c in shop.shop.commodities.values() if c.code == MANUAL)].stock
        == 4
    )


async def test_another_members_order_is_not_found(
    shop: AcgFakaSandbox, client: AcgFakaClient, control: ControlClient
) -> None:
    result = await client.trade(buy(PLAIN, "mine-1"))
    await control.post("/members", {"app_id": 2000, "app_key": "AAAABBBBCCCCDDDD"})
    async with AcgFakaClient(
        shop_settings(shop.base_url, app_id="2000", app_key="AAAABBBBCCCCDDDD")
    ) as other:
        with pytest.raises(BusinessError, match="order_not_found"):
            await other.query(result.trade_no)


async def test_no_redirect_is_followed(
    client: AcgFakaClient, control: ControlClient, shop: AcgFakaSandbox
) -> None:
    """A redirect is reported with where it pointed, never followed with the signed body."""
    await control.post(
        "/faults", {"knob": "redirect_next", "location": shop.base_url + "/shared/commodity/items"}
    )
    shop.reset_requests()
    with pytest.raises(ProtocolError, match="follows no redirect"):
        await client.items()
    assert shop.request_counts["items"] == 1  # followed, the redirect would have made it 2


async def test_what_goes_on_the_wire(aiohttp_server: AiohttpServer) -> None:
    """A form POST with app_id and the signature: no Accept-Language, no cookie sent back (the shop set two),
    a plain User-Agent, and the app_key never in the body."""
    received: list[tuple[str, str, dict[str, str], bytes]] = []

    async def supplier(request: web.Request) -> web.StreamResponse:
        received.append((request.method, request.path, dict(request.headers), await request.read()))
        answer = web.Response(
            body='{"code":200,"msg":"success","data":{"shopName":"店","balance":1.5}}'.encode(),
            content_type="application/json",
        )
        answer.set_cookie("acg_lang", "en")
        answer.set_cookie("PHPSESSID", "session")
        return answer

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", supplier)
    server = await aiohttp_server(app)
    key = "5EC2E7A99B0C1D2E"
    async with AcgFakaClient(shop_settings(f"http://127.0.0.1:{server.port}", app_key=key)) as client:
        assert (await client.connect()).balance == Decimal("1.5")
        await client.connect()
    assert len(received) == 2
    for method, path, headers, body in received:
        assert (method, path) == ("POST", "/shared/authentication/connect")
        assert headers["Content-Type"] == "application/x-www-form-urlencoded"
        assert "Accept-Language" not in headers
        assert "Cookie" not in headers
        assert headers["User-Agent"].startswith("procurd/")
        assert key.encode() not in body
        assert b"app_key" not in body
        assert dict(parse_qsl(body.decode())) == {"app_id": "1000", "sign": sign({"app_id": "1000"}, key)}


async def test_no_secret_in_logs(shop: AcgFakaSandbox, debug_logs: list[MutableMapping[str, Any]]) -> None:
    """Debug logs of a trade and of an unknown outcome hold no app_key, signature or delivered goods."""
    async with AcgFakaClient(shop_settings(shop.base_url)) as client:
        result = await client.trade(buy(PLAIN, "log-1", 2))
        shop.faults.lost_answer_next()
        with pytest.raises(OutcomeUnknown):
            await client.trade(buy(PLAIN, "log-2"))
    text = repr(debug_logs)
    assert "upstream.trade_outcome_unknown" in text
    for secret in ("0123456789ABCDEF", "P-0", "P-2", result.secret):
        assert secret not in text


async def test_trades_go_one_at_a_time(shop: AcgFakaSandbox) -> None:
    """Two trades through one client: the second is sent only once the first has ended."""
    shop.faults.hang_after_next()
    async with AcgFakaClient(shop_settings(shop.base_url, trade_timeout_seconds=0.5)) as client:
        first = asyncio.create_task(client.trade(buy(PLAIN, "one-1")))
        second = asyncio.create_task(client.trade(buy(PLAIN, "one-2")))
        await wait_until(lambda: shop.request_counts["trade"] == 2)
        assert first.done()
        with pytest.raises(OutcomeUnknown):
            await first
        assert (await second).secret == "P-1"
