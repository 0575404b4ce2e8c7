"""Helpers for the web console's tests: a cookie-keeping HTTP client that reads forms the way a browser
would, and ways to make orders, exceptions and deliveries through the sandbox and the JSON API."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import aiohttp
from multidict import CIMultiDict
from sqlalchemy import update

from procurd.core.records import Instance
from procurd.db.database import Database
from procurd.db.schema import instances
from procurd.db.stores import Tx
from procurd.db.types import utcnow
from procurd.http.testing import Stack

ADMIN_TOKEN = "console-admin-token-5e1f"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
_CSRF = re.compile(r'name="csrf_token" value="([^"]*)"')
_FLASH = re.compile(r'<p class="flash flash-(ok|error)" role="status">(.*?)</p>', re.S)


@dataclass
class Page:
    status: int
    text: str
    headers: Mapping[str, str] = field(repr=False)

    @property
    def location(self) -> str:
        return self.headers.get("Location", "")

    @property
    def csrf_token(self) -> str:
        found = _CSRF.search(self.text)
        assert found is not None, "the page has no form with a CSRF token"
        return found.group(1)

    @property
    def flash(self) -> tuple[str, str] | None:
        found = _FLASH.search(self.text)
        return None if found is None else (found.group(1), html.unescape(found.group(2)).strip())

    @property
    def error_code(self) -> str | None:
        found = re.search(r"HTTP \d+ · <code>([a-z_]+)</code>", self.text)
        return None if found is None else found.group(1)


class ConsoleClient:
    """A person at the console: cookies kept, redirects followed only when asked, forms posted with the
    CSRF token of the last page seen."""

    def __init__(self, admin_url: str, *, local_address: str | None = None) -> None:
        self.base = admin_url
        # From another loopback address (127.0.0.2 ...) when given: a client of its own to the listener.
        connector = aiohttp.TCPConnector(local_addr=(local_address, 0)) if local_address else None
        # aiohttp keeps no cookies of IP-address hosts unless told to.
        self.session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True), connector=connector)
        self.last: Page | None = None

    async def close(self) -> None:
        await self.session.close()

    async def get(self, path: str, *, follow: bool = False, headers: Mapping[str, str] | None = None) -> Page:
        return await self._send("GET", path, None, follow, headers)

    async def post(
        self,
        path: str,
        fields: Mapping[str, str] | None = None,
        *,
        csrf: str | None = None,
        follow: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> Page:
        """POST a form as a browser does, with the console's own ``Origin`` (``headers`` may replace it);
        ``csrf`` defaults to the token of the last page seen ("" sends none)."""
        data = dict(fields or {})
        token = self.last.csrf_token if csrf is None and self.last is not None else csrf
        if token:
            data["csrf_token"] = token
        return await self._send("POST", path, data, follow, {"Origin": self.base, **(headers or {})})

    async def _send(
        self,
        method: str,
        path: str,
        data: dict[str, str] | None,
        follow: bool,
        headers: Mapping[str, str] | None,
    ) -> Page:
        async with self.session.request(
            method, self.base + path, data=data, allow_redirects=follow, headers=headers
        ) as response:
            page = Page(response.status, await response.text(), CIMultiDict(response.headers))
        if "csrf_token" in page.text:
            self.last = page
        return page

    async def login(self, token: str = ADMIN_TOKEN) -> Page:
        await self.get("/ui/login")
        return await self.post("/ui/login", {"token": token, "next": "/ui/"}, follow=True)

    def cookie(self, name: str) -> str | None:
        for cookie in self.session.cookie_jar:
            if cookie.key == name:
                return cookie.value
        return None


async def order(
    stack: Stack, order_no: str, sku_id: int, upstream: str = "main", **item: Any
) -> dict[str, Any]:
    """Accept an order through the JSON API."""
    body = {"order_no": order_no, "items": [{"upstream": upstream, "sku_id": sku_id, "quantity": 1, **item}]}
    answer = await stack.admin("POST", "/api/v1/orders", body)
    assert answer.status in (200, 202), answer.body
    view: dict[str, Any] = answer.body["order"]
    return view


async def delivered_order(stack: Stack, order_no: str, sku_id: int) -> dict[str, Any]:
    """An order bought and delivered by the sandbox (callback received)."""
    await order(stack, order_no, sku_id)
    assert await stack.submit_due()
    await stack.sandbox.wait_callbacks_idle()
    view = await stack.order(order_no)
    assert view["status"] == "delivered", view
    return view


async def sandbox_control(stack: Stack, method: str, path: str, body: Any = None) -> Any:
    """Call the sandbox's control API (``/_sandbox...``) over HTTP."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    answer = await stack.request(method, stack.sandbox.base_url + "/_sandbox" + path, data, headers)
    assert answer.status == 200, answer.text
    return answer.body


# The instances :func:`record_instances` writes, and the state each is in.
INSTANCE_STATES = {
    "alive:1": "alive",
    "stopped:2": "stopped",
    "down:3": "down",
    "stale:4": "down",
    "old:5": "stopped",
    "old:6": "stopped",
    "old:7": "stopped",
}
STOPPED_LONG_AGO = ("old:5", "old:6", "old:7")


async def record_instances(database: Database) -> None:
    """Daemon instances as a cluster leaves them: one beating now, one stopped cleanly two hours ago, one
    found down (a SIGKILL), one whose heartbeat went stale unnoticed, and three stopped days ago (ordinary
    restarts of last week)."""
    now = utcnow()

    def write(tx: Tx) -> None:
        for index, instance_id in enumerate(INSTANCE_STATES):
            host, pid = instance_id.split(":")
            beat = now if instance_id == "alive:1" else now - timedelta(minutes=10 + index)
            started = beat - timedelta(days=5)
            tx.instances.register(
                Instance(
                    id=instance_id,
                    host=host,
                    pid=int(pid),
                    version="1.0.0",
                    started_at=started,
                    heartbeat_at=beat,
                )
            )
        tx.instances.stopped("stopped:2", now - timedelta(hours=2))
        for days, instance_id in enumerate(STOPPED_LONG_AGO, start=2):
            tx.instances.stopped(instance_id, now - timedelta(days=days))
        tx.instances.mark_down(now - timedelta(minutes=5), now, also=[])

    await database.write(write)
    # mark_down found both stale ones; keep one unnoticed (no down_at) as a cluster without a live
    # instance would leave it.
    await database.write(
        lambda tx: tx.connection.execute(
            update(instances).where(instances.c.id == "stale:4").values(down_at=None)
        )
    )
