"""The asyncio client of one acg-faka supplier's shared-shop API (``/shared/...``).

Every request is a form POST signed with the member's app_key (which is never sent), with a plain
User-Agent, no ``Accept-Language`` and no cookies (so that refusals stay in the Chinese procurd classifies),
and no redirect followed (a signed body never goes to another address). Requests wait for the same rate
limiter, by priority, and report to the same observer as the Dujiao-Next client's
(``observer(upstream, endpoint, outcome, seconds, error)``). Trades go one at a time per client: the
supplier's trade can deadlock against a second one of the same member.

What an answer that is not the protocol's means depends on the call: for an endpoint a version may lack
(``item``, ``stock``, ``valuation``, ``query``) an HTML page is :class:`EndpointAbsent`; for a trade,
anything but a success or a known refusal, and every failure after the request went out, is
:class:`~procurd.upstream.errors.OutcomeUnknown` (see :mod:`.refusals`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, TypeVar

import aiohttp

from procurd.config import UpstreamSettings
from procurd.protocol.acgfaka.envelope import (
    Answer,
    Malformed,
    NotJson,
    Refusal,
    StockReading,
    Success,
    decimal_value,
    read_envelope,
    read_stock,
)
from procurd.protocol.acgfaka.goods import (
    MAX_CHOICES,
    Commodity,
    Goods,
    GoodsError,
    Listing,
    PriceSource,
    Problem,
    fallback_unit_cost,
    goods_of,
    read_commodity,
    read_listing,
)
from procurd.protocol.acgfaka.orders import TRADE_NO, QueryResult, TradeRequest, TradeResult
from procurd.protocol.acgfaka.refusals import classify_refusal, classify_trade_refusal
from procurd.protocol.acgfaka.signing import FieldValue, form_body, sign
from procurd.protocol.transport import (
    RequestObserver,
    SessionClient,
    describe_transport_failure,
    parse_retry_after,
)
from procurd.upstream.errors import (
    AuthError,
    BusinessError,
    ConnectFailed,
    OutcomeUnknown,
    PriceChanged,
    ProtocolError,
    RateLimited,
    ServerError,
    TransportError,
    UpstreamError,
    UpstreamTimeout,
    redact,
)
from procurd.upstream.ratelimit import Priority, RateLimiter

PATHS = {
    "connect": "/shared/authentication/connect",
    "items": "/shared/commodity/items",
    "item": "/shared/commodity/item",
    "inventory": "/shared/commodity/inventory",
    "stock": "/shared/commodity/stock",
    "valuation": "/shared/commodity/valuation",
    "trade": "/shared/commodity/trade",
    "query": "/shared/commodity/query",
}
# Endpoints a supplier's version may not have: its HTML page means "not there".
OPTIONAL_ENDPOINTS = frozenset({"item", "stock", "valuation", "query"})
PROBE_CODE = "PROCURDPROBE0000"  # a docking code no shop uses: the probes buy and change nothing
PROBE_TRADE_NO = "000000000000000000"
PURCHASE_RECORDS_PATH = "/user/personal/purchaseRecord"
T = TypeVar("T")


class EndpointAbsent(ProtocolError):
    """The supplier answered an endpoint with its HTML page: its version does not have it."""

    default_code = "endpoint_absent"


@dataclass(frozen=True, slots=True)
class Connected:
    shop_name: str
    balance: Decimal
    latency_ms: float


@dataclass(frozen=True, slots=True)
class Features:
    """What a supplier's version has, as its answers show (acg-faka reports no version of its own)."""

    valuation: bool  # 3.4.6 on
    stock: bool  # 3.1.3 on
    item: Literal["code", "sharedCode"] | None  # 3.1.3 on / 1.3.9 - 3.1.0 / absent
    query: bool  # 1.3.6 on

    @property
    def price_source(self) -> PriceSource:
        if self.valuation:
            return PriceSource.VALUATION
        if self.stock or self.item == "code":
            return PriceSource.INVENTORY
        return PriceSource.ITEMS

    @property
    def version_range(self) -> str:
        if self.valuation:
            return "3.4.6 or later"
        if self.stock or self.item == "code":
            return "3.1.3 to 3.4.5"
        if self.item == "sharedCode":
            return "1.3.9 to 3.1.0"
        if self.query:
            return "1.3.6 to 1.3.8"
        return "before 1.3.6"

    @property
    def request_no_certain(self) -> bool:
        """Whether the supplier surely honours ``request_no`` (1.0.9 on; only ``query``, 1.3.6 on, shows it):
        without it a repeated trade would buy again."""
        return self.query


