"""The console's templates and the filters they use: one time zone (UTC) with "n minutes ago", multilingual
titles, amounts, plurals.

Autoescaping is on for every template: upstream text (titles, error messages) is always shown as text.
Jinja2 is imported when the first page is rendered: a daemon whose console nobody opens never loads it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from procurd import __version__
from procurd.core.orders import STATUS_MEANINGS
from procurd.core.times import iso_z, plural, utc_text, worded_ago, worded_duration
from procurd.http.console.context import CONSOLE, FLASH, SESSION, with_query

if TYPE_CHECKING:
    import jinja2

TITLE_LANGUAGES = ("en-US", "en", "zh-CN", "zh-TW")


def duration(seconds: float | None) -> str:
    """A length of time in its largest two units: ``3 minutes 20 seconds``, ``2 days 1 hour``."""
    return "—" if seconds is None else worded_duration(seconds)


def ago(value: Any, now: datetime | None = None) -> str:
    """``just now``, ``5 minutes ago``, ``1 hour ago``, ``in 3 minutes``; "" for no time."""
    return worded_ago(value, now) or ""


def utc(value: Any) -> str:
    """``2026-11-23 15:46:02 UTC``; "" for no time."""
    text = utc_text(value)
    return f"{text} UTC" if text is not None else ""


def iso(value: Any) -> str:
    return iso_z(value) or ""


def title_text(value: Any) -> str:
    """A multilingual title (``{"zh-CN": ..., "en-US": ...}``) as one line: the English text first, then
    the others that differ from it."""
    if isinstance(value, str):
        return value
    if not isinstance(value, Mapping) or not value:
        return "" if value is None else str(value)
    ordered = [value[key] for key in TITLE_LANGUAGES if key in value]
    ordered += [text for key, text in sorted(value.items()) if key not in TITLE_LANGUAGES]
    distinct: list[str] = []
    for text in ordered:
        if isinstance(text, str) and text and text not in distinct:
            distinct.append(text)
    return " / ".join(distinct)


def pretty_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)


def compact_json(value: Any) -> str:
    if not value:
        return ""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "), default=str)


def page_context(request: web.Request) -> dict[str, Any]:
    """What every page's layout needs: the session's CSRF token, sign-in state, the flash message."""
    console = request.app[CONSOLE]
    session = request.get(SESSION)
    return {
        "csrf_token": console.codec.csrf_token(session) if session is not None else "",
        "signed_in": session is not None and session.authenticated,
        "login_required": console.login_required,
        "provider_enabled": console.operations.settings.provider.enabled,
        "flash": request.get(FLASH),
        "path": request.path,
        "version": __version__,
        "here": with_query(request),
        "page_link": lambda page: with_query(request, page=page),
    }


class Templates:
    """The console's templates, loaded with their environment on first use."""

    @cached_property
    def environment(self) -> jinja2.Environment:
        import jinja2

        environment = jinja2.Environment(
            loader=jinja2.PackageLoader("procurd.http.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        environment.filters.update(
            ago=ago, utc=utc, iso=iso, title=title_text, duration=duration, plural=plural,
            pretty_json=pretty_json, compact_json=compact_json,
        )  # fmt: skip
        environment.globals["status_meanings"] = STATUS_MEANINGS
        return environment

    def render(self, template: str, context: Mapping[str, Any]) -> str:
        return self.environment.get_template(template).render(context)


TEMPLATES: Final = web.AppKey("console_templates", Templates)


def render(
    request: web.Request, template: str, context: Mapping[str, Any], *, status: int = 200
) -> web.Response:
    page = request.app[TEMPLATES].render(template, {**page_context(request), **context})
    return web.Response(text=page, status=status, content_type="text/html", charset="utf-8")


def setup_templates(app: web.Application) -> None:
    app[TEMPLATES] = Templates()
