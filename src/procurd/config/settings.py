"""The whole configuration: every section, checked together (unique upstream names and keys, the provider's
upstreams configured), and where each key was set."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from procurd.config.catalog import CatalogSettings, PricingSettings
from procurd.config.fields import repeated
from procurd.config.housekeeping import AlertsSettings, ReconcileSettings, RetentionSettings
from procurd.config.procurement import ProcurementSettings, StorefrontSettings
from procurd.config.provider import ProviderSettings
from procurd.config.service import DatabaseSettings, LoggingSettings, ServerSettings
from procurd.config.upstreams import UpstreamSettings

# Where a key came from when the environment set it: the variable's name, by location in the data.
Origins = dict[tuple[str | int, ...], str]


class Settings(BaseSettings):
    """The whole configuration. Build it with :func:`load_settings`."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True)

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    upstreams: list[UpstreamSettings] = Field(min_length=1)
    catalog: CatalogSettings = Field(default_factory=CatalogSettings)
    procurement: ProcurementSettings = Field(default_factory=ProcurementSettings)
    storefront: StorefrontSettings = Field(default_factory=StorefrontSettings)
    alerts: AlertsSettings = Field(default_factory=AlertsSettings)
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    pricing: PricingSettings = Field(default_factory=PricingSettings)
    provider: ProviderSettings = Field(default_factory=ProviderSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)

    @field_validator("upstreams")
    @classmethod
    def _unique_names_and_keys(cls, value: list[UpstreamSettings]) -> list[UpstreamSettings]:
        if (name := repeated([u.name for u in value])) is not None:
            raise ValueError(f"upstream name {name!r} is used more than once")
        keys = [u.api_key for u in value if u.protocol == "dujiao"]
        if len(set(keys)) != len(keys):
            raise ValueError("two upstreams share one api_key: callbacks could not be routed")
        return value

    @model_validator(mode="after")
    def _provider_offers_configured_upstreams(self) -> Settings:
        names = [upstream.name for upstream in self.upstreams]
        unknown = [name for name in self.provider.upstreams if name not in names]
        if unknown:
            configured = ", ".join(names)
            raise ValueError(
                f"[provider] upstreams: {unknown[0]!r} is not a configured upstream (those are: {configured})"
            )
        return self

    def offered_upstreams(self) -> list[str]:
        """The upstreams whose mirrors the provider offers, in the order they are configured."""
        chosen = self.provider.upstreams
        return [upstream.name for upstream in self.upstreams if not chosen or upstream.name in chosen]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # load_settings() merges the TOML file and the environment itself (upstream blocks are addressed
        # by name, which no stock source can do) and passes the result in as init arguments.
        return (init_settings,)

    _source: Path | None = PrivateAttr(default=None)
    _origins: dict[tuple[str | int, ...], str] = PrivateAttr(default_factory=dict)

    @property
    def source(self) -> Path | None:
        """The file these settings were read from, if any."""
        return self._source

    def origin(self, *location: str | int) -> str:
        """Where the key at ``location`` (``"database", "url"``) was set, as a message names it: the
        environment variable that set it, else the file (or ``(no configuration file)``)."""
        from_environment = origin_of(self._origins, location)
        if from_environment is not None:
            return from_environment
        return str(self._source) if self._source is not None else "(no configuration file)"

    def upstream(self, name: str) -> UpstreamSettings:
        for upstream in self.upstreams:
            if upstream.name == name:
                return upstream
        raise KeyError(name)


def origin_of(origins: Origins, location: tuple[str | int, ...]) -> str | None:
    """The environment variable that set ``location`` (or the upstream block holding it), if any."""
    for length in range(len(location), 0, -1):
        name = origins.get(location[:length])
        if name is not None:
            return f"environment variable {name}"
    return None
