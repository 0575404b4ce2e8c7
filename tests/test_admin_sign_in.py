"""Signing in to the admin listener, tried as an attacker would, over real sockets against two instances of
procurd sharing one database: wrong tokens at both doors (the console's sign-in and the JSON API's bearer
token) are throttled per client address, on every instance, with one alert and a summary line instead of a
line per try; a session signed out is over on every instance; a form posted from another origin is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from sqlalchemy import select

from console_support import ConsoleClient, Page, delivered_order
from procurd.config import Settings
from procurd.db.schema import sync_runs as sync_runs_table
from procurd.http.admin import make_admin_app
from procurd.http.testing import procurd_stack, serve
from procurd.operations import Operations
from procurd.operations.runtime import Runtime
from support import captured_log, sql_rows

TOKEN = "sign-in-admin-token-7c1e9a"
# Clients on loopback addresses of their own (Linux routes all of 127.0.0.0/8 to the loopback interface).
ATTACKER = "127.0.0.2"
OPERATOR = "127.0.0.3"
# Wrong tokens an address may send before it has to wait (procurd.core.throttle.FREE_FAILURES), and the
# one after them that starts the wait.
FREE_TRIES = 5


@dataclass
class Instance:
    runtime: Runtime
    admin_url: str


def instance_settings(database_url: str, token: str, trusted_proxies: Sequence[str]) -> Settings:
    """An admin listener on loopback (behind a trusted proxy there, when asked) with one upstream it never
    calls."""
    server: dict[str, Any] = {
        "admin_token": token,
        "callback_url": "http://127.0.0.1:9/api/v1/upstream/callback",
        "allow_private_callback_url": True,
    }
    if trusted_proxies:
        server["trusted_proxies"] = list(trusted_proxies)
    return Settings(
        database={"url": database_url},
        server=server,
        upstreams=[
            {"name": "main", "base_url": "http://127.0.0.1:9", "api_key": "k", "api_secret": "s"},
        ],
    )


@asynccontextmanager
async def instances(
    database_url: str, tokens: Sequence[str] = (TOKEN, TOKEN), trusted_proxies: Sequence[str] = ()
) -> AsyncIterator[list[Instance]]:
    """One admin listener per token, each with its own runtime, all on one database."""
    async with AsyncExitStack() as stack:
        started = []
        for number, token in enumerate(tokens):
            runtime = Runtime.build(
                instance_settings(database_url, token, trusted_proxies), instance=f"instance-{number}"
            )
            stack.push_async_callback(runtime.close)
            await runtime.start()
            url = await stack.enter_async_context(serve(make_admin_app(Operations(runtime))))
            started.append(Instance(runtime, url))
        yield started


@asynccontextmanager
async def client_at(address: str) -> AsyncIterator[aiohttp.ClientSession]:
    """HTTP from the loopback address ``address``."""
    connector = aiohttp.TCPConnector(local_addr=(address, 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


async def bearer(
    session: aiohttp.ClientSession, instance: Instance, token: str, forwarded_for: str | None = None
) -> tuple[int, dict[str, Any], str | None]:
    """``GET /api/v1/status`` with ``token`` (and an X-Forwarded-For header when given)."""
    headers = {"Authorization": f"Bearer {token}"}
    if forwarded_for is not None:
        headers["X-Forwarded-For"] = forwarded_for
    async with session.get(instance.admin_url + "/api/v1/status", headers=headers) as response:
        return response.status, await response.json(), response.headers.get("Retry-After")


async def alerts_of(instance: Instance, kind: str) -> list[tuple[str, int]]:
    _, found = await instance.runtime.database.read(lambda tx: tx.alerts.recent(1, 50, kind))
    return [(alert.subject, alert.count) for alert in found]


def log_events(stream: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


async def test_wrong_bearer_tokens_are_throttled_on_every_instance(database_url: str) -> None:
    """Wrong bearer tokens from one client address, sent to two instances in turn: the first five are
    answered 401, the sixth too and makes the address wait; every further try, the right token included, is
    answered 429 with Retry-After on either instance. The right token from other addresses is answered at
    once. The burst is one admin_auth_failures alert, the metrics count the wrong and the refused tries, and
    the log has a summary line per instance, not a line per try."""
    with captured_log("info") as log:
        async with (
            instances(database_url) as (first, second),
            client_at(ATTACKER) as attacker,
            client_at(OPERATOR) as operator,
            aiohttp.ClientSession() as local,
        ):
            answers = [await bearer(attacker, (first, second)[n % 2], f"guess-{n}") for n in range(12)]
            statuses = [status for status, _, _ in answers]
            assert statuses == [401] * (FREE_TRIES + 1) + [429] * 6, statuses
            for _, body, retry_after in answers[FREE_TRIES + 1 :]:
                assert body["error_code"] == "too_many_attempts", body
                assert retry_after is not None
                assert int(retry_after) >= 1, retry_after
                assert "try again in" in body["error_message"]
                assert TOKEN not in json.dumps(body)
            for instance in (first, second):
                right, body, retry_after = await bearer(attacker, instance, TOKEN)
                assert (right, body["error_code"]) == (429, "too_many_attempts")
                assert retry_after is not None
                assert (await bearer(operator, instance, TOKEN))[0] == 200
                assert (await bearer(local, instance, TOKEN))[0] == 200
            [(subject, count)] = await alerts_of(first, "admin_auth_failures")
            assert (subject, count) == ("admin", 1)
            async with local.get(
                first.admin_url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
            ) as response:
                metrics = await response.text()
            counted = 'procurd_admin_auth_failures_total{door="api",instance="instance-0",outcome="%s"} %s'
            assert counted % ("wrong_token", "3.0") in metrics
            assert counted % ("throttled", "4.0") in metrics
    events = log_events(log)
    assert not [event for event in events if TOKEN in json.dumps(event)]
    summaries = [event for event in events if event["event"] == "admin.auth_failures"]
    assert 1 <= len(summaries) <= 2, summaries
    assert sum(event["wrong_tokens"] for event in summaries) == FREE_TRIES + 1
    assert all(ATTACKER in event["top_addresses"] for event in summaries)
    raised = [event for event in events if event.get("kind") == "admin_auth_failures"]
    assert len(raised) == 1, raised
    per_try = [event for event in events if ATTACKER in json.dumps(event) and event not in summaries + raised]
    assert per_try == [], per_try


async def console_sign_in(client: ConsoleClient, token: str) -> Page:
    """The login page, then the token posted."""
    await client.get("/ui/login")
    return await client.post("/ui/login", {"token": token, "next": "/ui/"})


async def test_wrong_console_tokens_are_throttled_and_the_right_one_from_elsewhere_signs_in(
    database_url: str,
) -> None:
    """At the console's sign-in, wrong tokens from one address (on either instance) are answered with the
    login page and 401, then, once the address must wait, 429 with Retry-After and a message saying how long,
    its token unchecked: the right one from there is refused too. The right token from another address signs
    in at once. The count is the one the bearer door adds to: one alert for the burst."""
    async with instances(database_url) as (first, second):
        clients = [
            ConsoleClient(first.admin_url, local_address=ATTACKER),
            ConsoleClient(second.admin_url, local_address=ATTACKER),
        ]
        operator = ConsoleClient(second.admin_url, local_address=OPERATOR)
        try:
            pages = [await console_sign_in(clients[n % 2], f"guess-{n}") for n in range(10)]
            statuses = [page.status for page in pages]
            assert statuses == [401] * (FREE_TRIES + 1) + [429] * 4, statuses
            assert "That is not the admin token." in pages[0].text
            waiting = pages[-1]
            assert re.search(r"try again in \d+ seconds?", waiting.text), waiting.text[-800:]
            assert int(waiting.headers["Retry-After"]) >= 1
            refused = await console_sign_in(clients[0], TOKEN)
            assert refused.status == 429
            assert (await clients[0].get("/ui/")).location == "/ui/login"

            signed_in = await console_sign_in(operator, TOKEN)
            assert (signed_in.status, signed_in.location) == (303, "/ui/")
            assert (await operator.get("/ui/")).status == 200
            [(subject, count)] = await alerts_of(first, "admin_auth_failures")
            assert (subject, count) == ("admin", 1)
        finally:
            for client in (*clients, operator):
                await client.close()


async def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy(database_url: str) -> None:
    """Behind a trusted proxy (127.0.0.1) a client is the address X-Forwarded-For names last: wrong tokens
    from one of them make it wait, another one's right token is answered. A client that is not the proxy
    naming another address at every try is counted by its own: the seventh wrong token is answered 429
    whatever it claims, and so is its right token then."""
    async with (
        instances(database_url, tokens=(TOKEN,), trusted_proxies=("127.0.0.1",)) as (only,),
        aiohttp.ClientSession() as proxy,
        client_at(ATTACKER) as direct,
    ):
        forwarded = [await bearer(proxy, only, f"guess-{n}", "10.0.0.1, 198.51.100.7") for n in range(7)]
        assert [status for status, _, _ in forwarded] == [401] * (FREE_TRIES + 1) + [429]
        assert (await bearer(proxy, only, TOKEN, "198.51.100.7"))[0] == 429
        assert (await bearer(proxy, only, TOKEN, "198.51.100.8"))[0] == 200
        assert (await bearer(proxy, only, TOKEN))[0] == 200

        claims = [await bearer(direct, only, f"guess-{n}", f"192.0.2.{n + 1}") for n in range(7)]
        assert [status for status, _, _ in claims] == [401] * (FREE_TRIES + 1) + [429]
        assert (await bearer(direct, only, TOKEN, "192.0.2.200"))[0] == 429


def session_cookie(client: ConsoleClient) -> str:
    cookie = client.cookie("procurd_console")
    assert cookie is not None
    return cookie


async def with_cookie(
    instance: Instance,
    cookie: str,
    method: str = "GET",
    path: str = "/ui/",
    data: dict[str, str] | None = None,
) -> tuple[int, str | None]:
    """The status and Location of a request that carries ``cookie`` alone (a copy replayed by someone
    else, from a page of the console)."""
    headers = {"Cookie": f"procurd_console={cookie}", "Origin": instance.admin_url}
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, instance.admin_url + path, data=data, headers=headers, allow_redirects=False
        ) as response,
    ):
        return response.status, response.headers.get("Location")


SIGN_IN = (303, "/ui/login")


async def sync_runs(instance: Instance) -> int:
    return len(await sql_rows(instance.runtime.database, select(sync_runs_table)))


async def test_a_cookie_replayed_after_sign_out_opens_nothing_on_any_instance(database_url: str) -> None:
    """A session cookie copied before *Sign out* opens the console on both instances until then; after it,
    on either instance, every page leads to the login page, and the copy with its CSRF token starts no
    catalogue pass."""
    async with instances(database_url) as (first, second):
        person = ConsoleClient(first.admin_url)
        try:
            home = await console_sign_in(person, TOKEN)
            assert home.status == 303
            page = await person.get("/ui/sync")
            copied, csrf = session_cookie(person), page.csrf_token
            assert (await with_cookie(first, copied))[0] == 200
            assert (await with_cookie(second, copied))[0] == 200
            runs = await sync_runs(first)

            signed_out = await person.post("/ui/logout")
            assert (signed_out.status, signed_out.location) == SIGN_IN
            for instance in (first, second):
                assert await with_cookie(instance, copied) == SIGN_IN
                assert await with_cookie(instance, copied, "GET", "/ui/orders") == (
                    303,
                    "/ui/login?next=%2Fui%2Forders",
                )
                form = {"upstream": "main", "csrf_token": csrf}
                assert await with_cookie(instance, copied, "POST", "/ui/sync", form) == SIGN_IN
            assert await sync_runs(first) == runs
        finally:
            await person.close()


async def test_sign_out_everywhere_ends_every_session(database_url: str) -> None:
    """*Sign out everywhere* on one instance ends every console session, on both instances: the person's
    own, and another person's signed in elsewhere; the login page says how many ended."""
    async with instances(database_url) as (first, second):
        here, there = ConsoleClient(first.admin_url), ConsoleClient(second.admin_url)
        try:
            await console_sign_in(here, TOKEN)
            await console_sign_in(there, TOKEN)
            home = await here.get("/ui/")
            assert "Sign out everywhere" in home.text
            kept = session_cookie(there)
            assert (await with_cookie(second, kept))[0] == 200
            ended = await here.post("/ui/logout/everywhere", follow=True)
            assert ended.status == 200
            assert ended.flash == ("ok", "Signed out everywhere: 2 sessions ended.")
            assert await with_cookie(second, kept) == SIGN_IN
            assert await with_cookie(first, kept) == SIGN_IN
            assert (await there.get("/ui/")).location == "/ui/login"
            assert (await here.get("/ui/")).location == "/ui/login"
        finally:
            await here.close()
            await there.close()


