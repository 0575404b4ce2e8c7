"""The console's pages and form actions.

Pages read through :mod:`procurd.http.console.data`; actions check their input and act through the
installation's operations (:mod:`procurd.operations`), exactly as the JSON API does, then redirect back
with a message (post/redirect/get). Refusals (:class:`~procurd.core.refusals.Refused`) are shown by the
console's middleware as an error page; a refused action on a provider account (a bad amount, a short
wallet, no note) is shown on the account's page instead, beside its form.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlencode

import structlog
from aiohttp import web

from procurd.core.orders import MAX_NOTE_CHARS
from procurd.core.provider import ORDER_STATUSES as PROVIDER_ORDER_STATUSES
from procurd.core.refusals import Refused
from procurd.core.times import plural
from procurd.http.console import data
from procurd.http.console.context import (
    CONSOLE,
    FORM,
    HOME,
    LOGIN_PATH,
    SESSION,
    end_session,
    form_text,
    redirect,
    redirect_with,
    safe_next,
    set_session,
)
from procurd.http.console.render import render
from procurd.http.console.session import Flash
from procurd.http.errors import ApiError
from procurd.http.inputs import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE,
    MAX_PAGE_SIZE,
    parse_procurement_id,
    parse_provider_order_id,
    query_int,
    query_text,
)
from procurd.http.throttle import THROTTLE, Throttled
from procurd.operations import Operations
from procurd.operations.orders import DEFAULT_BULK_RETRY, check_order_no, order_not_found
from procurd.operations.runtime import Runtime
from procurd.provider.accounts import ACCOUNT_NAME, account_not_found
from procurd.provider.operations import ProviderOperations

log = structlog.get_logger("procurd.console")

MAX_SEARCH_CHARS = 100
MAX_TOKEN_CHARS = 4096


def _runtime(request: web.Request) -> Runtime:
    return request.app[CONSOLE].runtime


def _operations(request: web.Request) -> Operations:
    return request.app[CONSOLE].operations


def _paging(request: web.Request) -> tuple[int, int]:
    page = query_int(request.query, "page", 1, 1, MAX_PAGE)
    return page, query_int(request.query, "page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)


def _upstream_filter(request: web.Request) -> str | None:
    upstream = query_text(request.query, "upstream")
    if upstream is not None and upstream not in _runtime(request).service.upstream_names:
        raise ApiError(400, "unknown_upstream", f"no upstream {upstream!r}")
    return upstream


def _back(request: web.Request, default: str) -> str:
    return safe_next(form_text(request, "next"), default)


def order_path(order_no: str) -> str:
    return "/ui/orders/" + quote(order_no, safe="")


# --- signing in -------------------------------------------------------------------------------------------


async def login_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    target = safe_next(request.query.get("next"))
    if not console.login_required or request[SESSION].authenticated:
        return redirect(target)
    return render(request, "login.html", {"next": target, "error": None})


async def login(request: web.Request) -> web.Response:
    """Exchange the admin token for a new signed-in session (a new session id: no fixation), recorded in the
    database so that signing out ends it everywhere. Wrong tokens are counted per client address: one that
    must wait is answered 429 before its token is looked at (:mod:`procurd.http.throttle`)."""
    console = request.app[CONSOLE]
    target = _back(request, HOME)
    if not console.login_required:
        return redirect(target)
    throttle = request.app[THROTTLE]
    address = throttle.address(request)
    try:
        throttle.check_waiting(address, "console")
        given = form_text(request, "token", max_chars=MAX_TOKEN_CHARS).strip()
        if not hmac.compare_digest(given.encode(), console.admin_token.encode()):
            if given:  # an empty form guesses nothing
                await throttle.wrong_token(address, "console")
            context = {"next": target, "error": "That is not the admin token."}
            return render(request, "login.html", context, status=401)
        await throttle.check_right_token(address, "console")
    except Throttled as waiting:
        return _throttled(request, target, waiting)
    await throttle.signed_in(address)
    session = console.codec.issue(authenticated=True)
    await console.sessions.start(session, address)
    response = redirect(target)
    set_session(request, response, session)
    log.info("console.signed_in", remote=address)
    return response


def _throttled(request: web.Request, target: str, waiting: Throttled) -> web.Response:
    seconds = waiting.retry_after
    context = {
        "next": target,
        "error": f"Too many wrong tokens from your address: try again in {plural(seconds, 'second')}.",
    }
    response = render(request, "login.html", context, status=429)
    response.headers["Retry-After"] = str(seconds)
    return response


async def logout(request: web.Request) -> web.Response:
    """End this session, on every instance (its row goes), and clear the cookie."""
    console = request.app[CONSOLE]
    session = request[SESSION]
    if console.login_required and session.authenticated:
        await console.sessions.end(session)
    response = redirect(LOGIN_PATH if console.login_required else HOME)
    end_session(response)
    log.info("console.signed_out", remote=request.remote)
    return response


async def logout_everywhere(request: web.Request) -> web.Response:
    """End every console session, this one included, on every instance: for a browser left signed in
    somewhere, or a cookie that may have been copied (changing the admin token does the same and more)."""
    console = request.app[CONSOLE]
    if not console.login_required:
        return redirect(HOME)
    ended = await console.sessions.end_all()
    response = redirect_with(
        request, LOGIN_PATH, Flash("ok", f"Signed out everywhere: {plural(ended, 'session')} ended.")
    )
    end_session(response)
    log.warning("console.signed_out_everywhere", remote=request.remote, sessions=ended)
    return response


# --- overview ---------------------------------------------------------------------------------------------


async def overview(request: web.Request) -> web.Response:
    charts = request.query.get("charts", "on")
    if charts not in ("on", "off"):
        raise ApiError(400, "invalid_query", "charts must be on or off")
    found = await data.overview(_operations(request), charts=charts == "on")
    return render(request, "overview.html", {"nav": "overview", "overview": found})


# --- exceptions -------------------------------------------------------------------------------------------


async def exceptions(request: web.Request) -> web.Response:
    upstream = _upstream_filter(request)
    reason = query_text(request.query, "reason")
    page, page_size = _paging(request)
    found = await data.exceptions_page(_operations(request), upstream, reason, page, page_size)
    context = {"nav": "exceptions", "found": found, "upstream": upstream, "reason": reason,
               "default_limit": DEFAULT_BULK_RETRY}  # fmt: skip
    return render(request, "exceptions.html", context)


async def retry_exception(request: web.Request) -> web.Response:
    procurement_id = parse_procurement_id(request.match_info["id"])
    await _operations(request).orders.retry(procurement_id, form_text(request, "note"))
    text = f"Procurement {procurement_id} is queued to be sent again."
    return redirect_with(request, _back(request, "/ui/exceptions"), Flash("ok", text))


async def resolve_exception(request: web.Request) -> web.Response:
    procurement_id = parse_procurement_id(request.match_info["id"])
    await _operations(request).orders.resolve(procurement_id, form_text(request, "note"))
    text = f"Procurement {procurement_id} is resolved."
    return redirect_with(request, _back(request, "/ui/exceptions"), Flash("ok", text))


async def retry_exceptions(request: web.Request) -> web.Response:
    """Send every exception with a reason again (within an upstream when one is chosen), oldest first."""
    reason = form_text(request, "reason").strip() or None
    upstream = form_text(request, "upstream").strip() or None
    raw_limit = form_text(request, "limit").strip() or str(DEFAULT_BULK_RETRY)
    result = await _operations(request).orders.retry_exceptions(
        upstream=upstream,
        reason=reason,
        note=form_text(request, "note"),
        limit=int(raw_limit) if raw_limit.isascii() and raw_limit.isdigit() else None,
    )
    parts = [f"{plural(len(result.retried), 'exception')} sent again"]
    if result.skipped:
        skipped = ", ".join(f"{item['id']} ({item['error_code']})" for item in result.skipped[:10])
        parts.append(f"{len(result.skipped)} skipped: {skipped}")
    if result.remaining:
        parts.append(f"{result.remaining} more match: send again to continue")
    level = "ok" if result.retried or not result.skipped else "error"
    return redirect_with(request, _back(request, "/ui/exceptions"), Flash(level, "; ".join(parts) + "."))


# --- orders -----------------------------------------------------------------------------------------------


async def orders(request: web.Request) -> web.Response:
    text = query_text(request.query, "q", MAX_SEARCH_CHARS)
    status = query_text(request.query, "status")
    if status is not None and status not in data.ORDER_STATUSES:
        raise ApiError(400, "invalid_query", f"status must be one of {', '.join(data.ORDER_STATUSES)}")
    page, page_size = _paging(request)
    found = await data.orders_page(_operations(request), text, status, page, page_size)
    if text and found.total == 1 and page == 1:
        return redirect(order_path(found.items[0].order_no))
    context = {"nav": "orders", "found": found, "q": text, "status": status, "statuses": data.ORDER_STATUSES}
    return render(request, "orders.html", context)


async def order(request: web.Request) -> web.Response:
    order_no = check_order_no(request.match_info["order_no"])
    audit_page = query_int(request.query, "audit_page", 1, 1, MAX_PAGE)
    detail = await data.order_detail(_operations(request), order_no, audit_page=audit_page)
    if detail is None:
        raise order_not_found(order_no)
    return render(request, "order.html", _order_context(detail))


async def reveal(request: web.Request) -> web.Response:
    """The order page with one procurement's delivered goods shown (asked for with a POST, so the goods are
    never in a page's source, a URL or a cache before someone asks)."""
    order_no = check_order_no(request.match_info["order_no"])
    procurement_id = parse_procurement_id(form_text(request, "procurement_id"))
    detail = await data.order_detail(_operations(request), order_no, reveal=procurement_id)
    if detail is None:
        raise order_not_found(order_no)
    if detail.revealed is None:
        raise ApiError(404, "procurement_not_found", f"order {order_no} has no procurement {procurement_id}")
    log.info("console.goods_revealed", order_no=order_no, procurement_id=procurement_id)
    return render(request, "order.html", _order_context(detail))


