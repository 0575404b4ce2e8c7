"""Every operation of an installation, one entry each.

The daemon's scheduled jobs, the admin API, the web console and the command line all call these, so an
operation takes the same path, spends the same request budget, raises the same alerts and writes the same
records whoever asked. An operation that does not apply raises :class:`Refused` (nothing changed).

A command opens the installation with :func:`open_operations`: the same
:class:`~procurd.operations.runtime.Runtime` as the daemon's, without listeners or background workers. Its
upstream clients take their slots from the budget every process of the installation shares in the database
(orders first, wherever they are sent from), and the alerts it raises are sent before it ends.

The operations are the one place that opens transactions (the state path's batch writer aside): the
listeners, the command line and the daemon call them, and the parts below them that keep something in the
database (the singletons' leases, the request budget) are given a port that an operation implements. The
database's failures reach the callers as this package's :class:`DatabaseError`, :class:`DatabaseUnavailable`
and :class:`Conflict`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from procurd.config import Settings
from procurd.core.refusals import Refused
from procurd.db.errors import Conflict, DatabaseError, DatabaseUnavailable
from procurd.operations.catalog import CatalogOperations
from procurd.operations.console import ConsoleReads
from procurd.operations.housekeeping import HousekeepingOperations
from procurd.operations.installation import (
    InstallationError,
    check_database,
    check_database_location,
    deliver_due_alerts,
    file_location_problem,
    open_checked_database,
    upgrade_database,
)
from procurd.operations.offers import OfferOperations
from procurd.operations.orders import OrderOperations
from procurd.operations.runtime import Runtime
from procurd.operations.sign_in import SignIn
from procurd.operations.upstreams import UpstreamOperations
from procurd.operations.views import ProcurementViews
from procurd.provider.operations import ProviderOperations

__all__ = [
    "Conflict",
    "DatabaseError",
    "DatabaseUnavailable",
    "InstallationError",
    "Operations",
    "Refused",
    "check_database",
    "check_database_location",
    "file_location_problem",
    "open_operations",
    "upgrade_database",
]


class Operations:
    """The operations of one process's runtime, by concern."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.catalog = CatalogOperations(runtime)
        self.upstreams = UpstreamOperations(runtime)
        self.views = ProcurementViews(runtime)
        self.orders = OrderOperations(runtime, self.views)
        self.offers = OfferOperations(runtime)
        self.housekeeping = HousekeepingOperations(runtime)
        self.console = ConsoleReads(runtime)
        self.sign_in = SignIn(runtime)
        self.provider = ProviderOperations(runtime, self.orders)
        self.catalog.offered = self.provider.refresh

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    async def close(self) -> None:
        """Cut short the work started in the background, then close the runtime."""
        await self.catalog.close()
        await self.provider.sender.close()
        await self.runtime.close()


@asynccontextmanager
async def open_operations(settings: Settings) -> AsyncIterator[Operations]:
    """The installation as a command uses it: the runtime on the configured database (which must be at the
    current migration, else :class:`InstallationError`), without listeners. On the way out, the alerts the
    command raised are sent (for a few seconds at most), then everything is closed."""
    database = await open_checked_database(settings)
    runtime = Runtime.build(settings, database=database)
    operations = Operations(runtime)
    try:
        yield operations
        await deliver_due_alerts(runtime)
    finally:
        await operations.close()
