"""Typed views of a transaction: one protocol per store of :class:`procurd.db.stores.Tx`.

A transaction's function names the stores it needs by the view it takes, made of these (a view of one
store, or a protocol that inherits several), never the whole :class:`~procurd.db.stores.Tx` or ``Any``::

    class TakeoverTx(WithInstances, WithLeases, Protocol): ...

    def take_over(tx: TakeoverTx, ...) -> ...: ...

``Tx`` satisfies every view, so such a function runs as any other: ``await database.write(take_over, ...)``.
"""

from __future__ import annotations

from typing import Protocol

from procurd.db.alert_store import AlertStore
from procurd.db.auth_store import AuthStore
from procurd.db.chart_store import ChartStore
from procurd.db.choice_store import ChoiceStore
from procurd.db.console_store import ConsoleStore
from procurd.db.dialect_store import DialectStore
from procurd.db.health_store import HealthStore
from procurd.db.instance_store import InstanceStore
from procurd.db.leases import LeaseStore
from procurd.db.mirror_store import MirrorStore
from procurd.db.offer_store import OfferStore
from procurd.db.offered_store import OfferedStore
from procurd.db.outbox_store import OutboxStore
from procurd.db.procurement_store import ProcurementStore
from procurd.db.provider_store import ProviderStore
from procurd.db.rate_budget import RateBudgetStore
from procurd.db.reconcile_store import ReconcileStore
from procurd.db.retention_store import RetentionStore
from procurd.db.revision import SchemaStore
from procurd.db.trade_store import TradeStore


class WithProcurements(Protocol):
    @property
    def procurements(self) -> ProcurementStore: ...


class WithOutbox(Protocol):
    @property
    def outbox(self) -> OutboxStore: ...


class WithAuth(Protocol):
    @property
    def auth(self) -> AuthStore: ...


class WithMirror(Protocol):
    @property
    def mirror(self) -> MirrorStore: ...


class WithHealth(Protocol):
    @property
    def health(self) -> HealthStore: ...


class WithDialects(Protocol):
    @property
    def dialects(self) -> DialectStore: ...


class WithLeases(Protocol):
    @property
    def leases(self) -> LeaseStore: ...


class WithAlerts(Protocol):
    @property
    def alerts(self) -> AlertStore: ...


class WithInstances(Protocol):
    @property
    def instances(self) -> InstanceStore: ...


class WithReconcile(Protocol):
    @property
    def reconcile(self) -> ReconcileStore: ...


class WithOffers(Protocol):
    @property
    def offers(self) -> OfferStore: ...


class WithRetention(Protocol):
    @property
    def retention(self) -> RetentionStore: ...


class WithConsole(Protocol):
    @property
    def console(self) -> ConsoleStore: ...


class WithRateBudget(Protocol):
    @property
    def rate_budget(self) -> RateBudgetStore: ...


class WithProvider(Protocol):
    @property
    def provider(self) -> ProviderStore: ...


class WithOffered(Protocol):
    @property
    def offered(self) -> OfferedStore: ...


class WithCharts(Protocol):
    @property
    def charts(self) -> ChartStore: ...


class WithSchema(Protocol):
    @property
    def schema(self) -> SchemaStore: ...


class WithChoices(Protocol):
    @property
    def choices(self) -> ChoiceStore: ...


class WithTrades(Protocol):
    @property
    def trades(self) -> TradeStore: ...
