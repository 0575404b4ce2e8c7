"""Buying from an acg-faka supplier: one trade per procurement, one at a time per member account, never twice.

A procurement's purchase (:meth:`AcgFakaTrading.create_order`) runs under the lease of the supplier account
(every instance of the installation shares it: the supplier's trade can deadlock against a second one of the
same member), renewed while the purchase is in flight however long its requests wait for the upstream's
request budget, and checked right before the trade is sent. It goes:

1. A trade recorded under the procurement's ``request_no`` that may have bought answers for it: nothing is
   sent again (a lost answer, a crash in flight, an HTML page stay ``outcome_unknown``).
2. ``valuation`` of the exact choice and quantity, checked against the item's limit (the protocol has no
   price guard): above it, refused before money moves (``price_above_limit``).
3. ``connect``: the balance before, for a person settling an unknown outcome.
4. The trade, recorded before it is sent and with its answer after: card goods delivered in the answer, a
   manual commodity's notice (polled with ``query`` until its text changes), a paid order without its goods
   (:class:`~procurd.upstream.errors.NotDelivered`), a known refusal, or an unknown outcome.

The supplier's trade number (18 digits) is the upstream order id; ``get_order`` answers from ``query``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import structlog

from procurd.config import UpstreamSettings
from procurd.core.clock import utcnow
from procurd.core.records import MirroredProduct
from procurd.core.trades import Trade, TradeState
from procurd.protocol.acgfaka.client import PURCHASE_RECORDS_PATH, AcgFakaClient, EndpointAbsent
from procurd.protocol.acgfaka.orders import (
    TradeRequest,
    TradeResult,
    delivered_later,
    interpret_delivery,
    request_no,
)
from procurd.protocol.acgfaka.ports import ChoiceBook, TradeBook
from procurd.upstream.errors import (
    AuthError,
    BusinessError,
    ConnectFailed,
    NotDelivered,
    OutcomeUnknown,
    PriceChanged,
    RateLimited,
    UpstreamError,
)
from procurd.upstream.models import (
    CancelResult,
    CreateOrderRequest,
    Fulfillment,
    OrderCreated,
    UpstreamOrder,
)
from procurd.upstream.ratelimit import Priority

log = structlog.get_logger("procurd.upstream")

LEASE_WAIT_SECONDS = 0.05  # between two looks at a busy account's lease
LEASE_RENEWALS = 4  # renewals of the account's lease in one lease's length while a trade is in flight
TRADE_NO_DIGITS = 18
CENT = Decimal("0.01")


class AcgFakaTrading:
    def __init__(
        self, settings: UpstreamSettings, client: AcgFakaClient, choices: ChoiceBook, trades: TradeBook
    ) -> None:
        self.settings = settings
        self.client = client
        self.choices = choices
        self.trades = trades
        self.name = settings.name
        self.root = settings.base_url.rstrip("/")
        where = urlsplit(self.root)
        self.account = f"acg-faka trades {settings.app_id}@{where.netloc}{where.path}"[:128]

    # -- buying -----------------------------------------------------------------------------------------

    async def create_order(
        self, request: CreateOrderRequest, *, priority: Priority = Priority.ORDER
    ) -> OrderCreated:
        choice = await self.choices.choice(self.name, request.sku_id)
        if choice is None:
            raise self._refused(
                f"SKU {request.sku_id} is no choice procurd gave {self.name}", "sku_unavailable"
            )
        if not request.downstream_order_no:
            raise self._refused("the procurement has no downstream_order_no", "invalid_request")
        number = request_no(request.downstream_order_no, self.settings.app_id)
        try:
            trade = TradeRequest(
                choice.code,
                request.quantity,
                number,
                choice.race,
                choice.options,
                inputs=_inputs(request.manual_form_data),
            )
            trade.fields()
        except ValueError as exc:
            raise self._refused(str(exc), "input_rejected") from None
        goods = _Goods.of(await self.choices.product(self.name, choice.product_id))
        token = secrets.token_hex(8)
        await self._hold(token)
        keeper = asyncio.create_task(self._keep(token), name=f"trade lease {self.name}")
        try:
            return await self._buy(request, trade, goods, priority, token)
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            try:
                await self.trades.let_go(self.account, token)
            except Exception:  # noqa: BLE001 - the lease then expires by itself
                log.warning("upstream.trade_lease_not_released", upstream=self.name)

    @property
    def lease_seconds(self) -> float:
        """How long the account's lease lasts past its last renewal: longer than the trade's own requests
        (valuation, connect, the trade, connect), so that a trade whose instance died is over at the shop
        before another instance may trade for the account."""
        return 2 * self.settings.trade_timeout_seconds + 3 * self.settings.timeout_seconds

    async def _hold(self, token: str) -> None:
        """Wait for the account's lease (one trade at a time across every instance), up to one trade's
        timeout; then the submission is put off (nothing was sent)."""
        wait = self.settings.trade_timeout_seconds
        deadline = asyncio.get_running_loop().time() + wait
        while not await self.trades.hold(self.account, token, self.lease_seconds):
            if asyncio.get_running_loop().time() >= deadline:
                raise RateLimited(
                    "another trade of this member account is in flight", retry_after=1.0, upstream=self.name
                )
            await asyncio.sleep(LEASE_WAIT_SECONDS)

    async def _keep(self, token: str) -> None:
        """Renew the account's lease while the trade is in flight, however long its requests wait for the
        upstream's request budget: its expiry covers the whole trade, never only the requests' timeouts."""
        every = self.lease_seconds / LEASE_RENEWALS
        while True:
            await asyncio.sleep(every)
            try:
                if not await self.trades.renew(self.account, token, self.lease_seconds):
                    log.error("upstream.trade_lease_lost", upstream=self.name)
                    return
            except Exception:  # noqa: BLE001 - the next renewal tries again; the lease lasts till then
                log.warning("upstream.trade_lease_not_renewed", upstream=self.name)

    async def _still_held(self, token: str) -> None:
        """Right before a trade is sent: the account's lease is still this trade's (renewed now), else
        nothing is sent (put off like a busy account)."""
        if not await self.trades.renew(self.account, token, self.lease_seconds):
            raise RateLimited(
                "the member account's trade lease was lost before the trade; nothing was sent",
                retry_after=1.0,
                upstream=self.name,
            )

    async def _buy(
        self, request: CreateOrderRequest, trade: TradeRequest, goods: _Goods, priority: Priority, token: str
    ) -> OrderCreated:
        recorded = await self.trades.recorded(self.name, trade.request_no)
        if recorded is not None and recorded.may_have_bought:
            return await self._again(recorded, request, priority)
        balance = await self._before_trade(request, trade, priority)
        await self._still_held(token)
        now = utcnow()
        record = Trade(
            upstream=self.name,
            request_no=trade.request_no,
            downstream_order_no=request.downstream_order_no or "",
            code=trade.code,
            quantity=trade.quantity,
            state=TradeState.SENDING,
            sent_at=now,
            balance_before=None if balance is None else str(balance),
        )
        begun = await self.trades.begin(record)
        if begun is not record:  # another try recorded it meanwhile
            return await self._again(begun, request, priority)
        # Sent before and cleared by a person: the shop then reads the number's refusals as a repeat's.
        repeated = recorded is not None and recorded.state is TradeState.CLEARED
        try:
            result = await self.client.trade(
                trade,
                repeated=repeated,
                input_errors=goods.input_errors,
                balance_before=balance,
                priority=priority,
            )
        except (AuthError, BusinessError, PriceChanged, ConnectFailed):
            await self._record(record, TradeState.REFUSED)
            raise
        except OutcomeUnknown:
            await self._record(record, TradeState.UNKNOWN)
            raise
        return await self._answered(record, request, result, goods.chained)

    async def _before_trade(
        self, request: CreateOrderRequest, trade: TradeRequest, priority: Priority
    ) -> Decimal | None:
        """The price check and the balance before the trade; a failure here sent no trade."""
        options = dict(trade.options)
        try:
            try:
                total = await self.client.valuation(
                    trade.code, trade.quantity, trade.race, options, priority=priority
                )
            except EndpointAbsent:
                total = None  # before 3.4.6: the claim's check of the mirrored price is all there is
            if total is not None and request.unit_limit is not None:
                limit = Decimal(request.unit_limit)
                if total > limit * trade.quantity:
                    what = "max_unit_price" if request.limit_given else "the limit from the selling price"
                    raise self._refused(
                        f"the supplier asks {total} for {trade.quantity}, above {what} {limit} a unit; "
                        "nothing was bought",
                        "price_above_limit",
                    )
            return (await self.client.connect(priority=priority)).balance
        except (BusinessError, AuthError, RateLimited):
            raise
        except UpstreamError as exc:
            # No trade went out: put off like a connection that could not be opened.
            raise ConnectFailed(
                f"before the trade: {exc.message}", code=exc.code, upstream=self.name, endpoint=exc.endpoint
            ) from None

    async def _answered(
        self, record: Trade, request: CreateOrderRequest, result: TradeResult, chained: bool
    ) -> OrderCreated:
        manual = request.fulfillment_type == "manual"
        delivery = interpret_delivery(result.secret, quantity=record.quantity, manual=manual, chained=chained)
        amount = _cents(result.amount)
        if delivery.kind == "delivered":
            await self._record(record, TradeState.DELIVERED, result)
            return self._created(result.trade_no, amount, "delivered", _goods(result.secret, manual))
        if delivery.kind == "pending":
            await self._record(record, TradeState.PENDING, result, notice=result.secret)
            return self._created(result.trade_no, amount, "fulfilling", None)
        await self._record(record, TradeState.NOT_DELIVERED, result, notice=result.secret)
        raise self._not_delivered(result.trade_no, amount, delivery.reason or "nothing delivered")

    async def _again(self, recorded: Trade, request: CreateOrderRequest, priority: Priority) -> OrderCreated:
        """A procurement sent again whose trade is recorded as one that may have bought: its answer, as far
        as it is known; never a second trade."""
        trade_no = recorded.trade_no
        if recorded.state is TradeState.PENDING and trade_no is not None:
            return self._created(trade_no, recorded.amount, "fulfilling", None)
        if recorded.state is TradeState.DELIVERED and trade_no is not None:
            order = await self.get_order(int(trade_no), priority=priority)
            return self._created(trade_no, recorded.amount, order.status, order.fulfillment)
        if recorded.state is TradeState.NOT_DELIVERED and trade_no is not None:
            raise self._not_delivered(trade_no, recorded.amount, "recorded as paid without its goods")
        details = {
            "request_no": recorded.request_no,
            "code": recorded.code,
            "quantity": str(recorded.quantity),
            "purchase_records": self.root + PURCHASE_RECORDS_PATH,
            "sent_at": recorded.sent_at.isoformat(),
        }
        if recorded.balance_before is not None:
            details["balance_before"] = recorded.balance_before
        raise OutcomeUnknown(
            "a trade under this request number was sent before and its outcome is not known",
            cause="sent_before",
            details=details,
            upstream=self.name,
            endpoint="trade",
        )

    async def _record(
        self, record: Trade, state: TradeState, result: TradeResult | None = None, notice: str | None = None
    ) -> None:
        answered = Trade(
            upstream=record.upstream,
            request_no=record.request_no,
            downstream_order_no=record.downstream_order_no,
            code=record.code,
            quantity=record.quantity,
            state=state,
            sent_at=record.sent_at,
            trade_no=None if result is None else result.trade_no,
            amount=None if result is None else _cents(result.amount),
            balance_before=record.balance_before,
            notice=notice,
            answered_at=utcnow(),
        )
        try:
            await self.trades.answered(answered)
        except Exception:  # noqa: BLE001 - the row says "sending": a next try reports the outcome unknown
            log.error("upstream.trade_not_recorded", upstream=self.name, request_no=record.request_no)

    # -- reading ----------------------------------------------------------------------------------------

    async def get_order(self, order_id: int, *, priority: Priority = Priority.POLL) -> UpstreamOrder:
        """The order under trade number ``order_id`` as ``query`` answers it now; a manual order is
        delivered once its text is no longer the notice its trade answered."""
        trade_no = f"{order_id:0{TRADE_NO_DIGITS}d}"
        recorded = await self.trades.by_trade_no(self.name, trade_no)
        answer = await self.client.query(trade_no, priority=priority)
        data: dict[str, Any] = {
            "order_id": order_id,
            "order_no": trade_no,
            "status": "fulfilling",
            "currency": self.settings.currency or None,
        }
        if recorded is not None:
            data["downstream_order_no"] = recorded.downstream_order_no
            data["amount"] = recorded.amount
            if recorded.state is TradeState.DELIVERED:
                data.update(status="delivered", fulfillment=_goods(answer.secret or "", manual=False))
            elif delivered_later(recorded.notice, answer.secret):
                data.update(status="delivered", fulfillment=_goods(answer.secret or "", manual=True))
            elif recorded.state is TradeState.NOT_DELIVERED:
                data["status"] = "paid"
        return UpstreamOrder.model_validate({k: v for k, v in data.items() if v is not None})

    async def cancel_order(self, order_id: int, *, priority: Priority = Priority.ORDER) -> CancelResult:
        raise self._refused(
            "acg-faka has no cancel: a trade once sent is bought (a refund is the supplier's to make by "
            "hand)",
            "cancel_not_allowed",
        )

    # -- answers ----------------------------------------------------------------------------------------

    def _created(
        self, trade_no: str, amount: str | None, status: str, fulfillment: Fulfillment | None
    ) -> OrderCreated:
        return OrderCreated(
            order_id=int(trade_no),
            order_no=trade_no,
            status=status,
            amount=amount,
            currency=self.settings.currency or None,
            fulfillment=fulfillment,
        )

    def _not_delivered(self, trade_no: str, amount: str | None, reason: str) -> NotDelivered:
        return NotDelivered(
            f"trade {trade_no} was paid ({amount or 'amount unknown'}) without its goods: {reason}",
            details={"purchase_records": self.root + PURCHASE_RECORDS_PATH},
            order_id=int(trade_no),
            order_no=trade_no,
            amount=amount,
            currency=self.settings.currency or None,
            upstream=self.name,
            endpoint="trade",
        )

    def _refused(self, message: str, code: str) -> BusinessError:
        return BusinessError(message, code=code, upstream=self.name, endpoint="trade")


@dataclass(frozen=True, slots=True)
class _Goods:
    """What a trade needs of the commodity's mirror row: the texts its buyer inputs are refused with (a
    refusal proving nothing was bought), and whether the shop imported it from another shop (its answer
    is that shop's, never refreshed: goods or nothing, no notice to poll)."""

    input_errors: frozenset[str] = frozenset()
    chained: bool = False

    @classmethod
    def of(cls, product: MirroredProduct | None) -> _Goods:
        if product is None:
            return cls()
        facts = (product.extra or {}).get("acg_faka")
        chained = isinstance(facts, Mapping) and facts.get("chained") is True
        return cls(_input_errors(product.manual_form_schema), chained)


def _input_errors(schema: Any) -> frozenset[str]:
    """The refusal texts of the inputs of a mirrored form (``pattern_error`` of each field with a pattern,
    as :func:`procurd.protocol.acgfaka.widgets.form_schema` writes it); an empty text proves nothing."""
    fields = schema.get("fields") if isinstance(schema, Mapping) else None
    texts: set[str] = set()
    for entry in fields if isinstance(fields, list) else ():
        if not isinstance(entry, Mapping) or not entry.get("pattern"):
            continue
        error = entry.get("pattern_error")
        found = error.values() if isinstance(error, Mapping) else [error]
        texts.update(text for text in found if isinstance(text, str) and text)
    return frozenset(texts)


def _cents(amount: Decimal) -> str:
    """An amount as the shop keeps it (cents; its JSON may say ``20.0``)."""
    return str(amount.quantize(CENT))


def _goods(secret: str, manual: bool) -> Fulfillment:
    return Fulfillment(
        type="manual" if manual else "auto",
        status="delivered",
        payload=secret,
        delivered_at=utcnow().isoformat(),
    )


def _inputs(form: Mapping[str, Any] | None) -> dict[str, str]:
    """The buyer inputs as the trade's form fields (text, numbers as written)."""
    inputs: dict[str, str] = {}
    for name, value in (form or {}).items():
        if value is None:
            continue
        if isinstance(value, bool):
            inputs[name] = "1" if value else "0"
        elif isinstance(value, str | int | Decimal):
            inputs[name] = str(value)
        else:
            raise ValueError(f"buyer input {name!r} is not text")
    return inputs
