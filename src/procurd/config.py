"""Configuration: one TOML file plus ``PROCURD_<SECTION>__<KEY>`` environment overrides.

Lookup order of the file: ``--config PATH``, ``$PROCURD_CONFIG``, ``./procurd.toml``,
``/etc/procurd/procurd.toml``. Environment variables take precedence over the file. Upstream blocks are
addressed by name or by position: ``PROCURD_UPSTREAMS__MAIN__API_KEY`` or ``PROCURD_UPSTREAMS__0__API_KEY``.

Any problem becomes a :class:`ConfigError` whose message names the file, the key and the reason.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

ENV_PREFIX = "PROCURD_"
DEFAULT_LOCATIONS = (Path("procurd.toml"), Path("/etc/procurd/procurd.toml"))
CALLBACK_PATH = "/api/v1/upstream/callback"


class ConfigError(Exception):
    """A configuration problem; ``str()`` is the message for a person."""


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url)]
PositiveSeconds = Annotated[float, Field(gt=0)]


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
    callback_url: HttpUrl = "https://shop.example.com/api/v1/upstream/callback"
    allow_private_callback_url: bool = False
    shutdown_timeout_seconds: PositiveSeconds = 20
    console_session_seconds: PositiveSeconds = 8 * 3600  # a web console sign-in lasts this long

    @model_validator(mode="after")
    def _admin_off_loopback_needs_token(self) -> ServerSettings:
        if not is_loopback_host(self.admin_host) and not self.admin_token.get_secret_value():
            raise ValueError(
                f"admin_token: required because admin_host {self.admin_host!r} is not a loopback address"
            )
        return self

    def callback_url_problem(self) -> str | None:
        """Why ``callback_url`` is not a public address an upstream will accept, or ``None``."""
        if self.allow_private_callback_url:
            return None
        return private_url_reason(self.callback_url)


class UpstreamSettings(_Section):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    base_url: HttpUrl
    api_key: str = Field(min_length=1)
    api_secret: SecretStr | None = None
    api_secret_file: Path | None = None
    header_prefix: str = Field(default="Service", pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*$")
    timeout_seconds: PositiveSeconds = 15
    max_requests_per_second: PositiveSeconds = 1
    ping_interval_seconds: PositiveSeconds = 300

    @model_validator(mode="after")
    def _exactly_one_secret(self) -> UpstreamSettings:
        if self.api_secret is None and self.api_secret_file is None:
            raise ValueError("api_secret: missing (set api_secret or api_secret_file)")
        if self.api_secret is not None and self.api_secret_file is not None:
            raise ValueError("api_secret: set either api_secret or api_secret_file, not both")
        if self.api_secret is not None and not self.api_secret.get_secret_value():
            raise ValueError("api_secret: must not be empty")
        return self

    def secret(self) -> str:
        """The API secret, unwrapped for signing; never log or print the result."""
        if self.api_secret is None:
            raise RuntimeError(f"upstream {self.name}: api_secret_file was not read (use load_settings)")
        return self.api_secret.get_secret_value()

    @property
    def api_root(self) -> str:
        """``base_url`` plus the signed API's prefix, without a trailing slash."""
        return self.base_url.rstrip("/") + "/api/v1/upstream"


class CatalogSettings(_Section):
    sync_interval_seconds: PositiveSeconds = 600
    page_size: int = Field(default=50, ge=1, le=100)
    concurrency: int = Field(default=4, ge=1, le=64)


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
    header_prefix: str = Field(default="Service", pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*$")

    @model_validator(mode="after")
    def _webhook_needs_secret(self) -> StorefrontSettings:
        if self.webhook_url and not self.webhook_secret.get_secret_value():
            raise ValueError("webhook_secret: required when webhook_url is set")
        return self


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
    logging: LoggingSettings = Field(default_factory=LoggingSettings)

    @field_validator("upstreams")
    @classmethod
    def _unique_names_and_keys(cls, value: list[UpstreamSettings]) -> list[UpstreamSettings]:
        names = [u.name for u in value]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"upstream name {name!r} is used more than once")
        keys = [u.api_key for u in value]
        if len(set(keys)) != len(keys):
            raise ValueError("two upstreams share one api_key: callbacks could not be routed")
        return value

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

    @property
    def source(self) -> Path | None:
        """The file these settings were read from, if any."""
        return self._source

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


