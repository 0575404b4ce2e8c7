"""The procurement service: the process's one door to the state path, and the reads of the HTTP API.

Every change — intake, claims, submission answers, callbacks, polls, a person's actions — is a command for
:mod:`procurd.procurement.transitions`, committed by the group-commit writer; the caller gets its result once
it is durable. After each commit the service tells the rest of the process what changed: submitters wake for
new work, the storefront dispatcher for new events, metrics and logs count the transitions.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

import structlog

from procurd.config import Settings
from procurd.core.intake import OrderRequest
from procurd.core.machine import Policy, decide
from procurd.core.numbers import item_number
from procurd.core.orders import exception_view, iso, order_view
from procurd.core.procurement import (
    Event,
    NotAllowed,
    Procurement,
    Reason,
    Retry,
    Source,
    State,
    UpstreamReport,
)
from procurd.core.provider import ProviderIntake
from procurd.db.batching import BatchWriter
from procurd.db.database import Database
from procurd.db.stores import Tx
from procurd.db.types import utcnow
from procurd.instance import instance_id
from procurd.procurement.admission import admit_items, item_sources, preview_view
from procurd.procurement.confirmation import ClaimConfirmation, OrderLookup
from procurd.procurement.settled import SettledNumbers
from procurd.procurement.transitions import (
    Applied,
    Change,
    ChangeAll,
    Claimed,
    ClaimPolls,
    ClaimSubmissions,
    Command,
    Intake,
    IntakeResult,
    ReleaseClaims,
    Report,
    ReportRejected,
    ReportUnverified,
    Result,
    Rules,
    apply_batch,
)
from procurd.upstream.errors import AUTH_ERROR_CODES, BUSINESS_ERROR_CODES

log = structlog.get_logger("procurd.procurement")

Clock = Callable[[], datetime]
Observer = Callable[[Applied], None]

# Exception reasons: procurd's own, and the upstream's refusal codes it records as they come.
ASSIGNED_REASONS = frozenset(
    {reason.value for reason in Reason}
    | AUTH_ERROR_CODES
    | BUSINESS_ERROR_CODES
    | {"auth_error", "business_error"}
)
DEFAULT_BULK_RETRY = 100  # exceptions one bulk retry sends again unless told otherwise
MAX_BULK_RETRY = 1000


@dataclass(frozen=True, slots=True)
class BulkRetry:
    """What a bulk retry did: the ids queued again, the ones skipped (with why) and how many still match."""

    retried: list[int]
    skipped: list[dict[str, Any]]
    remaining: int


@dataclass(frozen=True, slots=True)
class ReportOutcome:
    """What a callback or poll did: the decision's name, and whether anything was written."""

    outcome: str
    changed: bool
    verified: bool = False  # it named an order not recorded yet, which the upstream confirmed


@dataclass
class Wakeups:
    """In-process signals so submitters and the storefront dispatcher react at once."""

    queued: dict[str, asyncio.Event] = field(default_factory=dict)
    polls: dict[str, asyncio.Event] = field(default_factory=dict)
    events: asyncio.Event = field(default_factory=asyncio.Event)
    provider_callbacks: asyncio.Event = field(default_factory=asyncio.Event)

    def for_upstream(self, upstream: str) -> asyncio.Event:
        """Set when ``upstream`` has a procurement to submit, now or at a new due time."""
        return self.queued.setdefault(upstream, asyncio.Event())

    def for_polls(self, upstream: str) -> asyncio.Event:
        """Set when a fallback poll of ``upstream`` was scheduled."""
        return self.polls.setdefault(upstream, asyncio.Event())


