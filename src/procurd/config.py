"""Configuration: one TOML file plus ``PROCURD_<SECTION>__<KEY>`` environment overrides.

Lookup order of the file: ``--config PATH``, ``$PROCURD_CONFIG``, ``./procurd.toml``,
``/etc/procurd/procurd.toml``. Environment variables take precedence over the file. Upstream blocks are
addressed by name or by position: ``PROCURD_UPSTREAMS__MAIN__API_KEY`` or ``PROCURD_UPSTREAMS__0__API_KEY``.
Other ``PROCURD_*`` variables (without a ``__``) are not configuration and are ignored.

Secrets have a ``_file`` form (``api_secret_file``, ``app_key_file``, ``admin_token_file``,
``webhook_secret_file``). A bare file name is a credential: it is looked up in ``$CREDENTIALS_DIRECTORY``
(systemd's ``LoadCredential=``) and, outside systemd, in the ``credentials`` directory beside the
configuration file (``/etc/procurd/credentials/NAME``), where the shipped unit loads it from.

Any problem becomes a :class:`ConfigError` whose message names the file (or the environment variable), the
key and the reason.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import tomllib
import typing
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from procurd.core.addresses import private_url_reason
from procurd.core.pricing import Pricing, PricingRule, RuleError, build_rule, parse_amount

ENV_PREFIX = "PROCURD_"
RULES_LABEL = "[[pricing.rules]]"
DEFAULT_LOCATIONS = (Path("procurd.toml"), Path("/etc/procurd/procurd.toml"))
MAX_ROTATION_OVERLAP_HOURS = 24 * 365  # the longest a previous secret may stay valid after a rotation


class ConfigError(Exception):
    """A configuration problem; ``str()`` is the message for a person."""


def _optional_amount(value: object) -> str:
    """A decimal string such as ``"50.00"``, or ``""`` for none. A whole TOML number (``100``) is exact and
    taken as its decimal text (``"100"``); a TOML number with a fraction is a binary float, which cannot
    hold every amount: it is refused with the string to write instead."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    elif isinstance(value, float | Decimal):  # the file's floats are read as Decimal, an API's as float
        number = Decimal(str(value)) if isinstance(value, float) else value
        suggestion = f'"{number:.2f}"' if number.is_finite() else '"50.00"'
        raise ValueError(
            f"must be a decimal string such as {suggestion}: a number with a fraction is read as a binary "
            "float, which cannot hold every amount exactly"
        )
    if not isinstance(value, str):
        raise ValueError('must be a decimal string such as "50.00", or "" for none')
    if value == "":
        return value
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise ValueError('must be a decimal string such as "50.00", or "" for none') from None
    if not amount.is_finite() or amount < 0:
        raise ValueError("must be a finite, non-negative amount")
    return value


OptionalAmount = Annotated[str, BeforeValidator(_optional_amount)]


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url)]


def _network(value: str) -> str:
    """An IP address or network (``10.0.0.0/8``), in its canonical form."""
    try:
        network = ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise ValueError("must be an IP address or a network such as 10.0.0.0/8") from None
    return str(network) if network.num_addresses > 1 else str(network.network_address)


Network = Annotated[str, AfterValidator(_network)]
PositiveSeconds = Annotated[float, Field(gt=0)]


def _optional_hours(value: object) -> float | str:
    """A number of hours above 0, or ``""`` for off."""
    if value == "":
        return ""
    if not isinstance(value, bool) and isinstance(value, int | float | str | Decimal):
        try:
            hours = float(value)
        except ValueError:
            hours = float("nan")
        if math.isfinite(hours) and hours > 0:
            return hours
    raise ValueError('must be a number of hours above 0, or "" for off')


OptionalHours = Annotated[float | Literal[""], BeforeValidator(_optional_hours)]
NonNegativeDays = Annotated[float, Field(ge=0)]  # 0 = keep forever


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseSettings(_Section):
    url: str = "sqlite+aiosqlite:///procurd.db"

    @field_validator("url")
    @classmethod
    def _supported_driver(cls, value: str) -> str:
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
            raise ValueError("must start with sqlite+aiosqlite:// or postgresql+asyncpg://")
        return value


