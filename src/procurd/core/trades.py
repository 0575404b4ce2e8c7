"""A purchase at an upstream whose protocol cannot look one up by procurd's number (acg-faka), as procurd
records it before sending it and after its answer (``upstream_trades``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class TradeState(StrEnum):
    SENDING = "sending"  # written before the request went out; no answer recorded (yet)
    DELIVERED = "delivered"  # goods in the answer
    PENDING = "pending"  # a notice in the answer: goods typed in by hand later
    NOT_DELIVERED = "not_delivered"  # paid, nothing usable delivered
    REFUSED = "refused"  # a refusal that proves nothing was bought
    UNKNOWN = "unknown"  # nobody can tell whether it was bought
    # A person found nothing bought under it and decided to send it again, under the same number (a shop
    # that holds an order under it answers that the number exists: never a second purchase).
    CLEARED = "cleared"


@dataclass(frozen=True, slots=True, kw_only=True)
class Trade:
    upstream: str
    request_no: str
    downstream_order_no: str
    code: str
    quantity: int
    state: TradeState
    sent_at: datetime
    trade_no: str | None = None
    amount: str | None = None
    balance_before: str | None = None
    notice: str | None = field(default=None, repr=False)  # a pending order's first text
    answered_at: datetime | None = None

    @property
    def may_have_bought(self) -> bool:
        """Sent, and neither an answer nor a person says that nothing was bought: never sent again by
        itself."""
        return self.state not in (TradeState.REFUSED, TradeState.CLEARED)
