"""Reconciliation: the upstream's word on every recent order, compared with procurd's, and repaired.

A pass asks the upstream for the order of each procurement in the window (``GET /orders/:id`` at the lowest
request priority) and compares status, amount and currency. A difference is a finding (``reconcile_findings``,
alert ``reconcile_mismatch``); with repair it is applied through the state path like a callback
(:class:`procurd.core.procurement.Reconciled`): delivered upstream but not here becomes delivered, refunded or
canceled upstream after its delivery here becomes exception ``upstream_refunded``, an amount that differs
exception ``amount_mismatch``. It catches what polls never see: real upstreams send no callback for refunds.

The scheduled pass checks the unsettled procurements, and once a day the settled ones too; ``procurd
reconcile`` checks every procurement in the window.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import structlog

from procurd.core.alerts import Kind, Occurrence
from procurd.core.clock import utcnow
from procurd.core.orders import iso
from procurd.core.procurement import NotAllowed, Procurement, Reconciled, Source
from procurd.core.reconcile import Mismatch, mismatches
from procurd.core.records import Finding
from procurd.db.database import Database
from procurd.db.views import WithReconcile
from procurd.operations.alerts import Alerts
from procurd.procurement.answers import answer_problem, finding_of, report_of
from procurd.procurement.service import ProcurementService
from procurd.upstream.errors import BusinessError, UpstreamError
from procurd.upstream.interface import Upstream
from procurd.upstream.ratelimit import Priority

log = structlog.get_logger("procurd.reconcile")

FULL_CHECK_EVERY = timedelta(days=1)
MAX_PER_PASS = 5000
CONCURRENCY = 4


@dataclass
class ReconcileReport:
    run_id: int
    trigger: str
    checked: int = 0
    repaired: int = 0
    errors: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def mismatches(self) -> int:
        return len({finding.procurement_id for finding in self.findings})


async def reconcile(
    service: ProcurementService,
    clients: Mapping[str, Upstream],
    alerts: Alerts,
    *,
    upstream: str | None = None,
    window_seconds: float,
    repair: bool,
    trigger: str = "scheduled",
) -> ReconcileReport:
    """One pass. ``trigger`` is ``scheduled`` (unsettled procurements; settled ones too once a day, which
    makes it ``daily``) or ``manual`` (every procurement in the window)."""
    database = service.database
    now = utcnow()
    if trigger == "scheduled":
        last_full = await database.read(lambda tx: tx.reconcile.last_full_check())
        if last_full is None or now - last_full >= FULL_CHECK_EVERY:
            trigger = "daily"
    include_settled = trigger in ("daily", "manual")
    since = now - timedelta(seconds=window_seconds)
    run_id = await database.write(lambda tx: tx.reconcile.start(upstream, trigger, now))
    report = ReconcileReport(run_id, trigger)
    log.info("reconcile.started", run_id=run_id, trigger=trigger, upstream=upstream)
    error: str | None = None
    try:
        candidates = await database.read(
            lambda tx: tx.procurements.reconcile_candidates(since, upstream, include_settled, MAX_PER_PASS)
        )
        gate = asyncio.Semaphore(CONCURRENCY)

        async def check(p: Procurement) -> None:
            async with gate:
                await _check(service, clients[p.upstream], p, repair, report)

        await asyncio.gather(*(check(p) for p in candidates if p.upstream in clients))
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        finished = utcnow()
        status = "ok" if error is None else "failed"
        findings = list(report.findings)
        await database.write(lambda tx: tx.reconcile.add_findings(run_id, findings))
        await database.write(
            lambda tx: tx.reconcile.finish(
                run_id,
                status=status,
                checked=report.checked,
                repaired=report.repaired,
                errors=report.errors,
                error=error,
                now=finished,
            )
        )
    await alerts.raise_(*_alerts(report.findings, repair))
    log.info(
        "reconcile.finished",
        run_id=run_id,
        trigger=trigger,
        checked=report.checked,
        mismatches=report.mismatches,
        repaired=report.repaired,
        errors=report.errors,
    )
    return report


async def _check(
    service: ProcurementService, client: Upstream, p: Procurement, repair: bool, report: ReconcileReport
) -> None:
    assert p.upstream_order_id is not None
    try:
        order = await client.get_order(p.upstream_order_id, priority=Priority.RECONCILE)
    except BusinessError as exc:
        report.checked += 1
        if exc.code == "order_not_found":
            report.findings.append(_finding(p, Mismatch("order", str(p.upstream_order_id), None), None))
        else:
            report.errors += 1
        return
    except UpstreamError as exc:
        report.errors += 1
        log.info("reconcile.check_failed", procurement_id=p.id, code=exc.code, upstream=p.upstream)
        return
    report.checked += 1
    if answer_problem(p, order) is not None:
        # An answer about another order is never applied: a finding for a person.
        answered = str(order.order_id) if order.order_id != p.upstream_order_id else "another number"
        report.findings.append(_finding(p, Mismatch("order", str(p.upstream_order_id), answered), None))
        return
    amount = None if order.amount is None else str(order.amount)
    found = mismatches(p, order.status, amount, order.currency)
    if not found:
        return
    repair_event = None
    if repair:
        try:
            applied = await service.apply(
                p.id, Reconciled(report_of(order)), Source.RECONCILE, order_no=p.order_no
            )
        except NotAllowed:
            applied = None
        if applied is not None and applied.changed:
            repair_event = applied.decision.event
            report.repaired += 1
    report.findings += [_finding(p, mismatch, repair_event) for mismatch in found]


def _finding(p: Procurement, mismatch: Mismatch, repair: str | None) -> Finding:
    return finding_of(p, mismatch, repair, utcnow())


def _alerts(findings: Sequence[Finding], repair: bool) -> list[Occurrence]:
    by_order: dict[str, list[Finding]] = {}
    for finding in findings:
        by_order.setdefault(finding.order_no, []).append(finding)
    occurrences = []
    for order_no, found in by_order.items():
        what = "; ".join(
            f"{f.downstream_order_no} {f.field}: procurd {f.local_value}, upstream {f.upstream_value}"
            + (f" (repaired: {f.repair})" if f.repair else "")
            for f in found
        )
        advice = "" if repair else " Repair is off: `procurd reconcile` with repair, or handle it by hand."
        message = f"order {order_no} disagrees with the upstream: {what}.{advice}"
        occurrences.append(Occurrence(Kind.RECONCILE_MISMATCH, order_no, message, found[0].upstream))
    return occurrences


async def recent_runs(database: Database, limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` passes, the newest first, each with its findings (what ``GET /api/v1/reconcile``
    answers), in one snapshot."""
    return await database.read(runs_with_findings, limit)


