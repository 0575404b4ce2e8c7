"""The state path's commands, which the procurement service hands to the batch
(:func:`procurd.procurement.transitions.apply_batch`).

Intake (a paid order, or a downstream site's order of an offered SKU), one event or several for a
procurement, what an upstream says about an order, claims for submission
and for a poll, the release of a gone instance's claims, and a look at one procurement. Each runs in the
writer's transaction with the others of its batch and fails alone: a refused report raises
:class:`ReportRejected` (or :class:`ReportUnverified`, which the claim's confirmation takes up).
:class:`Rules` is what the state path needs besides the database.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from procurd.core.intake import OrderRequest
from procurd.core.machine import Policy
from procurd.core.pricing import PricingRule
from procurd.core.procurement import Event, Procurement, Source, UpstreamReport
from procurd.core.provider import ProviderIntake, ProviderTerms


class ReportRejected(Exception):
    """A report that matches no procurement of the upstream (unknown number, or another order id), or whose
    claim the upstream did not confirm (``code`` ``callback_unverified``)."""

    def __init__(self, reason: str, code: str = "order_not_found", status: int = 404) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.status = status


class ReportUnverified(ReportRejected):
    """A report names an upstream order that procurd has not recorded for the procurement: it changes
    nothing until the upstream confirms the order. Carries what the service needs to ask, or to wait for a
    submission in flight whose answer will record the order."""

    def __init__(self, reason: str, procurement: Procurement, now: datetime) -> None:
        super().__init__(reason)
        self.procurement = procurement
        self.checked_at = now

    @property
    def submission_in_flight(self) -> bool:
        """A claim on the procurement is live: its submission's answer may be the one that names the order."""
        p = self.procurement
        return (
            p.submission_in_flight and p.lease_expires_at is not None and p.lease_expires_at > self.checked_at
        )


# --- commands -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Intake:
    """Take in a paid order (its items' upstreams already filled in); with ``provider``, a downstream
    site's order, charged to its wallet in the same transaction."""

    request: OrderRequest
    fingerprint: str
    provider: ProviderIntake | None = None


@dataclass(frozen=True, slots=True)
class ProviderPlacement:
    """A downstream site's order of an offered SKU, its request's fields checked: the state path finds an
    earlier order of the account under ``downstream_order_no`` (which it answers), else checks the SKU
    against the mirror, prices it at the account's level, charges the wallet and takes the order in
    (:mod:`procurd.procurement.provider_orders`). ``callback_problem``: what is wrong with the callback URL
    (the message of its refusal, 400 ``invalid_callback_url``), which refuses a new order but not a
    repeat."""

    account_id: int
    order_no: str  # the number the provider order and the local order that buys it take
    sku_id: int  # the offered SKU id
    quantity: int
    manual_form_data: dict[str, Any] | None
    downstream_order_no: str | None
    trace_id: str | None
    callback_url: str | None
    callback_problem: str | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """One event for one procurement; ``order_no`` saves a lookup when the caller knows it."""

    procurement_id: int
    event: Event
    source: Source
    order_no: str | None = None


@dataclass(frozen=True, slots=True)
class ChangeAll:
    """Events for several procurements of one order that succeed or fail together (a cancel)."""

    order_no: str
    events: tuple[tuple[int, Event], ...]
    source: Source


@dataclass(frozen=True, slots=True)
class Report:
    """What the upstream says about the order under ``number`` (a callback, or a poll)."""

    upstream: str
    number: str
    report: UpstreamReport
    source: Source


@dataclass(frozen=True, slots=True)
class Claims:
    """``owner`` claims up to ``limit`` procurements of ``upstream``."""

    upstream: str
    owner: str
    limit: int


@dataclass(frozen=True, slots=True)
class ClaimSubmissions(Claims):
    """A submitter claims due procurements to send."""


@dataclass(frozen=True, slots=True)
class ClaimPolls(Claims):
    """A poller claims procurements due for a fallback poll."""


@dataclass(frozen=True, slots=True)
class ReleaseClaims:
    """The instances named are gone: the submissions and polls they had claimed may be taken again at
    once."""

    instances: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Current:
    """The procurement ``procurement_id`` of order ``order_no`` as it stands (``None``: there is none), read
    in the writer's transaction: what a claim's confirmation waits on."""

    procurement_id: int
    order_no: str


Command = (
    Intake
    | ProviderPlacement
    | Change
    | ChangeAll
    | Report
    | ClaimSubmissions
    | ClaimPolls
    | ReleaseClaims
    | Current
)


@dataclass(frozen=True, slots=True)
class Rules:
    """What the state path needs besides the database."""

    policy: Policy
    upstreams: tuple[str, ...]
    lease_seconds: float
    storefront_events: bool
    clock: Callable[[], datetime]
    rng: random.Random | None = None
    alert_repeat_after: float = 3600
    alert_delivery: bool = False  # alert URLs are configured: opened exceptions are to be sent
    pricing: tuple[PricingRule, ...] = ()  # [[pricing.rules]]: an item without max_unit_price is limited
    writer: str = ""  # this process's rows of the hourly rollup (its instance id)
    provider: ProviderTerms | None = None  # [provider]: what a downstream site's order is sold on

    @property
    def default_upstream(self) -> str | None:
        """The upstream of an item that names none: the only one configured (``None`` with several)."""
        return self.upstreams[0] if len(self.upstreams) == 1 else None
