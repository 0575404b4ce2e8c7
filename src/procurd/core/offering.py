"""What the provider can offer, pure: why it offers nothing, what the pricing rules sell in, which accounts
are below the low-balance threshold. ``procurd doctor``, ``procurd status`` and the console read it.

A SKU is offered only with a selling price in ``[provider] currency`` (set by ``[pricing]``), so a provider
that offers nothing has one of three causes: nothing is mirrored, no rule prices what is, or the rules price
it in another currency.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from procurd.core.pricing import PricingRule
from procurd.core.provider import AmountError, to_cents


@dataclass(frozen=True, slots=True)
class OfferFacts:
    """What the mirror holds for the provider."""

    currency: str  # [provider] currency
    upstreams: tuple[str, ...]  # the offered upstreams
    selling: Mapping[str | None, int]  # live SKUs by the currency of their selling price (None: unpriced)
    rules: int  # how many [[pricing.rules]] are configured

    @property
    def skus(self) -> int:
        return sum(self.selling.values())

    @property
    def sellable(self) -> int:
        """Live SKUs with a selling price in the provider's currency: what it offers."""
        return self.selling.get(self.currency, 0)


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why the provider offers nothing, and what to do about it."""

    cause: str
    fix: str

    def __str__(self) -> str:
        return f"{self.cause}: {self.fix}"


def why_nothing_is_offered(facts: OfferFacts) -> Shortfall | None:
    """Why no SKU can be offered; ``None`` when some can."""
    if facts.sellable:
        return None
    where = ", ".join(facts.upstreams) or "none"
    if not facts.skus:
        return Shortfall(
            f"no mirrored SKUs of the offered upstreams ({where})",
            "run `procurd catalog sync`, and check [provider] upstreams",
        )
    if not facts.rules:
        return Shortfall(
            f"no pricing rule: a SKU is offered only with a selling price in {facts.currency}, and the "
            f"{facts.skus} mirrored SKUs have none",
            f'add a [[pricing.rules]] block (with currency = "{facts.currency}" and its exchange_rate when '
            "the upstream sells in another currency)",
        )
    others = sorted((currency, count) for currency, count in facts.selling.items() if currency is not None)
    if others:
        named = ", ".join(f"{count} in {currency}" for currency, count in others)
        return Shortfall(
            f"the pricing rules price the mirrored SKUs in another currency than [provider] currency "
            f"{facts.currency} ({named})",
            f'set currency = "{facts.currency}" (and its exchange_rate) on the rules, or change [provider] '
            "currency",
        )
    return Shortfall(
        f"no pricing rule prices the {facts.skus} mirrored SKUs (their filters match none, or they exclude "
        "them)",
        "correct the rules' filters; after a change of the rules, `procurd catalog reprice` (the daemon "
        "reprices when it starts)",
    )


@dataclass(frozen=True, slots=True)
class RuleCurrency:
    """The currency a rule sells in for an offered upstream (``None``: the upstream's, not known)."""

    rule: int
    upstream: str
    currency: str | None


def rule_currencies(
    rules: Sequence[PricingRule], offered: Sequence[str], upstream_currencies: Mapping[str, str | None]
) -> list[RuleCurrency]:
    """What each rule that prices an offered upstream's SKUs (and does not exclude them) sells in: its own
    ``currency``, or else the upstream's (from its last answer)."""
    found = []
    for rule in rules:
        if rule.exclude:
            continue
        for upstream in offered:
            if rule.applies_to(upstream):
                found.append(
                    RuleCurrency(rule.number, upstream, rule.currency or upstream_currencies.get(upstream))
                )
    return found


def balance_below(balance: str, threshold: str | None) -> bool:
    """Whether a wallet balance is below ``[provider] low_balance_threshold`` (never when it is off)."""
    if not threshold:
        return False
    try:
        return to_cents(balance) < to_cents(threshold)
    except AmountError:
        return False


def low_accounts(balances: Sequence[Mapping[str, str]], threshold: str | None) -> list[Mapping[str, str]]:
    """The active accounts whose wallet is below the threshold (none without one), the lowest first."""
    low = [
        entry
        for entry in balances
        if entry.get("status") in (None, "active") and balance_below(entry["balance"], threshold)
    ]
    return sorted(low, key=lambda entry: (to_cents(entry["balance"]), entry["name"]))
