"""What the console's middleware and views share: the console's state, request keys, rendering, redirects,
form fields."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from aiohttp import web

from procurd.http.console.session import (
    FLASH_COOKIE,
    SESSION_COOKIE,
    Flash,
    Session,
    SessionBook,
    SessionCodec,
)
from procurd.http.errors import ApiError
from procurd.operations import Operations
from procurd.operations.runtime import Runtime

PREFIX = "/ui"
HOME = "/ui/"
LOGIN_PATH = "/ui/login"
STATIC_PREFIX = "/ui/static/"
COOKIE_PATH = "/ui"
MAX_FORM_FIELD_CHARS = 8000
_SAFE_NEXT = re.compile(r"^/ui/[A-Za-z0-9/_.:~%?&=+,;@-]*$")


@dataclass
class Console:
    operations: Operations
    codec: SessionCodec
    login_required: bool
    admin_token: str
    sessions: SessionBook  # the signed-in ones, in the database

    @property
    def runtime(self) -> Runtime:
        return self.operations.runtime


CONSOLE = web.AppKey("procurd.console", Console)
SESSION = web.RequestKey("procurd.console.session", Session)
FLASH = web.RequestKey("procurd.console.flash", Flash)  # set when a flash cookie came with the request
FORM = web.RequestKey("procurd.console.form", Mapping[str, str])


def is_console_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def behind_https(request: web.Request) -> bool:
    return request.secure or request.headers.get("X-Forwarded-Proto", "").strip().lower() == "https"


def redirect(location: str, *, status: int = 303) -> web.Response:
    return web.Response(status=status, headers={"Location": location})


def redirect_with(request: web.Request, location: str, flash: Flash) -> web.Response:
    """A 303 to ``location`` that shows ``flash`` once there (the post/redirect/get of every action)."""
    response = redirect(location)
    response.set_cookie(
        FLASH_COOKIE,
        request.app[CONSOLE].codec.encode_flash(flash),
        path=COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=behind_https(request),
    )
    return response


def set_session(request: web.Request, response: web.StreamResponse, session: Session) -> None:
    codec = request.app[CONSOLE].codec
    response.set_cookie(
        SESSION_COOKIE,
        codec.encode(session),
        max_age=max(0, int(session.expires_at - codec.clock())),
        path=COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=behind_https(request),
    )


def end_session(response: web.StreamResponse) -> None:
    response.del_cookie(SESSION_COOKIE, path=COOKIE_PATH)


def safe_next(value: str | None, default: str = HOME) -> str:
    """A place to go back to after a form: a path of the console on this listener, never another site."""
    if not value or not _SAFE_NEXT.fullmatch(value) or "//" in value:
        return default
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return default
    return value


def with_query(request: web.Request, **changes: Any) -> str:
    """This page's path and query with ``changes`` (``None`` or "" removes a parameter)."""
    query = dict(request.query)
    for key, value in changes.items():
        if value is None or value == "":
            query.pop(key, None)
        else:
            query[key] = str(value)
    encoded = urlencode(query)
    return request.path + ("?" + encoded if encoded else "")


def form_text(request: web.Request, name: str, *, max_chars: int = MAX_FORM_FIELD_CHARS) -> str:
    """A field of the posted form ("" when absent); 400 when it is far too long to be meant."""
    value = request[FORM].get(name, "")
    if len(value) > max_chars:
        raise ApiError(400, "invalid_request", f"{name} is longer than {max_chars} characters")
    return value
