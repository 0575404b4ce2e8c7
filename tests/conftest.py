"""Shared fixtures: a migrated database per test (SQLite file, or PostgreSQL cloned from a template)."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from procurd.db.database import Database, open_database
from procurd.logs import configure_logging
from procurd.operations.installation import migrate_schema

# Tests that need other logging set it up themselves; the rest log warnings and worse, as JSON.
configure_logging("warning", "json")

# PROCURD_TEST_POSTGRES_URL=postgresql+asyncpg://user@127.0.0.1:5432/postgres switches the whole suite
# onto PostgreSQL: every test gets a fresh database cloned from a migrated template.
POSTGRES_URL = os.environ.get("PROCURD_TEST_POSTGRES_URL", "")
# One template per test session, so that sessions on one server (two terminals, a loop) never drop
# each other's.
TEMPLATE_DB = f"procurd_test_template_{uuid.uuid4().hex[:12]}"


def database_kind() -> str:
    return "postgresql" if POSTGRES_URL else "sqlite"


async def _admin_execute(statements: list[str]) -> None:
    admin = create_async_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as connection:
            for statement in statements:
                await connection.execute(text(statement))
    finally:
        await admin.dispose()


def _database_url(name: str) -> str:
    return make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str | None]:
    """Create and migrate the template database once per session (PostgreSQL only)."""
    if not POSTGRES_URL:
        yield None
        return

    async def build() -> None:
        await _admin_execute([f"DROP DATABASE IF EXISTS {TEMPLATE_DB}", f"CREATE DATABASE {TEMPLATE_DB}"])
        database = open_database(_database_url(TEMPLATE_DB))
        try:
            await migrate_schema(database)
        finally:
            await database.close()

    asyncio.run(build())
    yield TEMPLATE_DB
    asyncio.run(_admin_execute([f"DROP DATABASE IF EXISTS {TEMPLATE_DB}"]))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """A SQLite file migrated once per session; each test gets a copy (migrating takes 0.2 s, copying
    0.3 ms). ``None`` on PostgreSQL."""
    if POSTGRES_URL:
        return None
    path = tmp_path_factory.mktemp("template") / "procurd.db"

    async def build() -> None:
        database = open_database(f"sqlite+aiosqlite:///{path}")
        try:
            await migrate_schema(database)
        finally:
            await database.close()

    asyncio.run(build())
    return path


@pytest.fixture
async def database_url(
    tmp_path: Path, postgres_template: str | None, sqlite_template: Path | None
) -> AsyncIterator[str]:
    """The URL of a fresh, migrated database for this test."""
    if sqlite_template is not None:
        path = tmp_path / "procurd.db"
        shutil.copyfile(sqlite_template, path)
        yield f"sqlite+aiosqlite:///{path}"
        return
    name = f"procurd_test_{uuid.uuid4().hex[:12]}"
    await _admin_execute([f"CREATE DATABASE {name} TEMPLATE {postgres_template}"])
    try:
        yield _database_url(name)
    finally:
        await _admin_execute([f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"])


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    """This test's migrated database, closed afterwards."""
    database = open_database(database_url)
    try:
        yield database
    finally:
        await database.close()


# Fixtures that give a test a database of the pass's kind (SQLite, or PostgreSQL in its pass): every
# migrated one is cloned from the template (database_url and the modules' own), the empty one is not.
DATABASE_FIXTURES = frozenset({"postgres_template", "empty_database_url"})


def uses_the_pass_database(item: pytest.Item) -> bool:
    """Whether ``item`` runs differently on PostgreSQL: it takes a database from a fixture of
    :data:`DATABASE_FIXTURES` (directly or through another fixture), or is marked ``postgres``."""
    fixtures = set(getattr(item, "fixturenames", ()))
    return bool(fixtures & DATABASE_FIXTURES) or item.get_closest_marker("postgres") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The PostgreSQL pass runs only the tests that use its database: the others (the pure core, the
    sandbox, the command line on its own SQLite file) would run exactly as in the SQLite pass."""
    if not POSTGRES_URL:
        return
    kept = [item for item in items if uses_the_pass_database(item)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if not uses_the_pass_database(item)])
        items[:] = kept
