"""The state path's audit entries as written: identical repeats counted on one entry.

A report recorded without changing anything (a late status, a replayed callback) may say again exactly what
the entry before it on its procurement says. It then adds to that entry's ``count`` (and ``last_at``)
instead of adding an entry, whether that entry is in the database or earlier in the same batch, so that an
upstream replaying a callback thousands of times leaves one entry that says how often.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from procurd.db.procurement_store import AuditRow, ProcurementStore


def write_audit(store: ProcurementStore, rows: Sequence[tuple[AuditRow, bool]], now: datetime) -> None:
    """Write ``rows`` (each with its procurement's id; ``True``: a repeat of the entry before it may merge
    into that entry) in their order."""
    if not any(repeat for _, repeat in rows):
        store.insert_audit([row for row, _ in rows])
        return
    wanted = {(row.order_no, row.procurement_id) for row, repeat in rows if repeat}
    last: dict[int, tuple[int | None, AuditRow]] = {
        procurement_id: (entry_id, entry)
        for procurement_id, (entry_id, entry) in store.last_audit_entries(wanted).items()
    }
    inserted: list[AuditRow] = []
    added: dict[int, int] = {}  # audit entry id -> repeats to add
    for row, repeat in rows:
        assert row.procurement_id is not None
        before = last.get(row.procurement_id)
        if repeat and before is not None and _same_entry(before[1], row):
            entry_id, entry = before
            if entry_id is None:  # an entry of this batch: count it there
                index = next(i for i in range(len(inserted) - 1, -1, -1) if inserted[i] is entry)
                merged = replace(entry, count=entry.count + 1, last_at=row.at)
                inserted[index] = merged
                last[row.procurement_id] = (None, merged)
            else:
                added[entry_id] = added.get(entry_id, 0) + 1
            continue
        inserted.append(row)
        last[row.procurement_id] = (None, row)
    store.insert_audit(inserted)
    store.count_audit_repeats(added, now)


def _same_entry(entry: AuditRow, row: AuditRow) -> bool:
    return (entry.source, entry.event, entry.old_state, entry.new_state, dict(entry.detail or {})) == (
        row.source,
        row.event,
        row.old_state,
        row.new_state,
        dict(row.detail or {}),
    )
