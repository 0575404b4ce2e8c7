"""What the provider role is given by the installation that composes it (:mod:`procurd.operations`): the
runtime's parts it acts through, and the local orders it cancels and shows. Declared here, as the methods and
attributes the provider uses and nothing more; :class:`procurd.operations.runtime.Runtime` and
:class:`procurd.operations.orders.OrderOperations` meet them."""

from __future__ import annotations

from typing import Any, Protocol

from procurd.config import Settings
from procurd.core.alerts import Occurrence
from procurd.core.procurement import Source
from procurd.db.database import Database
from procurd.metrics import Metrics
from procurd.procurement.service import ProcurementService


class Alerts(Protocol):
    async def raise_(self, *occurrences: Occurrence) -> None: ...


class Installation(Protocol):
    """The runtime's parts the provider acts through."""

    @property
    def settings(self) -> Settings: ...

    @property
    def database(self) -> Database: ...

    @property
    def service(self) -> ProcurementService: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def alerts(self) -> Alerts: ...

    @property
    def instance(self) -> str: ...


class OrderViews(Protocol):
    async def order(self, order_no: str) -> dict[str, Any] | None: ...


class LocalOrders(Protocol):
    """The local orders behind provider orders: a downstream's cancel, and an order's view."""

    @property
    def views(self) -> OrderViews: ...

    async def cancel(self, order_no: str, *, source: Source = ...) -> dict[str, Any]: ...
