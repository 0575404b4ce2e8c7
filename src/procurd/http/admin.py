"""The admin listener: order intake, order reads and cancels, the exception queue, catalogue passes and price
holds, alerts, reconciliation, status, metrics, and the web console under ``/ui/``
(:mod:`procurd.http.console`).

JSON everywhere but the console. Success answers carry ``"ok": true``; failures
``{"ok": false, "error_code", "error_message"}`` with a meaningful HTTP status. When ``server.admin_token``
is set, every path but ``/healthz`` and the console needs ``Authorization: Bearer <admin_token>``.
"""

from __future__ import annotations

import hmac
from typing import Any

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client.aiohttp import make_aiohttp_handler

from procurd import offers
from procurd.alerts import alert_view
from procurd.catalog.pricing import holds, release_hold
from procurd.core.alerts import KINDS
from procurd.core.exact import loads_exact
from procurd.core.intake import CONFLICTS, MALFORMED, IntakeError, parse_order_request
from procurd.core.numbers import MAX_ID
from procurd.core.procurement import Resolve, Retry
from procurd.http.console import console_middleware, is_console_path, setup_console
from procurd.http.errors import (
    HEALTH_PATH,
    RUNTIME,
    ApiError,
    Handler,
    admin_error_body,
    healthz,
    json_response,
    listener_app,
    read_body,
)
from procurd.http.json_limits import json_problem
from procurd.http.operations import (
    DEFAULT_PAGE_SIZE,
    MAX_FILTER_CHARS,
    MAX_PAGE,
    MAX_PAGE_SIZE,
    cancel_order,
    check_bulk_filter,
    check_bulk_limit,
    check_known_filters,
    check_note,
    check_order_no,
    handle_exception,
    order_not_found,
    parse_procurement_id,
    query_int,
    query_text,
)
from procurd.offers import OfferError
from procurd.procurement.service import DEFAULT_BULK_RETRY
from procurd.reconcile import runs_with_findings
from procurd.runtime import Runtime
from procurd.status import refresh_metrics, status_report

log = structlog.get_logger("procurd.admin")


# --- request helpers --------------------------------------------------------------------------------------