class ProcurementService:
    def __init__(
        self,
        database: Database,
        settings: Settings,
        *,
        clock: Clock = utcnow,
        rng: random.Random | None = None,
        wakeups: Wakeups | None = None,
        observers: Sequence[Observer] = (),
        writer: str | None = None,
        clients: Mapping[str, OrderLookup] | None = None,
    ) -> None:
        self.database = database
        self.settings = settings
        self.clock = clock
        self.wakeups = wakeups or Wakeups()
        self.observers = list(observers)
        procurement = settings.procurement
        self.policy = Policy(
            max_attempts=procurement.max_attempts,
            retry_base_seconds=procurement.retry_base_seconds,
            retry_max_seconds=procurement.retry_max_seconds,
            poll_initial_seconds=procurement.poll_initial_seconds,
            poll_max_seconds=procurement.poll_max_seconds,
        )
        self.upstream_names = [upstream.name for upstream in settings.upstreams]
        self.provider = settings.provider.enabled
        self.rules = Rules(
            policy=self.policy,
            upstreams=tuple(self.upstream_names),
            lease_seconds=procurement.lease_seconds,
            storefront_events=bool(settings.storefront.webhook_url),
            clock=clock,
            rng=rng,
            alert_repeat_after=settings.alerts.repeat_after_seconds,
            alert_delivery=bool(settings.alerts.urls),
            pricing=settings.pricing.compiled().rules,
            writer=writer or instance_id(),
        )
        self._writer: BatchWriter[Command, Result] = BatchWriter(
            database, partial(_run_batch, rules=self.rules)
        )
        self._settled = SettledNumbers()
        # Reports about upstream orders procurd has not recorded: confirmed with the upstream, or refused.
        self.confirmation = ClaimConfirmation(self._writer.submit, self.apply, clients or {}, clock)

    async def close(self) -> None:
        """Commit what was submitted and stop the writer."""
        await self._writer.close()

    @property
    def transactions(self) -> tuple[int, int]:
        """Write transactions committed and commands they carried, since start."""
        return self._writer.transactions, self._writer.commands

    # --- changes ------------------------------------------------------------------------------------------

    async def submit(self, request: OrderRequest, provider: ProviderIntake | None = None) -> IntakeResult:
        """Accept a locally paid order: validate it against the mirror and queue one procurement per item.

        Never calls an upstream. A repeat of the same body returns the existing order; the same number with
        another body raises ``order_conflict`` (:class:`procurd.core.intake.IntakeError`). With ``provider``
        the order is a downstream site's, charged to its wallet in the same transaction (see
        :mod:`procurd.procurement.provider_orders`).
        """
        default = self.upstream_names[0] if len(self.upstream_names) == 1 else None
        request = request.with_upstream(default)
        result = await self._submit(Intake(request, request.fingerprint(), provider))
        assert isinstance(result, IntakeResult)
        if result.created:
            for applied in result.admitted:
                self._after(applied)
            log.info("order.accepted", order_no=request.order_no, items=len(request.items))
        return result

    async def preview(self, request: OrderRequest) -> dict[str, Any]:
        """What :meth:`submit` would do with ``request`` now, decided by the same code
        (:func:`procurd.procurement.admission.admit_items` and the state machine's admission), writing
        nothing: ``POST /api/v1/orders/preview``'s answer."""
        default = self.upstream_names[0] if len(self.upstream_names) == 1 else None
        request = request.with_upstream(default)
        order_no = request.order_no

        def read(tx: Tx) -> tuple[Any, Any, Any, str | None]:
            offers = tx.offers.many(item.offer for item in request.items if item.offer is not None)
            sku_keys: list[tuple[str, int]] = []
            number_keys: list[tuple[str, str]] = []
            for position, item in enumerate(request.items):
                keys = item_sources(item, offers)
                sku_keys += keys
                number_keys += [(upstream, item_number(order_no, position)) for upstream, _ in keys]
            store = tx.procurements
            found = store.order(order_no)
            existing = None if found is None else found[0].fingerprint
            return offers, store.numbers(number_keys), store.mirrored_skus(sku_keys), existing

        offers, numbers, skus, existing = await self.database.read(read)

        def taken(upstream: str, number: str) -> bool:  # by another order: an order's own are its own
            row = numbers.get((upstream, number))
            return row is not None and row.order_no != order_no

        rules = self.rules
        admitted = admit_items(
            request, taken=taken, skus=skus, offers=offers, upstreams=rules.upstreams, pricing=rules.pricing
        )
        now = self.clock()
        decisions = [
            None if item.admit is None else decide(None, item.admit, now, rules.policy) for item in admitted
        ]
        return preview_view(request, admitted, decisions, skus, rules.pricing, existing)

    async def apply(
        self, procurement_id: int, event: Event, source: Source, *, order_no: str | None = None
    ) -> Applied | None:
        """Decide and write one event; ``None`` when the procurement does not exist.

        Raises :class:`NotAllowed` (nothing written) when the event does not apply.
        """
        result = await self._submit(Change(procurement_id, event, source, order_no))
        assert result is None or isinstance(result, Applied)
        if result is not None:
            self._after(result)
        return result

    async def apply_all(
        self, order_no: str, events: Sequence[tuple[int, Event]], source: Source
    ) -> list[Applied]:
        """Events for several procurements of one order, all written or none (:class:`NotAllowed`)."""
        result = await self._submit(ChangeAll(order_no, tuple(events), source))
        assert isinstance(result, list)
        applied_all = [applied for applied in result if isinstance(applied, Applied)]
        for applied in applied_all:
            self._after(applied)
        return applied_all

    async def report(
        self, upstream: str, number: str, report: UpstreamReport, source: Source
    ) -> ReportOutcome:
        """Apply what the upstream says about the order under ``number`` of ``upstream``.

        The number is matched within the upstream that sent it, and the order id must agree with the one
        known for that number: matching on the number alone would let one upstream settle another's order.
        A report naming an upstream order that nothing recorded for the procurement is taken only once
        :attr:`confirmation` confirms it. Raises :class:`ReportRejected` when nothing matches or the claim is
        not confirmed.
        """
        if self._settled.repeats(upstream, number, report):
            return ReportOutcome("duplicate", False)
        verified = False
        command = Report(upstream, number, report, source)
        try:
            result = await self._submit(command)
        except ReportUnverified as unverified:
            result = await self.confirmation.confirm(command, unverified)
            verified = isinstance(result, Applied) and result.decision.detail.get("verified") is True
        assert isinstance(result, Applied)
        self._after(result)
        self._settled.remember(upstream, number, report, result.procurement)
        return ReportOutcome(result.decision.event, result.changed, verified)

    async def claim_submissions(self, upstream: str, owner: str, limit: int) -> list[Procurement]:
        """Claim due procurements; the claim (and the attempt) is committed before any upstream call."""
        return await self._claims(ClaimSubmissions(upstream, owner, limit))

    async def claim_polls(self, upstream: str, owner: str, limit: int) -> list[Procurement]:
        """Claim procurements due for a fallback poll; their next poll moves out until the answer comes."""
        return await self._claims(ClaimPolls(upstream, owner, limit))

    async def release_claims(self, instances: Sequence[str]) -> list[Applied]:
        """The submissions and polls ``instances`` had claimed may be taken again at once (the instances are
        gone)."""
        result = await self._submit(ReleaseClaims(tuple(instances)))
        assert isinstance(result, list)
        released = [applied for applied in result if isinstance(applied, Applied)]
        for applied in released:
            self._after(applied)
        if released:
            for upstream in {applied.procurement.upstream for applied in released}:
                self.wakeups.for_upstream(upstream).set()
        return released

    async def _claims(self, command: ClaimSubmissions | ClaimPolls) -> list[Procurement]:
        """What was claimed; a claim that moved a procurement on instead (an exception over its limit, an
        offer's next source) is carried out like any other change."""
        result = await self._submit(command)
        assert isinstance(result, Claimed)
        for applied in result.moved:
            self._after(applied)
        return result.procurements

    async def retry_exceptions(
        self, upstream: str | None, reason: str | None, note: str | None, limit: int
    ) -> BulkRetry:
        """Send up to ``limit`` matching exceptions again, oldest first, each through the state path.

        One that changed meanwhile (a person resolved it, another retry won) is reported as skipped.
        """
        total, ids = await self.database.read(
            lambda tx: tx.procurements.exception_ids(upstream, reason, limit)
        )
        outcomes = await asyncio.gather(
            *(self.apply(pid, Retry(note), Source.ADMIN) for pid in ids), return_exceptions=True
        )
        retried: list[int] = []
        skipped: list[dict[str, Any]] = []
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

    async def _submit(self, command: Command) -> Result:
        return await self._writer.submit(command)

    def _after(self, applied: Applied) -> None:
        """What the process does once a change is durable."""
        if not applied.changed:
            return
        p = applied.procurement
        self.confirmation.changed(p.id)
        self._settled.forget(p)
        if p.state is State.QUEUED and p.lease_owner is None:
            self.wakeups.for_upstream(p.upstream).set()
        if p.next_poll_at is not None and p.next_poll_at != applied.before.next_poll_at:
            self.wakeups.for_polls(p.upstream).set()
        if self.rules.storefront_events and applied.state_changed:
            self.wakeups.events.set()
        if self.provider and (applied.state_changed or p.upstream_status != applied.before.upstream_status):
            # A provider order also shows the upstream's passed-through statuses (fulfilling ...).
            self.wakeups.provider_callbacks.set()
        _log(applied)
        for observer in self.observers:
            observer(applied)

    # --- reads --------------------------------------------------------------------------------------------

    async def order(self, order_no: str) -> dict[str, Any] | None:
        found = await self.database.read(lambda tx: tx.procurements.order(order_no))
        return None if found is None else order_view(*found)

    async def procurement(self, procurement_id: int) -> dict[str, Any] | None:
        found = await self.database.read(lambda tx: tx.procurements.procurement(procurement_id))
        return None if found is None else exception_view(found)

    async def exceptions(
        self, upstream: str | None, reason: str | None, page: int, page_size: int
    ) -> tuple[int, list[dict[str, Any]]]:
        total, items = await self.database.read(
            lambda tx: tx.procurements.exceptions(upstream, reason, page, page_size)
        )
        return total, [exception_view(item) for item in items]

    async def audit(self, order_no: str) -> list[dict[str, Any]]:
        rows = await self.database.read(lambda tx: tx.procurements.audit_trail(order_no))
        return [
            {
                "at": iso(row.at),
                "procurement_id": row.procurement_id,
                "source": row.source,
                "event": row.event,
                "old_state": row.old_state,
                "new_state": row.new_state,
                "detail": row.detail,
                "count": row.count,
                "last_at": iso(row.last_at) if row.last_at is not None else None,
            }
            for row in rows
        ]

    async def filter_problem(self, upstream: str | None, reason: str | None) -> tuple[str, str] | None:
        """``(code, message)`` when an exception filter names no upstream or reason procurd knows (a typo),
        with the known values; ``None`` when it is fine."""
        if upstream is not None and upstream not in self.upstream_names:
            known = ", ".join(self.upstream_names)
            return "unknown_upstream", f"no upstream {upstream!r} (configured: {known})"
        if reason is not None:
            reasons = await self.known_reasons()
            if reason not in reasons:
                return "unknown_reason", f"no exception reason {reason!r} (known: {', '.join(reasons)})"
        return None

    async def known_reasons(self) -> list[str]:
        """Every exception reason procurd assigns, and those the database holds (upstreams may add codes)."""
        held = await self.database.read(lambda tx: tx.procurements.exception_reasons())
        found = {reason for reasons in held.values() for reason in reasons}
        return sorted(ASSIGNED_REASONS | found)

    async def next_submission_due(self, upstream: str) -> datetime | None:
        return await self.database.read(lambda tx: tx.procurements.next_submission_due(upstream))

    async def next_poll_due(self, upstream: str) -> datetime | None:
        return await self.database.read(lambda tx: tx.procurements.next_poll_due(upstream))


