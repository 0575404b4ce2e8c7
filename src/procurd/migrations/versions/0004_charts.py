"""the shop's pulse: the selling price known at intake on each procurement, the hourly rollup of procurements,
the wallet's balance hour by hour, and the ledger by time

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27 10:00:00

The rollup is filled from the procurements already stored, as the state path would have written it (by one
writer, ``migration``); this file keeps its own copy of that arithmetic, so that it never changes with later
versions.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

import sqlalchemy as sa
from alembic import op

import procurd.db.types

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

UTC_DATETIME = procurd.db.types.UtcDateTime(timezone=True)
MONEY = sa.String(length=40)
WRITER = "migration"

STATES = ("queued", "submitted", "delivered", "canceled", "exception", "resolved")
DELIVERY_BOUNDS = (
    ("dt_1s", 1), ("dt_2s", 2), ("dt_5s", 5), ("dt_10s", 10), ("dt_20s", 20), ("dt_30s", 30),
    ("dt_1m", 60), ("dt_2m", 120), ("dt_5m", 300), ("dt_10m", 600), ("dt_20m", 1200), ("dt_30m", 1800),
    ("dt_1h", 3600), ("dt_2h", 7200), ("dt_4h", 14400), ("dt_8h", 28800), ("dt_1d", 86400),
    ("dt_3d", 259200),
)  # fmt: skip
VALUE_COLUMNS = (
    *(f"n_{state}" for state in STATES), "n_paid", "n_priced",
    "spend_micros", "sold_micros", "sold_cost_micros",
    *(name for name, _ in DELIVERY_BOUNDS), "dt_more",
)  # fmt: skip
BATCH = 5_000


def upgrade() -> None:
    with op.batch_alter_table("procurements") as batch_op:
        batch_op.add_column(sa.Column("sell_price", MONEY, nullable=True))
        batch_op.add_column(sa.Column("sell_currency", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("sell_rate", MONEY, nullable=True))
    op.create_table(
        "procurement_hours",
        sa.Column("upstream", sa.String(length=64), nullable=False),
        sa.Column("account_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("hour", UTC_DATETIME, nullable=False),
        sa.Column("currency", sa.String(length=16), nullable=False),
        sa.Column("writer", sa.String(length=128), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in VALUE_COLUMNS),
        sa.PrimaryKeyConstraint(
            "upstream", "account_id", "hour", "currency", "writer", name=op.f("pk_procurement_hours")
        ),
    )
    op.create_table(
        "upstream_balances",
        sa.Column("upstream", sa.String(length=64), nullable=False),
        sa.Column("hour", UTC_DATETIME, nullable=False),
        sa.Column("balance", MONEY, nullable=False),
        sa.Column("currency", sa.String(length=16), nullable=True),
        sa.Column("at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("upstream", "hour", name=op.f("pk_upstream_balances")),
    )
    op.create_index(
        "ix_provider_ledger_account_at", "provider_ledger", ["account_id", "created_at"], unique=False
    )
    connection = op.get_bind()
    fill_rollup(connection)
    fill_balances(connection)


def downgrade() -> None:
    op.drop_index("ix_provider_ledger_account_at", table_name="provider_ledger")
    op.drop_table("upstream_balances")
    op.drop_table("procurement_hours")
    with op.batch_alter_table("procurements") as batch_op:
        batch_op.drop_column("sell_rate")
        batch_op.drop_column("sell_currency")
        batch_op.drop_column("sell_price")


# --- the rollup of the procurements stored before it existed --------------------------------------------------


def _aware(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _micros(amount: Decimal) -> int:
    return int((amount * 1_000_000).to_integral_value(rounding=ROUND_HALF_EVEN))


def _bucket(seconds: float) -> str:
    for name, bound in DELIVERY_BOUNDS:
        if seconds <= bound:
            return name
    return "dt_more"


def _rows(connection: sa.Connection) -> Iterator[Any]:
    """Every procurement with the downstream account that ordered it (0: the storefront), by id."""
    statement = sa.text(
        "SELECT p.id, p.upstream, p.state, p.quantity, p.amount, p.currency, p.created_at, p.submitted_at, "
        "p.delivered_at, COALESCE(po.account_id, 0) AS account_id FROM procurements p "
        "LEFT JOIN provider_orders po ON po.order_no = p.order_no WHERE p.id > :after ORDER BY p.id LIMIT :n"
    )
    after = 0
    while True:
        rows = connection.execute(statement, {"after": after, "n": BATCH}).all()
        if not rows:
            return
        yield from rows
        after = rows[-1].id


def rollup_of(connection: sa.Connection) -> dict[tuple[str, int, datetime, str], dict[str, int]]:
    """The rollup of the stored procurements: ``(upstream, account, hour, currency)`` to its values."""
    hours: dict[tuple[str, int, datetime, str], dict[str, int]] = {}

    def add(upstream: str, account: int, hour: datetime, currency: str, column: str, value: int) -> None:
        for who in {0, account}:
            row = hours.setdefault((upstream, who, hour, currency), dict.fromkeys(VALUE_COLUMNS, 0))
            row[column] += value

    for row in _rows(connection):
        created = _aware(row.created_at)
        assert created is not None
        account = int(row.account_id or 0)
        add(row.upstream, account, _hour(created), "", f"n_{row.state}", 1)
        submitted, delivered = _aware(row.submitted_at), _aware(row.delivered_at)
        if row.state in ("submitted", "delivered") and row.amount is not None and submitted is not None:
            try:
                amount = _micros(Decimal(row.amount))
            except InvalidOperation:
                continue
            currency = row.currency or ""
            add(row.upstream, account, _hour(submitted), currency, "n_paid", 1)
            add(row.upstream, account, _hour(submitted), currency, "spend_micros", amount)
        if row.state == "delivered" and delivered is not None:
            bucket = _bucket((delivered - created).total_seconds())
            add(row.upstream, account, _hour(delivered), "", bucket, 1)
    return hours


def fill_rollup(connection: sa.Connection) -> None:
    table = sa.table(
        "procurement_hours",
        *(sa.column(name) for name in ("upstream", "account_id", "currency", "writer", *VALUE_COLUMNS)),
        sa.column("hour", UTC_DATETIME),
    )
    rows = [
        {"upstream": upstream, "account_id": account, "hour": hour, "currency": currency, "writer": WRITER,
         **values}
        for (upstream, account, hour, currency), values in rollup_of(connection).items()
    ]  # fmt: skip
    for start in range(0, len(rows), BATCH):
        connection.execute(sa.insert(table), rows[start : start + BATCH])


def fill_balances(connection: sa.Connection) -> None:
    """The last ping's balance of each upstream, as its hour's."""
    found = connection.execute(
        sa.text(
            "SELECT upstream, balance, currency, last_ping_at FROM upstream_health "
            "WHERE balance IS NOT NULL AND last_ping_at IS NOT NULL"
        )
    ).all()
    table = sa.table(
        "upstream_balances",
        sa.column("upstream"),
        sa.column("balance"),
        sa.column("currency"),
        sa.column("hour", UTC_DATETIME),
        sa.column("at", UTC_DATETIME),
    )
    rows = []
    for row in found:
        at = _aware(row.last_ping_at)
        assert at is not None
        rows.append(
            {"upstream": row.upstream, "hour": _hour(at), "balance": row.balance, "currency": row.currency,
             "at": at}
        )  # fmt: skip
    if rows:
        connection.execute(sa.insert(table), rows)
