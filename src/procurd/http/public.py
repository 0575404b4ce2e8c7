"""The public listener: the upstreams' signed callback receiver (seed 000, 4.8 and part 5) and ``/healthz``.

A callback is checked in this order, and the first failure answers ``{"ok": false, "message": REASON}``:
declared body size (413), signature headers of a configured header prefix (401), timestamp readable and
within 60 s (401), API key of a configured upstream (403), and only then is the body read: its size as sent
and decoded (413), signature over the raw body with ``POST`` and the path ``/api/v1/upstream/callback`` or
else the path of ``server.callback_url`` (401), body (400), a procurement of that upstream under that number
and order id (404). A callback refused before its body is read is answered and its connection closed, the
body neither read nor decompressed. ``{"ok": true, "message": "received"}`` is answered only
once the service has committed the report; a duplicate is answered the same way.

A callback naming an upstream order that procurd has not recorded for that procurement is taken only once
the upstream confirms it: after the submission in flight, if any, has its answer; otherwise procurd asks
the upstream (a signed ``GET /orders/{order_id}`` at callback priority in the request budget). Not
confirmed: 404 ``callback_unverified`` with an audit entry, counted in the ``callbacks_rejected`` alert at
once; the upstream could not be asked: 503 ``verification_unavailable`` (it sends the callback again later).
A callback for an order procurd knows costs what it always did.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import structlog
from aiohttp import web

from procurd.config import UpstreamSettings
from procurd.core.alerts import claim_unverified
from procurd.core.procurement import Source
from procurd.http.errors import (
    HEALTH_PATH,
    RUNTIME,
    ApiError,
    Handler,
    check_content_length,
    healthz,
    listener_app,
    public_error_body,
    read_body,
)
from procurd.operations import DatabaseError, Operations
from procurd.operations.runtime import Runtime
from procurd.procurement.commands import ReportRejected
from procurd.procurement.service import ReportOutcome
from procurd.protocol.dujiao.callback import (
    CALLBACK_PATH,
    Callback,
    CallbackBodyError,
    CallbackKey,
    CallbackRefused,
    CallbackVerifier,
    parse_callback,
)
from procurd.protocol.web import dumps

log = structlog.get_logger("procurd.callback")

RECEIVED = dumps({"ok": True, "message": "received"}).encode()


class CallbackReceiver:
    """Authenticates (:class:`CallbackVerifier`), parses and applies upstream callbacks."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        settings = runtime.settings
        # Only Dujiao-Next upstreams push callbacks (an acg-faka shop has none).
        pushing = [upstream for upstream in settings.upstreams if upstream.protocol == "dujiao"]
        self.upstreams = {upstream.name: upstream for upstream in pushing}
        keys = [
            CallbackKey(upstream.name, upstream.api_key, upstream.header_prefix, upstream.secret())
            for upstream in pushing
        ]
        self.verifier = CallbackVerifier(keys, (CALLBACK_PATH, configured_callback_path(runtime)))

    async def handle(self, request: web.Request) -> web.Response:
        claimed: UpstreamSettings | None = None
        try:
            check_content_length(request)
            try:
                credentials = self.verifier.credentials(request.headers)
                key = self.verifier.key_of(credentials)
                claimed = self.upstreams[key.upstream] if key is not None else None
                self.verifier.check_timestamp(credentials.timestamp)
                if key is None:
                    raise CallbackRefused(
                        403, "invalid_api_key", "the API key belongs to no configured upstream"
                    )
                raw = await read_body(request)  # only now: a refused callback's body is never read
                self.verifier.check_signature(key, credentials, raw)
            except CallbackRefused as refused:
                raise ApiError(refused.status, refused.code, refused.message) from None
            callback = _parse(raw)
            assert claimed is not None
            outcome = await self._apply(claimed, callback)
        except ApiError as error:
            self._rejected(request, claimed, error)
            raise
        self._accepted(claimed, callback, outcome)
        return web.Response(body=RECEIVED, content_type="application/json", charset="utf-8")

    async def _apply(self, upstream: UpstreamSettings, callback: Callback) -> ReportOutcome:
        try:
            return await self.runtime.service.report(
                upstream.name, callback.downstream_order_no, callback.report, Source.CALLBACK
            )
        except ReportRejected as exc:
            if exc.code == "callback_unverified":
                await self._alert_unverified(upstream, callback, exc.reason)
            raise ApiError(exc.status, exc.code, exc.reason) from None

    async def _alert_unverified(self, upstream: UpstreamSettings, callback: Callback, reason: str) -> None:
        """A correctly signed claim the upstream did not confirm: a buggy or compromised upstream, or a
        replayed callback of another chain. Counted in the upstream's ``callbacks_rejected`` alert at once."""
        try:
            await self.runtime.alerts.raise_(claim_unverified(upstream.name, reason))
        except DatabaseError as exc:
            log.warning("callback.alert_not_stored", upstream=upstream.name, reason=exc.reason)

    def _accepted(self, upstream: UpstreamSettings, callback: Callback, outcome: ReportOutcome) -> None:
        log.info(
            "callback.accepted",
            upstream=upstream.name,
            downstream_order_no=callback.downstream_order_no,
            order_id=callback.report.order_id,
            status=callback.report.status,
            callback_event=callback.event,
            outcome=outcome.outcome,
            changed=outcome.changed,
            verified=outcome.verified,
        )
        self.runtime.metrics.observe_callback(upstream.name, True)
        self.runtime.callbacks.count(upstream.name, True)

    def _rejected(self, request: web.Request, upstream: UpstreamSettings | None, error: ApiError) -> None:
        name = upstream.name if upstream is not None else None
        log.warning(
            "callback.rejected",
            upstream=name,
            reason=error.code,
            detail=error.message,
            http_status=error.status,
            remote=request.remote,
        )
        self.runtime.metrics.observe_callback(name, False, error.code)
        self.runtime.rejections.rejected(name, error.code)
        if name is not None:
            self.runtime.callbacks.count(name, False)


