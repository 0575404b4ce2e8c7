"""Every statement of the procurement engine: orders, procurements, numbers, audit, the storefront outbox.

Statements are built once; batches are written with ``executemany``. Rows leave this module as the
core's frozen records. Lock order, everywhere: order rows (sorted by number), then nothing else — every
writer of a procurement holds its order's row, so an order's items change one transaction at a time.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import (
    Connection,
    RowMapping,
    Select,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    or_,
    select,
    type_coerce,
    update,
)

from procurd.core.orders import Order
from procurd.core.procurement import MirroredSku, Procurement, SourceRef, State
from procurd.core.records import AuditRow as AuditRow  # re-exported: the state path names it from here
from procurd.core.records import NumberRow
from procurd.db.bulk import inserted_ids
from procurd.db.dialect import insert_or_skip
from procurd.db.keys import by_pairs
from procurd.db.schema import (
    alerts,
    audit_log,
    mirror_products,
    mirror_skus,
    orders,
    outbox,
    procurement_numbers,
    procurements,
)

# Columns a decision may change (the rest are fixed at intake).
MUTABLE_COLUMNS: Final = (
    "upstream",
    "sku_id",
    "product_id",
    "unit_price",
    "fulfillment_type",
    "unit_limit",
    "source_position",
    "failovers",
    "downstream_order_no",
    "downstream_order_nos",
    "number_canceled",
    "state",
    "upstream_status",
    "upstream_order_id",
    "upstream_order_no",
    "amount",
    "currency",
    "attempts",
    "last_error_code",
    "last_error_message",
    "exception_reason",
    "fulfillment",
    "upstream_may_exist",
    "next_attempt_at",
    "lease_owner",
    "lease_expires_at",
    "next_poll_at",
    "poll_interval_seconds",
    "submitted_at",
    "delivered_at",
    "resolution_note",
    "updated_at",
)
INSERT_COLUMNS: Final = tuple(column.name for column in procurements.c if column.name != "id")


def to_procurement(row: RowMapping) -> Procurement:
    values = dict(row)
    values["state"] = State(values["state"])
    values["downstream_order_nos"] = tuple(values["downstream_order_nos"] or (values["downstream_order_no"],))
    values["number_canceled"] = bool(values["number_canceled"])
    values["upstream_may_exist"] = bool(values["upstream_may_exist"])
    values["sources"] = tuple(
        SourceRef(source["upstream"], int(source["sku_id"]), source.get("limit"))
        for source in values["sources"] or ()
    )
    values["source_position"] = int(values["source_position"] or 0)
    values["failovers"] = tuple(values["failovers"] or ())
    return Procurement(**values)


def to_order(row: RowMapping) -> Order:
    return Order(
        order_no=row["order_no"],
        trace_id=row["trace_id"],
        fingerprint=row["fingerprint"],
        status=row["status"],
        exception=bool(row["exception"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        provider=bool(row["provider"]),
    )


def _row_values(p: Procurement, columns: Iterable[str]) -> dict[str, Any]:
    values = {name: getattr(p, name) for name in columns}
    values["state"] = p.state.value
    values["downstream_order_nos"] = list(p.downstream_order_nos)
    if "sources" in values:
        values["sources"] = [
            {"upstream": source.upstream, "sku_id": source.sku_id, "limit": source.limit}
            for source in p.sources
        ] or None
    if "failovers" in values:
        values["failovers"] = [dict(hop) for hop in p.failovers] or None
    return values


# --- statements, built once --------------------------------------------------------------------------------

_ORDER_COLUMNS = (
    orders.c.order_no,
    orders.c.trace_id,
    orders.c.fingerprint,
    orders.c.status,
    orders.c.exception,
    orders.c.provider,
    orders.c.created_at,
    orders.c.updated_at,
)
_LOCK_ORDERS = (
    select(*_ORDER_COLUMNS)
    .where(orders.c.order_no.in_(bindparam("order_nos", expanding=True)))
    .order_by(orders.c.order_no)
    .with_for_update()
)
_READ_ORDERS = select(*_ORDER_COLUMNS).where(orders.c.order_no.in_(bindparam("order_nos", expanding=True)))
_ITEMS_OF_ORDERS = (
    select(procurements)
    .where(procurements.c.order_no.in_(bindparam("order_nos", expanding=True)))
    .order_by(procurements.c.order_no, procurements.c.position)
)
_ORDER_NOS_OF = select(procurements.c.id, procurements.c.order_no).where(
    procurements.c.id.in_(bindparam("ids", expanding=True))
)
_NUMBERS = select(
    procurement_numbers.c.upstream,
    procurement_numbers.c.downstream_order_no,
    procurement_numbers.c.procurement_id,
    procurements.c.order_no,
    procurement_numbers.c.upstream_order_id,
).join(procurements, procurements.c.id == procurement_numbers.c.procurement_id)
# Keys are looked up one upstream at a time (``first``, then the ``seconds`` of that upstream): SQLite
# searches its two-column indexes only on the first column for a row-value IN.
_NUMBERS_BY_KEY = _NUMBERS.where(
    procurement_numbers.c.upstream == bindparam("first"),
    procurement_numbers.c.downstream_order_no.in_(bindparam("seconds", expanding=True)),
)
_MIRRORED_SKUS = (
    select(
        mirror_skus.c.upstream,
        mirror_skus.c.id,
        mirror_skus.c.product_id,
        mirror_skus.c.price_amount,
        mirror_skus.c.sell_price,
        mirror_skus.c.sell_currency,
        mirror_skus.c.stock_status,
        mirror_skus.c.stock_quantity,
        mirror_skus.c.price_held_at,
        mirror_skus.c.is_active.label("sku_active"),
        mirror_skus.c.removed_at.label("sku_removed_at"),
        mirror_products.c.is_active.label("product_active"),
        mirror_products.c.removed_at.label("product_removed_at"),
        mirror_products.c.fulfillment_type,
        mirror_products.c.manual_form_schema,
        mirror_products.c.category_id,
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
    .where(
        mirror_skus.c.upstream == bindparam("first"),
        mirror_skus.c.id.in_(bindparam("seconds", expanding=True)),
    )
)
_INSERT_ORDER = insert(orders)
_UPDATE_PROCUREMENT = (
    update(procurements)
    .where(procurements.c.id == bindparam("b_id"))
    .values({name: bindparam(name) for name in MUTABLE_COLUMNS})
)
_INSERT_NUMBER = insert(procurement_numbers)
_RETIRE_NUMBER = (
    update(procurement_numbers)
    .where(
        procurement_numbers.c.upstream == bindparam("b_upstream"),
        procurement_numbers.c.downstream_order_no == bindparam("b_number"),
    )
    .values(upstream_order_id=bindparam("upstream_order_id"))
)
_INSERT_AUDIT = insert(audit_log)
_COUNT_AUDIT_REPEAT = (
    update(audit_log)
    .where(audit_log.c.id == bindparam("b_id"))
    .values(count=audit_log.c.count + bindparam("b_added"), last_at=bindparam("last_at"))
)
_UPDATE_ORDER = (
    update(orders)
    .where(orders.c.order_no == bindparam("b_order_no"))
    .values(status=bindparam("status"), exception=bindparam("exception"), updated_at=bindparam("updated_at"))
)
_INSERT_EVENT = insert(outbox)


def _due_for_submission(now: datetime, upstream: str, limit: int) -> Select[Any]:
    return (
        select(procurements.c.id, procurements.c.order_no)
        .join(orders, orders.c.order_no == procurements.c.order_no)
        .where(
            procurements.c.upstream == upstream,
            procurements.c.state == State.QUEUED.value,
            procurements.c.next_attempt_at <= now,
            or_(procurements.c.lease_owner.is_(None), procurements.c.lease_expires_at < now),
        )
        .order_by(procurements.c.next_attempt_at, procurements.c.id)
        .limit(limit)
        .with_for_update(of=orders, skip_locked=True)
    )


def _due_for_poll(now: datetime, upstream: str, limit: int) -> Select[Any]:
    return (
        select(procurements.c.id, procurements.c.order_no)
        .join(orders, orders.c.order_no == procurements.c.order_no)
        .where(
            procurements.c.upstream == upstream,
            procurements.c.state.in_((State.SUBMITTED.value, State.DELIVERED.value)),
            procurements.c.next_poll_at <= now,
            procurements.c.upstream_order_id.is_not(None),
        )
        .order_by(procurements.c.next_poll_at, procurements.c.id)
        .limit(limit)
        .with_for_update(of=orders, skip_locked=True)
    )


class ProcurementStore:
    """The procurement statements, on one transaction's connection."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    # --- loading for a batch of changes ----------------------------------------------------------------

    def lock_orders(self, order_nos: Iterable[str]) -> dict[str, Order]:
        """The orders, locked for this transaction in a fixed order (their items with them)."""
        wanted = sorted(set(order_nos))
        if not wanted:
            return {}
        rows = self.connection.execute(_LOCK_ORDERS, {"order_nos": wanted}).mappings()
        return {row["order_no"]: to_order(row) for row in rows}

    def items_of(self, order_nos: Iterable[str]) -> dict[str, list[Procurement]]:
        """Each order's procurements, by position."""
        wanted = sorted(set(order_nos))
        items: dict[str, list[Procurement]] = {order_no: [] for order_no in wanted}
        if wanted:
            for row in self.connection.execute(_ITEMS_OF_ORDERS, {"order_nos": wanted}).mappings():
                items[row["order_no"]].append(to_procurement(row))
        return items

    def order_nos_of(self, ids: Iterable[int]) -> dict[int, str]:
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        return {row.id: row.order_no for row in self.connection.execute(_ORDER_NOS_OF, {"ids": wanted})}

    def numbers(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], NumberRow]:
        """The numbers ``(upstream, downstream_order_no)`` that are registered, with their procurement."""
        wanted = sorted(set(keys))
        if not wanted:
            return {}
        return {
            (row.upstream, row.downstream_order_no): NumberRow(*row)
            for row in by_pairs(self.connection, _NUMBERS_BY_KEY, wanted)
        }

    def mirrored_skus(self, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], MirroredSku]:
        """The SKUs ``(upstream, sku_id)`` the mirror holds, with what intake checks of their products."""
        wanted = sorted(set(keys))
        if not wanted:
            return {}
        rows = [row._mapping for row in by_pairs(self.connection, _MIRRORED_SKUS, wanted)]
        return {
            (row["upstream"], row["id"]): MirroredSku(
                id=int(row["id"]),
                product_id=int(row["product_id"]),
                price_amount=str(row["price_amount"]),
                fulfillment_type=row["fulfillment_type"] or "auto",
                sku_active=bool(row["sku_active"]),
                sku_removed=row["sku_removed_at"] is not None,
                product_known=row["product_active"] is not None,
                product_active=bool(row["product_active"]),
                product_removed=row["product_removed_at"] is not None,
                manual_form_schema=row["manual_form_schema"],
                category_id=row["category_id"],
                sell_price=row["sell_price"],
                sell_currency=row["sell_currency"],
                stock_status=row["stock_status"],
                stock_quantity=row["stock_quantity"],
                price_held=row["price_held_at"] is not None,
            )
            for row in rows
        }

    def claim_due(self, upstream: str, now: datetime, limit: int) -> dict[int, str]:
        """Due queued procurements of ``upstream`` (id to order number), their orders locked.

        On PostgreSQL orders another transaction holds are skipped, so instances never wait on each other.
        """
        rows = self.connection.execute(_due_for_submission(now, upstream, limit))
        return {row.id: row.order_no for row in rows}

    def claim_polls(self, upstream: str, now: datetime, limit: int) -> dict[int, str]:
        """Procurements of ``upstream`` due for a fallback poll (id to order number), their orders locked."""
        rows = self.connection.execute(_due_for_poll(now, upstream, limit))
        return {row.id: row.order_no for row in rows}

    def claimed_by(self, instances: Iterable[str]) -> dict[int, str]:
        """Procurements whose submission or poll one of ``instances`` has claimed (id to order number)."""
        owners = [
            procurements.c.lease_owner.startswith(f"{instance}/", autoescape=True) for instance in instances
        ]
        if not owners:
            return {}
        statement = select(procurements.c.id, procurements.c.order_no).where(
            procurements.c.lease_owner.is_not(None), or_(*owners)
        )
        return {row.id: row.order_no for row in self.connection.execute(statement)}

    # --- writing a batch -------------------------------------------------------------------------------

    def insert_orders(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self.connection.execute(_INSERT_ORDER, list(rows))

    def insert_procurements(self, items: Sequence[Procurement]) -> list[int]:
        """Insert new procurements; their ids, in the order given."""
        if not items:
            return []
        rows = [_row_values(p, INSERT_COLUMNS) for p in items]
        return inserted_ids(self.connection, procurements, rows, ("order_no", "position"))

    def update_procurements(self, items: Sequence[Procurement]) -> None:
        if items:
            rows = [dict(_row_values(p, MUTABLE_COLUMNS), b_id=p.id) for p in items]
            self.connection.execute(_UPDATE_PROCUREMENT, rows)

    def insert_numbers(self, rows: Sequence[Mapping[str, Any]], *, again: bool = False) -> None:
        """Register numbers; ``again``: a number the procurement may hold with that upstream already."""
        if not rows:
            return
        if not again:
            self.connection.execute(_INSERT_NUMBER, list(rows))
            return
        statement = insert_or_skip(
            self.connection,
            procurement_numbers,
            procurement_numbers.c.upstream,
            procurement_numbers.c.downstream_order_no,
        )
        self.connection.execute(statement, list(rows))

    def retire_numbers(self, rows: Sequence[tuple[str, str, int | None]]) -> None:
        """Keep the upstream order id of numbers that are no longer used: ``(upstream, number, order_id)``."""
        if rows:
            self.connection.execute(
                _RETIRE_NUMBER,
                [{"b_upstream": u, "b_number": n, "upstream_order_id": order_id} for u, n, order_id in rows],
            )

    def insert_audit(self, rows: Sequence[AuditRow]) -> None:
        if rows:
            self.connection.execute(
                _INSERT_AUDIT,
                [
                    {
                        "order_no": row.order_no,
                        "procurement_id": row.procurement_id,
                        "at": row.at,
                        "source": row.source,
                        "event": row.event,
                        "old_state": row.old_state,
                        "new_state": row.new_state,
                        "detail": dict(row.detail) if row.detail else None,
                        "count": row.count,
                        "last_at": row.last_at,
                    }
                    for row in rows
                ],
            )

    def update_orders(self, rows: Sequence[tuple[str, str, bool, datetime]]) -> None:
        """Store orders' derived status: ``(order_no, status, exception, updated_at)``."""
        if rows:
            self.connection.execute(
                _UPDATE_ORDER,
                [
                    {"b_order_no": order_no, "status": status, "exception": exception, "updated_at": at}
                    for order_no, status, exception, at in rows
                ],
            )

    def insert_events(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self.connection.execute(_INSERT_EVENT, list(rows))

    # --- reads ------------------------------------------------------------------------------------------

    def order(self, order_no: str) -> tuple[Order, list[Procurement]] | None:
        """The order and its procurements, or ``None``."""
        row = self.connection.execute(_READ_ORDERS, {"order_nos": [order_no]}).mappings().first()
        if row is None:
            return None
        return to_order(row), self.items_of([order_no])[order_no]

    def procurement(self, procurement_id: int) -> Procurement | None:
        row = self.connection.execute(select(procurements).where(procurements.c.id == procurement_id))
        found = row.mappings().first()
        return None if found is None else to_procurement(found)

    def exceptions(
        self, upstream: str | None, reason: str | None, page: int, page_size: int
    ) -> tuple[int, list[Procurement]]:
        conditions = _exceptions_matching(upstream, reason)
        rows = self.connection.execute(
            select(procurements)
            .where(*conditions)
            .order_by(procurements.c.updated_at, procurements.c.id)
            .limit(page_size)
            .offset((page - 1) * page_size)
        ).mappings()
        return self._count(conditions), [to_procurement(row) for row in rows]

    def exception_ids(
        self, upstream: str | None, reason: str | None, limit: int, *, excluding: Collection[str] = ()
    ) -> tuple[int, list[int]]:
        """How many exceptions match (leaving out those of a reason in ``excluding``), and the ids of the
        ``limit`` oldest (the exception list's order)."""
        conditions = _exceptions_matching(upstream, reason)
        if excluding:
            conditions.append(procurements.c.exception_reason.not_in(sorted(excluding)))
        ids = self.connection.execute(
            select(procurements.c.id)
            .where(*conditions)
            .order_by(procurements.c.updated_at, procurements.c.id)
            .limit(limit)
        ).scalars()
        return self._count(conditions), [int(value) for value in ids]

    def exceptions_of_reasons(
        self, upstream: str | None, reason: str | None, reasons: Collection[str], limit: int
    ) -> list[tuple[int, str]]:
        """The ``limit`` oldest matching exceptions whose reason is one of ``reasons``: (id, reason)."""
        if not reasons:
            return []
        conditions = _exceptions_matching(upstream, reason)
        conditions.append(procurements.c.exception_reason.in_(sorted(reasons)))
        rows = self.connection.execute(
            select(procurements.c.id, procurements.c.exception_reason)
            .where(*conditions)
            .order_by(procurements.c.updated_at, procurements.c.id)
            .limit(limit)
        )
        return [(int(row.id), str(row.exception_reason)) for row in rows]

    def exception_reasons(self) -> dict[str, dict[str, int]]:
        """Open exceptions per upstream and reason."""
        statement = (
            select(procurements.c.upstream, procurements.c.exception_reason, func.count())
            .where(procurements.c.state == State.EXCEPTION.value)
            .group_by(procurements.c.upstream, procurements.c.exception_reason)
        )
        counts: dict[str, dict[str, int]] = {}
        for upstream, reason, count in self.connection.execute(statement):
            counts.setdefault(upstream, {})[reason or "unknown"] = int(count)
        return counts

    def _count(self, conditions: Sequence[Any]) -> int:
        statement = select(func.count()).select_from(procurements).where(*conditions)
        return int(self.connection.execute(statement).scalar_one())

    def audit_trail(self, order_no: str) -> list[AuditRow]:
        statement = select(audit_log).where(audit_log.c.order_no == order_no).order_by(audit_log.c.id)
        return [_audit_row(row) for row in self.connection.execute(statement).mappings()]

    def last_audit_entries(self, wanted: Iterable[tuple[str, int | None]]) -> dict[int, tuple[int, AuditRow]]:
        """The last audit entry (its id and the entry) of each ``(order_no, procurement_id)`` that has one
        (read through the order's index)."""
        pairs = [(order_no, procurement_id) for order_no, procurement_id in wanted if procurement_id]
        if not pairs:
            return {}
        latest = (
            select(func.max(audit_log.c.id))
            .where(
                audit_log.c.order_no.in_({order_no for order_no, _ in pairs}),
                audit_log.c.procurement_id.in_({procurement_id for _, procurement_id in pairs}),
            )
            .group_by(audit_log.c.procurement_id)
        )
        statement = select(audit_log).where(audit_log.c.id.in_(latest.scalar_subquery()))
        found: dict[int, tuple[int, AuditRow]] = {}
        for row in self.connection.execute(statement).mappings():
            if (row["order_no"], row["procurement_id"]) in pairs:
                found[row["procurement_id"]] = (row["id"], _audit_row(row))
        return found

    def count_audit_repeats(self, added: Mapping[int, int], now: datetime) -> None:
        """Add ``added[id]`` identical repeats to each audit entry's count."""
        if added:
            self.connection.execute(
                _COUNT_AUDIT_REPEAT,
                [{"b_id": entry_id, "b_added": count, "last_at": now} for entry_id, count in added.items()],
            )

    def queue_counts(self) -> dict[tuple[str, str], int]:
        statement = select(procurements.c.upstream, procurements.c.state, func.count()).group_by(
            procurements.c.upstream, procurements.c.state
        )
        return {(row[0], row[1]): int(row[2]) for row in self.connection.execute(statement)}

    def oldest_queued(self) -> dict[str, datetime]:
        statement = (
            select(
                procurements.c.upstream,
                type_coerce(func.min(procurements.c.created_at), procurements.c.created_at.type),
            )
            .where(procurements.c.state == State.QUEUED.value)
            .group_by(procurements.c.upstream)
        )
        return {
            upstream: value for upstream, value in self.connection.execute(statement) if value is not None
        }

    def next_submission_due(self, upstream: str) -> datetime | None:
        """When the earliest queued procurement of ``upstream`` can next be claimed.

        A claimed one (its submission in flight) counts from its claim's expiry, not from its due time.
        """
        claimable_at = case(
            (procurements.c.lease_owner.is_(None), procurements.c.next_attempt_at),
            else_=procurements.c.lease_expires_at,
        )
        statement = select(type_coerce(func.min(claimable_at), procurements.c.next_attempt_at.type)).where(
            procurements.c.upstream == upstream, procurements.c.state == State.QUEUED.value
        )
        value = self.connection.execute(statement).scalar_one_or_none()
        return value if isinstance(value, datetime) else None

    def next_poll_due(self, upstream: str) -> datetime | None:
        """When the earliest fallback poll (or amount fetch) of ``upstream`` falls due."""
        statement = select(
            type_coerce(func.min(procurements.c.next_poll_at), procurements.c.next_poll_at.type)
        ).where(
            procurements.c.upstream == upstream,
            procurements.c.state.in_((State.SUBMITTED.value, State.DELIVERED.value)),
            procurements.c.upstream_order_id.is_not(None),
        )
        value = self.connection.execute(statement).scalar_one_or_none()
        return value if isinstance(value, datetime) else None

    def reconcile_candidates(
        self, since: datetime, upstream: str | None, include_settled: bool, limit: int
    ) -> list[Procurement]:
        """Procurements created since ``since`` that have an upstream order to compare: the unsettled ones
        (queued, submitted, exception), and with ``include_settled`` the delivered, canceled and resolved
        ones too."""
        states = [State.QUEUED, State.SUBMITTED, State.EXCEPTION]
        if include_settled:
            states += [State.DELIVERED, State.CANCELED, State.RESOLVED]
        conditions = [
            procurements.c.created_at >= since,
            procurements.c.upstream_order_id.is_not(None),
            procurements.c.state.in_([state.value for state in states]),
        ]
        if upstream is not None:
            conditions.append(procurements.c.upstream == upstream)
        statement = select(procurements).where(*conditions).order_by(procurements.c.id).limit(limit)
        return [to_procurement(row) for row in self.connection.execute(statement).mappings()]

    def stuck_without_alert(self, cutoff: datetime, limit: int = 500) -> list[Procurement]:
        """Submitted procurements waiting for delivery since before ``cutoff`` with no ``order_stuck`` alert
        raised since they were submitted."""
        key = literal("order_stuck:") + procurements.c.order_no
        statement = (
            select(procurements)
            .outerjoin(alerts, alerts.c.key == key)
            .where(
                procurements.c.state == State.SUBMITTED.value,
                procurements.c.submitted_at < cutoff,
                or_(alerts.c.key.is_(None), alerts.c.last_at < procurements.c.submitted_at),
            )
            .order_by(procurements.c.submitted_at)
            .limit(limit)
        )
        return [to_procurement(row) for row in self.connection.execute(statement).mappings()]


def _exceptions_matching(upstream: str | None, reason: str | None) -> list[Any]:
    conditions: list[Any] = [procurements.c.state == State.EXCEPTION.value]
    if upstream:
        conditions.append(procurements.c.upstream == upstream)
    if reason:
        conditions.append(procurements.c.exception_reason == reason)
    return conditions


def _audit_row(row: RowMapping) -> AuditRow:
    return AuditRow(
        row["order_no"],
        row["procurement_id"],
        row["at"],
        row["source"],
        row["event"],
        row["old_state"],
        row["new_state"],
        row["detail"],
        row["count"],
        row["last_at"],
    )