def _order_context(detail: data.OrderDetail) -> dict[str, Any]:
    url = order_path(detail.order["order_no"])

    def audit_link(page: int) -> str:
        return f"{url}?audit_page={page}#audit"

    return {
        "nav": "orders",
        "detail": detail,
        "order": detail.order,
        "order_url": url,
        "audit_link": audit_link,
    }


async def cancel(request: web.Request) -> web.Response:
    order_no = check_order_no(request.match_info["order_no"])
    await _operations(request).orders.cancel(order_no)
    return redirect_with(request, order_path(order_no), Flash("ok", f"Order {order_no} is canceled."))


# --- catalogue, sync runs ---------------------------------------------------------------------------------


async def catalog(request: web.Request) -> web.Response:
    text = query_text(request.query, "q", MAX_SEARCH_CHARS)
    upstream = _upstream_filter(request)
    page, page_size = _paging(request)
    found = await data.catalog_page(_operations(request), text, upstream, page, page_size)
    context = {"nav": "catalog", "found": found, "q": text, "upstream": upstream}
    return render(request, "catalog.html", context)


async def release_hold(request: web.Request) -> web.Response:
    upstream = request.match_info["upstream"]
    if upstream not in _runtime(request).service.upstream_names:
        raise ApiError(404, "unknown_upstream", f"no upstream {upstream!r}")
    sku_id = parse_procurement_id(request.match_info["sku_id"])
    text = await data.release_hold(_operations(request), upstream, sku_id)
    return redirect_with(request, _back(request, "/ui/catalog"), Flash("ok", text))


