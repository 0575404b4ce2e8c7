"""Reading the configuration: one TOML file plus ``PROCURD_<SECTION>__<KEY>`` environment overrides, and
the secrets given as files."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError

from procurd.config.problems import ConfigError, format_validation_error
from procurd.config.settings import Origins, Settings, origin_of

ENV_PREFIX = "PROCURD_"
DEFAULT_LOCATIONS = (Path("procurd.toml"), Path("/etc/procurd/procurd.toml"))


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
        where = origin_of(self.origins, location) or self.where
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