def load_settings(
    explicit_path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Read, merge and validate the configuration; raise :class:`ConfigError` on any problem.

    On return every upstream's ``api_secret`` is set (read from ``api_secret_file`` where that was given).
    """
    environ = os.environ if environ is None else environ
    path = find_config_file(explicit_path, environ)
    where = str(path) if path is not None else "(no configuration file)"
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as handle:
                data = tomllib.load(handle)
        except FileNotFoundError:
            raise ConfigError(f"{where}: file not found") from None
        except PermissionError:
            raise ConfigError(f"{where}: permission denied") from None
        except IsADirectoryError:
            raise ConfigError(f"{where}: is a directory, not a TOML file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    try:
        merged = apply_environment(data, environ)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    try:
        settings = Settings(**merged)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(where, exc, merged)) from None
    resolved = [
        upstream.model_copy(update={"api_secret": _resolve_secret(where, index, upstream, environ)})
        for index, upstream in enumerate(settings.upstreams)
    ]
    settings = settings.model_copy(update={"upstreams": resolved})
    settings._source = path
    return settings


def _resolve_secret(
    where: str, index: int, upstream: UpstreamSettings, environ: Mapping[str, str]
) -> SecretStr:
    if upstream.api_secret is not None:
        return upstream.api_secret
    assert upstream.api_secret_file is not None
    secret_path = upstream.api_secret_file
    if not secret_path.is_absolute() and "CREDENTIALS_DIRECTORY" in environ:
        # systemd LoadCredential=: a bare name refers to a file in the credentials directory.
        secret_path = Path(environ["CREDENTIALS_DIRECTORY"]) / secret_path
    key = f"upstreams[{index}] ({upstream.name}).api_secret_file"
    try:
        value = secret_path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise ConfigError(f"{where}: {key}: file {secret_path} not found") from None
    except PermissionError:
        raise ConfigError(f"{where}: {key}: file {secret_path} is not readable (permission denied)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: {key}: cannot read {secret_path}: {type(exc).__name__}") from None
    if not value:
        raise ConfigError(f"{where}: {key}: file {secret_path} is empty")
    return SecretStr(value)


def apply_environment(data: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Overlay ``PROCURD_<SECTION>__<KEY>`` variables on the file's data.

    Values are strings; pydantic converts them. ``PROCURD_UPSTREAMS__<NAME or INDEX>__<KEY>`` addresses one
    upstream block; an index one past the end adds a block.
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
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name == "PROCURD_CONFIG" or name.startswith("PROCURD_TEST_"):
            continue
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        value = environ[name]
        if parts[0] == "upstreams":
            if len(parts) != 3:
                raise ValueError(f"{name}: expected PROCURD_UPSTREAMS__<NAME or INDEX>__<KEY>")
            _set_upstream_key(merged.setdefault("upstreams", []), parts[1], parts[2], value, name)
        elif len(parts) == 2:
            section = merged.setdefault(parts[0], {})
            if not isinstance(section, dict):
                raise ValueError(f"{name}: [{parts[0]}] is not a table in the file")
            section[parts[1]] = value
        else:
            raise ValueError(f"{name}: expected PROCURD_<SECTION>__<KEY>")
    return merged


def _set_upstream_key(upstreams: list[Any], selector: str, key: str, value: str, env_name: str) -> None:
    target: dict[str, Any] | None = None
    if selector.isdigit():
        index = int(selector)
        if index < len(upstreams):
            target = upstreams[index]
        elif index == len(upstreams):
            target = {}
            upstreams.append(target)
        else:
            raise ValueError(f"{env_name}: there are only {len(upstreams)} upstream blocks")
    else:
        for block in upstreams:
            if isinstance(block, dict) and str(block.get("name", "")).lower() == selector:
                target = block
                break
        if target is None:
            target = {"name": selector}
            upstreams.append(target)
    if not isinstance(target, dict):
        raise ValueError(f"{env_name}: upstream block {selector} is not a table")
    target[key] = value


def format_validation_error(where: str, exc: ValidationError, data: Mapping[str, Any]) -> str:
    """One line per problem: ``FILE: [section] key: reason``."""
    lines = []
    for error in exc.errors(include_url=False):
        location = _describe_location(error["loc"], data)
        message = str(error["msg"])
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "missing":
            message = "required key is missing"
        elif error["type"] == "too_short" and error["loc"] == ("upstreams",):
            message = "at least one [[upstreams]] block is required"
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        lines.append(f"{where}: {location}: {message}" if location else f"{where}: {message}")
    return "\n".join(lines)


def _describe_location(loc: tuple[int | str, ...], data: Mapping[str, Any]) -> str:
    if not loc:
        return ""
    head, *rest = loc
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
    return str(head)


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def private_url_reason(url: str) -> str | None:
    """Why an upstream would refuse ``url`` as a callback address (the real sites' rule), or ``None``.

    Hostnames are not resolved, exactly like the upstream's own check.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return "not an http or https URL"
    host = (parts.hostname or "").lower()
    if not host:
        return "has no host"
    if host in ("localhost", "0.0.0.0") or host.endswith(".localhost"):
        return f"host {host} is local"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if address.is_loopback or address.is_private or address.is_link_local or address.is_unspecified:
        return f"host {host} is a loopback, private or link-local address"
    return None
