"""Wiring the console into the admin application."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from aiohttp import web

from procurd.http.console.context import CONSOLE, STATIC_PREFIX, Console
from procurd.http.console.render import setup_templates
from procurd.http.console.session import SessionBook, SessionCodec
from procurd.http.console.views import add_routes
from procurd.operations import Operations


def setup_console(app: web.Application, operations: Operations) -> None:
    """Add the console's routes, templates and static files to ``app``, whose middlewares must include
    :func:`~procurd.http.console.middleware.console_middleware` inside the bearer check."""
    settings = operations.settings
    token = settings.server.admin_token.get_secret_value()
    codec = SessionCodec(token, settings.server.console_session_seconds)
    sessions = SessionBook(operations.sign_in)
    app[CONSOLE] = Console(
        operations, codec, login_required=bool(token), admin_token=token, sessions=sessions
    )
    setup_templates(app)
    add_routes(app.router)
    static = Path(str(files("procurd.http.console").joinpath("static")))
    app.router.add_static(STATIC_PREFIX, static)
