"""Claim confirmation: a report about an upstream order procurd has not recorded is taken only once confirmed.

An upstream report (a callback) that names an upstream order nothing recorded for its procurement changes
nothing on its own word (:class:`~procurd.procurement.transitions.ReportUnverified`).
:class:`ClaimConfirmation` decides what becomes of it:

1. a submission in flight is waited for first (a while at most): its answer records the order, and the report
   is then taken like any other (the usual case of a callback that overtakes the answer to the submission);
2. otherwise the upstream that sent it is asked for the order (a signed ``GET /orders/{order_id}`` at
   callback priority in the request budget), and the report is applied, as the upstream's answer says it,
   only when that answer is the order named, under the number, in a status that supports the claim
   (:func:`procurd.core.claims.claim_problem`);
3. a claim that is not confirmed is an audit entry ``callback_unverified`` on the procurement and a
   :class:`~procurd.procurement.transitions.ReportRejected` (``callback_unverified``, 404; or
   ``verification_unavailable``, 503, when the upstream could not be asked now). A claim the upstream did
   not confirm is refused again without asking for a minute.

Every change and read goes through the state path's commands (the service's writer); nothing here opens a
transaction.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Protocol

import structlog

from procurd.core.claims import claim_problem
from procurd.core.procurement import ClaimRefused, Event, Procurement, Source, UpstreamReport
from procurd.procurement.answers import report_of
from procurd.procurement.commands import Command, Current, Report, ReportRejected, ReportUnverified
from procurd.procurement.transitions import Applied, Result
from procurd.upstream.errors import BusinessError, UpstreamError
from procurd.upstream.models import UpstreamOrder
from procurd.upstream.ratelimit import Priority

log = structlog.get_logger("procurd.procurement")

# A claim about a procurement whose submission is in flight waits this long at most for the submission's
# answer (which records the order) before the upstream is asked.
SUBMISSION_WAIT_SECONDS = 10.0
SUBMISSION_RECHECK_SECONDS = 0.1
# A claim the upstream did not confirm is refused again without asking, for this long.
REFUSED_CLAIM_SECONDS = 60.0
REFUSED_CLAIMS_SIZE = 10_000


class OrderLookup(Protocol):
    """What confirmation asks of an upstream's client: its order (``GET /orders/{id}``)."""

    async def get_order(self, order_id: int, *, priority: Priority = ...) -> UpstreamOrder: ...


Run = Callable[[Command], Awaitable[Result]]
"""Runs one command on the state path's writer and returns its result once committed."""


class Apply(Protocol):
    """Decides and writes one event through the service (which tells the process what changed)."""

    def __call__(
        self, procurement_id: int, event: Event, source: Source, *, order_no: str | None = None
    ) -> Awaitable[Applied | None]: ...


