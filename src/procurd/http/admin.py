"""The admin listener: order intake, order reads and cancels, the exception queue, catalogue passes and price
holds, alerts, reconciliation, status, metrics, the provider's accounts, wallets and orders
(:mod:`procurd.http.provider_admin`), and the web console under ``/ui/`` (:mod:`procurd.http.console`).

Every action is the installation's operation (:mod:`procurd.operations`), as the console, the command line
and the daemon's schedule run it. JSON everywhere but the console. Success answers carry ``"ok": true``;
failures ``{"ok": false, "error_code", "error_message"}`` with a meaningful HTTP status. When
``server.admin_token`` is set, every path but ``/healthz`` and the console needs ``Authorization: Bearer
<admin_token>``.
"""

from __future__ import annotations

import hmac
from typing import Any

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client.aiohttp import make_aiohttp_handler

from procurd.core.numbers import MAX_ID
from procurd.http.console import console_middleware, is_console_path, setup_console
from procurd.http.errors import (
    HEALTH_PATH,
    OPERATIONS,
    RUNTIME,
    ApiError,
    Handler,
    admin_error_body,
    healthz,
    listener_app,
)
from procurd.http.inputs import (
    DEFAULT_PAGE_SIZE,
    MAX_FILTER_CHARS,
    MAX_PAGE,
    MAX_PAGE_SIZE,
    json_object,
    parse_procurement_id,
    query_int,
    query_text,
)
from procurd.http.openapi import DOCUMENT_PATH, serve_document
from procurd.http.provider_admin import add_provider_admin_routes
from procurd.http.throttle import THROTTLE, SignInThrottle, Throttled, throttled_error_text
from procurd.operations import Operations
from procurd.operations.orders import DEFAULT_BULK_RETRY, check_order_no
from procurd.protocol.web import json_response

log = structlog.get_logger("procurd.admin")


# --- request helpers --------------------------------------------------------------------------------------


def _operations(request: web.Request) -> Operations:
    return request.app[OPERATIONS]


