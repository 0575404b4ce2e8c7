"""The console's guard for every request under ``/ui``: security headers, the session, sign-in, CSRF, and
error pages instead of JSON.

Order of checks: a session cookie is read (a new one is issued when there is none or it is no good, or when
its signed-in session was signed out: its row is gone from the database); a
method the address does not take is answered 405 with ``Allow``, signed in or not; without
a signed-in session (when a token is configured) every page but the login page leads to the login page; a
POST must not come from another site (``Sec-Fetch-Site``, and its ``Origin``, or failing that its
``Referer``, must be the console's own) and must carry the CSRF token of its session; only then does the
handler run. Whatever fails becomes an HTML error page with a status, a code and a message; nothing changed.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware
from multidict import MultiDict

from procurd.core.json_limits import text_problem
from procurd.core.refusals import Refused
from procurd.http.console.context import (
    CONSOLE,
    COOKIE_PATH,
    FLASH,
    FORM,
    HOME,
    LOGIN_PATH,
    PREFIX,
    SESSION,
    STATIC_PREFIX,
    Console,
    behind_https,
    is_console_path,
    redirect,
    set_session,
)
from procurd.http.console.render import render
from procurd.http.console.session import FLASH_COOKIE, SESSION_COOKIE, Session
from procurd.http.errors import ApiError, Handler, read_body, route_name
from procurd.operations import DatabaseUnavailable

log = structlog.get_logger("procurd.console")

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    # Within the console a form's request carries its Origin (no-referrer would make it "null"); nothing
    # of a console address goes to another site.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}
FORM_TYPE = "application/x-www-form-urlencoded"
STATUS_TITLES = {400: "Bad request", 401: "Not signed in", 403: "Refused", 404: "Not found",
                 405: "Method not allowed", 409: "Not possible now", 413: "Too large",
                 415: "Not a form", 422: "Cannot do that", 501: "Not available yet",
                 503: "Database unavailable"}  # fmt: skip


def console_middleware() -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not is_console_path(request.path):
            return await handler(request)
        if request.path.startswith(STATIC_PREFIX):
            response = await _static(request, handler)
        else:
            page = redirect(HOME) if request.path == PREFIX else None
            response = page or await _page(request, handler, request.app[CONSOLE])
            response.headers["Cache-Control"] = "no-store"
        response.headers.update(SECURITY_HEADERS)
        return response

    return middleware


async def _static(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as error:
        return web.Response(status=error.status, text=f"{error.status} {error.reason}\n")
    response.headers["Cache-Control"] = "public, max-age=3600"
    return response


async def _page(request: web.Request, handler: Handler, console: Console) -> web.StreamResponse:
    codec = console.codec
    session = codec.decode(request.cookies.get(SESSION_COOKIE))
    if session is not None and session.authenticated and console.login_required:
        try:
            if not await console.sessions.alive(session):
                session = None  # signed out (here, on another instance, or everywhere)
        except DatabaseUnavailable as unavailable:
            log.error("console.database_unavailable", route=route_name(request), reason=unavailable.reason)
            reason = f"the database cannot be reached: {unavailable.reason}"
            return error_page(request, ApiError(503, "database_unavailable", reason))
    fresh = session is None
    if session is None:
        session = codec.issue(authenticated=not console.login_required)
    request[SESSION] = session
    flash = codec.decode_flash(request.cookies.get(FLASH_COOKIE))
    if flash is not None:
        request[FLASH] = flash
    response = await _answer(request, handler, console, session)
    if fresh and SESSION_COOKIE not in response.cookies:
        set_session(request, response, session)
    if FLASH_COOKIE in request.cookies and FLASH_COOKIE not in response.cookies:
        response.del_cookie(FLASH_COOKIE, path=COOKIE_PATH)
    return response


async def _answer(
    request: web.Request, handler: Handler, console: Console, session: Session
) -> web.StreamResponse:
    try:
        unmatched = request.match_info.http_exception
        if isinstance(unmatched, web.HTTPMethodNotAllowed):
            # A method no page takes (TRACE, PATCH ...) is refused as such, signed in or not: the login
            # page would not take it either.
            raise unmatched
        if console.login_required and not session.authenticated and request.path != LOGIN_PATH:
            return redirect(_login_url(request))
        if request.method == "POST":
            request[FORM] = await _checked_form(request, console, session)
        return await handler(request)
    except Refused as error:
        return error_page(request, error)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        allow = {"Allow": error.headers.get("Allow", "")} if error.status == 405 else {}
        return error_page(
            request, ApiError(error.status, _http_code(error.status), _http_text(error), headers=allow)
        )
    except DatabaseUnavailable as unavailable:
        log.error("console.database_unavailable", route=route_name(request), reason=unavailable.reason)
        reason = f"the database cannot be reached: {unavailable.reason}"
        return error_page(request, ApiError(503, "database_unavailable", reason))
    except Exception:
        log.exception("console.internal_error", method=request.method, route=route_name(request))
        return error_page(request, ApiError(500, "internal_error", "internal error: the log has the details"))


async def _checked_form(request: web.Request, console: Console, session: Session) -> MultiDict[str]:
    """The posted form's text fields, once the post is known to come from a page of this console."""
    if request.headers.get("Sec-Fetch-Site", "").lower() == "cross-site":
        log.warning("console.cross_site_post", route=route_name(request))
        raise ApiError(403, "cross_site", "a form posted from another site is refused")
    if request.content_type != FORM_TYPE:
        raise ApiError(415, "form_expected", "this address takes a form posted from the console's pages")
    problem = _foreign_origin(request)
    if problem is not None:
        log.warning("console.cross_site_post", route=route_name(request), origin=problem)
        raise ApiError(
            403,
            "cross_site",
            "a form posted from another site is refused: its Origin (or Referer) is not this console's",
        )
    body = await read_body(request)
    try:
        posted = parse_qsl(body.decode("utf-8"), keep_blank_values=True, errors="strict", max_num_fields=100)
    except (UnicodeError, ValueError):
        raise ApiError(400, "invalid_form", "the form is not UTF-8 form data of at most 100 fields") from None
    fields: MultiDict[str] = MultiDict()
    for name, value in posted:
        problem = text_problem(value) or text_problem(name)
        if problem is not None:
            raise ApiError(400, "invalid_request", f"{name} {problem}")
        fields.add(name, value)
    token = fields.get("csrf_token", "")
    if not token or not console.codec.csrf_valid(session, token):
        log.warning("console.csrf_refused", route=route_name(request), token_given=bool(token))
        raise ApiError(
            403,
            "csrf_failed",
            "the form's security token is missing or belongs to another session: "
            "reload the page and send the form again",
        )
    return fields


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _authority(host: str) -> tuple[str, int | None] | None:
    """``(host, port)`` of a ``Host`` header value (port ``None`` when it names none)."""
    try:
        parts = urlsplit("//" + host.strip())
        return (parts.hostname or "").lower(), parts.port
    except ValueError:
        return None


