"""The provider's rate limit on its signed API: ``[provider] rate_limit_per_minute`` verified requests a
minute per account, then the account refused for ``rate_limit_block_seconds`` with the real sites' HTTP 200
``{"ok": false, "status_code": 429, ...}`` and ``Retry-After``; requests that fail authentication are limited
per client address instead, so a stranger who knows an account's key cannot spend its budget.

Every client here is on loopback; the strangers connect from other loopback addresses (127.0.0.2,
127.0.0.3: Linux routes all of 127.0.0.0/8 to ``lo``), so "another address" is a real one, as the
provider's listener sees it.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest

from procurd.daemon import Daemon
from procurd.protocol.dujiao.ratelimit import RateLimiter
from procurd.protocol.dujiao.signing import HeaderNames
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import ApiResponse, ManualClock, SignedClient
from provider_support import ProviderSite, add_account, provider_settings
from support import running_daemon, wait_until
from test_hostile_callbacks import check_slow_body_is_refused

LIMIT = 10


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig(products=2, skus_per_product=1, manual_ratio=0)) as sandbox:
        yield sandbox


@asynccontextmanager
async def limited_provider(
    database_url: str, sandbox: Sandbox, block_seconds: float
) -> AsyncIterator[Daemon]:
    """A provider daemon allowing ``LIMIT`` verified requests a minute per account, blocking for
    ``block_seconds``."""
    settings = provider_settings(
        database_url,
        ("main", sandbox),
        provider={"rate_limit_per_minute": LIMIT, "rate_limit_block_seconds": block_seconds},
    )
    async with running_daemon(settings) as daemon:
        yield daemon


class ClientFrom(SignedClient):
    """An account's signed client whose connections leave from ``source`` (a loopback address)."""

    def __init__(self, site: ProviderSite, source: str = "127.0.0.1") -> None:
        super().__init__(site.base_url, site.api_key, site.api_secret, site.header_prefix)
        self.source = source

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(local_addr=(self.source, 0))
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session


def limited(response: ApiResponse) -> bool:
    """The real sites' answer to a caller over its limit: HTTP 200, their envelope, and ``Retry-After``."""
    if response.status != 200 or "json" not in response.content_type:
        return False
    body = response.json()
    return (
        body.get("ok") is False
        and body.get("status_code") == 429
        and isinstance(body.get("msg"), str)
        and "Retry-After" in response.headers
    )


def answered(response: ApiResponse) -> bool:
    return response.status == 200 and response.json().get("ok") is True


def retry_after(response: ApiResponse) -> int:
    return int(response.headers["Retry-After"])


async def metrics(daemon: Daemon) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{daemon.settings.server.admin_port}/metrics") as response,
    ):
        assert response.status == 200
        return await response.text()


def requests_counted(text: str, account: str, endpoint: str, outcome: str) -> float:
    """``procurd_provider_requests_total`` of ``account``, ``endpoint`` and ``outcome`` (this instance's) in a
    /metrics page; 0 when absent."""
    pattern = re.compile(
        r"^procurd_provider_requests_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.MULTILINE
    )
    wanted = {"account": account, "endpoint": endpoint, "outcome": outcome}
    for found in pattern.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found["labels"]))
        if {name: labels.get(name) for name in wanted} == wanted:
            return float(found["value"])
    return 0.0


async def test_an_account_over_its_limit_is_refused_then_blocked_and_others_are_not(
    database_url: str, sandbox: Sandbox
) -> None:
    """An account's 11th verified request in a minute (limit 10) gets HTTP 200 ``{"ok": false, "status_code":
    429}`` with ``Retry-After`` no longer than the block; during the block its valid requests, on any
    endpoint, are refused the same way; a second account keeps its whole budget meanwhile; after the block
    the first account is answered again. The metrics count each account's answers and refusals."""
    block = 3.0
    async with limited_provider(database_url, sandbox, block) as daemon:
        first_site = await add_account(daemon.operations, "first")
        second_site = await add_account(daemon.operations, "second")
        async with ClientFrom(first_site) as first, ClientFrom(second_site) as second:
            within = [await first.post("/ping") for _ in range(LIMIT)]
            assert all(answered(response) for response in within), [r.body for r in within]

            over = await first.post("/ping")
            assert limited(over), over.body
            assert 1 <= retry_after(over) <= block + 1
            during = [await first.post("/ping"), await first.get("/categories")]
            assert all(limited(response) for response in during), [r.body for r in during]
            assert retry_after(during[-1]) <= retry_after(over)

            others = [await second.post("/ping") for _ in range(LIMIT)]
            assert all(answered(response) for response in others), [r.body for r in others]

            text = await metrics(daemon)
            assert requests_counted(text, "first", "ping", "ok") == LIMIT
            assert requests_counted(text, "first", "ping", "rate_limited") == 2
            assert requests_counted(text, "first", "categories", "rate_limited") == 1
            assert requests_counted(text, "second", "ping", "ok") == LIMIT
            assert requests_counted(text, "second", "ping", "rate_limited") == 0

            async def unblocked() -> bool:
                return answered(await first.post("/ping"))

            # The block ends on its own (a refused request does not prolong it).
            await wait_until(unblocked, timeout=block + 10, interval=0.25)
            again = await first.get("/categories")
            assert answered(again), again.body