@dataclass(frozen=True, slots=True)
class _Reply:
    answer: Answer
    seconds: float


class AcgFakaClient(SessionClient):
    """Talks to one acg-faka supplier as one member account; every method raises an
    :class:`~procurd.upstream.errors.UpstreamError` subclass on failure. One HTTP session per client, opened
    on first use inside the running loop; ``await close()`` or ``async with`` releases it."""

    connection_limit = 4
    keeps_cookies = False

    def __init__(
        self,
        settings: UpstreamSettings,
        *,
        limiter: RateLimiter | None = None,
        observer: RequestObserver | None = None,
    ) -> None:
        if settings.protocol != "acg-faka":
            raise ValueError(f"upstream {settings.name} speaks {settings.protocol}, not acg-faka")
        super().__init__(settings, limiter=limiter, observer=observer)
        self._root = settings.base_url.rstrip("/")
        self._trading = asyncio.Lock()

    def __repr__(self) -> str:
        return f"AcgFakaClient(name={self.name!r}, base_url={self._root!r})"

    # -- reading ----------------------------------------------------------------------------------------

    async def connect(self, *, priority: Priority = Priority.PING) -> Connected:
        """The shop's name and the member's balance (a credentials check too)."""
        data, seconds = await self._send(
            "connect", {}, priority, lambda reply: (self._data("connect", reply), reply.seconds)
        )
        if not isinstance(data, dict):
            raise self._protocol_error("connect", "data is not an object")
        try:
            balance = decimal_value(data.get("balance"), "balance")
        except ValueError as exc:
            raise self._protocol_error("connect", str(exc)) from None
        name = data.get("shopName")
        return Connected(name if isinstance(name, str) else "", balance, round(seconds * 1000, 1))

    async def items(self, *, priority: Priority = Priority.CATALOG) -> Listing:
        """Every commodity the supplier lists for docking, by category (one answer, no pages)."""
        data = await self._send("items", {}, priority, self._reader("items"))
        try:
            return read_listing(data)
        except GoodsError as exc:
            raise self._protocol_error("items", str(exc)) from None

    async def item(self, code: str, *, priority: Priority = Priority.CATALOG) -> Commodity:
        """One commodity by its code, hidden or not listed for docking included (3.1.3 on; 1.3.9 - 3.1.0
        find only listed ones). :class:`EndpointAbsent` before 1.3.9; ``product_unavailable`` when unknown."""
        fields = {"code": code, "sharedCode": code}  # the parameter's name before 3.1.3, and since
        data = await self._send("item", fields, priority, self._reader("item"))
        try:
            if isinstance(data, list):
                found = [c for c in read_listing(data).commodities if c.code == code]
                if not found:
                    raise BusinessError(
                        "not listed", code="product_unavailable", upstream=self.name, endpoint="item"
                    )
                return found[0]
            return read_commodity(data)
        except GoodsError as exc:
            raise self._protocol_error("item", f"{code}: {exc}") from None

    async def inventory(
        self, code: str, race: str | None = None, *, priority: Priority = Priority.CATALOG
    ) -> dict[str, Any]:
        """The ``inventory`` answer (``count``, ``factory_price``, ``config`` with ``[category_factory]``):
        the member's cost on versions without ``valuation``."""
        fields: dict[str, FieldValue] = {"sharedCode": code}
        if race is not None:
            fields["race"] = race
        data = await self._send("inventory", fields, priority, self._reader("inventory"))
        if not isinstance(data, dict):
            raise self._protocol_error("inventory", "data is not an object")
        return data

    async def stock(
        self,
        code: str,
        race: str | None = None,
        options: Mapping[str, str] | None = None,
        *,
        priority: Priority = Priority.CATALOG,
    ) -> StockReading:
        """The stock of one choice (3.1.3 on)."""
        fields = _choice_fields(code, race, options)
        data = await self._send("stock", fields, priority, self._reader("stock"))
        if not isinstance(data, dict) or "stock" not in data:
            raise self._protocol_error("stock", "data holds no stock")
        try:
            return read_stock(data["stock"])
        except ValueError as exc:
            raise self._protocol_error("stock", str(exc)) from None

    async def valuation(
        self,
        code: str,
        quantity: int = 1,
        race: str | None = None,
        options: Mapping[str, str] | None = None,
        *,
        priority: Priority = Priority.CATALOG,
    ) -> Decimal:
        """What the member would be charged now for ``quantity`` units of one choice (3.4.6 on): the
        supplier's own pricing, the one a trade charges."""
        fields: dict[str, FieldValue] = {**_choice_fields(code, race, options), "num": str(quantity)}
        fields["card_id"] = "0"
        data = await self._send("valuation", fields, priority, self._reader("valuation"))
        if not isinstance(data, dict):
            raise self._protocol_error("valuation", "data is not an object")
        try:
            price = decimal_value(data.get("price"), "price")
        except ValueError as exc:
            raise self._protocol_error("valuation", str(exc)) from None
        if price < 0:
            raise self._protocol_error("valuation", "price is negative")
        return price

    async def query(self, trade_no: str, *, priority: Priority = Priority.POLL) -> QueryResult:
        """An order of this member by the supplier's trade number (1.3.6 on): its current ``secret``."""
        data = await self._send("query", {"tradeNo": trade_no}, priority, self._reader("query"))
        if not isinstance(data, dict):
            raise self._protocol_error("query", "data is not an object")
        secret, status, inputs = data.get("secret"), data.get("status"), data.get("widget")
        return QueryResult(
            trade_no,
            secret if isinstance(secret, str) else None,
            status if isinstance(status, int) and not isinstance(status, bool) else None,
            inputs if isinstance(inputs, dict) else None,
        )

    async def features(self, *, priority: Priority = Priority.PING) -> Features:
        """Which of the later endpoints the supplier has, asking each about nothing (no order, no change)."""
        valuation = await self._probe("valuation", {"code": PROBE_CODE, "num": "1", "card_id": "0"}, priority)
        stock = await self._probe("stock", {"code": PROBE_CODE}, priority)
        query = await self._probe("query", {"tradeNo": PROBE_TRADE_NO}, priority)
        item = await self._probe("item", {"code": PROBE_CODE, "sharedCode": PROBE_CODE}, priority)
        shape: Literal["code", "sharedCode"] | None = None
        if item is not None:
            shape = "sharedCode" if isinstance(item, Success) and isinstance(item.data, list) else "code"
        return Features(valuation is not None, stock is not None, shape, query is not None)

    async def goods(
        self,
        commodity: Commodity,
        features: Features,
        *,
        priority: Priority = Priority.CATALOG,
        max_choices: int = MAX_CHOICES,
    ) -> Goods:
        """``commodity`` as a product with one SKU per choice, priced and stocked as the supplier's version
        allows: per choice one ``valuation`` (3.4.6 on, else the cost fields: ``inventory`` once for
        3.1.3 - 3.4.5, the listing before) and one ``stock`` (3.1.3 on; before, ``inventory``'s count per
        variant for card goods and the listing's counter for manual goods). A choice the supplier refuses
        is a problem of that choice; a transport or protocol failure raises."""
        source = features.price_source
        try:
            choices = commodity.choices(max_choices, add_ons=source is not PriceSource.ITEMS)
        except GoodsError:
            return goods_of(commodity, prices={}, source=source, max_choices=max_choices)
        inventory = (
            await self.inventory(commodity.code, priority=priority)
            if source is PriceSource.INVENTORY
            else None
        )
        prices: dict[str, Decimal] = {}
        stocks: dict[str, StockReading] = {}
        counts: dict[str | None, StockReading] = {}
        problems: list[Problem] = []
        for choice in choices:
            if commodity.choice_problem(choice) is not None:
                continue  # goods_of names it
            try:
                if source is PriceSource.VALUATION:
                    prices[choice.key] = await self.valuation(
                        commodity.code, 1, choice.race, choice.sku, priority=priority
                    )
                else:
                    prices[choice.key] = fallback_unit_cost(commodity, choice, source, inventory)
                if features.stock:
                    stocks[choice.key] = await self.stock(
                        commodity.code, choice.race, choice.sku, priority=priority
                    )
                elif not commodity.manual:
                    if choice.race not in counts:
                        answer = await self.inventory(commodity.code, choice.race, priority=priority)
                        counts[choice.race] = read_stock(answer.get("count"))
                    stocks[choice.key] = counts[choice.race]
            except (BusinessError, GoodsError, ValueError) as exc:
                reason = f"{exc.code}: {exc.message}" if isinstance(exc, BusinessError) else str(exc)
                problems.append(Problem("choice_unavailable", commodity.id, reason, choice.key))
        built = goods_of(
            commodity,
            prices=prices,
            stocks=stocks,
            source=source,
            base_url=self._root,
            max_choices=max_choices,
        )
        refused = {problem.choice_key for problem in problems}
        rest = [problem for problem in built.problems if problem.choice_key not in refused]
        return Goods(built.product, (*problems, *rest))

    async def _probe(self, endpoint: str, fields: dict[str, FieldValue], priority: Priority) -> Answer | None:
        def present(reply: _Reply) -> Answer | None:
            answer = reply.answer
            if isinstance(answer, NotJson):
                return None
            if isinstance(answer, Malformed):
                raise self._protocol_error(endpoint, answer.reason)
            if isinstance(answer, Refusal):
                error = classify_refusal(answer.message, upstream=self.name, endpoint=endpoint)
                if isinstance(error, AuthError):
                    raise error
            return answer

        return await self._send(endpoint, fields, priority, present)

    # -- buying -----------------------------------------------------------------------------------------

    async def trade(
        self,
        request: TradeRequest,
        *,
        repeated: bool = False,
        input_errors: Collection[str] = (),
        balance_before: Decimal | None = None,
        priority: Priority = Priority.ORDER,
    ) -> TradeResult:
        """Buy with the member's balance. Known refusals raise what :func:`classify_trade_refusal` says;
        every other outcome but a success raises :class:`OutcomeUnknown` (never send it again with a new
        number). ``repeated``: the same ``request_no`` was sent before and its answer lost."""
        fields = request.fields()
        details = {
            "request_no": request.request_no,
            "code": request.code,
            "quantity": str(request.quantity),
            "purchase_records": self._root + PURCHASE_RECORDS_PATH,
        }
        if balance_before is not None:
            details["balance_before"] = str(balance_before)
        async with self._trading:
            try:
                return await self._send(
                    "trade",
                    fields,
                    priority,
                    lambda reply: self._traded(request, reply, repeated, input_errors, details),
                    timeout=self._settings.trade_timeout_seconds,
                )
            except ConnectFailed:
                raise  # no connection was opened: nothing was sent
            except OutcomeUnknown as exc:
                raise await self._unknown(exc.message, exc.cause, exc.details) from None
            except (UpstreamTimeout, TransportError) as exc:
                raise await self._unknown(exc.message, "lost_answer", details) from None
            except (AuthError, BusinessError, PriceChanged):
                raise
            except UpstreamError as exc:
                raise await self._unknown(f"{exc.code}: {exc.message}", "http_status", details) from None

    def _traded(
        self,
        request: TradeRequest,
        reply: _Reply,
        repeated: bool,
        input_errors: Collection[str],
        details: dict[str, str],
    ) -> TradeResult:
        answer = reply.answer
        if isinstance(answer, Refusal):
            raise classify_trade_refusal(
                answer.message,
                repeated=repeated,
                input_errors=input_errors,
                upstream=self.name,
                details=details,
            )
        if isinstance(answer, NotJson):
            raise self._unknown_now(answer.describe(), "not_json", details)
        if isinstance(answer, Malformed):
            raise self._unknown_now(answer.reason, "malformed", details)
        data = answer.data
        try:
            if not isinstance(data, dict):
                raise ValueError("data is not an object")
            trade_no, secret = data.get("tradeNo"), data.get("secret")
            if not isinstance(trade_no, str) or not TRADE_NO.fullmatch(trade_no):
                raise ValueError("tradeNo is not 18 digits")
            if secret is not None and not isinstance(secret, str):
                raise ValueError("secret is not text")
            amount = decimal_value(data.get("amount"), "amount")
            stock = read_stock(data["stock"]) if "stock" in data else None
        except ValueError as exc:
            raise self._unknown_now(
                f"a success the client cannot read: {exc}", "malformed", details
            ) from None
        url, note = data.get("url"), data.get("leave_message")
        return TradeResult(
            trade_no=trade_no,
            amount=amount,
            secret=secret or "",
            request_no=request.request_no,
            url=url if isinstance(url, str) else None,
            leave_message=note if isinstance(note, str) else None,
            stock=stock,
        )

    def _unknown_now(self, message: str, cause: str, details: Mapping[str, str]) -> OutcomeUnknown:
        return OutcomeUnknown(message, cause=cause, details=details, upstream=self.name, endpoint="trade")

    async def _unknown(self, message: str, cause: str, details: Mapping[str, str]) -> OutcomeUnknown:
        """The error for a trade whose outcome is unknown, with the balance after it when it can be read."""
        known = dict(details)
        try:
            known["balance_after"] = str((await self.connect(priority=Priority.ORDER)).balance)
        except UpstreamError as exc:
            known["balance_after"] = f"unknown ({exc.code})"
        error = OutcomeUnknown(message, cause=cause, details=known, upstream=self.name, endpoint="trade")
        self._log.error("upstream.trade_outcome_unknown", cause=cause, request_no=known.get("request_no"))
        return error

    # -- the exchange -----------------------------------------------------------------------------------

    def _reader(self, endpoint: str) -> Callable[[_Reply], Any]:
        return lambda reply: self._data(endpoint, reply)

    def _data(self, endpoint: str, reply: _Reply) -> Any:
        """The data of a success; the error any other answer stands for."""
        answer = reply.answer
        if isinstance(answer, Success):
            return answer.data
        if isinstance(answer, Refusal):
            raise classify_refusal(answer.message, upstream=self.name, endpoint=endpoint)
        if isinstance(answer, NotJson):
            if endpoint in OPTIONAL_ENDPOINTS:
                raise EndpointAbsent(
                    f"answered {answer.describe()}: the supplier's version lacks {endpoint}",
                    upstream=self.name,
                    endpoint=endpoint,
                    http_status=200,
                )
            raise self._protocol_error(
                endpoint, f"answered {answer.describe()}: the shop failed, or base_url is not its root"
            )
        raise self._protocol_error(endpoint, answer.reason)

    async def _send(
        self,
        endpoint: str,
        fields: Mapping[str, FieldValue],
        priority: Priority,
        interpret: Callable[[_Reply], T],
        *,
        timeout: float | None = None,
    ) -> T:
        """Sign and post ``fields``, and read the answer with ``interpret`` (which raises for a failure);
        the observer sees each request once, with its outcome."""
        self._check_open()
        signed: dict[str, FieldValue] = {"app_id": self._settings.app_id, **fields}
        signature = sign(signed, self._settings.signing_key())
        body = form_body({**signed, "sign": signature})

        async def exchange(started: float) -> T:
            return interpret(await self._exchange(endpoint, body, signature, timeout, started))

        return await self._observed(endpoint, priority, exchange)

    async def _exchange(
        self, endpoint: str, body: bytes, signature: str, timeout: float | None, started: float
    ) -> _Reply:
        session = self._open_session()
        path = PATHS[endpoint]
        status: int | None = None
        where: dict[str, Any] = {"upstream": self.name, "endpoint": endpoint}
        try:
            async with session.post(
                self._root + path,
                data=body,
                headers={"Content-Type": "application/x-www-form-urlencoded"},
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout or self._settings.timeout_seconds),
            ) as response:
                status = response.status
                raw = await response.read()
                content_type = response.headers.get("Content-Type")
                location = response.headers.get("Location", "")
                retry_after = response.headers.get("Retry-After")
        except TimeoutError:
            seconds = timeout or self._settings.timeout_seconds
            raise UpstreamTimeout(
                f"no complete answer within {seconds:g} s", http_status=status, **where
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            failure = ConnectFailed if isinstance(exc, aiohttp.ClientConnectorError) else TransportError
            raise failure(describe_transport_failure(exc), http_status=status, **where) from None
        finally:
            self._log.debug(
                "upstream.request",
                path=path,
                status=status,
                ms=round((time.perf_counter() - started) * 1000, 1),
            )
        seconds = time.perf_counter() - started
        if status == 200:
            answer = read_envelope(raw, content_type)
            if isinstance(answer, Refusal):
                answer = Refusal(redact(answer.message, (self._settings.signing_key(), signature)))
            return _Reply(answer, seconds)
        where["http_status"] = status
        if 300 <= status < 400:
            target = redact(location[:200], (self._settings.signing_key(), signature))
            raise ProtocolError(
                f"redirected to {target or '(no Location)'}; procurd follows no redirect: set base_url "
                "to the shop's own address",
                **where,
            )
        if status == 429:
            raise RateLimited("too many requests", retry_after=parse_retry_after(retry_after), **where)
        if status >= 500:
            raise ServerError(f"HTTP {status} ({len(raw)} bytes)", **where)
        raise ProtocolError(
            f"HTTP {status}: the shared API answers only 200 (is base_url the shop's root?)", **where
        )


def _choice_fields(code: str, race: str | None, options: Mapping[str, str] | None) -> dict[str, FieldValue]:
    fields: dict[str, FieldValue] = {"code": code}
    if race is not None:
        fields["race"] = race
    if options:
        fields["sku"] = dict(options)
    return fields
