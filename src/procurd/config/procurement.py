"""The procurement's sections: ``[procurement]`` (submissions and polls) and ``[storefront]`` (the events
told to the storefront's webhook)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, SecretStr, model_validator

from procurd.config.fields import PositiveSeconds, Section, http_url, one_secret_form


class ProcurementSettings(Section):
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


class StorefrontSettings(Section):
    webhook_url: Annotated[str, AfterValidator(lambda v: v and http_url(v))] = ""
    webhook_api_key: str = ""
    webhook_secret: SecretStr = SecretStr("")
    webhook_secret_file: Path | None = None
    header_prefix: str = Field(default="Service", pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*$")

    @model_validator(mode="after")
    def _webhook_needs_secret(self) -> StorefrontSettings:
        one_secret_form("webhook_secret", self.webhook_secret, self.webhook_secret_file)
        has_secret = bool(self.webhook_secret.get_secret_value()) or self.webhook_secret_file is not None
        if self.webhook_url and not has_secret:
            raise ValueError("webhook_secret: required when webhook_url is set (or webhook_secret_file)")
        return self