def _pages(request: web.Request) -> tuple[int, int]:
    """``page`` and ``page_size`` of a listing, read as the document says (an empty value is refused)."""
    page = query_int(request.query, "page", 1, 1, MAX_PAGE, strict=True)
    page_size = query_int(request.query, "page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE, strict=True)
    return page, page_size


# --- handlers ---------------------------------------------------------------------------------------------


async def submit_order(request: web.Request) -> web.Response:
    """Accept a locally paid order for procurement: 202 when new, 200 for a repeat of the same body."""
    body = await json_object(request)
    result = await _operations(request).orders.submit(body)
    return json_response({"ok": True, "order": result.order}, 202 if result.created else 200)


async def preview_order(request: web.Request) -> web.Response:
    """What ``POST /api/v1/orders`` would do with the same body now, per item; creates nothing."""
    body = await json_object(request)
    preview = await _operations(request).orders.preview(body)
    return json_response({"ok": True, "preview": preview})


async def get_order(request: web.Request) -> web.Response:
    view = await _operations(request).orders.view(request.match_info["order_no"])
    return json_response({"ok": True, "order": view})


async def post_cancel(request: web.Request) -> web.Response:
    """Upstream-first cancel of the whole order; 409 ``cancel_not_allowed`` with the reason of each item."""
    view = await _operations(request).orders.cancel(request.match_info["order_no"])
    return json_response({"ok": True, "order": view})


async def order_audit(request: web.Request) -> web.Response:
    orders = _operations(request).orders
    order_no = check_order_no(request.match_info["order_no"])
    await orders.view(order_no)
    return json_response({"ok": True, "order_no": order_no, "audit": await orders.audit(order_no)})


async def list_exceptions(request: web.Request) -> web.Response:
    query = request.query
    upstream = query_text(query, "upstream", strict=True)
    reason = query_text(query, "reason", strict=True)
    page, page_size = _pages(request)
    total, items = await _operations(request).orders.exceptions(upstream, reason, page, page_size)
    return json_response({"ok": True, "items": items, "total": total, "page": page, "page_size": page_size})


async def retry_exception(request: web.Request) -> web.Response:
    """Send the procurement again (under a new number once the upstream canceled the old one)."""
    procurement_id = parse_procurement_id(request.match_info["id"])
    body = await json_object(request, allowed={"note", "nothing_bought"}, optional=True)
    answer = await _operations(request).orders.retry(
        procurement_id, body.get("note"), body.get("nothing_bought", False)
    )
    return json_response({"ok": True, **answer})


async def retry_exceptions(request: web.Request) -> web.Response:
    """Send many exceptions again: ``{"reason", "upstream", "all", "note", "limit"}``, oldest first."""
    body = await json_object(request, allowed={"reason", "upstream", "all", "note", "limit"}, optional=True)
    everything = body.get("all", False)
    if not isinstance(everything, bool):
        raise ApiError(400, "invalid_request", "all must be true or false")
    result = await _operations(request).orders.retry_exceptions(
        upstream=_body_filter(body, "upstream"),
        reason=_body_filter(body, "reason"),
        everything=everything,
        note=body.get("note"),
        limit=body.get("limit", DEFAULT_BULK_RETRY),
    )
    return json_response(
        {"ok": True, "retried": result.retried, "skipped": result.skipped, "remaining": result.remaining}
    )


def _body_filter(body: dict[str, Any], name: str) -> str | None:
    """A filter of a bulk retry as sent (null or left out: none), not stripped: only spaces is refused, and
    a value with spaces around a name names nothing procurd has."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_FILTER_CHARS:
        raise ApiError(
            400, "invalid_request", f"{name} must be a non-empty string of up to {MAX_FILTER_CHARS} chars"
        )
    return value


async def resolve_exception(request: web.Request) -> web.Response:
    """Close the exception by hand; ``{"note": TEXT}`` is required."""
    procurement_id = parse_procurement_id(request.match_info["id"])
    body = await json_object(request, allowed={"note"}, optional=True)
    answer = await _operations(request).orders.resolve(procurement_id, body.get("note"))
    return json_response({"ok": True, **answer})


async def list_alerts(request: web.Request) -> web.Response:
    """Recent alerts, the latest first: ``kind``, ``page``, ``page_size``."""
    kind = query_text(request.query, "kind", strict=True)
    page, page_size = _pages(request)
    total, items = await _operations(request).housekeeping.alerts(page, page_size, kind)
    return json_response({"ok": True, "items": items, "total": total, "page": page, "page_size": page_size})


async def list_reconciliations(request: web.Request) -> web.Response:
    """The last reconciliation passes (``limit``, 20 by default) with their findings."""
    limit = query_int(request.query, "limit", 20, 1, MAX_PAGE_SIZE, strict=True)
    runs = await _operations(request).upstreams.reconcile_runs(limit)
    return json_response({"ok": True, "runs": runs})


async def list_price_holds(request: web.Request) -> web.Response:
    """SKUs whose selling price is held after a steep cost increase (``upstream`` filter), oldest first."""
    catalog = _operations(request).catalog
    upstream = query_text(request.query, "upstream", strict=True)
    if upstream is not None:
        catalog.upstream(upstream)
    return json_response({"ok": True, "items": await catalog.holds(upstream)})


async def release_price_hold(request: web.Request) -> web.Response:
    """Release a SKU's price hold: it is priced from the rules and its current cost at once."""
    catalog = _operations(request).catalog
    upstream = catalog.upstream(request.match_info["upstream"])
    raw = request.match_info["sku_id"]
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_ID:
        raise ApiError(400, "invalid_id", "the SKU id must be a non-negative integer")
    released = await catalog.release_hold(upstream, int(raw))
    return json_response(
        {
            "ok": True,
            "upstream": upstream,
            "sku_id": released.sku_id,
            "sell_price": released.sell_price,
            "sell_currency": released.sell_currency,
        }
    )


async def start_catalog_sync(request: web.Request) -> web.Response:
    """Start a catalogue pass now: ``{"upstream": NAME, "full": true, "allow_mass_removal": false}``; 202."""
    catalog = _operations(request).catalog
    body = await json_object(request, allowed={"upstream", "full", "allow_mass_removal"}, optional=True)
    name = body.get("upstream")
    if name is not None and not isinstance(name, str):
        raise ApiError(400, "invalid_request", "upstream must be a string")
    upstream = catalog.upstream(name)
    flags = {}
    for flag in ("full", "allow_mass_removal"):
        value = body.get(flag, False)
        if not isinstance(value, bool):
            raise ApiError(400, "invalid_request", f"{flag} must be true or false")
        flags[flag] = value
    if not catalog.start_sync(upstream, **flags):
        raise ApiError(409, "sync_in_progress", f"a pass of {upstream} is already running in this instance")
    log.info("catalog.sync_requested", upstream=upstream, **flags)
    return json_response({"ok": True, "upstream": upstream, "started": True, **flags}, 202)


async def list_offers(request: web.Request) -> web.Response:
    """Every offer with its sources and the one in use now, by code."""
    page, page_size = _pages(request)
    total, items = await _operations(request).offers.page(page, page_size)
    return json_response({"ok": True, "items": items, "total": total, "page": page, "page_size": page_size})


async def get_offer(request: web.Request) -> web.Response:
    view = await _operations(request).offers.view(request.match_info["code"])
    return json_response({"ok": True, "offer": view})


async def put_offer(request: web.Request) -> web.Response:
    """Create or replace an offer: ``{"sources": [{"upstream", "sku_id"}, ...]}``, first choice first; 201
    when it is new."""
    offers = _operations(request).offers
    code = offers.check_code(request.match_info["code"])
    body = await json_object(request, allowed={"code", "sources"})
    if "code" in body and body["code"] != code:
        raise ApiError(400, "invalid_request", "code in the body differs from the one in the path")
    stored = await offers.put_request(code, body.get("sources"))
    return json_response(
        {"ok": True, "created": stored.created, "offer": stored.view}, 201 if stored.created else 200
    )


async def delete_offer(request: web.Request) -> web.Response:
    code = request.match_info["code"]
    await _operations(request).offers.delete(code)
    return json_response({"ok": True, "code": code, "deleted": True})


async def get_status(request: web.Request) -> web.Response:
    return json_response(await _operations(request).housekeeping.status())


def metrics_handler(operations: Operations) -> Handler:
    """Prometheus text (or OpenMetrics when asked), with the database-derived gauges refreshed first."""
    render = make_aiohttp_handler(operations.runtime.metrics.registry, disable_compression=True)

    async def metrics(request: web.Request) -> web.StreamResponse:
        try:
            await operations.housekeeping.refresh_metrics()
        except Exception:
            # Counters are still worth scraping when the database is away; the gauges keep their last values.
            log.exception("metrics.refresh_failed")
        return await render(request)

    return metrics


# --- the application --------------------------------------------------------------------------------------


def bearer_auth(token: str, throttle: SignInThrottle) -> Middleware:
    """Require ``Authorization: Bearer <token>`` on every path but ``/healthz`` and the web console (which
    signs people in with the same token) when a token is set.

    Wrong tokens are counted per client address (:mod:`procurd.http.throttle`): an address that must wait is
    answered 429 with ``Retry-After`` before its token is looked at. A request with no token at all is
    answered 401 without counting (a probe without credentials guesses nothing)."""
    expected = token.encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected and request.path != HEALTH_PATH and not is_console_path(request.path):
            address = throttle.address(request)
            try:
                throttle.check_waiting(address, "api")
                authorization = request.headers.get("Authorization", "")
                scheme, _, given = authorization.partition(" ")
                valid = scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected)
                if not valid:
                    if authorization.strip():
                        await throttle.wrong_token(address, "api")
                    raise ApiError(
                        401,
                        "unauthorized",
                        "a valid Authorization: Bearer token is required",
                        headers={"WWW-Authenticate": 'Bearer realm="procurd"'},
                    )
                await throttle.check_right_token(address, "api")
            except Throttled as waiting:
                raise ApiError(
                    429,
                    "too_many_attempts",
                    throttled_error_text(waiting.seconds),
                    headers={"Retry-After": str(waiting.retry_after)},
                ) from None
        return await handler(request)

    return middleware


