"""The hourly rollup of procurements (``procurd.core.rollup``, pure) and migration 0004, which fills it from
the procurements stored before it existed.

The rollup's agreement with the state path over real orders is checked in ``test_pulse.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from alembic import command
from sqlalchemy import inspect, text

from conftest import POSTGRES_URL, _admin_execute, _database_url
from procurd.core.procurement import Procurement, State
from procurd.core.rollup import (
    VALUE_COLUMNS,
    contributions,
    delivery_column,
    difference,
    from_micros,
    hour_number,
    hour_of,
    hour_start,
    micros,
    percentile,
    runway_hours,
    window_start,
)
from procurd.db import migrate
from procurd.db.database import open_database
from procurd.db.schema import procurement_hours, upstream_balances
from procurd.db.stores import Tx
from procurd.operations.installation import migrate_schema
from support import sql_rows

NOW = datetime(2026, 11, 25, 14, 35, 12, tzinfo=UTC)
HOUR = hour_number(NOW)


def procurement(state: State = State.QUEUED, **fields: object) -> Procurement:
    values: dict[str, object] = {
        "id": 1, "order_no": "A1", "position": 0, "upstream": "main", "sku_id": 7, "product_id": 3,
        "quantity": 2, "manual_form_data": None, "max_unit_price": None, "unit_price": "9.90",
        "fulfillment_type": "auto", "trace_id": None, "downstream_order_no": "A1",
        "downstream_order_nos": ("A1",), "state": state, "created_at": NOW, "updated_at": NOW,
    }  # fmt: skip
    values.update(fields)
    return Procurement(**values)  # type: ignore[arg-type]


def test_hours_are_utc_hours() -> None:
    """An hour is numbered from 1970 in UTC, whatever the zone of the moment; its start comes back aware."""
    assert hour_start(HOUR) == hour_of(NOW) == datetime(2026, 11, 25, 14, tzinfo=UTC)
    other_zone = NOW.astimezone(ZoneInfo("Asia/Shanghai"))
    assert hour_number(other_zone) == HOUR
    assert window_start(NOW) == datetime(2026, 11, 24, 15, tzinfo=UTC)  # the current hour and the 23 before


def test_amounts_are_summed_as_exact_millionths() -> None:
    """Amounts become integer millionths and come back with at least two decimals."""
    assert micros("9.90") == 9_900_000
    assert micros(Decimal("0.0000005")) == 0  # half-even past six decimals
    assert micros("123456789.123456") == 123_456_789_123_456
    assert str(from_micros(310_500_000)) == "310.50"
    assert str(from_micros(1_234_567)) == "1.234567"
    assert str(from_micros(0)) == "0.00"


def test_a_procurement_counts_in_its_hours_of_intake_submission_and_delivery() -> None:
    """Taken in at 14:35, submitted at 15:10, delivered at 16:02: a count under its state at 14:00, its amount
    (and what it sold for) at 15:00, its time to delivery at 16:00."""
    delivered = procurement(
        State.DELIVERED, amount="19.80", currency="CNY", submitted_at=NOW + timedelta(minutes=35),
        delivered_at=NOW + timedelta(minutes=87), sell_price="11.88", sell_currency="USD", sell_rate="0.5",
    )  # fmt: skip
    assert contributions(delivered) == {
        (HOUR, ""): {"n_delivered": 1},
        (HOUR + 1, "CNY"): {"n_paid": 1, "spend_micros": 19_800_000, "n_priced": 1,
                            "sold_micros": 47_520_000, "sold_cost_micros": 19_800_000},
        (HOUR + 2, ""): {"dt_2h": 1},
    }  # fmt: skip
    assert contributions(procurement()) == {(HOUR, ""): {"n_queued": 1}}


def test_a_change_moves_a_procurement_between_its_rows() -> None:
    """The difference a change makes: the old state out, the new in, the amount when it is paid; nothing
    for a change the rollup does not see (a claim); the account's rows as well as the upstream's."""
    queued = procurement()
    claimed = replace(queued, lease_owner="w/main/1", attempts=1)
    submitted = replace(claimed, state=State.SUBMITTED, amount="19.80", currency="CNY", submitted_at=NOW)
    assert difference([(None, queued, (0,))]) == {("main", 0, HOUR, ""): {"n_queued": 1}}
    assert difference([(queued, claimed, (0, 12))]) == {}
    assert difference([(claimed, submitted, (0, 12))]) == {
        ("main", 0, HOUR, ""): {"n_queued": -1, "n_submitted": 1},
        ("main", 12, HOUR, ""): {"n_queued": -1, "n_submitted": 1},
        ("main", 0, HOUR, "CNY"): {"n_paid": 1, "spend_micros": 19_800_000},
        ("main", 12, HOUR, "CNY"): {"n_paid": 1, "spend_micros": 19_800_000},
    }
    refunded = replace(submitted, state=State.EXCEPTION)  # the upstream holds no money for it any more
    assert difference([(submitted, refunded, (0,))]) == {
        ("main", 0, HOUR, ""): {"n_submitted": -1, "n_exception": 1},
        ("main", 0, HOUR, "CNY"): {"n_paid": -1, "spend_micros": -19_800_000},
    }
    moved = replace(queued, upstream="second")  # an offer moved on to a source at another upstream
    assert difference([(queued, moved, (0,))]) == {
        ("main", 0, HOUR, ""): {"n_queued": -1},
        ("second", 0, HOUR, ""): {"n_queued": 1},
    }


def test_time_to_delivery_buckets_and_percentiles() -> None:
    """A delivery falls in the first bucket whose bound it does not pass; a percentile is the bound of the
    bucket that holds it."""
    assert [delivery_column(s) for s in (0.2, 1, 1.5, 59, 61, 86_400, 10**7)] == [
        "dt_1s", "dt_1s", "dt_2s", "dt_1m", "dt_2m", "dt_1d", "dt_more",
    ]  # fmt: skip
    histogram = {"dt_1s": 50, "dt_5s": 45, "dt_2m": 4, "dt_more": 1}
    assert percentile(histogram, 0.5) == 1
    assert percentile(histogram, 0.95) == 5
    assert percentile(histogram, 0.99) == 120
    assert percentile(histogram, 1.0) == -1
    assert percentile({}, 0.5) is None


def test_runway_hours() -> None:
    """Balance over the spend per hour (one decimal); none without spend; none left at a balance of 0."""
    assert runway_hours(Decimal("1000.00"), Decimal("310.50")) == 77.3
    assert runway_hours(Decimal("20.80"), Decimal("79.20")) == 6.3
    assert runway_hours(Decimal("1000.00"), Decimal(0)) is None
    assert runway_hours(None, Decimal(5)) is None
    assert runway_hours(Decimal("-3"), Decimal(5)) == 0.0


ACCOUNT = """INSERT INTO provider_accounts (id, name, api_key, api_secret, status, balance_cents,
currency, created_at, updated_at) VALUES (7, 'shop', 'k', 's', 'active', 0, 'CNY', :created, :created)"""
ORDER = """INSERT INTO orders (order_no, fingerprint, request, status, exception, created_at, updated_at,
provider) VALUES (:no, 'x', '{}', 'paid', false, :created, :created, :p)"""
PROCUREMENT = """INSERT INTO procurements (order_no, position, upstream, sku_id, quantity,
downstream_order_no, downstream_order_nos, number_canceled, state, amount, currency, attempts,
upstream_may_exist, source_position, submitted_at, delivered_at, created_at, updated_at) VALUES (:no, 0,
'main', 1, 1, :no, '[]', false, :state, :amount, 'CNY', 1, false, 0, :submitted, :delivered, :created,
:created)"""
PROVIDER_ORDER = """INSERT INTO provider_orders (order_no, account_id, upstream, product_id, sku_id,
upstream_sku_id, fulfillment_type, quantity, unit_price, amount_cents, currency, status, refunded_cents,
created_at, updated_at) VALUES ('B1', 7, 'main', 1, 1, 1, 'auto', 1, '12.00', 1200, 'CNY', 'delivered', 0,
:created, :created)"""
PING = """INSERT INTO upstream_health (upstream, last_ping_at, last_ping_ok, balance, currency,
callbacks_accepted, callbacks_rejected, updated_at) VALUES ('main', :created, true, '970.30', 'CNY', 0, 0,
:created)"""


@pytest.fixture
async def empty_database_url(tmp_path: Path) -> AsyncIterator[str]:
    """A database with no schema at all (SQLite, or PostgreSQL in its pass)."""
    if not POSTGRES_URL:
        yield f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
        return
    name = f"procurd_empty_{uuid.uuid4().hex[:12]}"
    await _admin_execute([f"CREATE DATABASE {name}"])
    try:
        yield _database_url(name)
    finally:
        await _admin_execute([f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"])


async def test_migration_0004_fills_the_rollup_from_the_procurements_already_stored(
    empty_database_url: str,
) -> None:
    """A database at 0003 with procurements (a downstream account's among them) and a ping: upgraded, its
    rollup holds each procurement in its hours (the account's in its rows too), and the wallet's chart has
    the last ping's balance; downgraded, the tables and columns are gone again."""
    database = open_database(empty_database_url)
    try:
        await migrate_schema(database, "0003")
        created = datetime(2026, 11, 20, 9, 15, tzinfo=UTC)
        rows = [
            ("B1", "delivered", "9.90", created + timedelta(seconds=2), created + timedelta(seconds=40)),
            ("B2", "submitted", "9.90", created + timedelta(hours=1, seconds=5), None),
            ("B3", "exception", None, None, None),
            ("B4", "canceled", "9.90", created + timedelta(seconds=2), None),  # refunded: no spend
        ]

        def seed(tx: Tx) -> None:
            connection = tx.connection
            bind = {"created": created}
            connection.execute(text(ACCOUNT), bind)
            for number, state, amount, submitted, delivered in rows:
                connection.execute(text(ORDER), {**bind, "no": number, "p": number == "B1"})
                values = {"no": number, "state": state, "amount": amount, "submitted": submitted}
                connection.execute(text(PROCUREMENT), {**bind, **values, "delivered": delivered})
            connection.execute(text(PROVIDER_ORDER), bind)
            connection.execute(text(PING), bind)

        await database.write(seed)
        await migrate_schema(database, "0004")
        stored = await sql_rows(database, procurement_hours.select())
        found = {
            (row.account_id, row.hour.astimezone(UTC).hour, row.currency): {
                column: getattr(row, column) for column in VALUE_COLUMNS if getattr(row, column)
            }
            for row in stored
        }
        assert {row.writer for row in stored} == {"migration"}
        assert found == {
            (0, 9, ""): {"n_delivered": 1, "n_submitted": 1, "n_exception": 1, "n_canceled": 1, "dt_1m": 1},
            (0, 9, "CNY"): {"n_paid": 1, "spend_micros": 9_900_000},
            (0, 10, "CNY"): {"n_paid": 1, "spend_micros": 9_900_000},
            (7, 9, ""): {"n_delivered": 1, "dt_1m": 1},
            (7, 9, "CNY"): {"n_paid": 1, "spend_micros": 9_900_000},
        }
        [balance] = await sql_rows(database, upstream_balances.select())
        assert (balance.upstream, balance.balance, balance.currency) == ("main", "970.30", "CNY")
        assert balance.hour.astimezone(UTC) == datetime(2026, 11, 20, 9, tzinfo=UTC)

        def downgrade(tx: Tx) -> list[str]:
            command.downgrade(migrate.alembic_config(tx.connection), "0003")
            found = inspect(tx.connection)
            return [*(c["name"] for c in found.get_columns("procurements")), *found.get_table_names()]

        names = await database.write(downgrade)
        assert not {"sell_price", "sell_rate", "procurement_hours", "upstream_balances"} & set(names)
    finally:
        await database.close()