async def sync_runs(request: web.Request) -> web.Response:
    upstream = _upstream_filter(request)
    page, page_size = _paging(request)
    found = await data.sync_page(_operations(request), upstream, page, page_size)
    return render(request, "sync.html", {"nav": "sync", "found": found, "upstream": upstream})


async def sync_now(request: web.Request) -> web.Response:
    upstream = form_text(request, "upstream").strip()
    full = form_text(request, "full") == "on"
    text = await data.start_sync(_operations(request), upstream, full=full)
    log.info("console.sync_requested", upstream=upstream, full=full)
    return redirect_with(request, _back(request, "/ui/sync"), Flash("ok", text))


# --- pages whose features land later ----------------------------------------------------------------------


async def alerts(request: web.Request) -> web.Response:
    page, page_size = _paging(request)
    found = await data.alerts_page(_operations(request), page, page_size)
    return render(request, "alerts.html", {"nav": "alerts", "found": found})


async def offers(request: web.Request) -> web.Response:
    page, page_size = _paging(request)
    found = await data.offers_page(_operations(request), page, page_size)
    return render(request, "offers.html", {"nav": "offers", "found": found})


async def reconcile(request: web.Request) -> web.Response:
    page, page_size = _paging(request)
    found = await data.reconcile_page(_operations(request), page, page_size)
    return render(request, "reconcile.html", {"nav": "reconcile", "found": found})


# --- provider ---------------------------------------------------------------------------------------------

MAX_AMOUNT_CHARS = 32


def _provider(request: web.Request) -> ProviderOperations:
    """The provider's operations; 404 ``provider_disabled`` while ``[provider] enabled`` is false."""
    provider = _operations(request).provider
    if not provider.enabled:
        raise ApiError(404, "provider_disabled", "the provider role is off here ([provider] enabled = false)")
    return provider


