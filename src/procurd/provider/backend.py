"""The provider's side of the signed API (seed 000's seven endpoints): the
:class:`~procurd.protocol.dujiao.Backend` that the shared protocol server calls, answering from the offered
catalogue and the provider's operations (:mod:`procurd.provider.operations`). The public listener serves it
(:mod:`procurd.http.provider`); it opens no transaction and imports no storage.

The rate limit is the real sites' (``[provider] rate_limit_per_minute`` requests a minute per account, then
the account refused for ``rate_limit_block_seconds``, answered HTTP 200 ``{"ok": false, "status_code": 429,
...}`` with ``Retry-After``), but it is counted only for requests whose signature verified: a stranger who
knows a key cannot spend its budget. Requests that fail authentication (or whose body is too large for
their signature to be checked) are limited per client address, in a bucket of their own: the peer's, or the
one ``X-Forwarded-For`` names when the peer is one of ``[server] trusted_proxies`` (as for the admin
listener's wrong tokens: the listener gives the function that tells a request's client address). Each
instance keeps its own counts.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC
from typing import Any

import structlog
from aiohttp import hdrs, web

from procurd.core.intake import plain_json
from procurd.core.json_limits import json_problem
from procurd.core.provider import Account, cents_text
from procurd.core.refusals import Refused
from procurd.protocol.dujiao import (
    Backend,
    Caller,
    Credential,
    ErrorAnswer,
    Listing,
    OrderSubmission,
    PreviousSecret,
    ProductQuery,
)
from procurd.protocol.dujiao.failures import bad_request
from procurd.protocol.dujiao.ratelimit import RateLimiter
from procurd.protocol.web import dump_json, json_response
from procurd.provider.operations import ProviderOperations

log = structlog.get_logger("procurd.provider")

WINDOW_SECONDS = 60.0
LAST_PAGE = 2**62  # pages beyond it (times their size) lie past any listing


def rate_limited(retry_after: float) -> web.Response:
    """The real sites' answer to a key over its limit (HTTP 200, their storefront envelope), with
    ``Retry-After``."""
    response = json_response(
        {
            "ok": False,
            "status_code": 429,
            "msg": "too many requests",
            "data": {"request_id": uuid.uuid4().hex},
        }
    )
    response.headers[hdrs.RETRY_AFTER] = str(max(1, round(retry_after + 0.5)))
    return response


def protocol_error(refused: Refused) -> ErrorAnswer:
    return ErrorAnswer(refused.status, refused.code, refused.message, refused.extra)


class ProviderBackend(Backend):
    """The provider's side of the shared signed API."""

    def __init__(self, provider: ProviderOperations, address: Callable[[web.Request], str]) -> None:
        self.provider = provider
        self.server = provider.runtime.settings.server
        self.settings = provider.settings
        self.metrics = provider.runtime.metrics
        self.accounts = RateLimiter(time.monotonic)
        self.strangers = RateLimiter(time.monotonic)
        self._address = address  # a request's client address, as the listener tells it

    @property
    def header_prefix(self) -> str:
        return self.settings.header_prefix

    @property
    def max_body_bytes(self) -> int:
        return 1024 * 1024

    @property
    def body_timeout_seconds(self) -> float:
        """The public listener's ``body_timeout_seconds``, as for the callback receiver beside it."""
        return self.server.body_timeout_seconds

    @property
    def disabled_key_status(self) -> int:
        """A disabled account's requests answer 401: the key is known, its holder is not let in."""
        return 401

    def now(self) -> float:
        return time.time()

    async def credential(self, api_key: str) -> Credential | None:
        found = await self.provider.accounts.by_key(api_key)
        if found is None:
            return None
        account = found.account
        previous = tuple(
            PreviousSecret(old.id, old.api_secret, old.valid_until.timestamp()) for old in found.old_secrets
        )
        # A disabled account's key is refused as an invalid key (seed 000: "key invalid or disabled").
        return Credential(account.api_secret, account.active, True, account, previous)

    async def previous_secret_used(self, caller: Caller, secret: PreviousSecret) -> None:
        """Counted per account (its view and ``procurd_provider_old_secret_requests``): the operator sees when
        the downstream has switched to the new secret."""
        await self.provider.accounts.old_secret_used(caller.account, secret.id)

    # -- the rate limit ---------------------------------------------------------------------------------

    def _limit(self, limiter: RateLimiter, key: str) -> web.Response | None:
        settings = self.settings
        if limiter.allow(
            key, settings.rate_limit_per_minute, WINDOW_SECONDS, settings.rate_limit_block_seconds
        ):
            return None
        return rate_limited(limiter.blocked_for(key) or settings.rate_limit_block_seconds)

    async def before_authentication(
        self, request: web.Request, endpoint: str, api_key: str
    ) -> web.Response | None:
        """An address whose requests keep failing authentication is refused before being checked again."""
        blocked = self.strangers.blocked_for(self._address(request))
        return rate_limited(blocked) if blocked > 0 else None

    def authentication_failed(
        self, request: web.Request, endpoint: str, api_key: str, error: ErrorAnswer
    ) -> None:
        self._unverified(request, error.code)

    def _unverified(self, request: web.Request, code: str) -> None:
        """A request refused before its signature verified counts against its client address."""
        address = self._address(request)
        if self._limit(self.strangers, address) is not None:
            log.warning("provider.authentication_throttled", remote=address, code=code)

    async def after_authentication(
        self, request: web.Request, endpoint: str, caller: Caller
    ) -> web.Response | None:
        account: Account = caller.account
        return self._limit(self.accounts, f"account:{account.id}")

    def answered(
        self, request: web.Request, endpoint: str | None, caller: Caller | None, status: int, outcome: str
    ) -> None:
        account = caller.account.name if caller is not None else "-"
        self.metrics.provider_requests.labels(account, endpoint or "unknown", outcome).inc()
        if caller is None and outcome == "request_too_large":
            # Refused before its signature could be checked: limited like a failed authentication.
            self._unverified(request, outcome)

    # -- endpoints --------------------------------------------------------------------------------------

    async def ping(self, caller: Caller) -> Mapping[str, Any]:
        try:
            account: Account = await self.provider.accounts.get(caller.account.name)
        except Refused as refused:  # the account went away since it authenticated: no server error
            raise protocol_error(refused) from None
        level = self.provider.level(account)
        member_level = None
        if level is not None:
            position = self.settings.levels.index(level) + 1
            member_level = {"id": position, "name": level.name, "slug": level.slug, "icon": level.icon}
        return {
            "site_name": self.settings.site_name,
            "user_id": account.id,
            "balance": cents_text(account.balance_cents),
            "currency": account.currency,
            "member_level": member_level,
        }

    async def categories(self, caller: Caller) -> bytes:
        return dump_json(await self.provider.categories())

    async def products(self, caller: Caller, query: ProductQuery) -> Listing:
        # A page past any listing and an instant outside the years 1-9999 in UTC are answered, not turned
        # into an offset or a time the database cannot hold.
        page = min(query.page, LAST_PAGE // query.page_size)
        updated_after = query.updated_after
        if updated_after is not None:
            try:
                updated_after = updated_after.astimezone(UTC)
            except OverflowError:
                if updated_after.year > 1:  # after the last instant: nothing was updated since
                    return Listing([], 0, includes_inactive=query.include_inactive or None)
                updated_after = None  # before the first instant: everything was
        found = await self.provider.products(
            caller.account, page, query.page_size, query.category_id, updated_after, query.include_inactive
        )
        return Listing([], found.total, found.answer, includes_inactive=query.include_inactive or None)

    async def product(self, caller: Caller, product_id: int) -> bytes:
        try:
            return await self.provider.product(caller.account, product_id)
        except Refused as refused:
            raise protocol_error(refused) from None

    async def existing_order(self, caller: Caller, downstream_order_no: str) -> Mapping[str, Any] | None:
        """Nothing here: a repeat is answered by :meth:`create_order`, from the same read as its checks."""
        return None

    async def create_order(self, caller: Caller, submission: OrderSubmission) -> Mapping[str, Any]:
        form = submission.manual_form_data
        if form is not None and json_problem(form) is None:  # what is wrong else, the checks below name
            try:
                plain_json(form)  # its numbers as the order keeps them: not too large, finite
            except ValueError as exc:
                raise bad_request(str(exc)) from None
        try:
            order, created = await self.provider.create_order(
                caller.account,
                sku_id=submission.sku_id,
                quantity=submission.quantity,
                manual_form_data=submission.manual_form_data,
                downstream_order_no=submission.downstream_order_no,
                trace_id=submission.trace_id,
                callback_url=submission.callback_url,
            )
        except Refused as refused:
            raise protocol_error(refused) from None
        if created and order.status == "canceled":
            fields = {"order_id": order.id, "order_no": order.order_no, "status": order.status}
            raise ErrorAnswer(200, "payment_failed", "wallet payment failed: the balance is too low", fields)
        return order.summary()

    async def order(self, caller: Caller, order_id: int) -> Mapping[str, Any]:
        try:
            return (await self.provider.order_of(caller.account, order_id)).to_api()
        except Refused as refused:
            raise protocol_error(refused) from None

    async def cancel_order(self, caller: Caller, order_id: int) -> Mapping[str, Any]:
        try:
            order = await self.provider.cancel(caller.account, order_id)
        except Refused as refused:
            raise protocol_error(refused) from None
        return {"ok": True, "order_id": order.id, "order_no": order.order_no, "status": order.status}
