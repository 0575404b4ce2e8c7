"""Lookups by two-column keys that use both columns of the index, on every database.

A row-value ``(a, b) IN (...)`` is searched on SQLite by ``a`` alone (one key) or not by the index at all
(several), so its cost grows with the table. A statement written as ``a = :first AND b IN (:seconds)`` is run
once for each distinct first column instead: one statement in the usual case (one upstream, one account).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Any, TypeVar

from sqlalchemy import Connection, Executable, Row

A = TypeVar("A", bound=Hashable)
B = TypeVar("B", bound=Hashable)


def grouped(keys: Iterable[tuple[A, B]]) -> dict[A, list[B]]:
    """The keys' second columns by their first, each without repeats."""
    groups: dict[A, set[B]] = {}
    for first, second in keys:
        groups.setdefault(first, set()).add(second)
    return {first: list(seconds) for first, seconds in groups.items()}


def by_pairs(
    connection: Connection, statement: Executable, keys: Iterable[tuple[Any, Any]]
) -> Iterator[Row[*tuple[Any, ...]]]:
    """The rows of ``statement`` (bind parameters ``first`` and an expanding ``seconds``) for the keys."""
    for first, seconds in grouped(keys).items():
        yield from connection.execute(statement, {"first": first, "seconds": seconds})
