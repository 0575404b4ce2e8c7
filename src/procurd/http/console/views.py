"""The console's pages and form actions.

Pages read through :mod:`procurd.http.console.data`; actions check their input and act through the
installation's operations (:mod:`procurd.operations`), exactly as the JSON API does, then redirect back
with a message (post/redirect/get). Refusals (:class:`~procurd.core.refusals.Refused`) are shown by the
console's middleware as an error page.
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import quote

import structlog
from aiohttp import web

from procurd.http.console import data
from procurd.http.console.context import (
    CONSOLE,
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
from procurd.http.console.render import plural, render
from procurd.http.console.session import Flash
from procurd.http.errors import ApiError
from procurd.http.inputs import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE,
    MAX_PAGE_SIZE,
    parse_procurement_id,
    query_int,
    query_text,
)
from procurd.operations import Operations
from procurd.operations.orders import DEFAULT_BULK_RETRY, check_order_no, order_not_found
from procurd.runtime import Runtime

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
    """Exchange the admin token for a new signed-in session (a new session id: no fixation)."""
    console = request.app[CONSOLE]
    target = _back(request, HOME)
    if not console.login_required:
        return redirect(target)
    given = form_text(request, "token", max_chars=MAX_TOKEN_CHARS).strip()
    if not hmac.compare_digest(given.encode(), console.admin_token.encode()):
        log.warning("console.login_failed", remote=request.remote)
        context = {"next": target, "error": "That is not the admin token."}
        return render(request, "login.html", context, status=401)
    response = redirect(target)
    set_session(request, response, console.codec.issue(authenticated=True))
    log.info("console.signed_in", remote=request.remote)
    return response


async def logout(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    response = redirect(LOGIN_PATH if console.login_required else HOME)
    end_session(response)
    log.info("console.signed_out", remote=request.remote)
    return response


# --- overview ---------------------------------------------------------------------------------------------


async def overview(request: web.Request) -> web.Response:
    found = await data.overview(_runtime(request))
    return render(request, "overview.html", {"nav": "overview", "overview": found})


# --- exceptions -------------------------------------------------------------------------------------------


async def exceptions(request: web.Request) -> web.Response:
    upstream = _upstream_filter(request)
    reason = query_text(request.query, "reason")
    page, page_size = _paging(request)
    found = await data.exceptions_page(_runtime(request), upstream, reason, page, page_size)
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
    found = await data.orders_page(_runtime(request), text, status, page, page_size)
    if text and found.total == 1 and page == 1:
        return redirect(order_path(found.items[0].order_no))
    context = {"nav": "orders", "found": found, "q": text, "status": status, "statuses": data.ORDER_STATUSES}
    return render(request, "orders.html", context)


async def order(request: web.Request) -> web.Response:
    order_no = check_order_no(request.match_info["order_no"])
    audit_page = query_int(request.query, "audit_page", 1, 1, MAX_PAGE)
    detail = await data.order_detail(_runtime(request), order_no, audit_page=audit_page)
    if detail is None:
        raise order_not_found(order_no)
    return render(request, "order.html", _order_context(detail))


async def reveal(request: web.Request) -> web.Response:
    """The order page with one procurement's delivered goods shown (asked for with a POST, so the goods are
    never in a page's source, a URL or a cache before someone asks)."""
    order_no = check_order_no(request.match_info["order_no"])
    procurement_id = parse_procurement_id(form_text(request, "procurement_id"))
    detail = await data.order_detail(_runtime(request), order_no, reveal=procurement_id)
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
    found = await data.catalog_page(_runtime(request), text, upstream, page, page_size)
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
    found = await data.sync_page(_runtime(request), upstream, page, page_size)
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
    found = await data.alerts_page(_runtime(request), page, page_size)
    return render(request, "alerts.html", {"nav": "alerts", "found": found})


async def offers(request: web.Request) -> web.Response:
    page, page_size = _paging(request)
    found = await data.offers_page(_runtime(request), page, page_size)
    return render(request, "offers.html", {"nav": "offers", "found": found})


async def reconcile(request: web.Request) -> web.Response:
    page, page_size = _paging(request)
    found = await data.reconcile_page(_runtime(request), page, page_size)
    return render(request, "reconcile.html", {"nav": "reconcile", "found": found})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/ui/", overview)
    router.add_get(LOGIN_PATH, login_page)
    router.add_post(LOGIN_PATH, login)
    router.add_post("/ui/logout", logout)
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