def _foreign_origin(request: web.Request) -> str | None:
    """What is wrong with the post's origin (its ``Origin``, or failing that its ``Referer``): ``None`` when
    it is this console's own, that is the scheme, host and port the browser addressed (the ``Host`` header,
    or ``X-Forwarded-Host`` from a reverse proxy). A browser sends one of them with every form post; a
    cross-site form cannot set either, nor the headers they are compared with."""
    given = request.headers.get("Origin")
    source = "origin"
    if given is None or not given.strip():
        given, source = request.headers.get("Referer"), "referer"
    if given is None or not given.strip():
        return "none"
    if given.strip().lower() == "null":
        return "null"
    try:
        parts = urlsplit(given.strip())
        scheme, host, port = parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:
        return f"malformed {source}"
    if scheme not in _DEFAULT_PORTS or not host:
        return f"malformed {source}"
    effective = port if port is not None else _DEFAULT_PORTS[scheme]
    own_scheme = "https" if behind_https(request) else "http"
    for value in (request.headers.get("X-Forwarded-Host", "").split(",")[0], request.host):
        authority = _authority(value) if value else None
        if authority is None or authority[0] != host:
            continue
        own_port = authority[1]
        if own_port is None and port is None:
            return None  # each side on its scheme's default port (a proxy may end TLS before procurd)
        if own_port is not None and own_port == effective:
            return None
        if own_port is None and effective == _DEFAULT_PORTS[own_scheme]:
            return None
    return f"another {source}"


def _login_url(request: web.Request) -> str:
    if request.method in ("GET", "HEAD") and request.path != HOME:
        return LOGIN_PATH + "?" + urlencode({"next": request.path_qs})
    return LOGIN_PATH


def error_page(request: web.Request, error: Refused) -> web.Response:
    context: dict[str, Any] = {
        "status": error.status,
        "title": STATUS_TITLES.get(error.status, "Error"),
        "code": error.code,
        "message": error.message,
        "items": error.extra.get("items", []),
    }
    response = render(request, "error.html", context, status=error.status)
    if isinstance(error, ApiError):
        response.headers.update(error.headers)
    return response


def _http_code(status: int) -> str:
    return {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(status, "bad_request")


def _http_text(error: web.HTTPException) -> str:
    if error.status == 404:
        return "there is no such page in the console"
    if error.status == 405:
        return "this page does not take that method"
    if error.status == 413:
        return "the form is too large"
    return error.reason
