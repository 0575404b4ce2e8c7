"""The catalogue's sections: ``[catalog]`` (the mirror's passes) and ``[pricing]`` (its rules and price
holds)."""

from __future__ import annotations

from decimal import Decimal

from pydantic import Field, model_validator

from procurd.config.fields import ConfigDecimal, PositiveSeconds, Section
from procurd.core.pricing import Pricing, PricingRule, RuleError, build_rule, parse_amount

RULES_LABEL = "[[pricing.rules]]"


class CatalogSettings(Section):
    sync_interval_seconds: PositiveSeconds = 600
    page_size: int = Field(default=50, ge=1, le=100)
    concurrency: int = Field(default=4, ge=1, le=64)
    full_sync_interval_seconds: PositiveSeconds = 86400
    max_removed_fraction: float = Field(default=0.2, ge=0, le=1)


class PricingRuleSettings(Section):
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


class PricingSettings(Section):
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