class ServerSettings(_Section):
    public_host: str = "0.0.0.0"
    public_port: int = Field(default=8080, ge=0, le=65535)
    admin_host: str = "127.0.0.1"
    admin_port: int = Field(default=8081, ge=0, le=65535)
    admin_token: SecretStr = SecretStr("")
    admin_token_file: Path | None = None
    callback_url: HttpUrl = "https://shop.example.com/api/v1/upstream/callback"
    allow_private_callback_url: bool = False
    shutdown_timeout_seconds: PositiveSeconds = 20
    heartbeat_seconds: PositiveSeconds = 5
    header_timeout_seconds: PositiveSeconds = 15
    body_timeout_seconds: PositiveSeconds = 30
    console_session_seconds: PositiveSeconds = 8 * 3600  # a web console sign-in lasts this long
    # Reverse proxies (addresses or networks) whose X-Forwarded-For names the client: wrong admin tokens are
    # counted by client address.
    trusted_proxies: list[Network] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> ServerSettings:
        _one_secret_form("admin_token", self.admin_token, self.admin_token_file)
        has_token = bool(self.admin_token.get_secret_value()) or self.admin_token_file is not None
        if not is_loopback_host(self.admin_host) and not has_token:
            raise ValueError(
                f"admin_token: required because admin_host {self.admin_host!r} is not a loopback address"
            )
        same_port = self.public_port and self.public_port == self.admin_port
        if same_port and hosts_overlap(self.public_host, self.admin_host):
            raise ValueError(
                f"admin_port: {self.admin_port} is also public_port, on overlapping hosts "
                f"(public_host {self.public_host!r}, admin_host {self.admin_host!r}): "
                "the two listeners need different ports"
            )
        return self

    def callback_url_problem(self) -> str | None:
        """Why ``callback_url`` is not a public address an upstream will accept, or ``None``."""
        if self.allow_private_callback_url:
            return None
        return private_url_reason(self.callback_url)


def _one_secret_form(key: str, value: SecretStr | None, file: Path | None) -> None:
    if value is not None and value.get_secret_value() and file is not None:
        raise ValueError(f"{key}, {key}_file: both are set; set one of them, not both")


PROTOCOLS = ("dujiao", "acg-faka")
# Keys that only one protocol's upstreams take.
DUJIAO_KEYS = ("api_key", "api_secret", "api_secret_file", "header_prefix")
ACG_FAKA_KEYS = ("app_id", "app_key", "app_key_file", "currency", "codes", "trade_timeout_seconds")
ACG_FAKA_DEFAULT_CURRENCY = "CNY"