class ClaimConfirmation:
    """Confirms (or refuses) the reports the state path could not take on their word; see the module."""

    def __init__(
        self,
        run: Run,
        apply: Apply,
        clients: Mapping[str, OrderLookup],
        clock: Callable[[], datetime],
    ) -> None:
        self._run = run
        self._apply = apply
        self._clients = dict(clients)
        self._clock = clock
        # Who waits for the next change of a procurement (a claim waiting for a submission's answer).
        self._watchers: dict[int, list[asyncio.Future[None]]] = {}
        # Claims the upstream did not confirm: (upstream, number, order id, status) -> (until, why).
        self._refused: OrderedDict[tuple[str, str, int, str], tuple[float, str]] = OrderedDict()

    @property
    def awaiting_submissions(self) -> frozenset[int]:
        """The procurements whose submission's answer a report waits for here now."""
        return frozenset(self._watchers)

    def changed(self, procurement_id: int) -> None:
        """The procurement changed in this process: a report waiting on it looks again at once."""
        if self._watchers:
            for waiter in self._watchers.pop(procurement_id, ()):
                if not waiter.done():
                    waiter.set_result(None)

    async def confirm(self, command: Report, unverified: ReportUnverified) -> Result:
        """The report ``command`` about an order procurd has not recorded, applied once it is confirmed;
        otherwise an audit entry ``callback_unverified`` and :class:`ReportRejected`."""
        if unverified.submission_in_flight:
            await self._submission_settled(unverified.procurement)
            try:
                return await self._run(command)
            except ReportUnverified as still:
                unverified = still
        upstream, number, report = command.upstream, command.number, command.report
        claim = (upstream, number, report.order_id, report.status)
        now = time.monotonic()
        known = self._refused.get(claim)
        code, status = "callback_unverified", 404
        client = self._clients.get(upstream)
        if known is not None and known[0] > now:
            reason = known[1]  # refused a moment ago: not asked again
        elif client is None:
            reason = "the upstream was not asked"
        else:
            try:
                order = await client.get_order(report.order_id, priority=Priority.CALLBACK)
            except BusinessError as exc:
                reason = f"asked for the order, it answered {exc.code}"
            except UpstreamError as exc:
                reason = f"asking failed: {exc.code}"
                code, status = "verification_unavailable", 503
            else:
                problem = _problem(number, report, order)
                if problem is None:
                    confirmed = report_of(order, polled=False, verified=True)
                    return await self._run(Report(upstream, number, confirmed, command.source))
                reason = problem
            if status == 404:
                self._remember_refused(claim, now + REFUSED_CLAIM_SECONDS, reason)
        await self._refuse(command, unverified.procurement, reason)
        claimed = f"upstream order {report.order_id} ({report.status}) for {number!r}"
        if status == 503:
            message = f"{claimed} cannot be confirmed with {upstream} now ({reason}): send it again later"
        else:
            message = f"{claimed} is not confirmed by {upstream}: {reason}"
        raise ReportRejected(message, code=code, status=status)

    async def _refuse(self, command: Report, p: Procurement, reason: str) -> None:
        """The audit entry ``callback_unverified`` on ``p``, and the log line."""
        report = command.report
        event = ClaimRefused(report.order_id, report.status, reason)
        await self._apply(p.id, event, command.source, order_no=p.order_no)
        log.warning(
            "report.unverified",
            upstream=command.upstream,
            downstream_order_no=command.number,
            order_id=report.order_id,
            status=report.status,
            source=command.source.value,
            reason=reason,
        )

    def _remember_refused(self, claim: tuple[str, str, int, str], until: float, reason: str) -> None:
        self._refused[claim] = (until, reason)
        self._refused.move_to_end(claim)
        while len(self._refused) > REFUSED_CLAIMS_SIZE:
            self._refused.popitem(last=False)

    async def _submission_settled(self, p: Procurement) -> None:
        """Wait (a while at most) until ``p``'s submission in flight has its answer recorded: told at once
        when this process records it, seen by a look through the state path otherwise (a submitter of
        another instance)."""
        loop = asyncio.get_running_loop()
        lease_left = (p.lease_expires_at - self._clock()).total_seconds() if p.lease_expires_at else 0.0
        deadline = loop.time() + min(SUBMISSION_WAIT_SECONDS, max(0.0, lease_left))
        while loop.time() < deadline:
            waiter: asyncio.Future[None] = loop.create_future()
            watchers = self._watchers.setdefault(p.id, [])
            watchers.append(waiter)
            try:
                current = await self._run(Current(p.id, p.order_no))
                assert current is None or isinstance(current, Procurement)
                if current is None or current.lease_owner != p.lease_owner or current.state is not p.state:
                    return
                left = deadline - loop.time()
                if left > 0:
                    await asyncio.wait((waiter,), timeout=min(left, SUBMISSION_RECHECK_SECONDS))
                if waiter.done():
                    return  # it changed here (its submission's answer, most likely)
            finally:
                if waiter in watchers:
                    watchers.remove(waiter)
                if not watchers:
                    self._watchers.pop(p.id, None)


def _problem(number: str, report: UpstreamReport, order: UpstreamOrder) -> str | None:
    return claim_problem(
        number=number,
        claimed_order_id=report.order_id,
        claimed_status=report.status,
        answered_order_id=order.order_id,
        answered_number=order.downstream_order_no,
        answered_status=order.status,
    )
