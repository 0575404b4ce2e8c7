"""The ``procurd`` command line: one module per command group, all registered on :data:`main`."""

from __future__ import annotations

# Importing each module registers its commands on main.
from procurd.cli import (  # noqa: F401
    alerts,
    catalog,
    database,
    demo,
    doctor,
    exceptions,
    offers,
    orders,
    ping,
    probe,
    provider,
    prune,
    reconcile,
    run,
    status,
)
from procurd.cli.base import main
from procurd.sandbox.cli import sandbox_command

main.add_command(sandbox_command, "sandbox")

__all__ = ["main"]