def _app_id(value: object) -> object:
    """acg-faka's member id, written as a number or as text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


class UpstreamSettings(_Section):
    """One ``[[upstreams]]`` block: a Dujiao-Next site (seed 000, the default) or an acg-faka shop."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    protocol: Literal["dujiao", "acg-faka"] = "dujiao"
    base_url: HttpUrl
    # Dujiao-Next
    api_key: str = ""
    api_secret: SecretStr | None = None
    api_secret_file: Path | None = None
    header_prefix: str = Field(default="Service", pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*$")
    # acg-faka
    app_id: Annotated[str, BeforeValidator(_app_id)] = Field(default="", pattern=r"^$|^[1-9][0-9]{0,18}$")
    app_key: SecretStr | None = None
    app_key_file: Path | None = None
    currency: str = Field(default="", pattern=r"^$|^[A-Z]{3}$")
    codes: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]] = Field(default_factory=list)
    trade_timeout_seconds: PositiveSeconds = 60
    # both
    timeout_seconds: PositiveSeconds = 15
    max_requests_per_second: PositiveSeconds = 1
    ping_interval_seconds: PositiveSeconds = 300
    low_balance_threshold: OptionalAmount = ""
    # alert balance_runway when the wallet lasts fewer hours than this at the last 24 h's spend; "" = off
    runway_alert_hours: OptionalHours = 24
    incremental_sync: Literal["auto", "on", "off"] = "auto"

    @model_validator(mode="after")
    def _keys_of_its_protocol(self) -> UpstreamSettings:
        if self.protocol == "acg-faka":
            self._check_acg_faka()
            return self
        foreign = [key for key in ACG_FAKA_KEYS if key in self.model_fields_set]
        if foreign:
            raise ValueError(f'{foreign[0]}: belongs to upstreams with protocol = "acg-faka" only')
        if not self.api_key:
            raise ValueError(
                "api_key: required key is missing"
                if "api_key" not in self.model_fields_set
                else "api_key: must not be empty"
            )
        if self.api_secret is None and self.api_secret_file is None:
            raise ValueError("api_secret: missing (set api_secret or api_secret_file)")
        if self.api_secret is not None and self.api_secret_file is not None:
            raise ValueError("api_secret, api_secret_file: both are set; set one of them, not both")
        if self.api_secret is not None and not self.api_secret.get_secret_value():
            raise ValueError("api_secret: must not be empty")
        return self

    def _check_acg_faka(self) -> None:
        foreign = [key for key in DUJIAO_KEYS if key in self.model_fields_set]
        if foreign:
            raise ValueError(
                f"{foreign[0]}: belongs to Dujiao-Next upstreams only; an upstream with "
                'protocol = "acg-faka" signs with app_id and app_key'
            )
        if not self.app_id:
            raise ValueError('app_id: required for protocol = "acg-faka" (the member id at the supplier)')
        if self.app_key is None and self.app_key_file is None:
            raise ValueError('app_key: missing (set app_key or app_key_file for protocol = "acg-faka")')
        if self.app_key is not None and self.app_key_file is not None:
            raise ValueError("app_key, app_key_file: both are set; set one of them, not both")
        if self.app_key is not None:
            key = self.app_key.get_secret_value()
            if not key:
                raise ValueError("app_key: must not be empty")
            if key != key.strip() or any(character in key for character in "+% \t\r\n"):
                raise ValueError("app_key: must be the docking key as shown (no spaces, + or %)")
        if len(set(self.codes)) != len(self.codes):
            duplicate = next(code for code in self.codes if self.codes.count(code) > 1)
            raise ValueError(f"codes: {duplicate!r} is listed more than once")

    @model_validator(mode="before")
    @classmethod
    def _acg_faka_currency(cls, data: Any) -> Any:
        """An acg-faka shop reports no currency: its prices are taken as CNY unless ``currency`` says."""
        if isinstance(data, dict) and data.get("protocol") == "acg-faka" and not data.get("currency"):
            return {**data, "currency": ACG_FAKA_DEFAULT_CURRENCY}
        return data

    def secret(self) -> str:
        """The API secret, unwrapped for signing; never log or print the result."""
        if self.protocol != "dujiao":
            raise RuntimeError(f"upstream {self.name} speaks {self.protocol}: it has no api_secret")
        if self.api_secret is None:
            raise RuntimeError(f"upstream {self.name}: api_secret_file was not read (use load_settings)")
        return self.api_secret.get_secret_value()

    def signing_key(self) -> str:
        """An acg-faka upstream's app_key, unwrapped for signing; never log, print or send the result."""
        if self.protocol != "acg-faka":
            raise RuntimeError(f"upstream {self.name} speaks {self.protocol}: it has no app_key")
        if self.app_key is None:
            raise RuntimeError(f"upstream {self.name}: app_key_file was not read (use load_settings)")
        return self.app_key.get_secret_value()

    @property
    def api_root(self) -> str:
        """``base_url`` plus the signed API's prefix, without a trailing slash."""
        return self.base_url.rstrip("/") + "/api/v1/upstream"

    def budget_identity(self) -> tuple[str, str]:
        """What one request budget is shared by: the API's root and the account it signs as."""
        if self.protocol == "acg-faka":
            return self.base_url.rstrip("/") + "/shared", f"app_id:{self.app_id}"
        return self.api_root, self.api_key


