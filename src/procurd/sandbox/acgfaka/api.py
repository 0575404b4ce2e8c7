"""The sandbox shop's ``/shared/...`` API as acg-faka's kernel serves it.

A path is routed as ``/shared/<controller>/<method>`` (or ``index.php?s=``); an unknown one gets the shop's
HTML "page not found" with HTTP 200, before authentication (from 3.0.0; older kernels checked a known
controller's firewall and signature first). Only a form or multipart POST has fields. Then the firewall,
the member by ``app_id`` (商户ID不存在), the signature over the received fields (密钥错误), the endpoint.
Successes and refusals are JSON with HTTP 200; a PHP error is the HTML page.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import BodyPartReader, web

from procurd.protocol.acgfaka.signing import SigningError, sign
from procurd.sandbox.acgfaka import endpoints
from procurd.sandbox.acgfaka.faults import BEFORE_KINDS
from procurd.sandbox.acgfaka.php import (
    Post,
    flat_values,
    form_pairs,
    loose_equal,
    parse_post,
    php_json,
    sanitised,
    sanitised_post,
)
from procurd.sandbox.acgfaka.shop import NEW_KERNEL_FROM, RAW_SIGNATURE_FROM, Member, ShopCrash, ShopRefusal

if TYPE_CHECKING:
    from procurd.sandbox.acgfaka.server import AcgFakaSandbox

log = structlog.get_logger("procurd.sandbox")

JSON_TYPE = "application/json;charset=utf-8"
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "SAMEORIGIN",
    "Referrer-Policy": "strict-origin-when-cross-origin",
    "Content-Security-Policy": "frame-ancestors 'self'",
}
NOT_FOUND_PAGE = (
    '<!DOCTYPE html><html lang="zh-CN"><head><meta charset="utf-8"><title>页面没有找到</title></head>'
    '<body><div class="error"><h1>404</h1><p>页面没有找到</p></div></body></html>'
)
FIREWALL_TEXT = "The current session is not secure. Please refresh the web page and try again."
LEGACY_FIREWALL_TEXT = "WAF检测到非法请求"
_FIREWALL_RULES = tuple(
    re.compile(rule, re.IGNORECASE | re.DOTALL)
    for rule in (
        r"select\b.+\bfrom\b",
        r"union\b.+\bselect\b",
        r"<\s*(script|iframe|object|embed|img|svg)\b",
        r"\bon(error|load|click|mouseover)\s*=",
        r"\b(php|data|file|phar|zip|glob|expect):/",
        r"\b(concat|sleep|benchmark|extractvalue|updatexml|load_file)\s*\(",
    )
)
_LEGACY_FIREWALL_RULES = (re.compile(r"=.*['\"$(;`]|['\"$(;`].*="), re.compile(r"\$.*[#{]|\{\$smarty\."))
_LEGACY_AGENTS = re.compile(r"parser|libwww|harvest|audit|sqlmap", re.IGNORECASE)

Handler = Callable[[endpoints.Call], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    controller: tuple[str, ...]
    method: str  # as the path gave it


def route_of(request: web.Request) -> Route | None:
    """The controller and method a path names (``/shared/commodity/items`` or ``index.php?s=...``)."""
    path = request.path
    target = request.query.get("s", "") if path in ("/", "/index.php") else path
    segments = [segment for segment in target.strip("/").split("/") if segment != ""]
    if len(segments) < 2:
        return None
    method = segments[-1].split(".", 1)[0]
    controller = tuple(segment[:1].upper() + segment[1:] for segment in segments[:-1])
    return Route(controller, method)


def html_page(message: str | None = None) -> web.Response:
    """The shop's HTML page: "page not found", or with DEBUG on the error itself."""
    body = NOT_FOUND_PAGE if message is None else f"<html><body><b>Error</b>: {message}</body></html>"
    return web.Response(text=body, content_type="text/html", charset="utf-8", headers=SECURITY_HEADERS)


def json_answer(data: Any) -> web.Response:
    return web.Response(body=php_json(data), headers={"Content-Type": JSON_TYPE, **SECURITY_HEADERS})


def refusal(message: str) -> web.Response:
    return json_answer({"code": 0, "msg": message})


def abort_connection(request: web.Request) -> web.Response:
    """Close the connection without an answer (the returned response is never written)."""
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=500)


