"""The procurement service: the one code path through which every state change is made.

Intake, workers, callbacks, polls and admin actions all end in :meth:`ProcurementService.apply` (or its
many-procurement form for cancels): lock the order and the procurement, ask the pure state machine,
write the procurement, its audit entry, the order's derived status and the storefront event in one
transaction.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import structlog
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from procurd.config import Settings
from procurd.db import procurement_store as store
from procurd.db.types import utcnow
from procurd.procurement.intake import IntakeError, OrderRequest
from procurd.procurement.machine import NotAllowed, Policy, cancel_refusal, decide, needs_upstream_cancel
from procurd.procurement.model import (
    Cancel,
    Decision,
    Event,
    Reason,
    Retry,
    Snapshot,
    Source,
    State,
    UpstreamReport,
)
from procurd.procurement.numbers import item_number
from procurd.procurement.order_status import derive_status, event_for
from procurd.procurement.views import exception_view, iso, item_state, order_view, procurement_view

log = structlog.get_logger("procurd.procurement")

Clock = Callable[[], datetime]

DEFAULT_BULK_RETRY = 100  # exceptions one bulk retry sends again unless told otherwise
MAX_BULK_RETRY = 1000


@dataclass(frozen=True)
class IntakeResult:
    created: bool
    order: dict[str, Any]


@dataclass(frozen=True)
class Applied:
    """The outcome of one event: the decision, and the state before it."""

    procurement_id: int
    order_no: str
    old_state: State
    decision: Decision

    @property
    def changed(self) -> bool:
        return not self.decision.noop


@dataclass(frozen=True)
class BulkRetry:
    """What a bulk retry did: the ids queued again, the ones skipped (with why) and how many still match."""

    retried: list[int]
    skipped: list[dict[str, Any]]
    remaining: int


class ReportRejected(Exception):
    """A callback that matches no procurement of the upstream (unknown number, or another order id)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class CancelItem:
    procurement_id: int
    downstream_order_no: str
    reason: str


class CancelDenied(Exception):
    """The order cannot be canceled (upstream-first); ``items`` says why, item by item."""

    def __init__(self, items: list[CancelItem]) -> None:
        super().__init__("; ".join(f"{item.downstream_order_no}: {item.reason}" for item in items))
        self.items = items


UpstreamCancel = Callable[[str, int], Awaitable[None]]
"""Cancels upstream order ``order_id`` of upstream ``name``; raises on refusal or failure."""


@dataclass
class Wakeups:
    """In-process signals so workers and the event dispatcher react at once instead of at their next tick."""

    queued: dict[str, asyncio.Event] = field(default_factory=dict)
    events: asyncio.Event = field(default_factory=asyncio.Event)

    def for_upstream(self, upstream: str) -> asyncio.Event:
        return self.queued.setdefault(upstream, asyncio.Event())


