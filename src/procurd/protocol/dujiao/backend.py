"""What a site behind the shared signed API provides: a :class:`Backend`, and the typed values the server
hands it (:class:`Caller`, :class:`ProductQuery`, :class:`OrderSubmission`) and takes back
(:class:`Credential`, :class:`Listing`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiohttp import web

from procurd.protocol.dujiao.failures import ErrorAnswer

MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 20


@dataclass(frozen=True)
class PreviousSecret:
    """A key's previous secret that still verifies signatures until ``valid_until`` (Unix seconds, on the
    site's clock): the overlap after a rotation. ``id`` is the backend's, passed back when it is used."""

    id: int
    secret: str = field(repr=False)
    valid_until: float


@dataclass(frozen=True)
class Credential:
    """What a backend knows of an API key: its secret, whether key and user are active, the backend's own
    record of the caller (passed back in :class:`Caller`), and previous secrets still in their overlap."""

    secret: str = field(repr=False)
    key_active: bool
    user_active: bool
    account: Any
    previous: tuple[PreviousSecret, ...] = ()


@dataclass(frozen=True)
class Caller:
    """An authenticated request's API user."""

    api_key: str
    account: Any


@dataclass(frozen=True)
class ProductQuery:
    """``GET /products``: a page (from 1), its size (the backend's clamp applied), the filters, and whether
    the caller asked for inactive products too (``include_inactive=true``; the backend decides whether it
    serves them)."""

    page: int
    page_size: int
    category_id: int | None = None
    updated_after: datetime | None = None
    include_inactive: bool = False


@dataclass(frozen=True)
class Listing:
    """One page of products, each already serialized, and how many products match in all; or, from a site
    that keeps its answers ready, the whole answer gzip-compressed (``gzip_answer``). ``includes_inactive``
    is the answer's field of that name (``None``: the answer has no such field)."""

    items: Sequence[bytes]
    total: int
    gzip_answer: bytes | None = None
    includes_inactive: bool | None = None


@dataclass(frozen=True)
class OrderSubmission:
    """``POST /orders``, its fields checked for type (the backend checks what they name)."""

    sku_id: int
    quantity: int
    manual_form_data: dict[str, Any] | None
    downstream_order_no: str | None
    trace_id: str | None
    callback_url: str | None


class Backend:
    """What one site holds and decides. Subclasses implement the endpoints; the hooks default to nothing."""

    @property
    def header_prefix(self) -> str:
        """The prefix of the three signature headers (``Service-Api-Key`` ...)."""
        return "Service"

    @property
    def max_body_bytes(self) -> int:
        """The largest request body read (the real sites take 10 MB)."""
        return 10 * 1024 * 1024

    @property
    def body_timeout_seconds(self) -> float | None:
        """How long a request's body may take to arrive (``None``: as long as the connection lives)."""
        return None

    @property
    def disabled_key_status(self) -> int:
        """The HTTP status of ``invalid_api_key`` for a key the site knows but has disabled (the real sites:
        403, as for a key they do not know)."""
        return 403

    @property
    def page_size_max(self) -> int:
        """The largest page of products answered (seed 000: 100)."""
        return MAX_PAGE_SIZE

    @property
    def honours_updated_after(self) -> bool:
        """Whether ``GET /products`` filters by ``updated_after``."""
        return True

    def page_size(self, asked: int | None) -> int:
        """The page size ``GET /products`` answers for ``page_size`` asked (``None``: left out). Seed 000: 20
        by default, below 1 read as 20, above :attr:`page_size_max` as that maximum."""
        if asked is None or asked < 1:
            asked = DEFAULT_PAGE_SIZE
        return min(asked, self.page_size_max)

    def now(self) -> float:
        """The site's clock (Unix seconds): the timestamp window and the ``Date`` header."""
        raise NotImplementedError

    async def credential(self, api_key: str) -> Credential | None:
        """The key's credential, or ``None`` for a key the site does not know."""
        raise NotImplementedError

    # -- hooks -----------------------------------------------------------------------------------------

    async def before_authentication(
        self, request: web.Request, endpoint: str, api_key: str
    ) -> web.Response | None:
        """An answer that ends the request before its signature is checked (``None``: go on)."""
        return None

    async def after_authentication(
        self, request: web.Request, endpoint: str, caller: Caller
    ) -> web.Response | None:
        """An answer that ends an authenticated request before its endpoint runs (``None``: go on)."""
        return None

    async def previous_secret_used(self, caller: Caller, secret: PreviousSecret) -> None:
        """A request of ``caller`` was signed with one of its previous secrets (for counting)."""

    def authentication_failed(
        self, request: web.Request, endpoint: str, api_key: str, error: ErrorAnswer
    ) -> None:
        """A request to ``endpoint`` failed authentication (for counting, or limiting its source)."""

    async def unrouted(self, request: web.Request, signed: Callable[[], Awaitable[bool]]) -> None:
        """A request for a path or method the API does not have (``signed()`` says whether it carries a
        valid signature anyway)."""

    def answered(
        self, request: web.Request, endpoint: str | None, caller: Caller | None, status: int, outcome: str
    ) -> None:
        """Every answer, once decided (for a request log or metrics): its HTTP status, and ``ok``, the error
        code, ``rate_limited`` or ``fault``."""

    async def around(self, request: web.Request, endpoint: str) -> web.Response | None:
        """An answer instead of the endpoint's (the sandbox's fault knobs), or ``None``."""
        return None

    async def after(self, request: web.Request, endpoint: str, response: web.Response) -> web.Response:
        """The answer to send once the endpoint answered ``response`` (the sandbox's fault knobs)."""
        return response

    # -- endpoints -------------------------------------------------------------------------------------

    async def ping(self, caller: Caller) -> Mapping[str, Any]:
        """``POST /ping``'s fields besides ``ok`` and ``protocol_version``."""
        raise NotImplementedError

    async def categories(self, caller: Caller) -> bytes:
        """``GET /categories``: the serialized array of categories."""
        raise NotImplementedError

    async def products(self, caller: Caller, query: ProductQuery) -> Listing:
        raise NotImplementedError

    async def product(self, caller: Caller, product_id: int) -> bytes:
        """The serialized product; :class:`ErrorAnswer` ``product_not_found`` / ``product_unavailable``."""
        raise NotImplementedError

    async def existing_order(self, caller: Caller, downstream_order_no: str) -> Mapping[str, Any] | None:
        """The answer to a repeated ``POST /orders`` (same key, same ``downstream_order_no``), or ``None``."""
        raise NotImplementedError

    async def create_order(self, caller: Caller, submission: OrderSubmission) -> Mapping[str, Any]:
        """Create and pay an order: the success answer, or :class:`ErrorAnswer` (``payment_failed`` as
        HTTP 200 with the canceled order's fields in ``extra``)."""
        raise NotImplementedError

    async def order(self, caller: Caller, order_id: int) -> Mapping[str, Any]:
        """``GET /orders/:id`` of the caller's own order; ``order_not_found`` otherwise."""
        raise NotImplementedError

    async def cancel_order(self, caller: Caller, order_id: int) -> Mapping[str, Any]:
        raise NotImplementedError