async def test_changing_the_admin_token_ends_every_session(database_url: str) -> None:
    """An instance started with a new admin token on the same database does not take a session signed in
    with the old one."""
    async with instances(database_url, tokens=(TOKEN, TOKEN + "-new")) as (old, new):
        person = ConsoleClient(old.admin_url)
        try:
            await console_sign_in(person, TOKEN)
            cookie = session_cookie(person)
            assert (await with_cookie(old, cookie))[0] == 200
            assert await with_cookie(new, cookie) == SIGN_IN
        finally:
            await person.close()


@pytest.fixture
async def signed_in(database_url: str) -> AsyncIterator[tuple[ConsoleClient, str, str]]:
    """A console signed in in front of the sandbox, with a delivered order; the client, its admin URL and
    the goods of the order."""
    async with procurd_stack(database_url, admin_token=TOKEN, upstreams=("main",)) as stack:
        product = stack.sandbox.state.add_product(price="9.90")
        await stack.sync("main")
        view = await delivered_order(stack, "OR-1", stack.sandbox.state.product(product).skus[0].id)
        goods = view["procurements"][0]["fulfillment"]["payload"]
        client = ConsoleClient(stack.admin_url)
        try:
            await client.get("/ui/login")
            await client.post("/ui/login", {"token": TOKEN})
            await client.get("/ui/orders/OR-1")
            yield client, stack.admin_url, goods
        finally:
            await client.close()


