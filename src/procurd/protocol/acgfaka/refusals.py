"""acg-faka's refusals, classified by their exact text, and what each proves about a trade.

The supplier answers every refusal with HTTP 200 and ``{"code": 0, "msg": TEXT}``: the text is all there is.
procurd sends no ``Accept-Language`` and no ``acg_lang`` cookie, so the texts are the Chinese sources below
(and the few English ones the shop never translates).

For a trade the text also says whether money can have moved. The supplier checks, in this order: the
firewall and the credentials (before the endpoint), then the goods, quantity, buyer inputs, variant,
options, stock, price and payment method, then (inside its transaction) whether the price changed, **then
whether an order with this ``request_no`` exists**, then the account and its balance. So:

* on a first try every known refusal is conclusive: nothing was bought;
* on a repeated try (the same ``request_no`` after an answer was lost) only the refusals checked after the
  duplicate check prove nothing was bought; one checked before it (``库存不足`` because the first try took the
  last cards, say) proves nothing, and the outcome stays unknown;
* ``The request ID already exists`` means an order with that number exists: bought, but which goods, the
  answer that was lost said; a person settles it;
* any other text on a trade (a seller's plugin, an upstream's message for chained goods, a failure after
  the supplier committed) leaves the outcome unknown.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum

from procurd.upstream.errors import AuthError, BusinessError, OutcomeUnknown, PriceChanged, UpstreamError

DUPLICATE_REQUEST = "The request ID already exists"
PRICE_CHANGED = "商品信息已经更新，请刷新后重新下单"
# Notices a paid trade answers instead of goods (see :mod:`.delivery`).
SOLD_OUT_NOTICE = "很抱歉，有人在你付款之前抢走了商品，请联系客服。"
MANUAL_NOTICE = "正在发货中，请耐心等待，如有疑问，请联系客服。"


class Stage(Enum):
    """Where the supplier's trade checks what the text refuses."""

    GATE = "gate"  # firewall and credentials, before the endpoint: nothing happened
    VALIDATION = "validation"  # before the request_no duplicate check
    PAYMENT = "payment"  # after the duplicate check: no order under this request_no exists


@dataclass(frozen=True, slots=True)
class Rule:
    pattern: re.Pattern[str]
    code: str
    stage: Stage


def _rule(text: str, code: str, stage: Stage = Stage.VALIDATION, *, pattern: bool = False) -> Rule:
    return Rule(re.compile(text if pattern else re.escape(text)), code, stage)


AUTH_CODES = frozenset({"app_id_unknown", "app_key_wrong", "account_banned", "account_missing"})
FIREWALL = "firewall_refused"
PRODUCT_UNAVAILABLE = "product_unavailable"
SKU_UNAVAILABLE = "sku_unavailable"
INSUFFICIENT_STOCK = "insufficient_stock"
INSUFFICIENT_BALANCE = "insufficient_balance"
INPUT_REJECTED = "input_rejected"
DUPLICATE = "duplicate_request"

# Texts every endpoint can answer before it runs.
GATE_RULES = (
    _rule("商户ID不存在", "app_id_unknown", Stage.GATE),
    _rule("密钥错误", "app_key_wrong", Stage.GATE),
    _rule(
        "The current session is not secure. Please refresh the web page and try again.", FIREWALL, Stage.GATE
    ),
    _rule("WAF检测到非法请求", FIREWALL, Stage.GATE),
    # before 1.4.8 a missing parameter was refused by the framework before the endpoint ran
    _rule(r"[A-Za-z_]+ can not be empty", "bad_request", Stage.GATE, pattern=True),
)

# A trade's refusals in the order the supplier checks them (request_no last but three).
TRADE_RULES = (
    _rule("商品不存在", PRODUCT_UNAVAILABLE),
    _rule("至少购买1个", "quantity_not_allowed"),
    _rule("当前商品已停售", PRODUCT_UNAVAILABLE),
    _rule(r"本商品最少购买[0-9]+个", "quantity_not_allowed", pattern=True),
    _rule(r"本商品单次最多购买[0-9]+个", "quantity_not_allowed", pattern=True),
    _rule("抢购还未开始", PRODUCT_UNAVAILABLE),
    _rule("抢购已结束", PRODUCT_UNAVAILABLE),
    _rule("请选择商品类型", SKU_UNAVAILABLE),
    _rule(r"此商品类型不存在\[.*\]", SKU_UNAVAILABLE, pattern=True),
    _rule("请选择商品种类", SKU_UNAVAILABLE),
    _rule("商品种类不存在", SKU_UNAVAILABLE),
    _rule(r"请选择.+", SKU_UNAVAILABLE, pattern=True),  # an add-on group left out (请选择<group>)
    _rule(r".+选择错误", SKU_UNAVAILABLE, pattern=True),  # an option the group has not
    _rule("库存不足", INSUFFICIENT_STOCK),
    _rule(r"该商品每人只能购买[0-9]+件", "purchase_limit_reached", pattern=True),
    _rule("商品不存在#1", PRODUCT_UNAVAILABLE),
    _rule(r"此SKU不存在\[.*\]", SKU_UNAVAILABLE, pattern=True),
    _rule("该支付方式不存在", "balance_payment_disabled"),
    _rule("当前支付方式已停用，请换个支付方式再进行支付", "balance_payment_disabled"),
    _rule("商品不存在或已被删除，请刷新后重试", PRODUCT_UNAVAILABLE),
    _rule("商品归属已经变更，请刷新后重试", PRODUCT_UNAVAILABLE),
    _rule(PRICE_CHANGED, "price_changed"),
    _rule(DUPLICATE_REQUEST, DUPLICATE),
    _rule("用户不存在", "account_missing", Stage.PAYMENT),
    _rule("You have been banned", "account_banned", Stage.PAYMENT),
    _rule("余额不足", INSUFFICIENT_BALANCE, Stage.PAYMENT),
)

