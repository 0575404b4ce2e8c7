"""The provider's part of the admin listener: accounts of downstream sites, their wallets and ledgers, the
orders they sent, and their callbacks (``/api/v1/provider/...``, described in ``openapi.yaml``).

Each handler reads its input and calls one provider operation (:mod:`procurd.provider.operations` and
:mod:`procurd.provider.accounts`), as ``procurd provider`` and the console do. The routes answer
whether or not ``[provider] enabled`` is set: accounts can be prepared and wallets topped up before the
signed API is switched on, and orders received earlier stay readable after it is switched off. An account's
API secret is in two answers only, creating the account and rotating its secret, and never in a log line.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from aiohttp import web

from procurd.core.orders import iso
from procurd.core.provider import ACCOUNT_NAME_RULE, Account, account_view
from procurd.http.errors import OPERATIONS, ApiError, Handler
from procurd.http.inputs import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE,
    MAX_PAGE_SIZE,
    json_object,
    parse_provider_order_id,
    query_int,
    query_text,
)
from procurd.operations import Operations
from procurd.protocol.web import json_response
from procurd.provider.accounts import ACCOUNT_NAME
from procurd.provider.operations import ProviderOperations

PREFIX = "/api/v1/provider"


# --- reading requests ---------------------------------------------------------------------------------------


def _provider(request: web.Request) -> ProviderOperations:
    operations: Operations = request.app[OPERATIONS]
    return operations.provider


def _account_name(request: web.Request) -> str:
    """The account named in the path; 404 ``account_not_found`` for a name no account can have."""
    name = request.match_info["name"]
    if not ACCOUNT_NAME.fullmatch(name):
        raise _no_such_name()
    return name


def _no_such_name() -> ApiError:
    return ApiError(404, "account_not_found", f"no provider account: an account name is {ACCOUNT_NAME_RULE}")


def _order_id(request: web.Request) -> int:
    return parse_provider_order_id(request.match_info["id"])


def _pages(request: web.Request) -> tuple[int, int]:
    page = query_int(request.query, "page", 1, 1, MAX_PAGE, strict=True)
    page_size = query_int(request.query, "page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE, strict=True)
    return page, page_size


def _brief(account: Account) -> dict[str, Any]:
    """An account after a change: its view without the order counts (the list and the account's own view
    carry those)."""
    view = account_view(account)
    del view["orders"], view["old_secrets"]
    return view


# --- accounts -------------------------------------------------------------------------------------------


async def list_accounts(request: web.Request) -> web.Response:
    """Every account with its status, level, balance and orders by status, by name."""
    provider = _provider(request)
    items = await provider.accounts.list()
    return json_response(
        {"ok": True, "provider_enabled": provider.enabled, "currency": provider.settings.currency,
         "items": items}
    )  # fmt: skip


async def add_account(request: web.Request) -> web.Response:
    """Create an account (``{"name"}``): 201 with its API key and, this once, its API secret."""
    body = await json_object(request, allowed={"name"})
    account, secret = await _provider(request).accounts.add(body.get("name", ""))
    return json_response({"ok": True, "account": _brief(account), "api_secret": secret}, 201)


async def get_account(request: web.Request) -> web.Response:
    """An account with a page of its ledger, the newest movement first."""
    name = _account_name(request)
    page, page_size = _pages(request)
    view = await _provider(request).accounts.show(name, page, page_size)
    return json_response({"ok": True, "account": view})


def _movement(topup: bool) -> Handler:
    async def move(request: web.Request) -> web.Response:
        name = _account_name(request)
        body = await json_object(request, allowed={"amount", "note"})
        moved = await _provider(request).accounts.move(
            name, body.get("amount"), body.get("note"), topup=topup
        )
        return json_response({"ok": True, **moved})

    move.__doc__ = (
        "Add ``amount`` to the wallet, with a ``note`` for the ledger."
        if topup
        else "Take ``amount`` from the wallet (409 ``insufficient_balance`` beyond its balance)."
    )
    return move


def _status_change(active: bool) -> Handler:
    async def change(request: web.Request) -> web.Response:
        name = _account_name(request)
        await json_object(request, allowed=set(), optional=True)
        account = await _provider(request).accounts.set_status(name, active)
        return json_response({"ok": True, "account": _brief(account)})

    change.__doc__ = (
        "Let the account's signed requests in again."
        if active
        else "Refuse the account's signed requests (401 ``invalid_api_key``) until it is enabled."
    )
    return change


async def rotate_secret(request: web.Request) -> web.Response:
    """A new API secret for the account, shown this once; the old one keeps verifying the account's
    requests for ``overlap_hours`` (``[provider] rotation_overlap_hours`` by default), or ends at once with
    ``{"now": true}`` (a leaked secret)."""
    name = _account_name(request)
    body = await json_object(request, allowed={"overlap_hours", "now"}, optional=True)
    end_now = body.get("now", False)
    if not isinstance(end_now, bool):
        raise ApiError(400, "invalid_request", "now must be true or false")
    overlap = body.get("overlap_hours")
    if "overlap_hours" in body and (isinstance(overlap, bool) or not isinstance(overlap, int | Decimal)):
        raise ApiError(400, "invalid_overlap", "overlap_hours must be a number of hours")
    rotation = await _provider(request).accounts.rotate(name, overlap, end_now=end_now)
    return json_response(
        {"ok": True, "account": _brief(rotation.account), "api_secret": rotation.api_secret,
         "old_valid_until": iso(rotation.old_valid_until)}
    )  # fmt: skip


async def set_level(request: web.Request) -> web.Response:
    """Give the account a price tier of ``[[provider.levels]]`` (``{"level": SLUG}``), or none
    (``{"level": null}``)."""
    name = _account_name(request)
    provider = _provider(request)
    body = await json_object(request, allowed={"level"})
    if "level" not in body:
        raise ApiError(400, "invalid_request", "level is required: a configured slug, or null for none")
    slug = body["level"]
    if slug is not None and not isinstance(slug, str):
        raise ApiError(400, "invalid_request", "level must be a string (a configured slug) or null")
    if slug is not None and not ACCOUNT_NAME.fullmatch(slug):
        known = ", ".join(level.slug for level in provider.settings.levels) or "none are configured"
        raise ApiError(400, "unknown_level", f"no such level in [[provider.levels]] ({known})")
    account = await provider.accounts.set_level(name, slug)
    return json_response({"ok": True, "account": _brief(account)})


# --- orders ---------------------------------------------------------------------------------------------


async def list_orders(request: web.Request) -> web.Response:
    """Orders received from downstream sites, the newest first: ``account``, ``status``, ``page``,
    ``page_size``."""
    account = query_text(request.query, "account", strict=True)
    status = query_text(request.query, "status", strict=True)
    if account is not None and not ACCOUNT_NAME.fullmatch(account):
        raise _no_such_name()
    page, page_size = _pages(request)
    total, items = await _provider(request).orders(account, status, page, page_size)
    return json_response({"ok": True, "items": items, "total": total, "page": page, "page_size": page_size})


async def get_order(request: web.Request) -> web.Response:
    """One order with the procurement behind it, its callback and the callback's delivery log."""
    view = await _provider(request).order_detail(_order_id(request))
    return json_response({"ok": True, "order": view})


