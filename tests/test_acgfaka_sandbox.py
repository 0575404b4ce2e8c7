"""The sandbox acg-faka shop as a faithful fake: routing, what counts as a request, envelopes and value
types, the trade's order of checks, versions, its control API and ``procurd sandbox --protocol acg-faka``."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from procurd.protocol.acgfaka.signing import form_body, sign
from procurd.sandbox.acgfaka import DEFAULT_APP_KEY, AcgFakaSandbox, ShopConfig
from procurd.sandbox.acgfaka.testing import ControlClient, FormClient
from procurd.sandbox.cli import sandbox_command

CONNECT = "/shared/authentication/connect"
ITEMS = "/shared/commodity/items"
TRADE = "/shared/commodity/trade"
CODE = "A0000000000000F1"


@pytest.fixture
async def shop() -> AsyncIterator[AcgFakaSandbox]:
    async with AcgFakaSandbox(ShopConfig(commodities=0)) as sandbox:
        async with ControlClient(sandbox.base_url) as control:
            category = (await control.post("/categories", {"name": "分类"}))["category"]["id"]
            await control.post(
                "/commodities", {"code": CODE, "name": "卡", "category_id": category, "price": "5.00"}
            )
            await control.post(
                f"/commodities/{CODE}/cards", {"cards": [{"secret": f"K-{n}"} for n in range(3)]}
            )
        yield sandbox


@pytest.fixture
async def client(shop: AcgFakaSandbox) -> AsyncIterator[FormClient]:
    async with FormClient(shop.base_url) as client:
        yield client


def trade_fields(request_no: str, num: str = "1") -> dict[str, Any]:
    return {"shared_code": CODE, "num": num, "request_no": request_no}


async def test_routing(client: FormClient, shop: AcgFakaSandbox) -> None:
    """index.php?s= reaches the same code; method names ignore case, controller names do not; what follows
    a dot is not part of the method; an unknown route is the HTML page with 200, before authentication."""
    for path in (CONNECT, "/index.php?s=/shared/authentication/connect", "/shared/authentication/CONNECT"):
        assert (await client.signed(path, {})).json()["code"] == 200, path
    assert (await client.signed("/shared/authentication/connect.json", {})).json()["code"] == 200
    for path in ("/SHARED/authentication/connect", "/shared/commodity/nothing", "/whatever"):
        for answer in (await client.signed(path, {}), await client.raw(path, b"")):
            assert (answer.status, answer.is_html) == (200, True), path
            assert "页面没有找到" in answer.body.decode()
    assert (await client.raw(CONNECT, b"", method="GET")).headers["X-Frame-Options"] == "SAMEORIGIN"


async def test_older_kernels_authenticate_before_routing_a_method(
    client: FormClient, shop: AcgFakaSandbox
) -> None:
    """Up to 1.4.7 a known controller's checks ran first: an unsigned call to a missing method is refused,
    a signed one gets the HTML page."""
    shop.config.version = "1.4.7"
    assert (await client.raw("/shared/commodity/valuation", b"")).json() == {"code": 0, "msg": "商户ID不存在"}
    assert (await client.signed("/shared/commodity/valuation", {"code": CODE})).is_html


async def test_only_form_posts_have_fields(client: FormClient) -> None:
    """A JSON body, a query string or a GET leaves $_POST empty: no member. Multipart is a form too."""
    signed = {"app_id": "1000", "sign": sign({"app_id": "1000"}, DEFAULT_APP_KEY)}
    refused = {"code": 0, "msg": "商户ID不存在"}
    assert (
        await client.raw(CONNECT, b'{"app_id":"1000"}', content_type="application/json")
    ).json() == refused
    assert (await client.raw(CONNECT + "?app_id=1000&sign=" + signed["sign"], b"")).json() == refused
    assert (await client.raw(CONNECT, form_body(signed), method="GET")).json() == refused
    form = aiohttp.FormData()
    for name, value in signed.items():
        form.add_field(name, value)
    async with (
        aiohttp.ClientSession() as session,
        session.post(client.base_url + CONNECT, data=form()) as answer,
    ):
        assert (await answer.json())["code"] == 200


async def test_envelopes_and_value_types(client: FormClient) -> None:
    """msg only where the endpoint sends one; prices as JSON numbers, valuation's as text, stock as text,
    tradeNo 18 digits; the content type of the real shop."""
    connect = await client.signed(CONNECT, {})
    assert connect.headers["Content-Type"] == "application/json;charset=utf-8"
    assert b'"balance":1000.0' in connect.body
    assert connect.json()["msg"] == "success"
    items = await client.signed(ITEMS, {})
    assert "msg" not in items.json()
    assert b'"price":5.0,"user_price":5.0' in items.body
    valuation = (await client.signed("/shared/commodity/valuation", {"code": CODE, "num": "2"})).json()
    assert valuation == {"code": 200, "data": {"price": "10.00"}}
    assert (await client.signed("/shared/commodity/stock", {"code": CODE})).json() == {
        "code": 200,
        "data": {"stock": "3"},
    }
    traded = (await client.signed(TRADE, trade_fields("T1"))).json()
    assert traded["msg"] == "success"
    assert re.fullmatch(r"[0-9]{18}", traded["data"]["tradeNo"])
    assert (traded["data"]["secret"], traded["data"]["stock"], traded["data"]["leave_message"]) == (
        "K-0",
        "2",
        None,
    )
    assert (await client.signed("/shared/commodity/stock", {})).is_html  # no code: PHP fails


async def test_request_number_is_checked_late_and_globally(client: FormClient, shop: AcgFakaSandbox) -> None:
    """The duplicate check comes after the stock check; it spans every member, ignoring case; a number
    longer than the column crashes the trade (rolled back)."""
    assert (await client.signed(TRADE, trade_fields("REQ-1"))).json()["code"] == 200
    assert (await client.signed(TRADE, trade_fields("REQ-1", num="5"))).json()["msg"] == "库存不足"
    assert (await client.signed(TRADE, trade_fields("REQ-1"))).json()[
        "msg"
    ] == "The request ID already exists"
    async with ControlClient(shop.base_url) as control:
        await control.post("/members", {"app_id": 1001, "app_key": "BBBBBBBBBBBBBBBB"})
    async with FormClient(shop.base_url, 1001, "BBBBBBBBBBBBBBBB") as other:
        assert (await other.signed(TRADE, trade_fields("req-1 "))).json()[
            "msg"
        ] == "The request ID already exists"
    assert (await client.signed(TRADE, trade_fields("X" * 20))).is_html
    assert len(shop.shop.orders) == 1


async def test_versions_before_request_numbers_buy_again(client: FormClient, shop: AcgFakaSandbox) -> None:
    """Before 1.0.9 the number was ignored: the same request buys twice."""
    shop.config.version = "1.0.8"
    for _ in range(2):
        assert (await client.signed(TRADE, trade_fields("SAME"))).json()["code"] == 200
    assert len(shop.shop.orders) == 2


async def test_firewall_answers_before_the_member(client: FormClient, shop: AcgFakaSandbox) -> None:
    answer = await client.raw(CONNECT, form_body({"note": "1 union select password from user"}))
    assert answer.json()["msg"].startswith("The current session is not secure")
    shop.config.version = "1.4.7"
    answer = await client.raw(CONNECT, form_body({"x": "a=b'"}), headers={"User-Agent": "x"})
    assert answer.json() == {"code": 0, "msg": "WAF检测到非法请求"}


async def test_control_api(shop: AcgFakaSandbox) -> None:
    """Bad fields are named; unknown goods and orders are 404; state counts what the shop holds."""
    async with ControlClient(shop.base_url) as control:
        bad = await control.post("/commodities", {"name": "x", "category_id": 1, "price": 5}, expect=400)
        assert bad["field"] == "price"
        assert (await control.post("/commodities", {"name": "x"}, expect=400))["field"] == "category_id"
        wrong = await control.post(
            "/commodities", {"name": "x", "category_id": 1, "races": {"a": "x"}}, expect=400
        )
        assert wrong["field"] == "races.a"
        await control.get("/orders/000000000000000000", expect=404)
        await control.post("/faults", {"knob": "melt_next"}, expect=400)
        state = await control.get("/state")
        assert (state["protocol"], state["version"], state["catalogue"]["commodities"]) == (
            "acg-faka",
            "3.6.0",
            1,
        )
        assert state["members"]["1000"] == {"balance": "1000.00", "banned": False}


async def test_a_catalogue_for_a_benchmark() -> None:
    """1,000 generated commodities: a quarter hidden or not docked, the rest listed by items."""
    async with (
        AcgFakaSandbox(ShopConfig(commodities=1000)) as sandbox,
        FormClient(sandbox.base_url) as client,
    ):
        listed = (await client.signed(ITEMS, {})).json()["data"]
        assert sum(len(category["children"]) for category in listed) == 750
        assert all(child["hide"] == 0 and child["api_status"] == 1 for c in listed for child in c["children"])


def test_options_of_the_other_protocol_are_refused() -> None:
    result = CliRunner().invoke(sandbox_command, ["--protocol", "acg-faka", "--api-key", "k"])
    assert result.exit_code == 2
    assert "--api-key does not apply to --protocol acg-faka" in result.output
    result = CliRunner().invoke(sandbox_command, ["--app-id", "5"])
    assert "--app-id does not apply to --protocol dujiao" in result.output
    result = CliRunner().invoke(sandbox_command, ["--protocol", "acg-faka", "--acg-version", "three"])
    assert "--acg-version" in result.output


async def test_the_command_serves_an_acg_faka_shop() -> None:
    """procurd sandbox --protocol acg-faka as a real process: where it listens and as whom, a signed connect,
    and exit 0 on SIGTERM."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from procurd.sandbox.cli import sandbox_command; sandbox_command()",
        *("--protocol", "acg-faka", "--port", "0", "--products", "5", "--acg-version", "3.4.6"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert found, line
        assert f"app_id 1000, app_key {DEFAULT_APP_KEY}" in line
        assert "acg-faka 3.4.6" in line
        async with FormClient(found.group(1)) as client:
            assert (await client.signed(CONNECT, {})).json()["data"]["balance"] == 1000
            assert len((await client.signed(ITEMS, {})).json()["data"]) >= 1
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0
