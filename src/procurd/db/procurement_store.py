"""Every statement of the procurement engine: orders, procurements, numbers, audit, outbox, health.

Functions take an open ``AsyncConnection`` inside a transaction the caller owns, so one state change (the
procurement row, its audit entry, the order's status and the storefront event) commits atomically.
Lock order, everywhere: the order row, then its procurement rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, insert, or_, select, type_coerce, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from procurd.db.schema import (
    audit_log,
    mirror_products,
    mirror_skus,
    orders,
    outbox,
    procurement_numbers,
    procurements,
    upstream_health,
)
from procurd.procurement.model import State

DbRow = Any  # a SQLAlchemy Row; attributes are the selected columns


class StaleWrite(Exception):
    """The procurement changed between read and write (cannot happen under the row lock; a safety net)."""


# --- mirror lookups for intake ----------------------------------------------------------------------------


async def mirrored_sku(conn: AsyncConnection, upstream: str, sku_id: int) -> DbRow | None:
    """The SKU and its product as mirrored, or ``None`` when never seen."""
    statement = (
        select(
            mirror_skus.c.id,
            mirror_skus.c.product_id,
            mirror_skus.c.price_amount,
            mirror_skus.c.is_active.label("sku_active"),
            mirror_skus.c.removed_at.label("sku_removed_at"),
            mirror_products.c.is_active.label("product_active"),
            mirror_products.c.removed_at.label("product_removed_at"),
            mirror_products.c.fulfillment_type,
        )
        .select_from(
            mirror_skus.outerjoin(
                mirror_products,
                and_(
                    mirror_products.c.upstream == mirror_skus.c.upstream,
                    mirror_products.c.id == mirror_skus.c.product_id,
                ),
            )
        )
        .where(mirror_skus.c.upstream == upstream, mirror_skus.c.id == sku_id)
    )
    return (await conn.execute(statement)).first()


# --- orders -----------------------------------------------------------------------------------------------


async def get_order(conn: AsyncConnection, order_no: str, *, lock: bool = False) -> DbRow | None:
    statement = select(orders).where(orders.c.order_no == order_no)
    if lock:
        statement = statement.with_for_update()
    return (await conn.execute(statement)).first()


async def insert_order(
    conn: AsyncConnection,
    *,
    order_no: str,
    trace_id: str | None,
    fingerprint: str,
    request: Mapping[str, Any],
    now: datetime,
) -> None:
    await conn.execute(
        insert(orders).values(
            order_no=order_no,
            trace_id=trace_id,
            fingerprint=fingerprint,
            request=dict(request),
            status="paid",
            exception=False,
            created_at=now,
            updated_at=now,
        )
    )


async def set_order_status(
    conn: AsyncConnection, order_no: str, status: str, exception: bool, now: datetime
) -> None:
    await conn.execute(
        update(orders)
        .where(orders.c.order_no == order_no)
        .values(status=status, exception=exception, updated_at=now)
    )


# --- procurements -----------------------------------------------------------------------------------------


async def insert_procurement(conn: AsyncConnection, values: Mapping[str, Any]) -> int:
    result = await conn.execute(insert(procurements).values(**values).returning(procurements.c.id))
    return int(result.scalar_one())


async def insert_number(
    conn: AsyncConnection, upstream: str, number: str, procurement_id: int, now: datetime
) -> None:
    await conn.execute(
        insert(procurement_numbers).values(
            upstream=upstream,
            downstream_order_no=number,
            procurement_id=procurement_id,
            upstream_order_id=None,
            upstream_canceled=False,
            created_at=now,
        )
    )


async def procurements_of(conn: AsyncConnection, order_no: str, *, lock: bool = False) -> Sequence[DbRow]:
    statement = (
        select(procurements).where(procurements.c.order_no == order_no).order_by(procurements.c.position)
    )
    if lock:
        statement = statement.with_for_update()
    return (await conn.execute(statement)).all()


async def get_procurement(conn: AsyncConnection, procurement_id: int) -> DbRow | None:
    return (await conn.execute(select(procurements).where(procurements.c.id == procurement_id))).first()


async def lock_procurement(conn: AsyncConnection, procurement_id: int) -> DbRow | None:
    """The procurement row, locked for this transaction (its order row is locked first)."""
    order_no = (
        await conn.execute(select(procurements.c.order_no).where(procurements.c.id == procurement_id))
    ).scalar_one_or_none()
    if order_no is None:
        return None
    await get_order(conn, order_no, lock=True)
    statement = select(procurements).where(procurements.c.id == procurement_id).with_for_update()
    return (await conn.execute(statement)).first()


async def update_procurement(
    conn: AsyncConnection, row: DbRow, state: State, changes: Mapping[str, Any], now: datetime
) -> None:
    values = dict(changes)
    values.update(state=state.value, updated_at=now, version=row.version + 1)
    result = await conn.execute(
        update(procurements)
        .where(procurements.c.id == row.id, procurements.c.version == row.version)
        .values(**values)
    )
    if result.rowcount != 1:
        raise StaleWrite(f"procurement {row.id} changed concurrently")


async def numbers_of(conn: AsyncConnection, procurement_id: int) -> Sequence[DbRow]:
    statement = (
        select(procurement_numbers)
        .where(procurement_numbers.c.procurement_id == procurement_id)
        .order_by(procurement_numbers.c.created_at, procurement_numbers.c.downstream_order_no)
    )
    return (await conn.execute(statement)).all()


async def find_number(conn: AsyncConnection, upstream: str, number: str) -> DbRow | None:
    statement = select(procurement_numbers).where(
        procurement_numbers.c.upstream == upstream, procurement_numbers.c.downstream_order_no == number
    )
    return (await conn.execute(statement)).first()


async def record_number_order(
    conn: AsyncConnection, upstream: str, number: str, order_id: int | None, canceled: bool | None = None
) -> None:
    values: dict[str, Any] = {}
    if order_id is not None:
        values["upstream_order_id"] = order_id
    if canceled is not None:
        values["upstream_canceled"] = canceled
    if values:
        await conn.execute(
            update(procurement_numbers)
            .where(
                procurement_numbers.c.upstream == upstream,
                procurement_numbers.c.downstream_order_no == number,
            )
            .values(**values)
        )


async def claim_due(
    conn: AsyncConnection, upstream: str, worker: str, now: datetime, lease: timedelta, limit: int
) -> Sequence[DbRow]:
    """Claim due queued procurements of ``upstream`` in one statement.

    Free or expired claims are taken; an expired claim means a worker died mid-submission, so the upstream
    may hold an order: ``upstream_may_exist`` is set. The attempt is counted here, before any HTTP call.
    """
    due = (
        select(procurements.c.id)
        .where(
            procurements.c.state == State.QUEUED.value,
            procurements.c.upstream == upstream,
            procurements.c.next_attempt_at <= now,
            or_(procurements.c.lease_owner.is_(None), procurements.c.lease_expires_at < now),
        )
        .order_by(procurements.c.next_attempt_at, procurements.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    statement = (
        update(procurements)
        .where(procurements.c.id.in_(due.scalar_subquery()))
        .values(
            lease_owner=worker,
            lease_expires_at=now + lease,
            attempts=procurements.c.attempts + 1,
            upstream_may_exist=or_(
                procurements.c.upstream_may_exist, procurements.c.lease_owner.is_not(None)
            ),
            version=procurements.c.version + 1,
            updated_at=now,
        )
        .returning(*procurements.c)
    )
    return (await conn.execute(statement)).all()


async def claim_polls(
    conn: AsyncConnection, upstream: str, now: datetime, hold: timedelta, limit: int
) -> Sequence[DbRow]:
    """Claim procurements due for a poll (submitted ones, and delivered ones whose amount is still to be
    fetched); the claim pushes next_poll_at by ``hold``."""
    due = (
        select(procurements.c.id)
        .where(
            procurements.c.state.in_((State.SUBMITTED.value, State.DELIVERED.value)),
            procurements.c.upstream == upstream,
            procurements.c.next_poll_at <= now,
            procurements.c.upstream_order_id.is_not(None),
        )
        .order_by(procurements.c.next_poll_at, procurements.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    statement = (
        update(procurements)
        .where(procurements.c.id.in_(due.scalar_subquery()))
        .values(next_poll_at=now + hold, version=procurements.c.version + 1)
        .returning(*procurements.c)
    )
    return (await conn.execute(statement)).all()


async def next_due_at(conn: AsyncConnection, upstream: str) -> datetime | None:
    """When the earliest queued procurement of ``upstream`` can next be claimed (to sleep that long).

    A claimed one (its submission in flight) counts from its claim's expiry, not from its due time: that
    time is past, and counting it would wake the claimer again and again until the submission ends.
    """
    claimable_at = case(
        (procurements.c.lease_owner.is_(None), procurements.c.next_attempt_at),
        else_=procurements.c.lease_expires_at,
    )
    statement = select(type_coerce(func.min(claimable_at), procurements.c.next_attempt_at.type)).where(
        procurements.c.state == State.QUEUED.value, procurements.c.upstream == upstream
    )
    value = (await conn.execute(statement)).scalar_one_or_none()
    return value if isinstance(value, datetime) else None


def _exceptions_matching(upstream: str | None, reason: str | None) -> list[ColumnElement[bool]]:
    conditions = [procurements.c.state == State.EXCEPTION.value]
    if upstream:
        conditions.append(procurements.c.upstream == upstream)
    if reason:
        conditions.append(procurements.c.exception_reason == reason)
    return conditions


async def _count_procurements(conn: AsyncConnection, conditions: list[ColumnElement[bool]]) -> int:
    statement = select(func.count()).select_from(procurements).where(*conditions)
    return int((await conn.execute(statement)).scalar_one())


async def list_exceptions(
    conn: AsyncConnection, upstream: str | None, reason: str | None, page: int, page_size: int
) -> tuple[int, Sequence[DbRow]]:
    conditions = _exceptions_matching(upstream, reason)
    rows = (
        await conn.execute(
            select(procurements)
            .where(*conditions)
            .order_by(procurements.c.updated_at, procurements.c.id)
            .limit(page_size)
            .offset((page - 1) * page_size)
        )
    ).all()
    return await _count_procurements(conn, conditions), rows


async def exception_ids(
    conn: AsyncConnection, upstream: str | None, reason: str | None, limit: int
) -> tuple[int, list[int]]:
    """How many exceptions match, and the ids of the ``limit`` oldest (the exception list's order)."""
    conditions = _exceptions_matching(upstream, reason)
    ids = (
        await conn.execute(
            select(procurements.c.id)
            .where(*conditions)
            .order_by(procurements.c.updated_at, procurements.c.id)
            .limit(limit)
        )
    ).scalars()
    return await _count_procurements(conn, conditions), list(ids)


async def queue_counts(conn: AsyncConnection) -> dict[tuple[str, str], int]:
    statement = select(procurements.c.upstream, procurements.c.state, func.count()).group_by(
        procurements.c.upstream, procurements.c.state
    )
    return {(row[0], row[1]): int(row[2]) for row in (await conn.execute(statement)).all()}


async def oldest_queued(conn: AsyncConnection) -> dict[str, datetime]:
    statement = (
        select(procurements.c.upstream, func.min(procurements.c.created_at))
        .where(procurements.c.state == State.QUEUED.value)
        .group_by(procurements.c.upstream)
    )
    return {upstream: created for upstream, created in (await conn.execute(statement)).all() if created}


# --- audit ------------------------------------------------------------------------------------------------


async def add_audit(
    conn: AsyncConnection,
    *,
    order_no: str,
    procurement_id: int | None,
    source: str,
    event: str,
    old_state: str | None,
    new_state: str | None,
    detail: Mapping[str, Any] | None,
    now: datetime,
) -> None:
    await conn.execute(
        insert(audit_log).values(
            order_no=order_no,
            procurement_id=procurement_id,
            at=now,
            source=source,
            event=event,
            old_state=old_state,
            new_state=new_state,
            detail=dict(detail) if detail else None,
        )
    )


async def audit_trail(conn: AsyncConnection, order_no: str) -> Sequence[DbRow]:
    statement = select(audit_log).where(audit_log.c.order_no == order_no).order_by(audit_log.c.id)
    return (await conn.execute(statement)).all()


# --- outbox -----------------------------------------------------------------------------------------------


async def add_event(
    conn: AsyncConnection, order_no: str, event: str, payload: Mapping[str, Any], now: datetime
) -> str:
    event_id = str(uuid.uuid4())
    await conn.execute(
        insert(outbox).values(
            event_id=event_id,
            order_no=order_no,
            event=event,
            payload=dict(payload, event_id=event_id),
            created_at=now,
            attempts=0,
            next_attempt_at=now,
        )
    )
    return event_id


async def claim_events(
    conn: AsyncConnection, worker: str, now: datetime, lease: timedelta, limit: int
) -> Sequence[DbRow]:
    """Claim due events that are the oldest undelivered one of their order (delivery in order per order)."""
    earlier = outbox.alias("earlier")
    blocked = (
        select(earlier.c.id)
        .where(
            earlier.c.order_no == outbox.c.order_no,
            earlier.c.id < outbox.c.id,
            earlier.c.delivered_at.is_(None),
        )
        .exists()
    )
    due = (
        select(outbox.c.id)
        .where(
            outbox.c.delivered_at.is_(None),
            outbox.c.next_attempt_at <= now,
            or_(outbox.c.lease_owner.is_(None), outbox.c.lease_expires_at < now),
            ~blocked,
        )
        .order_by(outbox.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    statement = (
        update(outbox)
        .where(outbox.c.id.in_(due.scalar_subquery()))
        .values(lease_owner=worker, lease_expires_at=now + lease, attempts=outbox.c.attempts + 1)
        .returning(*outbox.c)
    )
    return (await conn.execute(statement)).all()


async def mark_event_delivered(conn: AsyncConnection, event_row_id: int, now: datetime) -> None:
    await conn.execute(
        update(outbox)
        .where(outbox.c.id == event_row_id)
        .values(delivered_at=now, lease_owner=None, lease_expires_at=None, last_error=None)
    )


async def mark_event_failed(conn: AsyncConnection, event_row_id: int, error: str, retry_at: datetime) -> None:
    await conn.execute(
        update(outbox)
        .where(outbox.c.id == event_row_id)
        .values(next_attempt_at=retry_at, lease_owner=None, lease_expires_at=None, last_error=error[:500])
    )


async def pending_events(conn: AsyncConnection) -> int:
    statement = select(func.count()).select_from(outbox).where(outbox.c.delivered_at.is_(None))
    return int((await conn.execute(statement)).scalar_one())


# --- upstream health --------------------------------------------------------------------------------------


async def ensure_health_rows(conn: AsyncConnection, names: Iterable[str], now: datetime) -> None:
    """Create the missing health rows; instances starting together on one database may both try."""
    existing = set((await conn.execute(select(upstream_health.c.upstream))).scalars())
    insert_new = postgresql_insert if conn.dialect.name == "postgresql" else sqlite_insert
    for name in names:
        if name not in existing:
            await conn.execute(
                insert_new(upstream_health)
                .values(upstream=name, callbacks_accepted=0, callbacks_rejected=0, updated_at=now)
                .on_conflict_do_nothing(index_elements=[upstream_health.c.upstream])
            )


async def update_health(
    conn: AsyncConnection, upstream: str, values: Mapping[str, Any], now: datetime
) -> None:
    await conn.execute(
        update(upstream_health).where(upstream_health.c.upstream == upstream).values(**values, updated_at=now)
    )


async def count_callback(conn: AsyncConnection, upstream: str, accepted: bool, now: datetime) -> None:
    column = upstream_health.c.callbacks_accepted if accepted else upstream_health.c.callbacks_rejected
    await conn.execute(
        update(upstream_health)
        .where(upstream_health.c.upstream == upstream)
        .values({column: column + 1, upstream_health.c.updated_at: now})
    )


async def health_rows(conn: AsyncConnection) -> dict[str, DbRow]:
    return {row.upstream: row for row in (await conn.execute(select(upstream_health))).all()}