class CatalogSettings(_Section):
    sync_interval_seconds: PositiveSeconds = 600
    page_size: int = Field(default=50, ge=1, le=100)
    concurrency: int = Field(default=4, ge=1, le=64)
    full_sync_interval_seconds: PositiveSeconds = 86400
    max_removed_fraction: float = Field(default=0.2, ge=0, le=1)


def _config_decimal(value: Any) -> Any:
    """Decimals in the file are text or integers (a TOML float is read exactly); kept as given."""
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise ValueError(f'must be a decimal number written as text, like "1.5" (got {value!r})')
    return value


ConfigDecimal = Annotated[Any, AfterValidator(_config_decimal)]


class PricingRuleSettings(_Section):
    """One ``[[pricing.rules]]`` block; checked by :func:`procurd.core.pricing.build_rule`."""

    upstream: str | None = None
    category_ids: list[int] | None = None
    product_ids: list[int] | None = None
    sku_ids: list[int] | None = None
    min_cost: ConfigDecimal | None = None
    max_cost: ConfigDecimal | None = None
    exchange_rate: ConfigDecimal = "1"
    markup_percent: ConfigDecimal = "0"
    markup_fixed: ConfigDecimal = "0"
    rounding: ConfigDecimal = "0.01"
    currency: str = ""
    exclude: bool = False

    def rule(self, number: int) -> PricingRule:
        """The checked rule at 1-based position ``number``; :class:`RuleError` when it cannot be used."""
        return build_rule(number, **self.model_dump())


class PricingSettings(_Section):
    hold_on_cost_increase_percent: ConfigDecimal = ""
    rules: list[PricingRuleSettings] = Field(default_factory=list)

    @model_validator(mode="after")
    def _usable(self) -> PricingSettings:
        self.hold_percent()
        for index, block in enumerate(self.rules):
            try:
                block.rule(index + 1)
            except RuleError as exc:
                raise ValueError(f"{RULES_LABEL} #{index + 1}: {exc}") from None
        return self

    def hold_percent(self) -> Decimal | None:
        """The cost increase (percent) above which a price is held; None when holds are off."""
        value = self.hold_on_cost_increase_percent
        if isinstance(value, str) and not value.strip():
            return None
        try:
            percent = parse_amount("hold_on_cost_increase_percent", value)
        except RuleError as exc:
            raise ValueError(str(exc)) from None
        if percent < 0:
            raise ValueError("hold_on_cost_increase_percent: must not be negative")
        return percent

    def compiled(self, upstream_currency: str | None = None) -> Pricing:
        """The rules and hold threshold as :func:`procurd.core.pricing.reprice` takes them."""
        rules = tuple(block.rule(index + 1) for index, block in enumerate(self.rules))
        return Pricing(rules, upstream_currency, self.hold_percent())


class ProcurementSettings(_Section):
    workers: int = Field(default=8, ge=1, le=256)
    max_attempts: int = Field(default=6, ge=1, le=100)
    retry_base_seconds: PositiveSeconds = 1
    retry_max_seconds: PositiveSeconds = 300
    poll_initial_seconds: PositiveSeconds = 30
    poll_max_seconds: PositiveSeconds = 900
    poll_give_up_seconds: PositiveSeconds = 604800
    lease_seconds: PositiveSeconds = 60

    @model_validator(mode="after")
    def _ordered_bounds(self) -> ProcurementSettings:
        if self.retry_max_seconds < self.retry_base_seconds:
            raise ValueError("retry_max_seconds: must not be below retry_base_seconds")
        if self.poll_max_seconds < self.poll_initial_seconds:
            raise ValueError("poll_max_seconds: must not be below poll_initial_seconds")
        return self


