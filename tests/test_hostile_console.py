"""Hostile input against the web console: hypothesis over real sockets, with a signed-in session.

Random paths under ``/ui``, methods, queries and form bodies (hostile text, invalid UTF-8, the session's
CSRF token, none, another session's or garbage; the console's own Origin, another site's, "null" or none) go
to the admin listener of the hostile target (orders in every state, see ``test_hostile_callbacks.py``).
Whatever arrives: never a 5xx and never a traceback; every answer carries the Content-Security-Policy; a
request without the session's CSRF token and the console's own Origin, or that is not a form post, changes
nothing; no secret and no delivered goods reach an answer (but a requested reveal) or a
log line. The same profile applies (``PROCURD_HOSTILE_EXAMPLES`` for a longer hunt).
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import quote

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from yarl import URL

from console_support import CSP, ConsoleClient
from test_hostile_callbacks import (
    ADMIN_TOKEN,
    HOSTILE_TEXT,
    PAYLOAD_MARK,
    Reply,
    Target,
    hostile_settings,
    hostile_target,
    request_line_too_long,
)


@dataclass
class Console:
    target: Target
    client: ConsoleClient
    cookie: str
    csrf_token: str
    foreign_token: str
    sign_ins: int = 0

    async def sign_in_again(self) -> None:
        """A new session, after an example signed this one out (from an address of its own: the examples'
        wrong tokens may have throttled theirs)."""
        self.sign_ins += 1
        await self.client.get("/ui/login")
        forwarded = {"X-Forwarded-For": f"192.0.2.{self.sign_ins % 250 + 1}"}
        page = await self.client.post("/ui/login", {"token": ADMIN_TOKEN}, follow=True, headers=forwarded)
        assert page.status == 200, page.status
        cookie = self.client.cookie("procurd_console")
        assert cookie is not None
        self.cookie, self.csrf_token = cookie, page.csrf_token
        self.target.logs.new_lines()


@pytest.fixture
async def console(database_url: str) -> AsyncIterator[Console]:
    """The hostile target with one signed-in console session (and another session's CSRF token), behind a
    trusted proxy on loopback (X-Forwarded-For names the client)."""
    async with hostile_target(database_url, trusted_proxies=["127.0.0.1"]) as target:
        own, other = ConsoleClient(target.admin_url), ConsoleClient(target.admin_url)
        try:
            page = await own.login(ADMIN_TOKEN)
            foreign = await other.login(ADMIN_TOKEN)
            cookie = own.cookie("procurd_console")
            assert cookie is not None
            target.logs.new_lines()
            yield Console(target, own, cookie, page.csrf_token, foreign.csrf_token)
        finally:
            await own.close()
            await other.close()


SEGMENTS = st.one_of(
    st.sampled_from(["HC-D1", "HC-S1", "HC-X1", "HC-Q1", "NOPE", "1", "2", "3", "0", "-1", str(2**64), "main",
                     "second", "%00", "%FF", "..", "%2e%2e", "%2F", "x" * 300, "static", "console.css"]),
    HOSTILE_TEXT.map(lambda text: quote(text.encode("utf-8", "surrogatepass"), safe="")),
)  # fmt: skip
TEMPLATES = (
    "/ui/", "/ui", "/ui/{}", "/ui/login", "/ui/logout", "/ui/logout/everywhere", "/ui/exceptions",
    "/ui/exceptions/retry",
    "/ui/exceptions/{}/retry", "/ui/exceptions/{}/resolve", "/ui/orders", "/ui/orders/{}",
    "/ui/orders/{}/reveal", "/ui/orders/{}/cancel", "/ui/catalog", "/ui/catalog/holds/{}/{}/release",
    "/ui/sync", "/ui/alerts", "/ui/offers", "/ui/reconcile", "/ui/static/{}", "/ui/{}/{}",
)  # fmt: skip
QUERY_NAMES = st.sampled_from(["q", "page", "page_size", "upstream", "reason", "status", "next", "x"])
QUERY_VALUES = st.one_of(
    st.sampled_from(["1", "0", "-1", "100", "101", str(2**64), "", "main", "price_above_limit", "delivered",
                     "HC-", "%", "_", "/ui/orders", "//evil.example", "x" * 200]),
    HOSTILE_TEXT,
)  # fmt: skip
FIELD_NAMES = st.sampled_from(["note", "reason", "upstream", "limit", "procurement_id", "next", "token", "q"])
FIELD_VALUES = st.one_of(
    st.sampled_from(["", "checked", "1", "4", "0", "999", "main", "price_above_limit", "/ui/", "n" * 4001,
                     ADMIN_TOKEN + "x"]),
    HOSTILE_TEXT,
)  # fmt: skip
CSRF_MODES = st.sampled_from(["own", "own", "none", "foreign", "garbage"])
ORIGINS = st.sampled_from(["own", "own", "own", "https://evil.example", "null", "none"])


def encode(text: str) -> str:
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


@st.composite
def console_paths(draw: st.DrawFn) -> str:
    template = draw(st.sampled_from(TEMPLATES))
    path = template.format(*(draw(SEGMENTS) for _ in range(template.count("{}"))))
    query = draw(st.lists(st.tuples(QUERY_NAMES, QUERY_VALUES), max_size=3))
    if query:
        path += "?" + "&".join(f"{name}={encode(value)}" for name, value in query)
    return path


@st.composite
def form_bodies(draw: st.DrawFn, csrf: str) -> bytes:
    fields = draw(st.lists(st.tuples(FIELD_NAMES, FIELD_VALUES), max_size=4))
    pairs = [f"{name}={encode(value)}" for name, value in fields]
    if csrf:
        pairs.insert(draw(st.integers(0, len(pairs))), f"csrf_token={encode(csrf)}")
    return "&".join(pairs).encode()


async def send(
    console: Console, method: str, path: str, body: bytes | None, form: bool, origin: str = "own"
) -> tuple[Reply, str]:
    headers = {"Cookie": f"procurd_console={console.cookie}"}
    if form:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    if origin != "none":
        headers["Origin"] = console.target.admin_url if origin == "own" else origin
    target = console.target
    data = io.BytesIO(body) if body and len(body) > 64 * 1024 else body  # aiohttp wants large bodies streamed
    async with target.session.request(
        method, URL(target.admin_url + path, encoded=True), data=data, headers=headers, allow_redirects=False
    ) as response:
        text = await response.text(errors="replace")
        reply = Reply(response.status, text, response.headers.get("Content-Type", ""), None)
        return reply, response.headers.get("Content-Security-Policy", "")


@hostile_settings()
@given(data=st.data())
async def test_any_console_request(console: Console, data: st.DataObject) -> None:
    """Any method, path, query and form on the console answers below 500 with the CSP and no traceback;
    without the session's CSRF token (or as anything but a form post) nothing changes; no secret or goods
    leak but through a requested reveal."""
    target = console.target
    before = await target.rows()
    method = data.draw(st.sampled_from(["GET", "POST", "POST", "HEAD", "PUT", "DELETE"]), label="method")
    path = data.draw(console_paths(), label="path")
    # The HTTP parser refuses an over-long request line before procurd sees it (test_hostile_admin.py).
    assume(not request_line_too_long(method, path))
    mode = data.draw(CSRF_MODES, label="csrf") if method == "POST" else "none"
    token = {"own": console.csrf_token, "foreign": console.foreign_token, "garbage": "AAAA", "none": ""}[mode]
    form = method == "POST" and data.draw(st.booleans(), label="as form")
    body = data.draw(form_bodies(token), label="body") if method in ("POST", "PUT") else None
    if body is not None and data.draw(st.booleans(), label="invalid utf-8"):
        body += b"&note=%FF%FE\xff"
    origin = data.draw(ORIGINS, label="origin") if method == "POST" else "none"
    reply, policy = await send(console, method, path, body, form, origin)

    assert reply.status < 500, (method, path[:200], reply.status, reply.text[-400:])
    assert "Traceback" not in reply.text
    assert policy == CSP, (method, path[:200], reply.status)
    if method != "HEAD" and reply.status != 303 and not path.startswith("/ui/static/"):
        assert reply.content_type.startswith("text/html"), (path[:200], reply.status, reply.content_type)
    acted = method == "POST" and form and mode == "own" and origin == "own" and reply.status == 303
    if not acted:
        assert await target.rows() == before, (method, path[:200], mode, origin, reply.status)
    revealed = (
        method == "POST" and mode == "own" and origin == "own" and path.split("?")[0].endswith("/reveal")
    )
    target.assert_quiet(reply if not (revealed and reply.status == 200) else None)
    if not revealed:
        assert PAYLOAD_MARK not in reply.text
    if acted and path.split("?")[0] in ("/ui/logout", "/ui/logout/everywhere"):
        await console.sign_in_again()
