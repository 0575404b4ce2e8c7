"""The signed site-to-site API (seed 000 parts 4, 5 and 7), served: one implementation for every site that
speaks it from procurd's code.

:class:`~procurd.protocol.server.SignedApi` routes the seven endpoints under ``/api/v1/upstream``, checks
each request as the real sites do (headers, timestamp, credential, body size, signature), reads and
validates queries and bodies, and answers in the protocol's envelopes and error codes. What a site holds
and decides (its users, catalogue, orders, wallet, rate limit, fault knobs) is its
:class:`~procurd.protocol.server.Backend`: the sandbox upstream (:mod:`procurd.sandbox`) keeps everything in
memory; procurd's provider role (:mod:`procurd.http.provider`) serves its mirror and buys upstream.
"""

from procurd.protocol.backend import (
    Backend,
    Caller,
    Credential,
    Listing,
    OrderSubmission,
    PreviousSecret,
    ProductQuery,
)
from procurd.protocol.errors import ProtocolError, bad_request
from procurd.protocol.server import API_PREFIX, PROTOCOL_VERSION, SignedApi, listing_answer

__all__ = [
    "API_PREFIX",
    "PROTOCOL_VERSION",
    "Backend",
    "Caller",
    "Credential",
    "Listing",
    "OrderSubmission",
    "PreviousSecret",
    "ProductQuery",
    "ProtocolError",
    "SignedApi",
    "bad_request",
    "listing_answer",
]
