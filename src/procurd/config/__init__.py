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

The sections are defined by concern: :mod:`~procurd.config.service` (``[database]``, ``[server]``,
``[logging]``), :mod:`~procurd.config.upstreams`, :mod:`~procurd.config.catalog` (``[catalog]``,
``[pricing]``), :mod:`~procurd.config.procurement` (``[procurement]``, ``[storefront]``),
:mod:`~procurd.config.housekeeping` (``[alerts]``, ``[reconcile]``, ``[retention]``) and
:mod:`~procurd.config.provider`; :mod:`~procurd.config.settings` holds them together,
:mod:`~procurd.config.loading` reads them and :mod:`~procurd.config.problems` says what is wrong.
"""

from procurd.config.catalog import (
    RULES_LABEL,
    CatalogSettings,
    PricingRuleSettings,
    PricingSettings,
)
from procurd.config.fields import (
    WILDCARD_HOSTS,
    ConfigDecimal,
    HttpUrl,
    Network,
    NonNegativeDays,
    OptionalAmount,
    OptionalHours,
    PositiveSeconds,
    hosts_overlap,
    is_loopback_host,
)
from procurd.config.housekeeping import (
    AlertsSettings,
    ReconcileSettings,
    RetentionSettings,
)
from procurd.config.loading import (
    DEFAULT_LOCATIONS,
    ENV_PREFIX,
    SecretFiles,
    find_config_file,
    load_settings,
    no_config_file_message,
    overlay_environment,
)
from procurd.config.problems import (
    ConfigError,
    format_validation_error,
)
from procurd.config.procurement import (
    ProcurementSettings,
    StorefrontSettings,
)
from procurd.config.provider import (
    MAX_ROTATION_OVERLAP_HOURS,
    ProviderLevelSettings,
    ProviderSettings,
)
from procurd.config.service import (
    DatabaseSettings,
    LoggingSettings,
    ServerSettings,
)
from procurd.config.settings import (
    Origins,
    Settings,
)
from procurd.config.upstreams import (
    ACG_FAKA_DEFAULT_CURRENCY,
    ACG_FAKA_KEYS,
    DUJIAO_KEYS,
    PROTOCOLS,
    UpstreamSettings,
)

__all__ = [
    "ACG_FAKA_DEFAULT_CURRENCY",
    "ACG_FAKA_KEYS",
    "DEFAULT_LOCATIONS",
    "DUJIAO_KEYS",
    "ENV_PREFIX",
    "MAX_ROTATION_OVERLAP_HOURS",
    "PROTOCOLS",
    "RULES_LABEL",
    "WILDCARD_HOSTS",
    "AlertsSettings",
    "CatalogSettings",
    "ConfigDecimal",
    "ConfigError",
    "DatabaseSettings",
    "HttpUrl",
    "LoggingSettings",
    "Network",
    "NonNegativeDays",
    "OptionalAmount",
    "OptionalHours",
    "Origins",
    "PositiveSeconds",
    "PricingRuleSettings",
    "PricingSettings",
    "ProcurementSettings",
    "ProviderLevelSettings",
    "ProviderSettings",
    "ReconcileSettings",
    "RetentionSettings",
    "SecretFiles",
    "ServerSettings",
    "Settings",
    "StorefrontSettings",
    "UpstreamSettings",
    "find_config_file",
    "format_validation_error",
    "hosts_overlap",
    "is_loopback_host",
    "load_settings",
    "no_config_file_message",
    "overlay_environment",
]