def runs_with_findings(tx: WithReconcile, limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` passes, the newest first, each with its findings (what ``GET /api/v1/reconcile``
    answers)."""
    runs = tx.reconcile.runs(limit)
    findings: dict[int, list[dict[str, Any]]] = {}
    for finding in tx.reconcile.findings([run.id for run in runs]):
        findings.setdefault(finding.run_id, []).append(finding_view(finding))
    return [
        {
            "id": run.id,
            "upstream": run.upstream,
            "trigger": run.trigger,
            "status": run.status,
            "started_at": iso(run.started_at),
            "finished_at": iso(run.finished_at),
            "checked": run.checked,
            "mismatches": run.mismatches,
            "repaired": run.repaired,
            "errors": run.errors,
            "error": run.error,
            "findings": findings.get(run.id, []),
        }
        for run in runs
    ]


def finding_view(finding: Finding) -> dict[str, Any]:
    return {
        "procurement_id": finding.procurement_id,
        "order_no": finding.order_no,
        "upstream": finding.upstream,
        "downstream_order_no": finding.downstream_order_no,
        "upstream_order_id": finding.upstream_order_id,
        "field": finding.field,
        "procurd": finding.local_value,
        "upstream_value": finding.upstream_value,
        "repair": finding.repair,
        "found_at": iso(finding.found_at),
    }