async def test_failed_authentications_are_limited_per_address_and_never_spend_the_accounts_budget(
    database_url: str, sandbox: Sandbox
) -> None:
    """200 requests with the account's key and a wrong signature from 127.0.0.2, and 200 without a signature
    from 127.0.0.3: each address gets 401s until it is over the limit, then the 429 envelope, without its
    requests being checked again (a correctly signed request from a blocked address is refused too, and is
    counted as nobody's). The account's valid requests from its own address are answered all along and have
    their whole budget: ten go through, the eleventh is limited."""
    async with limited_provider(database_url, sandbox, 60.0) as daemon:
        site = await add_account(daemon.operations, "victim")
        async with (
            ClientFrom(site) as own,
            ClientFrom(site, "127.0.0.2") as forger,
            ClientFrom(site, "127.0.0.3") as unsigned,
        ):
            forged = [await forger.post("/ping", signature="0" * 64) for _ in range(200)]
            bare = [await unsigned.post("/ping", omit_headers=["Service-Signature"]) for _ in range(200)]
            for answers, code in ((forged, "invalid_signature"), (bare, "missing_auth_headers")):
                # The 11th failure puts the address over the limit; it is itself answered as a failure.
                checked = answers[: LIMIT + 1]
                assert [(r.status, r.error_code) for r in checked] == [(401, code)] * (LIMIT + 1)
                assert all(limited(response) for response in answers[LIMIT + 1 :])

            # While it is blocked, the address is refused before its signature is looked at: a valid one too.
            valid_from_blocked = await forger.post("/ping")
            assert limited(valid_from_blocked), valid_from_blocked.body

            # The account, from its own address, was never limited by any of this, and has its whole budget.
            mine = [await own.post("/ping") for _ in range(LIMIT)]
            assert all(answered(response) for response in mine), [r.body for r in mine]
            assert mine[0].json()["user_id"] == (await daemon.operations.provider.accounts.get("victim")).id
            eleventh = await own.post("/ping")
            assert limited(eleventh), eleventh.body

            text = await metrics(daemon)
            assert requests_counted(text, "-", "ping", "invalid_signature") == LIMIT + 1
            assert requests_counted(text, "-", "ping", "missing_auth_headers") == LIMIT + 1
            # 189 + 189 refused by address, and the valid request from a blocked address.
            assert requests_counted(text, "-", "ping", "rate_limited") == 2 * (200 - LIMIT - 1) + 1
            assert requests_counted(text, "victim", "ping", "ok") == LIMIT
            assert requests_counted(text, "victim", "ping", "rate_limited") == 1


