"""acg-faka's answers read without I/O: the envelope, exact lenient numbers, stock figures, the INI config,
refusals and what each proves about a trade, buyer inputs, request numbers and what a paid secret is."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from procurd.protocol.acgfaka.envelope import (
    Malformed,
    NotJson,
    Refusal,
    StockReading,
    Success,
    decimal_value,
    money_text,
    read_envelope,
    read_stock,
)
from procurd.protocol.acgfaka.ini import IniError, parse_ini
from procurd.protocol.acgfaka.orders import delivered_later, interpret_delivery, request_no
from procurd.protocol.acgfaka.refusals import (
    DUPLICATE_REQUEST,
    MANUAL_NOTICE,
    PRICE_CHANGED,
    SOLD_OUT_NOTICE,
    classify_refusal,
    classify_trade_refusal,
)
from procurd.protocol.acgfaka.widgets import WidgetError, read_widgets
from procurd.upstream.errors import AuthError, BusinessError, OutcomeUnknown, PriceChanged


def test_envelope() -> None:
    """Success with or without msg, a refusal, an HTML page, and JSON that is not the envelope; amounts in
    the data stay exact (never a float)."""
    success = read_envelope(b'{"code":200,"msg":"success","data":{"balance":0.1}}')
    assert success == Success({"balance": Decimal("0.1")}, "success")
    assert read_envelope(b'{"code":200,"data":[]}') == Success([], None)
    assert read_envelope('{"code":0,"msg":"库存不足"}'.encode()) == Refusal("库存不足")
    page = read_envelope(b"<!DOCTYPE html><title>404</title>", "text/html")
    assert isinstance(page, NotJson)
    assert "HTML" in page.describe()
    assert read_envelope(b"", None) == NotJson(0, None)
    for body in (
        b"[1]",
        b'{"code":500,"msg":"x"}',
        b'{"code":0}',
        b'{"code":200}',
        b'{"code":"200","data":1}',
    ):
        assert isinstance(read_envelope(body), Malformed), body


@pytest.mark.parametrize(
    ("value", "expected"),
    [(10, "10"), (Decimal("10.0"), "10.0"), ("1.50", "1.50"), (" 2 ", "2"), ("-3.25", "-3.25")],
)
def test_lenient_exact_amounts(value: Any, expected: str) -> None:
    assert decimal_value(value, "price") == Decimal(expected)


@pytest.mark.parametrize("value", [True, None, "1e3", "abc", "", [1], 1.5, Decimal("NaN")])
def test_what_is_not_an_amount(value: Any) -> None:
    with pytest.raises(ValueError, match="price"):
        decimal_value(value, "price")


def test_money_text() -> None:
    assert money_text(Decimal("10")) == "10.00"
    assert money_text(Decimal("10.0")) == "10.00"
    assert money_text(Decimal("9.999")) == "9.999"


@pytest.mark.parametrize(
    ("value", "quantity", "text", "status"),
    [
        ("12", 12, None, "low_stock"),
        (25, 25, None, "in_stock"),
        ("", 0, None, "out_of_stock"),
        (None, 0, None, "out_of_stock"),
        ("0", 0, None, "out_of_stock"),
        ("充足", -1, "充足", "unlimited"),
        ("-4", 0, "-4", "out_of_stock"),
        (" 7 ", 7, None, "low_stock"),
    ],
)
def test_stock_figures(value: Any, quantity: int, text: str | None, status: str) -> None:
    """A number is a count, "" and null are 0, a word is -1 (available) with the word kept."""
    reading = read_stock(value)
    assert reading == StockReading(quantity, text)
    assert reading.status == status


def test_ini_as_the_shop_reads_it() -> None:
    """Sections, dotted keys nesting, first key wins, "0" lines skipped, keys and values untrimmed."""
    text = (
        "\n[category]\n月卡=10\n月卡=99\n年卡 = 100\n0\r\n\r\n"
        "[sku]\n区服.一区=0\n区服.二区=1.5\n[wholesale]\n10=9\n"
    )
    assert parse_ini(text) == {
        "category": {"月卡": "10", "年卡 ": " 100"},
        "sku": {"区服": {"一区": "0", "二区": "1.5"}},
        "wholesale": {"10": "9"},
    }
    assert parse_ini("x[category]\nA=1") == {"category": {"A": "1"}}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("月卡=10", "outside any section"),
        ("[category]\n; a comment", "not one key=value"),
        ("[category]\na=b=c", "not one key=value"),
        ("[category]\n   \nA=1", "not one key=value"),
        ("[0]\na=1", "outside any section"),
    ],
)
def test_ini_the_shop_refuses(text: str, problem: str) -> None:
    with pytest.raises(IniError, match=problem):
        parse_ini(text)


@pytest.mark.parametrize(
    ("text", "code", "kind"),
    [
        ("库存不足", "insufficient_stock", BusinessError),
        ("余额不足", "insufficient_balance", BusinessError),
        ("商品不存在", "product_unavailable", BusinessError),
        ("当前商品已停售", "product_unavailable", BusinessError),
        ("请选择商品类型", "sku_unavailable", BusinessError),
        ("此商品类型不存在[周卡]", "sku_unavailable", BusinessError),
        ("请选择区服", "sku_unavailable", BusinessError),
        ("区服选择错误", "sku_unavailable", BusinessError),
        ("此SKU不存在[三区]", "sku_unavailable", BusinessError),
        ("本商品最少购买2个", "quantity_not_allowed", BusinessError),
        ("该商品每人只能购买1件", "purchase_limit_reached", BusinessError),
        ("当前支付方式已停用，请换个支付方式再进行支付", "balance_payment_disabled", BusinessError),
        ("商户ID不存在", "app_id_unknown", AuthError),
        ("密钥错误", "app_key_wrong", AuthError),
        ("You have been banned", "account_banned", AuthError),
        (PRICE_CHANGED, "price_changed", PriceChanged),
        (DUPLICATE_REQUEST, "outcome_unknown", OutcomeUnknown),
        ("连接失败, 疑似被对方防火墙拦截", "outcome_unknown", OutcomeUnknown),
        ("Insufficient stock", "outcome_unknown", OutcomeUnknown),
    ],
)
def test_trade_refusals(text: str, code: str, kind: type[Exception]) -> None:
    """A first try: every known refusal proves nothing was bought; anything else leaves it unknown."""
    error = classify_trade_refusal(text, upstream="acg")
    assert type(error) is kind
    assert error.code == code
    assert error.upstream == "acg"
    assert error.endpoint == "trade"


def test_what_a_repeated_try_proves() -> None:
    """Under a request_no whose first answer was lost, only refusals checked after the duplicate check
    prove nothing was bought; the duplicate text means bought."""
    stock = classify_trade_refusal("库存不足", repeated=True, details={"request_no": "PC1"})
    assert isinstance(stock, OutcomeUnknown)
    assert stock.cause == "inconclusive_retry"
    assert stock.details == {"supplier_said": "库存不足", "request_no": "PC1"}
    assert not stock.retryable
    balance = classify_trade_refusal("余额不足", repeated=True)
    assert isinstance(balance, BusinessError)
    assert balance.code == "insufficient_balance"
    duplicate = classify_trade_refusal(DUPLICATE_REQUEST)
    assert isinstance(duplicate, OutcomeUnknown)
    assert duplicate.cause == "duplicate_request"
    assert isinstance(classify_trade_refusal("密钥错误", repeated=True), AuthError)


def test_input_error_texts() -> None:
    """A seller's input error text is a refusal only when it is one of this commodity's."""
    assert classify_trade_refusal("游戏ID格式错误", input_errors={"游戏ID格式错误"}).code == "input_rejected"
    assert isinstance(classify_trade_refusal("游戏ID格式错误"), OutcomeUnknown)


def test_reading_refusals() -> None:
    assert classify_refusal("商品不存在#0").code == "product_unavailable"
    assert classify_refusal("订单不存在").code == "order_not_found"
    assert isinstance(classify_refusal("密钥错误"), AuthError)
    unnamed = classify_refusal("连接失败")
    assert isinstance(unnamed, BusinessError)
    assert unnamed.code == "refused"
    assert (
        "WAF"
        not in classify_refusal(
            "The current session is not secure. Please refresh the web page and try again."
        ).code
    )


def test_request_numbers() -> None:
    """19 characters, upper-case letters and digits, the same for the same procurement and member."""
    first = request_no("A1001-1", "1000")
    assert len(first) == 19
    assert first.isupper()
    assert first.isalnum()
    assert first == request_no("A1001-1", "1000")
    assert first != request_no("A1001-2", "1000")
    assert first != request_no("A1001-1", "1001")


def test_what_a_secret_is() -> None:
    """Cards: exactly one line per unit; the sold-out notice or a wrong count is paid and undelivered; a
    manual commodity's answer is a pending notice, delivered once the text changes."""
    assert interpret_delivery("A\nB", quantity=2, manual=False).lines == ("A", "B")
    assert interpret_delivery("A\nB", quantity=2, manual=False).kind == "delivered"
    assert interpret_delivery(SOLD_OUT_NOTICE, quantity=1, manual=False).kind == "not_delivered"
    assert interpret_delivery("A", quantity=2, manual=False).reason == "1 lines of goods for 2 units bought"
    assert interpret_delivery("A\n", quantity=1, manual=False).kind == "not_delivered"
    assert interpret_delivery("卖家的通知", quantity=1, manual=True).kind == "pending"
    assert interpret_delivery(MANUAL_NOTICE, quantity=1, manual=True, chained=True).kind == "not_delivered"
    assert delivered_later("卖家的通知", "CODE-1")
    assert not delivered_later("卖家的通知", "卖家的通知")
    assert not delivered_later("卖家的通知", MANUAL_NOTICE)


