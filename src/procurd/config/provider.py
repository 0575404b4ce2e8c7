"""``[provider]``: procurd as the upstream of other sites, its levels (``[[provider.levels]]``) and their
discounts."""

from __future__ import annotations

from decimal import Decimal

from pydantic import Field, field_validator, model_validator

from procurd.config.fields import ConfigDecimal, OptionalAmount, PositiveSeconds, Section, repeated
from procurd.core.pricing import RuleError, parse_amount

MAX_ROTATION_OVERLAP_HOURS = 24 * 365  # the longest a previous secret may stay valid after a rotation


class ProviderLevelSettings(Section):
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


class ProviderSettings(Section):
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
        if (slug := repeated([level.slug for level in value])) is not None:
            raise ValueError(f"level slug {slug!r} is used more than once")
        return value

    def level(self, slug: str | None) -> ProviderLevelSettings | None:
        """The level ``slug`` names; ``None`` for no level, or one that is no longer configured."""
        return next((level for level in self.levels if level.slug == slug), None)
