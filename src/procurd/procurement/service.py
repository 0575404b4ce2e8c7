"""The procurement service: the process's one door to the state path, for commands only.

Every change — intake, claims, submission answers, callbacks, polls, a person's actions — is a command for
:mod:`procurd.procurement.transitions`, committed by the group-commit writer; the caller gets its result once
it is durable. A read the state path needs comes back with a command's result (a claim's next due time) or
is a command itself (what a claim's confirmation waits on): the service opens no transaction of its own.
After each commit the service tells the rest of the process what changed: submitters wake for new work, the
storefront dispatcher for new events, metrics and logs count the transitions.

Reads for people (the order view, the exception queue, the audit trail) are in
:mod:`procurd.operations.views`; a report about an upstream order procurd has not recorded is confirmed by
:class:`~procurd.procurement.confirmation.ClaimConfirmation`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

import structlog

from procurd.config import Settings
from procurd.core.intake import OrderRequest
from procurd.core.machine import Policy
from procurd.core.procurement import (
    Event,
    Source,
    State,
    UpstreamReport,
)
from procurd.core.provider import ProviderTerms
from procurd.db.batching import BatchWriter
from procurd.db.database import Database
from procurd.db.types import utcnow
from procurd.instance import instance_id
from procurd.procurement.commands import (
    Change,
    ChangeAll,
    ClaimPolls,
    ClaimSubmissions,
    Command,
    Intake,
    ProviderPlacement,
    ReleaseClaims,
    Report,
    ReportUnverified,
    Rules,
)
from procurd.procurement.confirmation import ClaimConfirmation, OrderLookup
from procurd.procurement.settled import SettledNumbers
from procurd.procurement.transitions import Applied, Claimed, IntakeResult, Result, apply_batch

log = structlog.get_logger("procurd.procurement")

Clock = Callable[[], datetime]
Observer = Callable[[Applied], None]


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
            provider=ProviderTerms(
                settings.provider.currency,
                frozenset(settings.offered_upstreams()),
                {level.slug: level.discount() for level in settings.provider.levels},
            ),
        )
        self._writer: BatchWriter[Command, Result] = BatchWriter(
            database, partial(apply_batch, rules=self.rules)
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

    async def submit(self, request: OrderRequest) -> IntakeResult:
        """Accept a locally paid order: validate it against the mirror and queue one procurement per item.

        Never calls an upstream. A repeat of the same body returns the existing order; the same number with
        another body raises ``order_conflict`` (:class:`procurd.core.intake.IntakeError`).
        """
        request = request.with_upstream(self.rules.default_upstream)
        result = await self._submit(Intake(request, request.fingerprint()))
        return self._accepted(result, request.order_no, len(request.items))

    async def place(self, placement: ProviderPlacement) -> IntakeResult:
        """A downstream site's order, checked against the mirror, priced, charged to its wallet and taken in
        for procurement in one transaction (:mod:`procurd.procurement.provider_orders`); or the earlier order
        it repeats. Raises :class:`~procurd.core.refusals.Refused` with what the downstream is told when it
        cannot be sold as asked (nothing written)."""
        return self._accepted(await self._submit(placement), placement.order_no, 1)

    def _accepted(self, result: Result, order_no: str, items: int) -> IntakeResult:
        assert isinstance(result, IntakeResult)
        if result.created:
            for applied in result.admitted:
                self._after(applied)
            log.info("order.accepted", order_no=order_no, items=items)
        return result

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

    async def claim_submissions(self, upstream: str, owner: str, limit: int) -> Claimed:
        """Claim due procurements; the claim (and the attempt) is committed before any upstream call. With
        fewer than ``limit`` claimed, the result says when the next one can be claimed."""
        return await self._claims(ClaimSubmissions(upstream, owner, limit))

    async def claim_polls(self, upstream: str, owner: str, limit: int) -> Claimed:
        """Claim procurements due for a fallback poll; their next poll moves out until the answer comes. With
        fewer than ``limit`` claimed, the result says when the next poll falls due."""
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

    async def _claims(self, command: ClaimSubmissions | ClaimPolls) -> Claimed:
        """What was claimed; a claim that moved a procurement on instead (an exception over its limit, an
        offer's next source) is carried out like any other change."""
        result = await self._submit(command)
        assert isinstance(result, Claimed)
        for applied in result.moved:
            self._after(applied)
        return result

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
    "Claimed",
    "IntakeResult",
    "ProcurementService",
    "ReportOutcome",
    "Wakeups",
]
