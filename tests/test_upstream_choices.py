"""The SKU ids procurd gives the choices of an upstream that numbers none (acg-faka): stable across passes,
one per choice key, never reused, and per upstream."""

from __future__ import annotations

from datetime import UTC, datetime

from procurd.core.records import ListedChoice
from procurd.db.database import Database

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _choice(key: str, product_id: int = 7) -> ListedChoice:
    return ListedChoice(key, product_id, "CODE", "red", (("size", "L"),))


async def test_a_choice_keeps_its_id_and_a_new_one_takes_the_next(database: Database) -> None:
    first = await database.write(lambda tx: tx.choices.assign("acg", [_choice("a"), _choice("b")], NOW))
    assert first == {"a": 1, "b": 2}
    again = await database.write(lambda tx: tx.choices.assign("acg", [_choice("b"), _choice("c")], NOW))
    assert again == {"b": 2, "c": 3}


async def test_ids_are_per_upstream_and_name_what_a_trade_needs(database: Database) -> None:
    await database.write(lambda tx: tx.choices.assign("acg", [_choice("a")], NOW))
    other = await database.write(lambda tx: tx.choices.assign("other", [_choice("z", 9)], NOW))
    assert other == {"z": 1}
    found = await database.read(lambda tx: tx.choices.of("other", 1))
    assert found is not None
    assert (found.key, found.product_id, found.code, found.race, found.options) == (
        "z",
        9,
        "CODE",
        "red",
        (("size", "L"),),
    )
    assert await database.read(lambda tx: tx.choices.of("acg", 2)) is None


async def test_a_choice_listed_twice_in_one_pass_gets_one_id(database: Database) -> None:
    ids = await database.write(lambda tx: tx.choices.assign("acg", [_choice("a"), _choice("a")], NOW))
    assert ids == {"a": 1}
    assert await database.write(lambda tx: tx.choices.assign("acg", [_choice("d")], NOW)) == {"d": 2}