async def test_a_post_whose_origin_is_not_the_consoles_is_refused(
    signed_in: tuple[ConsoleClient, str, str],
) -> None:
    """With the session's cookie and its CSRF token, and no Sec-Fetch-Site (a browser that omits it), a
    reveal whose Origin is another site's, "null", or absent with another site's Referer, or that names no
    origin at all, is refused 403 without the goods; from the console's own Origin, or failing that its own
    Referer, the goods are shown. The provider's pages are guarded the same way."""
    client, admin_url, goods = signed_in
    path = "/ui/orders/OR-1/reveal"
    page = await client.get("/ui/orders/OR-1")
    procurement_id = re.search(r'name="procurement_id" value="(\d+)"', page.text)
    assert procurement_id is not None
    form = {"procurement_id": procurement_id.group(1)}
    refusals = {
        "another origin": {"Origin": "https://evil.example"},
        "another port": {"Origin": admin_url.rsplit(":", 1)[0] + ":1"},
        "null origin": {"Origin": "null"},
        "another referer": {"Origin": "", "Referer": "https://evil.example/prize"},
        "no origin": {"Origin": ""},
    }
    for case, headers in refusals.items():
        refused = await client.post(path, form, csrf=page.csrf_token, headers=headers)
        assert (refused.status, refused.error_code) == (403, "cross_site"), case
        assert goods not in refused.text, case
    shown = await client.post(path, form, csrf=page.csrf_token)
    assert shown.status == 200
    assert goods in shown.text
    by_referer = await client.post(
        path, form, csrf=page.csrf_token, headers={"Origin": "", "Referer": admin_url + "/ui/orders/OR-1"}
    )
    assert (by_referer.status, goods in by_referer.text) == (200, True)
    provider = await client.post(
        "/ui/provider/orders/1/reveal", {}, csrf=page.csrf_token, headers={"Origin": "https://evil.example"}
    )
    assert (provider.status, provider.error_code) == (403, "cross_site")
    own = await client.post("/ui/provider/orders/1/reveal", {}, csrf=page.csrf_token)
    assert (own.status, own.error_code) == (404, "provider_disabled")