def decode_json(raw: bytes) -> Any:
    """The body as JSON with every fractional number an exact ``Decimal``; 400 ``invalid_json`` otherwise,
    and 400 ``invalid_request`` for JSON that cannot be stored (a NUL, an unpaired surrogate, deep
    nesting)."""
    try:
        body = loads_exact(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ApiError(400, "invalid_json", "the body is not valid JSON") from None
    problem = json_problem(body)
    if problem is not None:
        raise ApiError(400, "invalid_request", f"the body cannot be accepted: {problem}")
    return body


async def _json_object(request: web.Request, *, optional: bool = False) -> dict[str, Any]:
    raw = await read_body(request)
    if optional and not raw.strip():
        return {}
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    return body


def _intake_error(exc: IntakeError) -> ApiError:
    """400 for a malformed request, 409 for one that collides with an earlier order, 422 otherwise."""
    status = 400 if exc.code in MALFORMED else 409 if exc.code in CONFLICTS else 422
    extra = {"details": exc.details} if exc.details else {}
    return ApiError(status, exc.code, exc.message, **extra)


# --- handlers ---------------------------------------------------------------------------------------------


async def submit_order(request: web.Request) -> web.Response:
    """Accept a locally paid order for procurement: 202 when new, 200 for a repeat of the same body."""
    runtime = request.app[RUNTIME]
    body = await _json_object(request)
    try:
        order_request = parse_order_request(body)
        result = await runtime.service.submit(order_request)
    except IntakeError as exc:
        raise _intake_error(exc) from None
    if result.created:
        runtime.metrics.orders_accepted.inc()
    return json_response({"ok": True, "order": result.order}, 202 if result.created else 200)


async def get_order(request: web.Request) -> web.Response:
    order_no = check_order_no(request.match_info["order_no"])
    view = await request.app[RUNTIME].service.order(order_no)
    if view is None:
        raise order_not_found(order_no)
    return json_response({"ok": True, "order": view})


async def post_cancel(request: web.Request) -> web.Response:
    """Upstream-first cancel of the whole order; 409 ``cancel_not_allowed`` with the reason of each item."""
    order_no = check_order_no(request.match_info["order_no"])
    view = await cancel_order(request.app[RUNTIME], order_no)
    return json_response({"ok": True, "order": view})


async def order_audit(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    order_no = check_order_no(request.match_info["order_no"])
    if await runtime.service.order(order_no) is None:
        raise order_not_found(order_no)
    return json_response({"ok": True, "order_no": order_no, "audit": await runtime.service.audit(order_no)})


async def list_exceptions(request: web.Request) -> web.Response:
    query = request.query
    upstream = query_text(query, "upstream")
    reason = query_text(query, "reason")
    page = query_int(query, "page", 1, 1, MAX_PAGE)
    page_size = query_int(query, "page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    await check_known_filters(request.app[RUNTIME], upstream, reason)
    total, items = await request.app[RUNTIME].service.exceptions(upstream, reason, page, page_size)
    return json_response({"ok": True, "items": items, "total": total, "page": page, "page_size": page_size})


async def retry_exception(request: web.Request) -> web.Response:
    """Send the procurement again (under a new number once the upstream canceled the old one)."""
    procurement_id = parse_procurement_id(request.match_info["id"])
    body = await _json_object(request, optional=True)
    note = check_note(body.get("note"), required=False)
    answer = await handle_exception(request.app[RUNTIME], procurement_id, Retry(note))
    return json_response({"ok": True, **answer})


async def retry_exceptions(request: web.Request) -> web.Response:
    """Send many exceptions again: ``{"reason", "upstream", "all", "note", "limit"}``, oldest first."""
    runtime = request.app[RUNTIME]
    body = await _json_object(request, optional=True)
    unknown = sorted(set(body) - {"reason", "upstream", "all", "note", "limit"})
    if unknown:
        raise ApiError(400, "invalid_request", f"unknown field {unknown[0]!r}")
    reason = _body_filter(body, "reason")
    upstream = _body_filter(body, "upstream")
    everything = body.get("all", False)
    if not isinstance(everything, bool):
        raise ApiError(400, "invalid_request", "all must be true or false")
    await check_bulk_filter(runtime, upstream, reason, everything)
    limit = check_bulk_limit(body.get("limit", DEFAULT_BULK_RETRY))
    note = check_note(body.get("note"), required=False)
    result = await runtime.service.retry_exceptions(upstream, reason, note, limit)
    return json_response(
        {"ok": True, "retried": result.retried, "skipped": result.skipped, "remaining": result.remaining}
    )


def _body_filter(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_FILTER_CHARS:
        raise ApiError(
            400, "invalid_request", f"{name} must be a non-empty string of up to {MAX_FILTER_CHARS} chars"
        )
    return value.strip()


async def resolve_exception(request: web.Request) -> web.Response:
    """Close the exception by hand; ``{"note": TEXT}`` is required."""
    procurement_id = parse_procurement_id(request.match_info["id"])
    body = await _json_object(request, optional=True)
    note = check_note(body.get("note"), required=True)
    assert note is not None
    answer = await handle_exception(request.app[RUNTIME], procurement_id, Resolve(note))
    return json_response({"ok": True, **answer})


async def list_alerts(request: web.Request) -> web.Response:
    """Recent alerts, the latest first: ``kind``, ``page``, ``page_size``."""
    kind = query_text(request.query, "kind")
    if kind is not None and kind not in KINDS:
        raise ApiError(400, "unknown_kind", f"no alert kind {kind!r} (known: {', '.join(KINDS)})")
    page = query_int(request.query, "page", 1, 1, MAX_PAGE)
    page_size = query_int(request.query, "page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    total, found = await request.app[RUNTIME].alerts.recent(page, page_size, kind)
    items = [alert_view(alert) for alert in found]
    return json_response({"ok": True, "items": items, "total": total, "page": page, "page_size": page_size})


async def list_reconciliations(request: web.Request) -> web.Response:
    """The last reconciliation passes (``limit``, 20 by default) with their findings."""
    limit = query_int(request.query, "limit", 20, 1, MAX_PAGE_SIZE)
    runs = await request.app[RUNTIME].database.read(lambda tx: runs_with_findings(tx, limit))
    return json_response({"ok": True, "runs": runs})


def _upstream_name(runtime: Runtime, name: str) -> str:
    if name not in {upstream.name for upstream in runtime.settings.upstreams}:
        raise ApiError(404, "unknown_upstream", f"no upstream {name!r} is configured")
    return name


async def list_price_holds(request: web.Request) -> web.Response:
    """SKUs whose selling price is held after a steep cost increase (``upstream`` filter), oldest first."""
    runtime = request.app[RUNTIME]
    upstream = query_text(request.query, "upstream")
    if upstream is not None:
        _upstream_name(runtime, upstream)
    return json_response({"ok": True, "items": await holds(runtime.database, upstream)})


async def release_price_hold(request: web.Request) -> web.Response:
    """Release a SKU's price hold: it is priced from the rules and its current cost at once."""
    runtime = request.app[RUNTIME]
    upstream = _upstream_name(runtime, request.match_info["upstream"])
    raw = request.match_info["sku_id"]
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_ID:
        raise ApiError(400, "invalid_id", "the SKU id must be a non-negative integer")
    sku_id = int(raw)
    released = await release_hold(
        runtime.database, upstream, sku_id, runtime.settings.pricing, client=runtime.client(upstream)
    )
    if released is None:
        raise ApiError(404, "hold_not_found", f"SKU {sku_id} of {upstream} has no price hold")
    return json_response(
        {
            "ok": True,
            "upstream": upstream,
            "sku_id": sku_id,
            "sell_price": released.sell_price,
            "sell_currency": released.sell_currency,
        }
    )


async def start_catalog_sync(request: web.Request) -> web.Response:
    """Start a catalogue pass now: ``{"upstream": NAME, "full": true, "allow_mass_removal": false}``; 202."""
    runtime = request.app[RUNTIME]
    body = await _json_object(request, optional=True)
    unknown = sorted(set(body) - {"upstream", "full", "allow_mass_removal"})
    if unknown:
        raise ApiError(400, "invalid_request", f"unknown field {unknown[0]!r}")
    names = [upstream.name for upstream in runtime.settings.upstreams]
    name = body.get("upstream")
    if name is None:
        if len(names) != 1:
            raise ApiError(400, "upstream_required", f"name the upstream: one of {', '.join(names)}")
        name = names[0]
    if not isinstance(name, str):
        raise ApiError(400, "invalid_request", "upstream must be a string")
    upstream = _upstream_name(runtime, name)
    flags = {}
    for flag in ("full", "allow_mass_removal"):
        value = body.get(flag, False)
        if not isinstance(value, bool):
            raise ApiError(400, "invalid_request", f"{flag} must be true or false")
        flags[flag] = value
    if flags["allow_mass_removal"] and not flags["full"]:
        raise ApiError(400, "invalid_request", "allow_mass_removal needs full: only a full pass removes")
    if not runtime.start_catalog_sync(upstream, **flags):
        raise ApiError(409, "sync_in_progress", f"a pass of {upstream} is already running in this instance")
    log.info("catalog.sync_requested", upstream=upstream, **flags)
    return json_response({"ok": True, "upstream": upstream, "started": True, **flags}, 202)


OFFER_ERROR_STATUS = {"invalid_request": 400, "invalid_offer_code": 400, "invalid_source": 400}


def _offer_error(error: OfferError) -> ApiError:
    return ApiError(OFFER_ERROR_STATUS.get(error.code, 422), error.code, error.message)


def _offer_code(request: web.Request) -> str:
    try:
        return offers.check_code(request.match_info["code"])
    except OfferError as exc:
        raise _offer_error(exc) from None


async def list_offers(request: web.Request) -> web.Response:
    """Every offer with its sources and the one in use now, by code."""
    page = query_int(request.query, "page", 1, 1, MAX_PAGE)
    page_size = query_int(request.query, "page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    total, items = await offers.offers_page(request.app[RUNTIME].database, page, page_size)
    return json_response({"ok": True, "items": items, "total": total, "page": page, "page_size": page_size})


async def get_offer(request: web.Request) -> web.Response:
    code = _offer_code(request)
    view = await offers.offer_view(request.app[RUNTIME].database, code)
    if view is None:
        raise ApiError(404, "offer_not_found", f"no offer {code!r}")
    return json_response({"ok": True, "offer": view})


async def put_offer(request: web.Request) -> web.Response:
    """Create or replace an offer: ``{"sources": [{"upstream", "sku_id"}, ...]}``, first choice first; 201
    when it is new."""
    runtime = request.app[RUNTIME]
    code = _offer_code(request)
    body = await _json_object(request)
    unknown = sorted(set(body) - {"code", "sources"})
    if unknown:
        raise ApiError(400, "invalid_request", f"unknown field {unknown[0]!r}")
    if "code" in body and body["code"] != code:
        raise ApiError(400, "invalid_request", "code in the body differs from the one in the path")
    try:
        sources = offers.check_sources(body.get("sources"), runtime.service.upstream_names)
        stored = await offers.put_offer(runtime.database, code, sources, runtime.service.upstream_names)
    except OfferError as exc:
        raise _offer_error(exc) from None
    return json_response(
        {"ok": True, "created": stored.created, "offer": stored.view}, 201 if stored.created else 200
    )


async def delete_offer(request: web.Request) -> web.Response:
    code = _offer_code(request)
    if not await offers.delete_offer(request.app[RUNTIME].database, code):
        raise ApiError(404, "offer_not_found", f"no offer {code!r}")
    return json_response({"ok": True, "code": code, "deleted": True})


async def get_status(request: web.Request) -> web.Response:
    return json_response(await status_report(request.app[RUNTIME]))


def metrics_handler(runtime: Runtime) -> Handler:
    """Prometheus text (or OpenMetrics when asked), with the database-derived gauges refreshed first."""
    render = make_aiohttp_handler(runtime.metrics.registry, disable_compression=True)

    async def metrics(request: web.Request) -> web.StreamResponse:
        try:
            await refresh_metrics(runtime)
        except Exception:
            # Counters are still worth scraping when the database is away; the gauges keep their last values.
            log.exception("metrics.refresh_failed")
        return await render(request)

    return metrics


# --- the application --------------------------------------------------------------------------------------


def bearer_auth(token: str) -> Middleware:
    """Require ``Authorization: Bearer <token>`` on every path but ``/healthz`` and the web console (which
    signs people in with the same token) when a token is set."""
    expected = token.encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected and request.path != HEALTH_PATH and not is_console_path(request.path):
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            valid = scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected)
            if not valid:
                raise ApiError(
                    401,
                    "unauthorized",
                    "a valid Authorization: Bearer token is required",
                    headers={"WWW-Authenticate": 'Bearer realm="procurd"'},
                )
        return await handler(request)

    return middleware


def make_admin_app(runtime: Runtime) -> web.Application:
    """The admin API (see ``procurd/http/openapi.yaml``) bound to ``runtime``."""
    token = runtime.settings.server.admin_token.get_secret_value()
    app = listener_app(
        "admin",
        admin_error_body,
        runtime.metrics,
        runtime.settings.server,
        database_unavailable_status=503,
        middlewares=(bearer_auth(token), console_middleware()),
    )
    app[RUNTIME] = runtime
    setup_console(app, runtime)
    router = app.router
    router.add_post("/api/v1/orders", submit_order)
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
    router.add_get("/metrics", metrics_handler(runtime))
    router.add_get(HEALTH_PATH, healthz)
    return app
