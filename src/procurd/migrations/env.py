"""Alembic environment: runs on the connection handed in by ``procurd.db.migrate``."""

from __future__ import annotations

from alembic import context

from procurd.db.schema import ddl_metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `procurd db upgrade`, which provides the connection")

context.configure(
    connection=connection,
    target_metadata=ddl_metadata(),
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
