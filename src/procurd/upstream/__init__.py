"""The upstream interface every dialect's client meets: the ways a call can fail, and the request budget.

Each protocol's client lives with its wire in :mod:`procurd.protocol` (``dujiao``, ``acgfaka``)."""

from procurd.upstream.errors import (
    AuthError,
    BusinessError,
    ClockSkew,
    ConnectFailed,
    NotDelivered,
    OutcomeUnknown,
    PaymentFailed,
    PriceChanged,
    ProtocolError,
    RateLimited,
    ServerError,
    TransportError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from procurd.upstream.ratelimit import Priority, PriorityRateLimiter

__all__ = [
    "AuthError",
    "BusinessError",
    "ClockSkew",
    "ConnectFailed",
    "NotDelivered",
    "OutcomeUnknown",
    "PaymentFailed",
    "PriceChanged",
    "Priority",
    "PriorityRateLimiter",
    "ProtocolError",
    "RateLimited",
    "ServerError",
    "TransportError",
    "UpstreamError",
    "UpstreamTimeout",
    "UpstreamUnavailable",
]