async def _closed(throttle: SignInThrottle) -> None:
    throttle.close()


def make_admin_app(operations: Operations) -> web.Application:
    """The admin API (see ``procurd/http/openapi.yaml``) acting through ``operations``."""
    runtime = operations.runtime
    token = runtime.settings.server.admin_token.get_secret_value()
    throttle = SignInThrottle(operations)
    app = listener_app(
        "admin",
        admin_error_body,
        runtime.metrics,
        runtime.settings.server,
        database_unavailable_status=503,
        middlewares=(bearer_auth(token, throttle), console_middleware()),
    )
    app[RUNTIME] = runtime
    app[THROTTLE] = throttle
    app.on_cleanup.append(lambda _app: _closed(throttle))
    app[OPERATIONS] = operations
    setup_console(app, operations)
    router = app.router
    router.add_post("/api/v1/orders", submit_order)
    router.add_post("/api/v1/orders/preview", preview_order)
    router.add_get("/api/v1/orders/{order_no}", get_order)
    router.add_post("/api/v1/orders/{order_no}/cancel", post_cancel)
    router.add_get("/api/v1/orders/{order_no}/audit", order_audit)
    router.add_get("/api/v1/exceptions", list_exceptions)
    router.add_post("/api/v1/exceptions/retry", retry_exceptions)
    router.add_post("/api/v1/exceptions/{id}/retry", retry_exception)
    router.add_post("/api/v1/exceptions/{id}/resolve", resolve_exception)
    router.add_get("/api/v1/catalog/holds", list_price_holds)
    router.add_post("/api/v1/catalog/holds/{upstream}/{sku_id}/release", release_price_hold)
    router.add_post("/api/v1/catalog/sync", start_catalog_sync)
    router.add_get("/api/v1/offers", list_offers)
    router.add_get("/api/v1/offers/{code}", get_offer)
    router.add_put("/api/v1/offers/{code}", put_offer)
    router.add_delete("/api/v1/offers/{code}", delete_offer)
    router.add_get("/api/v1/status", get_status)
    router.add_get("/api/v1/alerts", list_alerts)
    router.add_get("/api/v1/reconcile", list_reconciliations)
    add_provider_admin_routes(router)
    router.add_get("/metrics", metrics_handler(operations))
    router.add_get(DOCUMENT_PATH, serve_document)
    router.add_get(HEALTH_PATH, healthz)
    return app