def _run_batch(tx: Tx, commands: Sequence[Command], rules: Rules) -> list[Result | Exception]:
    return apply_batch(tx, commands, rules)


def _log(applied: Applied) -> None:
    p = applied.procurement
    decision = applied.decision
    fields = {
        "procurement_id": p.id,
        "order_no": p.order_no,
        "downstream_order_no": p.downstream_order_no,
        "upstream": p.upstream,
        "source": applied.source.value,
        "decision": decision.event,
        "old_state": applied.before.state.value,
        "new_state": p.state.value,
    }
    if decision.event in ("claimed", "poll_claimed", "poll_unchanged"):
        log.debug("procurement.recorded", **fields)
    elif p.state is State.EXCEPTION and applied.state_changed:
        log.warning(
            "procurement.exception",
            **fields,
            reason=p.exception_reason,
            code=p.last_error_code,
            error=p.last_error_message,
        )
    elif decision.event == "failover":
        log.info(
            "procurement.failover",
            **fields,
            offer=p.offer_code,
            left=decision.detail.get("from"),
            to=decision.detail.get("to"),
            skipped=decision.detail.get("skipped"),
        )
    elif decision.event == "retry_scheduled":
        log.info(
            "procurement.retry_scheduled",
            **fields,
            code=decision.detail.get("code"),
            attempt=decision.detail.get("attempt"),
            max_attempts=decision.detail.get("max_attempts"),
            next_attempt_at=decision.detail.get("next_attempt_at"),
        )
    else:
        log.info("procurement.changed" if applied.state_changed else "procurement.recorded", **fields)


__all__ = [
    "Applied",
    "BulkRetry",
    "IntakeResult",
    "ProcurementService",
    "ReportOutcome",
    "ReportRejected",
    "ReportUnverified",
    "Wakeups",
]