# What the reading endpoints refuse with (every other text: a refusal procurd has no name for).
READ_RULES = (
    _rule("商品不存在", PRODUCT_UNAVAILABLE),
    _rule(r"商品不存在#[0-9]+", PRODUCT_UNAVAILABLE, pattern=True),
    _rule("当前商品已停售", PRODUCT_UNAVAILABLE),
    _rule("该商品暂未上架", PRODUCT_UNAVAILABLE),
    _rule("对接CODE不能为空", PRODUCT_UNAVAILABLE),
    _rule("商品代码不能为空", PRODUCT_UNAVAILABLE),
    _rule(r"该商品配置异常.*", "product_misconfigured", pattern=True),
    _rule(r"配置解析异常.*", "product_misconfigured", pattern=True),
    _rule(r"此商品类型不存在\[.*\]", SKU_UNAVAILABLE, pattern=True),
    _rule(r"此SKU不存在\[.*\]", SKU_UNAVAILABLE, pattern=True),
    _rule("请选择商品种类", SKU_UNAVAILABLE),
    _rule("库存不足", INSUFFICIENT_STOCK),
    _rule("订单不存在", "order_not_found"),
)


def _match(rules: tuple[Rule, ...], text: str) -> Rule | None:
    return next((rule for rule in rules if rule.pattern.fullmatch(text)), None)


def _gate_error(rule: Rule, text: str, upstream: str, endpoint: str) -> UpstreamError:
    if rule.code in AUTH_CODES:
        return AuthError(text, code=rule.code, http_status=200, upstream=upstream, endpoint=endpoint)
    return BusinessError(text, code=rule.code, http_status=200, upstream=upstream, endpoint=endpoint)


def classify_refusal(text: str, *, upstream: str = "", endpoint: str = "") -> UpstreamError:
    """The error a refusal of a reading endpoint (connect, items, item, stock, valuation, query, ...)
    stands for: :class:`AuthError` for the credentials, else a :class:`BusinessError` whose code names it
    (``refused`` for a text procurd has no name for)."""
    rule = _match(GATE_RULES, text) or _match(READ_RULES, text)
    if rule is None:
        return BusinessError(text, code="refused", http_status=200, upstream=upstream, endpoint=endpoint)
    return _gate_error(rule, text, upstream, endpoint)


def classify_trade_refusal(
    text: str,
    *,
    repeated: bool = False,
    input_errors: Collection[str] = (),
    upstream: str = "",
    endpoint: str = "trade",
    details: Mapping[str, str] | None = None,
) -> UpstreamError:
    """The error a trade's refusal stands for, and whether money can have moved (see the module's notes).

    ``repeated``: this try repeats an earlier one under the same ``request_no`` whose answer was lost.
    ``input_errors``: the error texts of the goods' buyer inputs (the seller writes them; a value that fails
    an input's pattern is refused with its text). ``details`` go into an :class:`OutcomeUnknown`.
    """
    known = {"supplier_said": text, **(details or {})}
    rule = _match(GATE_RULES, text)
    if rule is not None:
        return _gate_error(rule, text, upstream, endpoint)
    rule = _match(TRADE_RULES, text)
    if rule is None and text in input_errors:
        rule = Rule(re.compile(re.escape(text)), INPUT_REJECTED, Stage.VALIDATION)
    if rule is None:
        return OutcomeUnknown(
            f"the supplier refused with a text that proves nothing: {text}",
            cause="unrecognised_refusal",
            details=known,
            upstream=upstream,
            endpoint=endpoint,
        )
    if rule.code == DUPLICATE:
        return OutcomeUnknown(
            "the supplier already holds an order under this request_no: bought by this or an earlier try",
            cause="duplicate_request",
            details=known,
            upstream=upstream,
            endpoint=endpoint,
        )
    if repeated and rule.stage is Stage.VALIDATION:
        return OutcomeUnknown(
            f"a repeated try was refused before the supplier looked for the first one: {text}",
            cause="inconclusive_retry",
            details=known,
            upstream=upstream,
            endpoint=endpoint,
        )
    if rule.code == "price_changed":
        return PriceChanged(text, http_status=200, upstream=upstream, endpoint=endpoint)
    if rule.code in AUTH_CODES:
        return AuthError(text, code=rule.code, http_status=200, upstream=upstream, endpoint=endpoint)
    return BusinessError(text, code=rule.code, http_status=200, upstream=upstream, endpoint=endpoint)