async def read_post(request: web.Request) -> Post:
    """``$_POST``: the fields of a form or multipart POST; nothing for any other request."""
    if request.method != "POST":
        return {}
    if request.content_type == "application/x-www-form-urlencoded":
        return parse_post(form_pairs(await request.read()))
    if request.content_type == "multipart/form-data":
        pairs = []
        reader = await request.multipart()
        async for part in reader:
            if isinstance(part, BodyPartReader) and part.name is not None and part.filename is None:
                pairs.append((part.name, await part.text()))
        return parse_post(pairs)
    return {}


class ShopApi:
    """Routes, checks and answers requests for one sandbox shop."""

    def __init__(self, sandbox: AcgFakaSandbox) -> None:
        self.sandbox = sandbox
        self.shop = sandbox.shop
        self.faults = sandbox.faults

    def _firewall(self, request: web.Request, post: Post) -> str | None:
        legacy = not self.shop.has(NEW_KERNEL_FROM)
        values = [*request.query.values(), *(v for value in post.values() for v in flat_values(value))]
        for value in (sanitised(v) for v in values):
            if any(rule.search(value) for rule in _FIREWALL_RULES):
                return LEGACY_FIREWALL_TEXT if legacy else FIREWALL_TEXT
            if legacy and any(rule.search(value) for rule in _LEGACY_FIREWALL_RULES):
                return LEGACY_FIREWALL_TEXT
        if legacy and _LEGACY_AGENTS.search(request.headers.get("User-Agent", "")):
            return LEGACY_FIREWALL_TEXT
        return None

    def _signed(self, member: Member, post: Post) -> bool:
        provided = post.get("sign")
        fields = {key: value for key, value in post.items() if key != "sign"}
        if not self.shop.has(RAW_SIGNATURE_FROM) and self.shop.has(NEW_KERNEL_FROM):
            fields = sanitised_post(fields)  # 3.0.0 - 3.1.0 signed what their input filter made of it
        try:
            expected = sign(fields, member.app_key)
        except SigningError:
            return False
        return isinstance(provided, str) and loose_equal(provided, expected)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        route = route_of(request)
        handler = endpoints.handler_for(self.shop, route.controller, route.method) if route else None
        known_class = route is not None and endpoints.known_controller(route.controller)
        if handler is None and (self.shop.has(NEW_KERNEL_FROM) or not known_class):
            self.sandbox.record(None, None, None)
            return html_page()
        if handler is endpoints.face:
            return web.Response(text="", content_type="text/plain")
        post = await read_post(request)
        blocked = self._firewall(request, post)
        if blocked is not None:
            self.sandbox.record(route.method if route else None, None, False)
            return refusal(blocked)
        member = self.shop.member(post.get("app_id"))
        if member is None:
            self.sandbox.record(route.method if route else None, None, False)
            return refusal("商户ID不存在")
        if not self._signed(member, post):
            self.sandbox.record(route.method if route else None, member.id, False)
            return refusal("密钥错误")
        if handler is None:
            return html_page()
        name = endpoints.ENDPOINT_NAMES[handler]
        self.sandbox.record(name, member.id, True)
        return await self._answer(
            request, name, handler, endpoints.Call(self.shop, self.faults, member, post, request)
        )

    async def _answer(
        self, request: web.Request, name: str, handler: Handler, call: endpoints.Call
    ) -> web.Response:
        fault = self.faults.take(name, BEFORE_KINDS)
        if fault is not None:
            if fault.kind == "crash":
                return html_page("injected failure" if self.shop.config.debug else None)
            if fault.kind == "redirect":
                return web.Response(status=302, headers={"Location": fault.message, **SECURITY_HEADERS})
            return refusal(fault.message)
        try:
            answer = await handler(call)
        except ShopRefusal as refused:
            return refusal(refused.message)
        except ShopCrash as crash:
            log.debug("sandbox.acgfaka_crash", endpoint=name, error=str(crash))
            return html_page(str(crash) if self.shop.config.debug else None)
        if isinstance(answer, endpoints.AfterCommit):
            return await self._after_commit(request, answer)
        return json_answer(answer)

    async def _after_commit(self, request: web.Request, answer: endpoints.AfterCommit) -> web.Response:
        """A trade committed: answer it, unless a knob loses or spoils the answer."""
        if answer.fault is None:
            return json_answer(answer.body)
        if answer.fault.kind == "lost_answer":
            return abort_connection(request)
        if answer.fault.kind == "hang_after":
            await self.sandbox.wait_closing(None)
            return abort_connection(request)
        if answer.fault.html:
            return html_page()
        return refusal(answer.fault.message)