def account_path(name: str) -> str:
    return "/ui/provider/accounts/" + quote(name, safe="")


def provider_order_path(order_id: int) -> str:
    return f"/ui/provider/orders/{order_id}"


def _account_name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not ACCOUNT_NAME.fullmatch(name):
        raise account_not_found(name)
    return name


def _provider_order_id(request: web.Request) -> int:
    return parse_provider_order_id(request.match_info["id"])


async def provider_home(request: web.Request) -> web.Response:
    _provider(request)
    return redirect("/ui/provider/accounts")


async def provider_accounts(request: web.Request) -> web.Response:
    _provider(request)
    found = await data.provider_accounts(_operations(request))
    return render(
        request, "provider_accounts.html", {"nav": "provider", "subnav": "accounts", "found": found}
    )


async def provider_account(request: web.Request) -> web.Response:
    _provider(request)
    return await _account_page(request, _account_name(request))


async def _account_page(
    request: web.Request, name: str, refused: Refused | None = None, action: str | None = None
) -> web.Response:
    """The account's page; after a refused action, with the reason beside the form it came from and what
    was typed in it, answered with the refusal's status."""
    page, page_size = _paging(request)
    found = await data.provider_account(_operations(request), name, page, page_size)
    context = {
        "nav": "provider",
        "subnav": "accounts",
        "found": found,
        "account": found.account,
        "account_url": account_path(name),
        "ledger_link": lambda number: _ledger_link(name, number, page_size),
        "refused": refused,
        "action": action,
        "typed": _typed(request) if refused is not None else {},
    }
    return render(request, "provider_account.html", context, status=refused.status if refused else 200)


def _typed(request: web.Request) -> dict[str, str]:
    """What was typed in a refused form, to show in it again (not when it is far too long to be meant)."""
    form = request[FORM]
    return {name: value for name in ("amount", "note") if len(value := form.get(name, "")) <= MAX_NOTE_CHARS}


def _ledger_link(name: str, page: int, page_size: int) -> str:
    """A page of the account's ledger (also from the page a refused action answers, whose path is the
    action's)."""
    query = {"page": page} if page_size == DEFAULT_PAGE_SIZE else {"page": page, "page_size": page_size}
    return f"{account_path(name)}?{urlencode(query)}#ledger"


async def _account_action(
    request: web.Request, action: str, act: Callable[[ProviderOperations, str], Awaitable[str]]
) -> web.Response:
    """Run an action on the account named in the path; done: back to its page with what was done; refused
    (a bad amount, a short wallet, no note ...): its page with the reason, nothing changed."""
    provider = _provider(request)
    name = _account_name(request)
    try:
        text = await act(provider, name)
    except Refused as refused:
        if refused.status == 404:
            raise
        log.info("console.provider_action_refused", account=name, action=action, code=refused.code)
        return await _account_page(request, name, refused, action)
    return redirect_with(request, account_path(name), Flash("ok", text))


def _movement(topup: bool) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        async def act(provider: ProviderOperations, name: str) -> str:
            amount = form_text(request, "amount", max_chars=MAX_AMOUNT_CHARS)
            moved = await provider.accounts.move(name, amount, form_text(request, "note"), topup=topup)
            done, currency = "Topped up" if topup else "Debited", moved["currency"]
            shown = moved["amount"].lstrip("-")
            return f"{done} {shown} {currency}: {name} now holds {moved['balance']} {currency}."

        return await _account_action(request, "topup" if topup else "debit", act)

    return handler


def _status_change(active: bool) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        async def act(provider: ProviderOperations, name: str) -> str:
            await provider.accounts.set_status(name, active)
            if active:
                return f"Account {name} is enabled: its signed requests are answered again."
            return f"Account {name} is disabled: its signed requests are refused until it is enabled again."

        return await _account_action(request, "enable" if active else "disable", act)

    return handler


async def provider_set_level(request: web.Request) -> web.Response:
    async def act(provider: ProviderOperations, name: str) -> str:
        if "level" not in request[FORM]:
            raise ApiError(400, "invalid_request", "choose a level, or none")
        slug = form_text(request, "level", max_chars=64).strip() or None
        account = await provider.accounts.set_level(name, slug)
        return f"Account {name} has {'level ' + account.level if account.level else 'no level'} now."

    return await _account_action(request, "level", act)


async def provider_orders(request: web.Request) -> web.Response:
    _provider(request)
    account = query_text(request.query, "account")
    status = query_text(request.query, "status")
    page, page_size = _paging(request)
    found = await data.provider_orders_page(_operations(request), account, status, page, page_size)
    context = {"nav": "provider", "subnav": "orders", "found": found, "account": account, "status": status,
               "statuses": PROVIDER_ORDER_STATUSES}  # fmt: skip
    return render(request, "provider_orders.html", context)


