"""The ``procurd`` command line: one module per command group, all registered on :data:`main`."""

from __future__ import annotations

from procurd.cli import catalog, database, demo, ping, run  # noqa: F401  (modules register their commands)
from procurd.cli.base import main
from procurd.sandbox.cli import sandbox_command

main.add_command(sandbox_command, "sandbox")

__all__ = ["main"]
