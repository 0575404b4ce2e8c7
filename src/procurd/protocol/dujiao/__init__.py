"""Dujiao-Next's signed site-to-site API (seed 000, and the site as it runs since 2026): both halves.

The client half: :mod:`.signing` (part 5), the resources of part 2 as :mod:`procurd.upstream.models` (the
vocabulary the engine speaks to every upstream), :mod:`.answers`
(what an answer means, or the error it stands for), :mod:`.client` (``UpstreamClient``), :mod:`.callback`
(a callback's body read, verified and sent). The server half, one implementation for every site procurd
serves: :class:`~.server.SignedApi` routes the seven endpoints under ``/api/v1/upstream``, checks each request
as the real sites do (headers, timestamp, credential, body size, signature), reads and validates queries
and bodies, and answers in the protocol's envelopes and error codes (:mod:`.failures`); what a site holds and
decides is its :class:`~.backend.Backend`: the sandbox upstream (:mod:`procurd.sandbox`) keeps everything in
memory, procurd's provider role (:mod:`procurd.provider`) serves its mirror and buys upstream.
"""

from procurd.protocol.dujiao.backend import (
    Backend,
    Caller,
    Credential,
    Listing,
    OrderSubmission,
    PreviousSecret,
    ProductQuery,
)
from procurd.protocol.dujiao.failures import ErrorAnswer, bad_request
from procurd.protocol.dujiao.server import API_PREFIX, PROTOCOL_VERSION, SignedApi, listing_answer

__all__ = [
    "API_PREFIX",
    "PROTOCOL_VERSION",
    "Backend",
    "Caller",
    "Credential",
    "ErrorAnswer",
    "Listing",
    "OrderSubmission",
    "PreviousSecret",
    "ProductQuery",
    "SignedApi",
    "bad_request",
    "listing_answer",
]