class StorefrontSettings(_Section):
    webhook_url: Annotated[str, AfterValidator(lambda v: v and _http_url(v))] = ""
    webhook_api_key: str = ""
    webhook_secret: SecretStr = SecretStr("")
    webhook_secret_file: Path | None = None
    header_prefix: str = Field(default="Service", pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*$")

    @model_validator(mode="after")
    def _webhook_needs_secret(self) -> StorefrontSettings:
        _one_secret_form("webhook_secret", self.webhook_secret, self.webhook_secret_file)
        has_secret = bool(self.webhook_secret.get_secret_value()) or self.webhook_secret_file is not None
        if self.webhook_url and not has_secret:
            raise ValueError("webhook_secret: required when webhook_url is set (or webhook_secret_file)")
        return self


class AlertsSettings(_Section):
    urls: list[str] = Field(default_factory=list)
    repeat_after_seconds: PositiveSeconds = 3600
    stuck_after_seconds: PositiveSeconds = 3600
    unhealthy_after_seconds: PositiveSeconds = 300


class ReconcileSettings(_Section):
    interval_seconds: PositiveSeconds = 3600
    window_seconds: PositiveSeconds = 604800
    repair: bool = True


class RetentionSettings(_Section):
    audit_days: NonNegativeDays = 365
    mirror_changes_days: NonNegativeDays = 90
    outbox_delivered_days: NonNegativeDays = 7
    sync_runs_days: NonNegativeDays = 90
    alerts_days: NonNegativeDays = 90


class ProviderLevelSettings(_Section):
    """One ``[[provider.levels]]`` block: a price tier an account may have (seed 000's member level)."""

    slug: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    name: dict[str, str] = Field(default_factory=dict)
    icon: str = ""
    discount_percent: ConfigDecimal = "0"

    def discount(self) -> Decimal:
        """The discount as a percentage from 0 (inclusive) to 100 (exclusive)."""
        try:
            percent = parse_amount("discount_percent", self.discount_percent)
        except RuleError as exc:
            raise ValueError(str(exc)) from None
        if not 0 <= percent < 100:
            raise ValueError("discount_percent: must be from 0 to below 100")
        return percent

    @model_validator(mode="after")
    def _usable(self) -> ProviderLevelSettings:
        self.discount()
        return self


class ProviderSettings(_Section):
    """``[provider]``: procurd as the upstream of other sites (the seed 000 API on the public listener)."""

    enabled: bool = False
    upstreams: list[str] = Field(default_factory=list)  # [] = every configured upstream
    site_name: str = Field(default="procurd", min_length=1, max_length=255)
    currency: str = Field(default="CNY", pattern=r"^[A-Z]{3}$")
    header_prefix: str = Field(default="Service", pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*$")
    rate_limit_per_minute: int = Field(default=60, ge=1, le=100_000)
    rate_limit_block_seconds: PositiveSeconds = 30
    allow_private_callback_url: bool = False
    low_balance_threshold: OptionalAmount = ""
    # After `account rotate`, the previous secret stays valid this long (hours).
    rotation_overlap_hours: float = Field(
        default=168, ge=0, le=MAX_ROTATION_OVERLAP_HOURS, allow_inf_nan=False
    )
    callback_give_up_seconds: PositiveSeconds = 86400
    callback_timeout_seconds: PositiveSeconds = 15  # one try's wait for the downstream's answer
    levels: list[ProviderLevelSettings] = Field(default_factory=list)

    @field_validator("levels")
    @classmethod
    def _unique_slugs(cls, value: list[ProviderLevelSettings]) -> list[ProviderLevelSettings]:
        slugs = [level.slug for level in value]
        for slug in slugs:
            if slugs.count(slug) > 1:
                raise ValueError(f"level slug {slug!r} is used more than once")
        return value

    def level(self, slug: str | None) -> ProviderLevelSettings | None:
        """The level ``slug`` names; ``None`` for no level, or one that is no longer configured."""
        return next((level for level in self.levels if level.slug == slug), None)


class LoggingSettings(_Section):
    level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    format: Literal["json", "console", "auto"] = "auto"

    @field_validator("level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


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
        names = [u.name for u in value]
        for name in names:
            if names.count(name) > 1:
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
        from_environment = _origin(self._origins, location)
        if from_environment is not None:
            return from_environment
        return str(self._source) if self._source is not None else "(no configuration file)"

    def upstream(self, name: str) -> UpstreamSettings:
        for upstream in self.upstreams:
            if upstream.name == name:
                return upstream
        raise KeyError(name)


def find_config_file(explicit: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> Path | None:
    """The configuration file to read, following the documented lookup order."""
    if explicit:
        return Path(explicit)
    from_env = environ.get("PROCURD_CONFIG")
    if from_env:
        return Path(from_env)
    for candidate in DEFAULT_LOCATIONS:
        if candidate.is_file():
            return candidate
    return None


def no_config_file_message() -> str:
    looked_in = ", ".join(str(Path.cwd() / path) for path in DEFAULT_LOCATIONS)
    return f"no configuration file found (looked in: {looked_in}); use --config"


# Where a key came from when the environment set it: the variable's name, by location in the data.
Origins = dict[tuple[str | int, ...], str]


def load_settings(
    explicit_path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    read_secret_files: bool = True,
) -> Settings:
    """Read, merge and validate the configuration; raise :class:`ConfigError` on any problem.

    With ``read_secret_files`` every secret given as a ``_file`` is read on return (``api_secret``,
    ``admin_token``, ``webhook_secret`` are set). Without it the files are left alone: enough for everything
    that only uses the database.
    """
    environ = os.environ if environ is None else environ
    path = find_config_file(explicit_path, environ)
    where = str(path) if path is not None else "(no configuration file)"
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as handle:
                data = tomllib.load(handle, parse_float=Decimal)
        except FileNotFoundError:
            raise ConfigError(f"{where}: file not found") from None
        except PermissionError:
            raise ConfigError(f"{where}: permission denied") from None
        except IsADirectoryError:
            raise ConfigError(f"{where}: is a directory, not a TOML file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    try:
        merged, origins = overlay_environment(data, environ)
    except ValueError as exc:
        raise ConfigError(f"environment variable {exc}") from None
    try:
        settings = Settings(**merged)
    except ValidationError as exc:
        message = format_validation_error(where, exc, merged, origins)
        if path is None:
            from_environment = [line for line in message.splitlines() if line.startswith("environment")]
            message = "\n".join([no_config_file_message(), *from_environment])
        raise ConfigError(message) from None
    if read_secret_files:
        credentials = SecretFiles(where, origins, environ, path.parent if path is not None else Path())
        settings = credentials.read_into(settings)
    settings._source = path
    settings._origins = origins
    return settings


class SecretFiles:
    """Reads the ``_file`` forms of secrets into the settings."""

    def __init__(self, where: str, origins: Origins, environ: Mapping[str, str], config_dir: Path) -> None:
        self.where = where
        self.origins = origins
        self.environ = environ
        self.config_dir = config_dir

    def read_into(self, settings: Settings) -> Settings:
        upstreams = []
        for index, upstream in enumerate(settings.upstreams):
            for field in ("api_secret", "app_key"):
                name = getattr(upstream, f"{field}_file")
                if name is not None:
                    key = f"upstreams[{index}] ({upstream.name}).{field}_file"
                    secret = self.read(("upstreams", index, f"{field}_file"), key, name)
                    upstream = upstream.model_copy(update={field: secret})
            upstreams.append(upstream)
        server, storefront = settings.server, settings.storefront
        if server.admin_token_file is not None:
            token = self.read(
                ("server", "admin_token_file"), "[server] admin_token_file", server.admin_token_file
            )
            server = server.model_copy(update={"admin_token": token})
        if storefront.webhook_secret_file is not None:
            secret = self.read(
                ("storefront", "webhook_secret_file"),
                "[storefront] webhook_secret_file",
                storefront.webhook_secret_file,
            )
            storefront = storefront.model_copy(update={"webhook_secret": secret})
        return settings.model_copy(
            update={"upstreams": upstreams, "server": server, "storefront": storefront}
        )

    def path_of(self, name: Path) -> Path:
        """Where the secret file ``name`` is: a bare name is a credential (systemd's, or one beside the
        configuration file); any other path is used as it is."""
        if name.is_absolute() or name.parent != Path():
            return name
        if "CREDENTIALS_DIRECTORY" in self.environ:
            return Path(self.environ["CREDENTIALS_DIRECTORY"]) / name
        return self.config_dir / "credentials" / name

    def read(self, location: tuple[str | int, ...], key: str, name: Path) -> SecretStr:
        where = _origin(self.origins, location) or self.where
        secret_path = self.path_of(name)
        try:
            value = secret_path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            raise ConfigError(f"{where}: {key}: file {secret_path} not found{self._hint(name)}") from None
        except PermissionError:
            raise ConfigError(
                f"{where}: {key}: file {secret_path} is not readable (permission denied)"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: {key}: cannot read {secret_path}: {type(exc).__name__}") from None
        if not value:
            raise ConfigError(f"{where}: {key}: file {secret_path} is empty")
        return SecretStr(value)

    def _hint(self, name: Path) -> str:
        if name.is_absolute() or name.parent != Path():
            return ""
        if "CREDENTIALS_DIRECTORY" in self.environ:
            return " (a bare name is looked up in $CREDENTIALS_DIRECTORY)"
        return (
            " (a bare name is looked up in $CREDENTIALS_DIRECTORY, which is not set here, else in the "
            "credentials directory beside the configuration file)"
        )


def _origin(origins: Origins, location: tuple[str | int, ...]) -> str | None:
    """The environment variable that set ``location`` (or the upstream block holding it), if any."""
    for length in range(len(location), 0, -1):
        name = origins.get(location[:length])
        if name is not None:
            return f"environment variable {name}"
    return None


def overlay_environment(
    data: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[dict[str, Any], Origins]:
    """Overlay ``PROCURD_<SECTION>__<KEY>`` variables on the file's data; also say which variable set what.

    Values are strings; pydantic converts them. ``PROCURD_UPSTREAMS__<NAME or INDEX>__<KEY>`` addresses one
    upstream block; an index one past the end adds a block. Variables without ``__`` after the prefix
    (``PROCURD_CONFIG``, or those of scripts and tests) are not configuration and are ignored. A
    :class:`ValueError` names the variable that cannot be applied.
    """
    merged: dict[str, Any] = {
        key: (dict(value) if isinstance(value, dict) else value) for key, value in data.items()
    }
    upstreams = merged.get("upstreams", [])
    if not isinstance(upstreams, list):
        raise ValueError("upstreams: must be an array of tables ([[upstreams]])")
    merged["upstreams"] = [dict(u) if isinstance(u, dict) else u for u in upstreams]
    if not merged["upstreams"]:
        del merged["upstreams"]
    origins: Origins = {}
    blocks_in_file = len(merged.get("upstreams", []))
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or "__" not in name[len(ENV_PREFIX) :]:
            continue
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        value = environ[name]
        if parts[0] == "upstreams":
            if len(parts) != 3:
                raise ValueError(f"{name}: expected PROCURD_UPSTREAMS__<NAME or INDEX>__<KEY>")
            index = _set_upstream_key(merged.setdefault("upstreams", []), parts[1], parts[2], value, name)
            if index >= blocks_in_file:
                origins.setdefault(("upstreams", index), name)
            origins[("upstreams", index, parts[2])] = name
        elif len(parts) == 2:
            section = merged.setdefault(parts[0], {})
            if not isinstance(section, dict):
                raise ValueError(f"{name}: [{parts[0]}] is not a table in the file")
            section[parts[1]] = value
            origins[(parts[0], parts[1])] = name
        else:
            raise ValueError(f"{name}: expected PROCURD_<SECTION>__<KEY>")
    return merged, origins


def _set_upstream_key(upstreams: list[Any], selector: str, key: str, value: str, env_name: str) -> int:
    """Set ``key`` of the upstream block ``selector`` (a name or an index); the block's index."""
    index: int | None = None
    if selector.isdigit():
        index = int(selector)
        if index == len(upstreams):
            upstreams.append({})
        elif index > len(upstreams):
            raise ValueError(f"{env_name}: there are only {len(upstreams)} upstream blocks")
    else:
        for position, block in enumerate(upstreams):
            if isinstance(block, dict) and str(block.get("name", "")).lower() == selector:
                index = position
                break
        if index is None:
            index = len(upstreams)
            upstreams.append({"name": selector})
    target = upstreams[index]
    if not isinstance(target, dict):
        raise ValueError(f"{env_name}: upstream block {selector} is not a table")
    target[key] = value
    return index


def format_validation_error(
    where: str, exc: ValidationError, data: Mapping[str, Any], origins: Origins | None = None
) -> str:
    """One line per problem: ``FILE: [section] key: reason``, or ``environment variable NAME: ...`` for a
    value the environment set."""
    lines = []
    for error in exc.errors(include_url=False):
        location = _describe_location(error["loc"], data)
        loc = tuple(error["loc"])
        source = _origin(origins or {}, loc) or where
        message = str(error["msg"])
        if error["type"] == "extra_forbidden":
            if len(loc) == 1:
                # A section of no known name: the variables that made it up are to blame, if any did.
                named = sorted(name for at, name in (origins or {}).items() if at[:1] == loc)
                source = f"environment variable {named[0]}" if named else where
            noun = "section" if len(loc) == 1 and loc != ("upstreams",) else "key"
            message = f"unknown {noun}{_did_you_mean(loc)}"
        elif error["type"] == "missing":
            message = "required key is missing"
        elif error["type"] == "too_short" and error["loc"] == ("upstreams",):
            message = "at least one [[upstreams]] block is required"
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if error["loc"] == ("pricing",):
            # The section's own checks name the rule (or the key) themselves.
            prefix = "" if message.startswith(RULES_LABEL) else "[pricing] "
            lines.append(f"{source}: {prefix}{message}")
        elif not location:
            lines.append(f"{source}: {message}")
        elif error["type"] == "value_error" and len(error["loc"]) == 1 and location.startswith("["):
            # A check of the whole section: its message starts with the keys it concerns.
            lines.append(f"{source}: {location} {message}")
        else:
            lines.append(f"{source}: {location}: {message}")
    return "\n".join(lines)


def _did_you_mean(loc: tuple[int | str, ...]) -> str:
    """`` (did you mean api_secret?)`` for an unknown key close to a known one of its section, else ``""``."""
    model: type[BaseModel] = Settings
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # a block of an array of tables: its model is the section's
        field = model.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        sections = [
            argument
            for argument in (*typing.get_args(annotation), annotation)
            if isinstance(argument, type) and issubclass(argument, BaseModel)
        ]
        if not sections:
            return ""
        model = sections[0]
    key = loc[-1]
    if not isinstance(key, str):
        return ""
    close = difflib.get_close_matches(key.lower(), list(model.model_fields), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _describe_location(loc: tuple[int | str, ...], data: Mapping[str, Any]) -> str:
    if not loc:
        return ""
    head, *rest = loc
    if head == "pricing" and len(rest) >= 2 and rest[0] == "rules" and isinstance(rest[1], int):
        key = ".".join(str(part) for part in rest[2:])
        return f"{RULES_LABEL} #{rest[1] + 1}" + (f": {key}" if key else "")
    if head == "upstreams" and rest and isinstance(rest[0], int):
        index = rest[0]
        name = ""
        blocks = data.get("upstreams")
        if isinstance(blocks, list) and index < len(blocks) and isinstance(blocks[index], dict):
            name = f" ({blocks[index].get('name', '?')})"
        key = ".".join(str(part) for part in rest[1:])
        return f"upstreams[{index}]{name}" + (f".{key}" if key else "")
    if rest:
        return f"[{head}] " + ".".join(str(part) for part in rest)
    return str(head) if head == "upstreams" else f"[{head}]"


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# Addresses that listen on every interface of their family.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "*"})


def hosts_overlap(first: str, second: str) -> bool:
    """Whether listeners on ``first`` and ``second`` would compete for the same port: the same address, a
    wildcard, or ``localhost`` and a loopback address. Names other than ``localhost`` are not resolved."""

    def addresses(host: str) -> set[str]:
        host = host.strip("[]").lower()
        if host in ("localhost", "localhost.localdomain"):
            return {"127.0.0.1", "::1"}
        try:
            return {str(ipaddress.ip_address(host))}
        except ValueError:
            return {host}

    if first.strip("[]") in WILDCARD_HOSTS or second.strip("[]") in WILDCARD_HOSTS:
        return True
    return bool(addresses(first) & addresses(second))
