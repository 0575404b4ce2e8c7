"""Statements of reconciliation: its runs and what each found."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, RowMapping, func, insert, select, update

from procurd.core.records import Finding as Finding  # re-exported: the state path names it from here
from procurd.core.records import ReconcileRun
from procurd.db.schema import reconcile_findings, reconcile_runs

# The triggers of a reconciliation pass; a callback or a poll records its findings under its own source.
PASS_TRIGGERS = ("scheduled", "daily", "manual")


class ReconcileStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def start(self, upstream: str | None, trigger: str, now: datetime) -> int:
        statement = insert(reconcile_runs).values(
            upstream=upstream, trigger=trigger, started_at=now, status="running", checked=0, mismatches=0,
            repaired=0, errors=0,
        )  # fmt: skip
        result = self.connection.execute(statement.returning(reconcile_runs.c.id))
        return int(result.scalar_one())

    def finish(
        self,
        run_id: int,
        *,
        status: str,
        checked: int,
        repaired: int,
        errors: int,
        error: str | None,
        now: datetime,
    ) -> None:
        mismatches = self.connection.execute(
            select(func.count()).select_from(reconcile_findings).where(reconcile_findings.c.run_id == run_id)
        ).scalar_one()
        self.connection.execute(
            update(reconcile_runs)
            .where(reconcile_runs.c.id == run_id)
            .values(
                status=status,
                finished_at=now,
                checked=checked,
                mismatches=mismatches,
                repaired=repaired,
                errors=errors,
                error=error,
            )
        )

    def add_findings(self, run_id: int, findings: Sequence[Finding]) -> None:
        if findings:
            rows = [
                {
                    "run_id": run_id, "procurement_id": f.procurement_id, "order_no": f.order_no,
                    "upstream": f.upstream, "downstream_order_no": f.downstream_order_no,
                    "upstream_order_id": f.upstream_order_id, "field": f.field, "local_value": f.local_value,
                    "upstream_value": f.upstream_value, "repair": f.repair, "found_at": f.found_at,
                }
                for f in findings
            ]  # fmt: skip
            self.connection.execute(insert(reconcile_findings), rows)

    def runs(self, limit: int) -> list[ReconcileRun]:
        statement = select(reconcile_runs).order_by(reconcile_runs.c.id.desc()).limit(limit)
        return [ReconcileRun(**row) for row in self.connection.execute(statement).mappings()]

    def last_finished(self) -> ReconcileRun | None:
        """The last finished pass (not the finding a callback or poll recorded: goods after a resolution)."""
        statement = (
            select(reconcile_runs)
            .where(reconcile_runs.c.status != "running", reconcile_runs.c.trigger.in_(PASS_TRIGGERS))
            .order_by(reconcile_runs.c.id.desc())
            .limit(1)
        )
        row = self.connection.execute(statement).mappings().first()
        return None if row is None else ReconcileRun(**row)

    def findings(self, run_ids: Sequence[int]) -> list[Finding]:
        if not run_ids:
            return []
        statement = (
            select(reconcile_findings)
            .where(reconcile_findings.c.run_id.in_(list(run_ids)))
            .order_by(reconcile_findings.c.id)
        )
        return [_finding(row) for row in self.connection.execute(statement).mappings()]

    def recent_findings(self, page: int, page_size: int) -> tuple[int, list[Finding]]:
        """Every pass's findings, the newest first, one page of them and how many there are."""
        total = self.connection.execute(select(func.count()).select_from(reconcile_findings)).scalar_one()
        statement = (
            select(reconcile_findings)
            .order_by(reconcile_findings.c.id.desc())
            .limit(page_size)
            .offset((page - 1) * page_size)
        )
        return int(total), [_finding(row) for row in self.connection.execute(statement).mappings()]

    def last_full_check(self) -> datetime | None:
        """When the last finished run that checked delivered procurements too started."""
        statement = select(func.max(reconcile_runs.c.started_at)).where(
            reconcile_runs.c.status == "ok", reconcile_runs.c.trigger.in_(("daily", "manual"))
        )
        value = self.connection.execute(statement).scalar_one_or_none()
        return value if isinstance(value, datetime) else None


def _finding(row: RowMapping) -> Finding:
    return Finding(**{key: value for key, value in row.items() if key != "id"})
