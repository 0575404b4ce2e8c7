"""One transaction and the stores that speak SQL in it: what :class:`procurd.db.database.Database` hands to
the functions it runs."""

from __future__ import annotations

from functools import cached_property

from sqlalchemy import Connection

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
from procurd.db.rate_budget import RateBudgetStore, rate_budget_store
from procurd.db.reconcile_store import ReconcileStore
from procurd.db.retention_store import RetentionStore
from procurd.db.revision import SchemaStore
from procurd.db.trade_store import TradeStore


class Tx:
    """A transaction in progress. Its stores share its connection; nothing commits until the function that
    received it returns."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    @property
    def dialect(self) -> str:
        return self.connection.dialect.name

    @cached_property
    def procurements(self) -> ProcurementStore:
        return ProcurementStore(self.connection)

    @cached_property
    def outbox(self) -> OutboxStore:
        return OutboxStore(self.connection)

    @cached_property
    def auth(self) -> AuthStore:
        return AuthStore(self.connection)

    @cached_property
    def mirror(self) -> MirrorStore:
        return MirrorStore(self.connection)

    @cached_property
    def health(self) -> HealthStore:
        return HealthStore(self.connection)

    @cached_property
    def dialects(self) -> DialectStore:
        return DialectStore(self.connection)

    @cached_property
    def leases(self) -> LeaseStore:
        return LeaseStore(self.connection)

    @cached_property
    def trades(self) -> TradeStore:
        return TradeStore(self.connection)

    @cached_property
    def alerts(self) -> AlertStore:
        return AlertStore(self.connection)

    @cached_property
    def instances(self) -> InstanceStore:
        return InstanceStore(self.connection)

    @cached_property
    def reconcile(self) -> ReconcileStore:
        return ReconcileStore(self.connection)

    @cached_property
    def offers(self) -> OfferStore:
        return OfferStore(self.connection)

    @cached_property
    def retention(self) -> RetentionStore:
        return RetentionStore(self.connection)

    @cached_property
    def console(self) -> ConsoleStore:
        return ConsoleStore(self.connection)

    @cached_property
    def rate_budget(self) -> RateBudgetStore:
        return rate_budget_store(self.connection)

    @cached_property
    def provider(self) -> ProviderStore:
        return ProviderStore(self.connection)

    @cached_property
    def offered(self) -> OfferedStore:
        return OfferedStore(self.connection)

    @cached_property
    def charts(self) -> ChartStore:
        return ChartStore(self.connection)

    @cached_property
    def choices(self) -> ChoiceStore:
        return ChoiceStore(self.connection)

    @cached_property
    def schema(self) -> SchemaStore:
        return SchemaStore(self.connection)