async def replay_callback(request: web.Request) -> web.Response:
    """Tell the order's latest status to its downstream site now, signed afresh; the order with its
    delivery log (the try is in it, successful or not)."""
    order_id = _order_id(request)
    await json_object(request, allowed=set(), optional=True)
    view = await _provider(request).replay(order_id)
    return json_response({"ok": True, "order": view})


def add_provider_admin_routes(router: web.UrlDispatcher) -> None:
    router.add_get(f"{PREFIX}/accounts", list_accounts)
    router.add_post(f"{PREFIX}/accounts", add_account)
    router.add_get(PREFIX + "/accounts/{name}", get_account)
    router.add_post(PREFIX + "/accounts/{name}/topup", _movement(True))
    router.add_post(PREFIX + "/accounts/{name}/debit", _movement(False))
    router.add_post(PREFIX + "/accounts/{name}/disable", _status_change(False))
    router.add_post(PREFIX + "/accounts/{name}/enable", _status_change(True))
    router.add_post(PREFIX + "/accounts/{name}/rotate", rotate_secret)
    router.add_put(PREFIX + "/accounts/{name}/level", set_level)
    router.add_get(f"{PREFIX}/orders", list_orders)
    router.add_get(PREFIX + "/orders/{id}", get_order)
    router.add_post(PREFIX + "/orders/{id}/callback", replay_callback)