def test_buyer_inputs() -> None:
    """Inputs become a form schema with the seller's pattern; one the supplier would trip on is refused."""
    widgets = read_widgets(
        '[{"cn":"游戏ID","name":"game_uid","type":"text","regex":"^[0-9]{5,12}$","error":"格式错误","dict":""},'
        '{"cn":"备注","name":"note","type":"textarea","regex":"","error":"","dict":""},'
        '{"cn":"区","name":"server","type":"select","regex":"","error":"","dict":"QQ区=qq,微信区=wx"},'
        '{"cn":"说明","name":"x","type":"custom","regex":"","error":"","dict":""}]'
    )
    assert [w.name for w in widgets] == ["game_uid", "note", "server"]
    assert widgets[0].required
    assert not widgets[1].required
    schema = widgets[0].schema()
    assert schema["pattern"] == "^[0-9]{5,12}$"
    assert schema["pattern_error"] == {"zh-CN": "格式错误"}
    assert widgets[2].schema()["options"][1] == {"label": {"zh-CN": "微信区"}, "value": "wx"}
    for bad, reason in (
        ('[{"name":"game.uid","regex":""}]', "rewrites"),
        ('[{"name":"num","regex":""}]', "protocol posts"),
        ('[{"name":"a","regex":"x/y"}]', "unescaped '/'"),
        ("not json", "not valid JSON"),
    ):
        with pytest.raises(WidgetError, match=reason):
            read_widgets(bad)
    assert read_widgets('[{"name":"a","regex":"x\\\\/y"}]')[0].pattern == "x\\/y"