class ProcurementService:
    def __init__(
        self,
        engine: AsyncEngine,
        settings: Settings,
        *,
        clock: Clock = utcnow,
        rng: random.Random | None = None,
        wakeups: Wakeups | None = None,
        on_change: Callable[[Applied, str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.on_change = on_change
        self.settings = settings
        self.clock = clock
        self.rng = rng
        self.wakeups = wakeups or Wakeups()
        procurement = settings.procurement
        self.policy = Policy(
            max_attempts=procurement.max_attempts,
            retry_base_seconds=procurement.retry_base_seconds,
            retry_max_seconds=procurement.retry_max_seconds,
            poll_initial_seconds=procurement.poll_initial_seconds,
            poll_max_seconds=procurement.poll_max_seconds,
        )
        self.lease = timedelta(seconds=procurement.lease_seconds)
        self.upstream_names = [upstream.name for upstream in settings.upstreams]

    # --- intake -------------------------------------------------------------------------------------------

    async def submit(self, request: OrderRequest) -> IntakeResult:
        """Accept a locally paid order: validate it against the mirror and queue one procurement per item.

        Never calls an upstream. A repeat of the same body returns the existing order; the same number
        with another body raises ``order_conflict``.
        """
        default = self.upstream_names[0] if len(self.upstream_names) == 1 else None
        request = request.with_upstream(default)
        fingerprint = request.fingerprint()
        existing = await self._existing_order(request.order_no, fingerprint)
        if existing is not None:
            return IntakeResult(False, existing)
        now = self.clock()
        try:
            async with self.engine.begin() as conn:
                await self._insert_order(conn, request, fingerprint, now)
                view = await self._order_view(conn, request.order_no)
        except IntegrityError:
            # A concurrent identical request won the race, or a number is already taken.
            existing = await self._existing_order(request.order_no, fingerprint)
            if existing is not None:
                return IntakeResult(False, existing)
            raise IntakeError(
                "downstream_order_no_taken",
                "a downstream order number derived from this order_no is already used by another order",
                409,
            ) from None
        for upstream in {item.upstream for item in request.items if item.upstream}:
            self.wakeups.for_upstream(upstream).set()
        log.info("order.accepted", order_no=request.order_no, items=len(request.items))
        return IntakeResult(True, view)

    async def _existing_order(self, order_no: str, fingerprint: str) -> dict[str, Any] | None:
        async with one_snapshot(self.engine) as conn:
            order = await store.get_order(conn, order_no)
            if order is None:
                return None
            if order.fingerprint != fingerprint:
                raise IntakeError("order_conflict", f"order {order_no} exists with a different body", 409)
            return await self._order_view(conn, order_no)

    async def _insert_order(
        self, conn: AsyncConnection, request: OrderRequest, fingerprint: str, now: datetime
    ) -> None:
        await store.insert_order(
            conn,
            order_no=request.order_no,
            trace_id=request.trace_id,
            fingerprint=fingerprint,
            request=request.canonical(),
            now=now,
        )
        for position, item in enumerate(request.items):
            upstream = item.upstream
            if upstream is None:
                raise IntakeError(
                    "upstream_required",
                    f"items.{position}.upstream: required when several upstreams are configured",
                    422,
                )
            if upstream not in self.upstream_names:
                raise IntakeError(
                    "unknown_upstream", f"items.{position}.upstream: no upstream {upstream!r}", 422
                )
            sku = await store.mirrored_sku(conn, upstream, item.sku_id)
            problem = _sku_problem(sku, item.manual_form_data)
            if problem is not None:
                code, message = problem
                raise IntakeError(code, f"items.{position}: {message}", 422)
            assert sku is not None
            state, reason = State.QUEUED, None
            if item.max_unit_price is not None and Decimal(sku.price_amount) > Decimal(item.max_unit_price):
                state, reason = State.EXCEPTION, Reason.PRICE_ABOVE_LIMIT
            number = item_number(request.order_no, position)
            values = {
                "order_no": request.order_no,
                "position": position,
                "upstream": upstream,
                "sku_id": item.sku_id,
                "product_id": sku.product_id,
                "quantity": item.quantity,
                "manual_form_data": item.manual_form_data,
                "max_unit_price": item.max_unit_price,
                "unit_price": sku.price_amount,
                "fulfillment_type": sku.fulfillment_type,
                "trace_id": request.trace_id,
                "downstream_order_no": number,
                "state": state.value,
                "attempts": 0,
                "upstream_may_exist": False,
                "exception_reason": reason,
                "last_error_code": reason,
                "last_error_message": (
                    f"mirrored unit price {sku.price_amount} is above max_unit_price {item.max_unit_price}"
                    if reason
                    else None
                ),
                "next_attempt_at": now if state is State.QUEUED else None,
                "version": 1,
                "created_at": now,
                "updated_at": now,
            }
            procurement_id = await store.insert_procurement(conn, values)
            await store.insert_number(conn, upstream, number, procurement_id, now)
            await store.add_audit(
                conn,
                order_no=request.order_no,
                procurement_id=procurement_id,
                source=Source.INTAKE.value,
                event="accepted" if state is State.QUEUED else "price_above_limit",
                old_state=None,
                new_state=state.value,
                detail={"downstream_order_no": number, "unit_price": sku.price_amount},
                now=now,
            )
        await self._refresh_order(conn, request.order_no, now, baseline=("paid", False))

    # --- the one code path --------------------------------------------------------------------------------

    async def apply(self, procurement_id: int, event: Event, source: Source) -> Applied | None:
        """Decide and write one event for one procurement; ``None`` when the procurement does not exist.

        Raises :class:`NotAllowed` (nothing written) when an admin action does not apply.
        """
        now = self.clock()
        async with self.engine.begin() as conn:
            applied = await self._apply_locked(conn, procurement_id, event, source, now)
        if applied is not None:
            self._after_commit(applied, source)
        return applied

    async def _apply_locked(
        self, conn: AsyncConnection, procurement_id: int, event: Event, source: Source, now: datetime
    ) -> Applied | None:
        row = await store.lock_procurement(conn, procurement_id)
        if row is None:
            return None
        return await self._apply_to_row(conn, row, event, source, now)

    async def _apply_to_row(
        self, conn: AsyncConnection, row: Any, event: Event, source: Source, now: datetime
    ) -> Applied:
        """Decide and write ``event`` for ``row``, locked by this transaction."""
        numbers = await store.numbers_of(conn, row.id)
        decision = decide(snapshot_of(row, numbers), event, now, self.policy, self.rng)
        applied = Applied(row.id, row.order_no, State(row.state), decision)
        if decision.noop:
            return applied
        if decision.changes or decision.state.value != row.state:
            await store.update_procurement(conn, row, decision.state, decision.changes, now)
        order_id = decision.changes.get("upstream_order_id", row.upstream_order_id)
        if decision.burn_number:
            await store.record_number_order(
                conn, row.upstream, row.downstream_order_no, order_id, canceled=True
            )
        elif decision.changes.get("upstream_order_id") is not None:
            await store.record_number_order(conn, row.upstream, row.downstream_order_no, order_id)
        if decision.new_number is not None:
            await store.insert_number(conn, row.upstream, decision.new_number, row.id, now)
        if decision.record:
            await self._audit(conn, row, decision, source, now)
        if decision.state.value != row.state or "fulfillment" in decision.changes:
            await self._refresh_order(conn, row.order_no, now)
        log.info(
            "procurement.changed" if decision.state.value != row.state else "procurement.recorded",
            procurement_id=row.id,
            order_no=row.order_no,
            downstream_order_no=row.downstream_order_no,
            source=source.value,
            decision=decision.event,
            old_state=row.state,
            new_state=decision.state.value,
        )
        return applied

    @staticmethod
    async def _audit(
        conn: AsyncConnection, row: Any, decision: Decision, source: Source, now: datetime
    ) -> None:
        await store.add_audit(
            conn,
            order_no=row.order_no,
            procurement_id=row.id,
            source=source.value,
            event=decision.event,
            old_state=row.state,
            new_state=decision.state.value,
            detail=decision.detail,
            now=now,
        )

    def _after_commit(self, applied: Applied, source: Source) -> None:
        if self.on_change is not None and applied.changed:
            self.on_change(applied, source.value)
        if applied.decision.state is State.QUEUED and applied.old_state is not State.QUEUED:
            # Retried by a person: wake the upstream's workers.
            for event in self.wakeups.queued.values():
                event.set()
        self.wakeups.events.set()

    async def _refresh_order(
        self, conn: AsyncConnection, order_no: str, now: datetime, baseline: tuple[str, bool] | None = None
    ) -> None:
        """Derive the order's status from its procurements; on a change, store it and queue an event."""
        order = await store.get_order(conn, order_no)
        assert order is not None
        items = await store.procurements_of(conn, order_no)
        new = derive_status(item_state(item) for item in items)
        old = baseline if baseline is not None else (order.status, bool(order.exception))
        if (order.status, bool(order.exception)) != new:
            await store.set_order_status(conn, order_no, new[0], new[1], now)
        name = event_for(old, new)
        if name is None or not self.settings.storefront.webhook_url:
            return
        view = await self._order_view(conn, order_no)
        payload = {"event": name, "timestamp": int(now.timestamp()), "order": view}
        await store.add_event(conn, order_no, name, payload, now)

    # --- callbacks and polls ------------------------------------------------------------------------------

    async def report(self, upstream: str, number: str, report: UpstreamReport, source: Source) -> Applied:
        """Apply what the upstream says about the order under ``number``, in one transaction.

        The number is matched within the upstream that sent it, and the order id must agree with the one
        known for that number: matching on the number alone would let one upstream settle another's order.
        """
        now = self.clock()
        async with self.engine.begin() as conn:
            match = await store.find_number(conn, upstream, number)
            row = await store.lock_procurement(conn, match.procurement_id) if match else None
            if match is None or row is None:
                raise ReportRejected(f"no order {number!r} for upstream {upstream!r}")
            if match.upstream_order_id is not None and match.upstream_order_id != report.order_id:
                raise ReportRejected(f"order {number!r} has another upstream order id")
            if row.downstream_order_no != number:
                # About an order under a number the procurement no longer uses (the upstream canceled it).
                return await self._record_old_number(conn, row, number, report, source, now)
            applied = await self._apply_to_row(conn, row, report, source, now)
        self._after_commit(applied, source)
        return applied

    async def _record_old_number(
        self,
        conn: AsyncConnection,
        row: Any,
        number: str,
        report: UpstreamReport,
        source: Source,
        now: datetime,
    ) -> Applied:
        decision = Decision(
            State(row.state),
            "status_for_previous_number",
            detail={"downstream_order_no": number, "status": report.status, "order_id": report.order_id},
        )
        await self._audit(conn, row, decision, source, now)
        log.warning(
            "procurement.previous_number_report",
            procurement_id=row.id,
            downstream_order_no=number,
            status=report.status,
        )
        return Applied(row.id, row.order_no, State(row.state), decision)

    # --- claims for workers and pollers -------------------------------------------------------------------

    async def claim_due(self, upstream: str, worker: str, limit: int = 1) -> Sequence[Any]:
        """Claim due procurements; the claim (and the attempt count) is committed before any upstream call."""
        async with self.engine.begin() as conn:
            return await store.claim_due(conn, upstream, worker, self.clock(), self.lease, limit)

    async def claim_polls(self, upstream: str, limit: int) -> Sequence[Any]:
        async with self.engine.begin() as conn:
            return await store.claim_polls(conn, upstream, self.clock(), self.lease, limit)

    async def next_due_at(self, upstream: str) -> datetime | None:
        async with self.engine.connect() as conn:
            return await store.next_due_at(conn, upstream)

    # --- people -------------------------------------------------------------------------------------------

    async def cancel(self, order_no: str, cancel_upstream: UpstreamCancel) -> dict[str, Any]:
        """Upstream-first cancel of a whole order; raises :class:`CancelDenied` when any item cannot be.

        Items never sent are canceled locally; items with a live upstream order only once the upstream
        confirmed the cancel. Nothing is canceled locally unless every item can be.
        """
        async with self.engine.connect() as conn:
            order = await store.get_order(conn, order_no)
            if order is None:
                raise KeyError(order_no)
            rows = await store.procurements_of(conn, order_no)
            snapshots = {row.id: snapshot_of(row, await store.numbers_of(conn, row.id)) for row in rows}
        upstream_first = [row for row in rows if needs_upstream_cancel(snapshots[row.id])]
        refusals = [
            CancelItem(row.id, row.downstream_order_no, reason)
            for row in rows
            if row not in upstream_first
            and row.state != State.CANCELED.value
            and (reason := cancel_refusal(snapshots[row.id])) is not None
        ]
        if refusals:
            raise CancelDenied(refusals)
        confirmed: list[int] = []
        for row in upstream_first:
            try:
                await cancel_upstream(row.upstream, row.upstream_order_id)
            except Exception as exc:  # noqa: BLE001 - any refusal or failure denies the cancel
                code = getattr(exc, "code", type(exc).__name__)
                by_id = {r.id: r for r in rows}
                items = [CancelItem(row.id, row.downstream_order_no, f"upstream refused: {code}")]
                items += [
                    CancelItem(pid, by_id[pid].downstream_order_no, "canceled upstream") for pid in confirmed
                ]
                await self._record_upstream_cancels(confirmed)
                raise CancelDenied(items) from None
            confirmed.append(row.id)
        now = self.clock()
        events: list[tuple[int, Event]] = [(pid, Cancel(upstream_confirmed=True)) for pid in confirmed]
        events += [(row.id, Cancel(upstream_confirmed=False)) for row in rows if row not in upstream_first]
        try:
            async with self.engine.begin() as conn:
                applied_all = [
                    await self._apply_locked(conn, procurement_id, event, Source.ADMIN, now)
                    for procurement_id, event in events
                ]
                view = await self._order_view(conn, order_no)
        except NotAllowed as exc:
            # The state moved between the check and the write (a worker claimed an item meanwhile).
            await self._record_upstream_cancels(confirmed)
            raise CancelDenied([CancelItem(0, order_no, exc.message)]) from None
        for applied in applied_all:
            if applied is not None:
                self._after_commit(applied, Source.ADMIN)
        return view

    async def _record_upstream_cancels(self, procurement_ids: list[int]) -> None:
        """Items the upstream did cancel are canceled locally too, whatever happens to the rest."""
        for procurement_id in procurement_ids:
            await self.apply(procurement_id, Cancel(upstream_confirmed=True), Source.ADMIN)

    # --- reads --------------------------------------------------------------------------------------------

    async def order(self, order_no: str) -> dict[str, Any] | None:
        async with one_snapshot(self.engine) as conn:
            if await store.get_order(conn, order_no) is None:
                return None
            return await self._order_view(conn, order_no)

    async def _order_view(self, conn: AsyncConnection, order_no: str) -> dict[str, Any]:
        order = await store.get_order(conn, order_no)
        assert order is not None
        items = await store.procurements_of(conn, order_no)
        numbers = {
            item.id: [n.downstream_order_no for n in await store.numbers_of(conn, item.id)] for item in items
        }
        return order_view(order, items, numbers)

    async def procurement(self, procurement_id: int) -> dict[str, Any] | None:
        async with self.engine.connect() as conn:
            row = await store.get_procurement(conn, procurement_id)
        return exception_view(row) if row is not None else None

    async def exceptions(
        self, upstream: str | None, reason: str | None, page: int, page_size: int
    ) -> tuple[int, list[dict[str, Any]]]:
        async with self.engine.connect() as conn:
            total, rows = await store.list_exceptions(conn, upstream, reason, page, page_size)
        return total, [exception_view(row) for row in rows]

    async def retry_exceptions(
        self, upstream: str | None, reason: str | None, note: str | None, limit: int
    ) -> BulkRetry:
        """Send up to ``limit`` matching exceptions again, oldest first, each through :meth:`apply`.

        One that changed meanwhile (a person resolved it, another retry won) is reported as skipped.
        """
        async with self.engine.connect() as conn:
            total, ids = await store.exception_ids(conn, upstream, reason, limit)
        retried: list[int] = []
        skipped: list[dict[str, Any]] = []
        for procurement_id in ids:
            try:
                applied = await self.apply(procurement_id, Retry(note), Source.ADMIN)
            except NotAllowed as exc:
                skipped.append({"id": procurement_id, "error_code": exc.code, "message": exc.message})
                continue
            if applied is None:
                skipped.append(
                    {"id": procurement_id, "error_code": "procurement_not_found", "message": "it is gone"}
                )
                continue
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

    async def audit(self, order_no: str) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            rows = await store.audit_trail(conn, order_no)
        return [
            {
                "at": iso(row.at),
                "procurement_id": row.procurement_id,
                "source": row.source,
                "event": row.event,
                "old_state": row.old_state,
                "new_state": row.new_state,
                "detail": row.detail,
            }
            for row in rows
        ]


@asynccontextmanager
async def one_snapshot(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A read-only connection whose statements all see the database as of its first one.

    PostgreSQL's default READ COMMITTED gives every statement its own snapshot: an order row read before
    another instance's commit and its procurements read after it would disagree. SQLite's transactions
    already read one snapshot.
    """
    async with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        yield conn


def snapshot_of(row: Any, numbers: Sequence[Any]) -> Snapshot:
    current = next((n for n in numbers if n.downstream_order_no == row.downstream_order_no), None)
    return Snapshot(
        state=State(row.state),
        downstream_order_no=row.downstream_order_no,
        attempts=row.attempts,
        upstream_may_exist=bool(row.upstream_may_exist),
        number_canceled_upstream=bool(current.upstream_canceled) if current is not None else False,
        upstream_order_id=row.upstream_order_id,
        upstream_order_no=row.upstream_order_no,
        upstream_status=row.upstream_status,
        amount=row.amount,
        exception_reason=row.exception_reason,
        lease_owner=row.lease_owner,
        fulfillment=row.fulfillment,
        submitted_at=row.submitted_at,
        poll_interval_seconds=row.poll_interval_seconds,
        numbers_used=max(1, len(numbers)),
    )


def _sku_problem(sku: Any, manual_form_data: dict[str, Any] | None) -> tuple[str, str] | None:
    if sku is None:
        return "sku_not_found", "no such SKU in the mirrored catalogue (run a catalogue sync?)"
    if sku.sku_removed_at is not None or not sku.sku_active:
        return "sku_inactive", f"SKU {sku.id} is not active upstream"
    if sku.product_active is None:
        return "product_not_found", f"the product of SKU {sku.id} is not in the mirrored catalogue"
    if sku.product_removed_at is not None or not sku.product_active:
        return "product_inactive", f"product {sku.product_id} is not active upstream"
    if sku.fulfillment_type == "manual" and not manual_form_data:
        return (
            "manual_form_data_required",
            f"product {sku.product_id} is manual: manual_form_data is required",
        )
    return None


__all__ = [
    "Applied",
    "CancelDenied",
    "CancelItem",
    "IntakeResult",
    "ProcurementService",
    "ReportRejected",
    "Wakeups",
    "procurement_view",
    "snapshot_of",
]