async def test_behind_a_trusted_proxy_failed_authentications_are_limited_per_forwarded_client(
    database_url: str, sandbox: Sandbox
) -> None:
    """With ``[server] trusted_proxies`` naming a reverse proxy (127.0.0.5 here), the provider limits failed
    authentications per client the proxy forwards (``X-Forwarded-For``), not per proxy: a forger behind it is
    blocked after ten, while the account's valid requests through the same proxy from another client are
    answered. From a peer that is no trusted proxy (127.0.0.6), ``X-Forwarded-For`` is not believed: a
    forger cannot escape its block by naming ever new clients."""
    settings = provider_settings(
        database_url,
        ("main", sandbox),
        provider={"rate_limit_per_minute": LIMIT, "rate_limit_block_seconds": 60.0},
        server={"trusted_proxies": ["127.0.0.5"]},
    )
    async with running_daemon(settings) as daemon:
        site = await add_account(daemon.operations, "behind")
        async with ClientFrom(site, "127.0.0.5") as proxy, ClientFrom(site, "127.0.0.6") as direct:
            forger = {"X-Forwarded-For": "203.0.113.7"}
            forged = [await proxy.post("/ping", signature="0" * 64, headers=forger) for _ in range(LIMIT + 3)]
            assert [r.status for r in forged[: LIMIT + 1]] == [401] * (LIMIT + 1)
            assert all(limited(response) for response in forged[LIMIT + 1 :]), [r.status for r in forged]
            still_blocked = await proxy.post("/ping", headers=forger)
            assert limited(still_blocked), still_blocked.body

            mine = await proxy.post("/ping", headers={"X-Forwarded-For": "203.0.113.8"})
            assert answered(mine), mine.body

            named = [
                await direct.post("/ping", signature="0" * 64, headers={"X-Forwarded-For": f"198.51.100.{n}"})
                for n in range(LIMIT + 3)
            ]
            assert [r.status for r in named[: LIMIT + 1]] == [401] * (LIMIT + 1)
            assert all(limited(response) for response in named[LIMIT + 1 :]), [r.status for r in named]


async def test_bodies_too_large_to_be_verified_are_limited_like_failed_authentications(
    database_url: str, sandbox: Sandbox
) -> None:
    """A request with an account's key and a body over the provider's 1 MB is refused 413 before its signature
    can be checked: it is unverified, and counts against its address like a failed authentication (after ten,
    the 429 envelope), so a stranger who knows a key cannot make the provider look it up and read large
    bodies without limit. The account's own requests from its address are not affected."""
    async with limited_provider(database_url, sandbox, 60.0) as daemon:
        site = await add_account(daemon.operations, "big")
        oversized = b"{" + b" " * (1024 * 1024) + b"}"
        async with ClientFrom(site) as own, ClientFrom(site, "127.0.0.4") as stranger:
            answers = [
                await stranger.post("/orders", body=oversized, signature="0" * 64) for _ in range(LIMIT + 3)
            ]
            assert [r.status for r in answers[: LIMIT + 1]] == [413] * (LIMIT + 1)
            assert all(limited(response) for response in answers[LIMIT + 1 :]), [r.status for r in answers]
            mine = await own.post("/ping")
            assert answered(mine), mine.body


def test_the_limiter_forgets_callers_that_went_quiet() -> None:
    """The limiter remembers a caller (an address that failed authentication, an account) only while that
    matters: a window after its last request, and not while it is blocked, it is forgotten, so strangers
    cannot grow it without bound by coming from ever new addresses."""
    clock = ManualClock()
    limiter = RateLimiter(clock)
    addresses = [f"2001:db8::{number:x}" for number in range(1000)]
    assert all(limiter.allow(address, 1, 60, 120) for address in addresses)
    assert not limiter.allow(addresses[0], 1, 60, 120)  # over its limit: blocked for 120 s
    assert len(limiter) == len(addresses)

    clock.advance(61)
    assert limiter.allow("2001:db8::beef:1", 1, 60, 120)
    assert len(limiter) == 2  # the blocked address is still held, the rest forgotten
    assert limiter.blocked(addresses[0])
    assert not limiter.allow(addresses[0], 1, 60, 120)

    clock.advance(60)
    assert limiter.allow(addresses[0], 1, 60, 120)  # its block is over: a fresh start
    assert len(limiter) == 1


async def test_a_body_slower_than_the_listeners_limit_is_refused(database_url: str, sandbox: Sandbox) -> None:
    """A signed order whose body stops arriving holds no handler past the public listener's
    ``body_timeout_seconds``: it is answered 408 ``request_timeout`` in the API's envelope and the connection
    is closed, as the callback receiver beside it does; nothing is taken in."""
    settings = provider_settings(database_url, ("main", sandbox), server={"body_timeout_seconds": 1})
    async with running_daemon(settings) as daemon:
        site = await add_account(daemon.operations, "slow")
        names = HeaderNames.for_prefix(site.header_prefix)
        headers = [
            f"{names.api_key}: {site.api_key}",
            f"{names.timestamp}: {int(time.time())}",
            f"{names.signature}: {'0' * 64}",  # never checked: the body has to arrive first
        ]
        answer = await check_slow_body_is_refused(site.base_url, "/api/v1/upstream/orders", headers)
        assert answer.body["error_message"] == "the body did not arrive within 1 s"
        total, _ = await daemon.operations.provider.orders(None, None, 1, 10)
    assert total == 0
