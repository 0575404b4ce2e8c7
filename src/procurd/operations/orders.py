"""Operations on orders and the exception queue: intake, upstream-first cancel, a person's retry and
resolve, bulk retry. Each change goes through the procurement service (the one state path) with the source
that records who acted (``intake`` for intake, ``admin`` for a person, whatever door they used); what they
answer is read through :mod:`procurd.operations.views`."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from procurd.core.exact import loads_exact
from procurd.core.intake import IntakeError, parse_order_request, refusal_status
from procurd.core.json_limits import json_problem
from procurd.core.numbers import MAX_ID, ORDER_NO_PATTERN
from procurd.core.orders import check_note
from procurd.core.procurement import SETTLE_WITH_UPSTREAM, NotAllowed, Reason, Resolve, Retry, Source, State
from procurd.core.refusals import Refused
from procurd.db.views import WithProcurements
from procurd.operations.runtime import Runtime
from procurd.operations.views import ProcurementViews
from procurd.procurement import cancel
from procurd.procurement.service import IntakeResult
from procurd.protocol.acgfaka.orders import request_no

log = structlog.get_logger("procurd.orders")

DEFAULT_BULK_RETRY = 100  # exceptions one bulk retry sends again unless told otherwise
MAX_BULK_RETRY = 1000


@dataclass(frozen=True, slots=True)
class BulkRetry:
    """What a bulk retry did: the ids queued again, the ones skipped (with why) and how many still match."""

    retried: list[int]
    skipped: list[dict[str, Any]]
    remaining: int


# Why a bulk retry leaves an exception of these reasons alone (see core.machine_people.settle_with_upstream).
NOT_RETRIED = {
    Reason.OUTCOME_UNKNOWN.value: (
        "not sent again: the upstream may have made the purchase (its outcome is unknown); settle it with "
        "the upstream, then resolve it with a note, or, if nothing was bought, retry it alone with "
        "nothing_bought and a note"
    ),
    Reason.NOT_DELIVERED.value: (
        "not sent again: the upstream made and charged the order but delivered nothing usable; settle it "
        "with the upstream, then resolve it with a note"
    ),
}

__all__ = ["DEFAULT_BULK_RETRY", "MAX_BULK_RETRY", "BulkRetry", "IntakeResult", "OrderOperations"]


def decode_json(raw: bytes) -> Any:
    """A request body as JSON with every fractional number an exact ``Decimal``; 400 ``invalid_json``
    otherwise, and 400 ``invalid_request`` for JSON that cannot be stored (a NUL, an unpaired surrogate,
    deep nesting)."""
    try:
        body = loads_exact(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise Refused(400, "invalid_json", "the body is not valid JSON") from None
    problem = json_problem(body)
    if problem is not None:
        raise Refused(400, "invalid_request", f"the body cannot be accepted: {problem}")
    return body


def _json_body(raw: bytes, allow_backorder: bool) -> dict[str, Any]:
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise Refused(400, "invalid_request", "the body must be a JSON object")
    if allow_backorder:
        body["allow_backorder"] = True
    return body


def intake_refusal(exc: IntakeError) -> Refused:
    """The refusal with the status :func:`procurd.core.intake.refusal_status` gives its code."""
    extra = {"details": exc.details} if exc.details else {}
    return Refused(refusal_status(exc.code), exc.code, exc.message, **extra)


def order_not_found(order_no: str) -> Refused:
    return Refused(404, "order_not_found", f"no order {order_no!r}")


def check_order_no(order_no: str) -> str:
    """An order number; one that no order can have is answered 404 without asking the database."""
    if not ORDER_NO_PATTERN.fullmatch(order_no):
        raise order_not_found(order_no)
    return order_no


def check_procurement_id(value: int) -> int:
    if not 0 < value <= MAX_ID:
        raise Refused(404, "procurement_not_found", f"no procurement {value}")
    return value


def check_bulk_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BULK_RETRY:
        raise Refused(400, "invalid_request", f"limit must be an integer from 1 to {MAX_BULK_RETRY}")
    return limit


class OrderOperations:
    def __init__(self, runtime: Runtime, views: ProcurementViews) -> None:
        self.runtime = runtime
        self.views = views

    async def submit(self, body: Mapping[str, Any]) -> IntakeResult:
        """Accept a locally paid order for procurement (queued for the submitters; nothing is bought here).
        A repeat of the same body answers the existing order; the same number with another body is refused
        409 ``order_conflict``."""
        try:
            result = await self.runtime.service.submit(parse_order_request(dict(body)))
        except IntakeError as exc:
            raise intake_refusal(exc) from None
        if result.created:
            self.runtime.metrics.orders_accepted.inc()
        return result

    async def preview(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """What :meth:`submit` would do with the same body now (the same decision, nothing written): the
        answer intake would give, and per item its source, prices, stock, hold, limit and loss guard, its
        offer's sources, and whether it would be bought or why not. A malformed body is refused as intake
        refuses it."""
        try:
            request = parse_order_request(dict(body))
        except IntakeError as exc:
            raise intake_refusal(exc) from None
        return await self.views.preview(request)

    async def submit_json(self, raw: bytes, *, allow_backorder: bool = False) -> IntakeResult:
        """:meth:`submit` of a raw JSON request body (``allow_backorder``: as if the body said it)."""
        return await self.submit(_json_body(raw, allow_backorder))

    async def preview_json(self, raw: bytes, *, allow_backorder: bool = False) -> dict[str, Any]:
        """:meth:`preview` of a raw JSON request body (``allow_backorder``: as if the body said it)."""
        return await self.preview(_json_body(raw, allow_backorder))

    async def view(self, order_no: str) -> dict[str, Any]:
        """The order view; 404 ``order_not_found``."""
        view = await self.views.order(check_order_no(order_no))
        if view is None:
            raise order_not_found(order_no)
        return view

    async def audit(self, order_no: str) -> list[dict[str, Any]]:
        return await self.views.audit(order_no)

    async def cancel(self, order_no: str, *, source: Source = Source.ADMIN) -> dict[str, Any]:
        """Upstream-first cancel of the whole order; its order view, or 409 ``cancel_not_allowed`` with the
        reason of each item (``items``). ``source``: a person, or a downstream site (its provider order)."""
        runtime = self.runtime
        check_order_no(order_no)
        found = await runtime.database.read(lambda tx: tx.procurements.order(order_no))
        if found is None:
            raise order_not_found(order_no)
        try:
            await cancel.cancel_order(runtime.service, order_no, found[1], runtime.cancel_upstream, source)
        except cancel.CancelDenied as exc:
            items = [
                {"procurement_id": item.procurement_id or None,
                 "downstream_order_no": item.downstream_order_no, "reason": item.reason}
                for item in exc.items
            ]  # fmt: skip
            log.info("order.cancel_denied", order_no=order_no, reasons=[item["reason"] for item in items])
            raise Refused(
                409, "cancel_not_allowed", f"order {order_no} cannot be canceled: {exc}", items=items
            ) from None
        log.info("order.canceled", order_no=order_no)
        view = await self.views.order(order_no)
        assert view is not None
        return view

    async def retry(
        self, procurement_id: int, note: Any = None, nothing_bought: Any = False
    ) -> dict[str, Any]:
        """Send an exception's procurement again (under a new number once the upstream canceled the old);
        ``note`` (optional) is checked as :func:`check_note` says.

        ``nothing_bought``: a person checked the upstream and found that a purchase whose outcome was unknown
        was not made (a note is then required). Its trade is marked so (an acg-faka upstream, which otherwise
        never sends it again) and the procurement is sent again under the same number; a shop that does hold
        an order under it answers so, and it is ``outcome_unknown`` again: never a second purchase."""
        if not isinstance(nothing_bought, bool):
            raise Refused(400, "invalid_request", "nothing_bought must be true or false")
        checked = check_note(note, required=nothing_bought)
        if nothing_bought:
            check_procurement_id(procurement_id)
            await self._clear_trade(procurement_id)
        return await self._handle(procurement_id, Retry(checked, nothing_bought=nothing_bought))

    async def _clear_trade(self, procurement_id: int) -> None:
        """Mark the trade of an ``outcome_unknown`` procurement of an acg-faka upstream as one a person found
        nothing bought under (before the retry: its submission must find it so)."""
        runtime = self.runtime
        p = await runtime.database.read(lambda tx: tx.procurements.procurement(procurement_id))
        if p is None or p.state is not State.EXCEPTION or p.exception_reason != Reason.OUTCOME_UNKNOWN:
            return  # the retry answers what applies
        block = next((u for u in runtime.settings.upstreams if u.name == p.upstream), None)
        if block is None or block.protocol != "acg-faka":
            return
        number = request_no(p.downstream_order_no, block.app_id)
        await runtime.database.write(lambda tx: tx.trades.clear(p.upstream, number))

    async def resolve(self, procurement_id: int, note: Any) -> dict[str, Any]:
        """Close an exception by hand, with a note for the audit trail (required, checked as
        :func:`check_note` says)."""
        checked = check_note(note, required=True)
        assert checked is not None
        return await self._handle(procurement_id, Resolve(checked))

    async def _handle(self, procurement_id: int, event: Retry | Resolve) -> dict[str, Any]:
        """The procurement and its order after a person's action, as the JSON API answers them; 409 with the
        refusal's code when the action does not apply, 404 when there is no such procurement."""
        service = self.runtime.service
        check_procurement_id(procurement_id)
        try:
            applied = await service.apply(procurement_id, event, Source.ADMIN)
        except NotAllowed as exc:
            raise Refused(409, exc.code, exc.message) from None
        if applied is None:
            raise Refused(404, "procurement_not_found", f"no procurement {procurement_id}")
        log.info("exception.handled", procurement_id=procurement_id, action=applied.decision.event)
        return {
            "procurement": await self.views.procurement(procurement_id),
            "order": await self.views.order(applied.procurement.order_no),
        }

    async def retry_exceptions(
        self,
        *,
        upstream: str | None = None,
        reason: str | None = None,
        everything: bool = False,
        note: Any = None,
        limit: Any = DEFAULT_BULK_RETRY,
    ) -> BulkRetry:
        """Send many exceptions again, oldest first: those of a reason or an upstream procurd knows, or
        every one (``everything``); ``note`` and ``limit`` are checked as given."""
        if reason is None and upstream is None and not everything:
            raise Refused(
                422,
                "filter_required",
                'name a reason or an upstream, or send "all": true for every exception',
            )
        await self.check_filters(upstream, reason)
        return await self._retry_matching(
            upstream, reason, check_note(note, required=False), check_bulk_limit(limit)
        )

    async def _retry_matching(
        self, upstream: str | None, reason: str | None, note: str | None, limit: int
    ) -> BulkRetry:
        """Send up to ``limit`` matching exceptions again, oldest first, each through the state path.

        One that changed meanwhile (a person resolved it, another retry won) is reported as skipped. Those
        a retry never sends again (money may have moved: ``outcome_unknown``, ``not_delivered``) are not
        tried, not counted as remaining, and reported as skipped with their reason (the oldest ``limit``).
        """
        service = self.runtime.service
        held = sorted(SETTLE_WITH_UPSTREAM)

        def read(tx: WithProcurements) -> tuple[tuple[int, list[int]], list[tuple[int, str]]]:
            store = tx.procurements
            return (
                store.exception_ids(upstream, reason, limit, excluding=held),
                store.exceptions_of_reasons(upstream, reason, held, limit),
            )

        (total, ids), settle = await self.runtime.database.read(read)
        outcomes = await asyncio.gather(
            *(service.apply(pid, Retry(note), Source.ADMIN) for pid in ids), return_exceptions=True
        )
        retried: list[int] = []
        skipped: list[dict[str, Any]] = [
            {"id": procurement_id, "error_code": held_for, "message": NOT_RETRIED[held_for]}
            for procurement_id, held_for in settle
        ]
        for procurement_id, outcome in zip(ids, outcomes, strict=True):
            if isinstance(outcome, NotAllowed):
                skipped.append({"id": procurement_id, "error_code": outcome.code, "message": outcome.message})
            elif outcome is None:
                skipped.append(
                    {"id": procurement_id, "error_code": "procurement_not_found", "message": "it is gone"}
                )
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                retried.append(procurement_id)
        log.info(
            "exceptions.retried",
            upstream=upstream,
            reason=reason,
            retried=len(retried),
            skipped=len(skipped),
            remaining=total - len(ids),
        )
        return BulkRetry(retried, skipped, total - len(ids))

    async def exceptions(
        self, upstream: str | None, reason: str | None, page: int, page_size: int
    ) -> tuple[int, list[dict[str, Any]]]:
        """A page of the exception queue, filtered by an upstream and a reason procurd knows."""
        await self.check_filters(upstream, reason)
        return await self.views.exceptions(upstream, reason, page, page_size)

    async def check_filters(self, upstream: str | None, reason: str | None) -> None:
        """A filter naming no upstream or reason procurd knows is a typo: 400 naming the known values."""
        problem = await self.views.filter_problem(upstream, reason)
        if problem is not None:
            raise Refused(400, *problem)