async def provider_order(request: web.Request) -> web.Response:
    _provider(request)
    detail = await data.provider_order_detail(_operations(request), _provider_order_id(request))
    return render(request, "provider_order.html", _provider_order_context(detail))


async def provider_reveal(request: web.Request) -> web.Response:
    """The provider order's page with its delivered goods shown (asked for with a POST, as on the local
    order page)."""
    _provider(request)
    order_id = _provider_order_id(request)
    detail = await data.provider_order_detail(_operations(request), order_id, reveal=True)
    if not detail.revealed:
        raise ApiError(404, "fulfillment_not_found", f"provider order {order_id} has no delivered goods")
    log.info("console.goods_revealed", provider_order_id=order_id)
    return render(request, "provider_order.html", _provider_order_context(detail))


def _provider_order_context(detail: data.ProviderOrderDetail) -> dict[str, Any]:
    order_no = detail.order["order_no"]
    return {
        "nav": "provider",
        "subnav": "orders",
        "detail": detail,
        "order": detail.order,
        "order_url": provider_order_path(detail.order["id"]),
        "local_order_url": order_path(order_no),
        "account_url": account_path(detail.order["account"]) if detail.order["account"] else None,
    }


async def provider_replay(request: web.Request) -> web.Response:
    """Tell the order's latest status to its downstream again now, and say how it went."""
    order_id = _provider_order_id(request)
    view = await _provider(request).replay(order_id)
    log.info("console.callback_replayed", provider_order_id=order_id)
    tried = next((attempt for attempt in view["callback_log"] if attempt["replay"]), None)
    if tried is None:  # the try is always logged; this only guards the page
        return redirect_with(request, provider_order_path(order_id), Flash("ok", "The callback was sent."))
    http = f"HTTP {tried['http_status']}" if tried["http_status"] is not None else "no answer"
    said = f": {tried['message']}" if tried["message"] else ""
    if tried["ok"]:
        text = f"The downstream was told {tried['status']} again and took it ({http}{said})."
        return redirect_with(request, provider_order_path(order_id), Flash("ok", text))
    text = f"The downstream was told {tried['status']} again but did not take it ({http}{said})."
    return redirect_with(request, provider_order_path(order_id), Flash("error", text))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/ui/", overview)
    router.add_get(LOGIN_PATH, login_page)
    router.add_post(LOGIN_PATH, login)
    router.add_post("/ui/logout", logout)
    router.add_post("/ui/logout/everywhere", logout_everywhere)
    router.add_get("/ui/exceptions", exceptions)
    router.add_post("/ui/exceptions/retry", retry_exceptions)
    router.add_post("/ui/exceptions/{id}/retry", retry_exception)
    router.add_post("/ui/exceptions/{id}/resolve", resolve_exception)
    router.add_get("/ui/orders", orders)
    router.add_get("/ui/orders/{order_no}", order)
    router.add_post("/ui/orders/{order_no}/reveal", reveal)
    router.add_post("/ui/orders/{order_no}/cancel", cancel)
    router.add_get("/ui/catalog", catalog)
    router.add_post("/ui/catalog/holds/{upstream}/{sku_id}/release", release_hold)
    router.add_get("/ui/sync", sync_runs)
    router.add_post("/ui/sync", sync_now)
    router.add_get("/ui/alerts", alerts)
    router.add_get("/ui/offers", offers)
    router.add_get("/ui/reconcile", reconcile)
    router.add_get("/ui/provider", provider_home)
    router.add_get("/ui/provider/accounts", provider_accounts)
    router.add_get("/ui/provider/accounts/{name}", provider_account)
    router.add_post("/ui/provider/accounts/{name}/topup", _movement(topup=True))
    router.add_post("/ui/provider/accounts/{name}/debit", _movement(topup=False))
    router.add_post("/ui/provider/accounts/{name}/enable", _status_change(active=True))
    router.add_post("/ui/provider/accounts/{name}/disable", _status_change(active=False))
    router.add_post("/ui/provider/accounts/{name}/level", provider_set_level)
    router.add_get("/ui/provider/orders", provider_orders)
    router.add_get("/ui/provider/orders/{id}", provider_order)
    router.add_post("/ui/provider/orders/{id}/reveal", provider_reveal)
    router.add_post("/ui/provider/orders/{id}/callback", provider_replay)
