"""Statements run on the driver's own tuples, for the rows written by the thousand (the catalogue mirror's):
a Core statement compiled once per dialect, JSON serialized once (orjson) from the values as sent, and no
per-row SQLAlchemy processing. And rows inserted with their ids in a few statements (:func:`inserted_ids`)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import orjson
from sqlalchemy import Connection, Dialect, Executable, Table, bindparam, insert
from sqlalchemy.sql.compiler import Compiled
from sqlalchemy.sql.expression import ClauseElement

VARIABLES_PER_STATEMENT = 2000  # bound values per multi-row INSERT (SQLite and PostgreSQL allow 32766)


def json_text(value: Any) -> str | None:
    if value is None:
        return None
    return orjson.dumps(value, default=_exact).decode()


def _exact(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


class DriverSql:
    """A Core statement compiled once per dialect into the driver's SQL (one positional parameter)."""

    def __init__(self, statement: ClauseElement) -> None:
        self._statement = statement
        self._compiled: dict[str, str] = {}

    def sql(self, dialect: Dialect) -> str:
        known = self._compiled.get(dialect.name)
        if known is None:
            known = self._compiled[dialect.name] = str(self._statement.compile(dialect=dialect))
        return known


class Bulk:
    """A Core statement compiled once per dialect into the driver's SQL, run on tuples whose values are in
    the order of the statement's bind names ``p0, p1, ...``.

    An INSERT runs as multi-row ``VALUES`` statements: on SQLite the driver releases the GIL for every
    statement step, and one step per row makes the writer thread wait for the event loop at every row; on
    PostgreSQL it saves the server a statement per row. Other statements are one ``executemany``.
    """

    def __init__(self, build: Callable[[], ClauseElement]) -> None:
        self._build = build
        self._compiled: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        self._multi_row: dict[tuple[str, int], str] = {}

    def _for(self, dialect: Dialect) -> tuple[str, tuple[int, ...] | None]:
        known = self._compiled.get(dialect.name)
        if known is None:
            compiled: Compiled = self._build().compile(dialect=dialect)
            names = getattr(compiled, "positiontup", None) or []
            order = tuple(int(name[1:]) for name in names)
            known = (str(compiled), None if order == tuple(range(len(order))) else order)
            self._compiled[dialect.name] = known
        return known

    def run(self, connection: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        if not rows:
            return
        dialect = connection.dialect
        sql, order = self._for(dialect)
        if order is not None:
            rows = [tuple(row[index] for index in order) for row in rows]
        if not sql.startswith("INSERT"):
            connection.exec_driver_sql(sql, list(rows))
            return
        # Whole groups only: one multi-row statement (and the single-row one for the rest) per table, so the
        # drivers' statement caches never fill with statements of every length.
        width = len(rows[0])
        per_statement = max(1, VARIABLES_PER_STATEMENT // width)
        whole = len(rows) - len(rows) % per_statement
        if whole:
            grouped = self._multi_row_sql(dialect.name, sql, per_statement, width)
            for start in range(0, whole, per_statement):
                chunk = rows[start : start + per_statement]
                connection.exec_driver_sql(grouped, tuple(value for row in chunk for value in row))
        if whole < len(rows):
            connection.exec_driver_sql(sql, list(rows[whole:]))

    def _multi_row_sql(self, dialect: str, sql: str, count: int, width: int) -> str:
        known = self._multi_row.get((dialect, count))
        if known is None:
            head, _, group = sql.partition(" VALUES ")
            if "$1" in group:  # numbered placeholders ($1, $2 ...): each group takes the next numbers
                groups = [_renumbered(group, row * width) for row in range(count)]
            else:
                groups = [group] * count
            known = f"{head} VALUES {', '.join(groups)}"
            self._multi_row[(dialect, count)] = known
        return known


_NUMBERED = re.compile(r"\$(\d+)")


def _renumbered(group: str, shift: int) -> str:
    def renumber(found: re.Match[str]) -> str:
        return f"${int(found[1]) + shift}"

    return _NUMBERED.sub(renumber, group)


def binds(count: int, start: int = 0) -> list[Any]:
    return [bindparam(f"p{index}") for index in range(start, start + count)]


def inserted_ids(
    connection: Connection, table: Table, rows: Sequence[Mapping[str, Any]], key: Sequence[str]
) -> list[int]:
    """Insert ``rows`` into ``table``: their ids, in the order given.

    SQLAlchemy's "insertmanyvalues" sends them as multi-row ``VALUES`` statements (one for a batch's rows),
    each returning the new ids with the rows' unique ``key`` columns, which tell the rows apart (the order of
    ``RETURNING`` rows is not promised). Asking for the ids in the order of the rows instead
    (``sort_by_parameter_order``) runs one statement a row on SQLite, and at every row the writer thread gives
    up the GIL and waits for it again while the event loop runs.
    """
    if not rows:
        return []
    ids = {
        tuple(found[1:]): int(found[0])
        for found in connection.execute(_returning_ids(table, tuple(key)), list(rows))
    }
    return [ids[tuple(row[name] for name in key)] for row in rows]


@functools.cache
def _returning_ids(table: Table, key: tuple[str, ...]) -> Executable:
    return insert(table).returning(table.c.id, *(table.c[name] for name in key))