def _parse(raw: bytes) -> Callback:
    try:
        return parse_callback(raw)
    except CallbackBodyError as exc:
        raise ApiError(400, "bad_request", str(exc)) from None


def configured_callback_path(runtime: Runtime) -> str:
    """The path of ``server.callback_url`` (what an upstream behind a path-rewriting proxy may sign)."""
    return urlsplit(runtime.settings.server.callback_url).path or "/"


async def _post_only_here(request: web.Request) -> web.Response:
    raise web.HTTPMethodNotAllowed(request.method, ["POST"])


def _post_only(app: web.Application, path: str, handler: Handler) -> None:
    """``POST path`` answered by ``handler``; any other method 405 with ``Allow: POST`` (the provider's
    signed API, served under the same prefix, does not answer it)."""
    app.router.add_post(path, handler)
    app.router.add_route("*", path, _post_only_here)


def make_public_app(operations: Operations) -> web.Application:
    """The callback receiver and ``/healthz``; the receiver also answers at ``callback_url``'s own path. With
    ``[provider] enabled`` the provider's signed API is served under ``/api/v1/upstream`` too."""
    runtime = operations.runtime
    app = listener_app("public", public_error_body, runtime.metrics, runtime.settings.server)
    app[RUNTIME] = runtime
    receiver = CallbackReceiver(runtime)
    _post_only(app, CALLBACK_PATH, receiver.handle)
    own_path = configured_callback_path(runtime)
    if own_path not in (CALLBACK_PATH, HEALTH_PATH, "/") and "{" not in own_path:
        _post_only(app, own_path, receiver.handle)
    app.router.add_get(HEALTH_PATH, healthz)
    if runtime.settings.provider.enabled:
        from procurd.http.provider import add_provider_routes

        add_provider_routes(app, operations)
    return app
