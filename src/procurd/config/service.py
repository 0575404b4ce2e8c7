"""The daemon's own sections: ``[database]``, ``[server]`` (the two listeners, the admin token, the
callback URL) and ``[logging]``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from procurd.config.fields import (
    HttpUrl,
    Network,
    PositiveSeconds,
    Section,
    hosts_overlap,
    is_loopback_host,
    one_secret_form,
)
from procurd.core.addresses import private_url_reason


class DatabaseSettings(Section):
    url: str = "sqlite+aiosqlite:///procurd.db"

    @field_validator("url")
    @classmethod
    def _supported_driver(cls, value: str) -> str:
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
            raise ValueError("must start with sqlite+aiosqlite:// or postgresql+asyncpg://")
        return value


class ServerSettings(Section):
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
        one_secret_form("admin_token", self.admin_token, self.admin_token_file)
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


class LoggingSettings(Section):
    level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    format: Literal["json", "console", "auto"] = "auto"

    @field_validator("level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value
