"""``[[upstreams]]``: the sites procurd buys from, each a Dujiao-Next site (seed 000, the default) or an
acg-faka shop, with the keys of its protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SecretStr, model_validator

from procurd.config.fields import HttpUrl, OptionalAmount, OptionalHours, PositiveSeconds, Section, repeated

PROTOCOLS = ("dujiao", "acg-faka")
# Keys that only one protocol's upstreams take.
DUJIAO_KEYS = ("api_key", "api_secret", "api_secret_file", "header_prefix")
ACG_FAKA_KEYS = (
    "app_id",
    "app_key",
    "app_key_file",
    "currency",
    "codes",
    "trade_timeout_seconds",
    "catalog_requests_per_pass",
)
ACG_FAKA_DEFAULT_CURRENCY = "CNY"


def _app_id(value: object) -> object:
    """acg-faka's member id, written as a number or as text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


class UpstreamSettings(Section):
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
    # the price and stock requests one catalogue pass makes at most (the rest waits for the next pass)
    catalog_requests_per_pass: int = Field(default=500, ge=1, le=1_000_000)
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
        if (duplicate := repeated(self.codes)) is not None:
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
