"""The real sites' rate limit on the sandbox: HTTP 200 envelope with status_code 429, then a block."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.ratelimit import RateLimiter
from procurd.sandbox.testing import ApiResponse, SignedClient


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig(
        rate_limit=True, rate_limit_requests=3, rate_limit_window_seconds=60, rate_limit_block_seconds=0.3
    )
    async with Sandbox(config) as sandbox:
        yield sandbox


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[SignedClient]:
    async with SignedClient(sandbox.base_url) as client:
        yield client


def is_envelope(response: ApiResponse) -> bool:
    data = response.json()
    return response.status == 200 and data.get("status_code") == 429


async def test_excess_request_gets_the_storefront_envelope(client: SignedClient) -> None:
    """The request over the limit is answered HTTP 200 with {status_code: 429, msg, data.request_id}."""
    for _ in range(3):
        assert (await client.post("/ping")).json()["ok"] is True
    response = await client.post("/ping")
    data = response.json()
    assert response.status == 200
    assert (data["status_code"], data["msg"]) == (429, "too many requests")
    assert data["data"]["request_id"]
    assert "ok" not in data


async def test_key_is_blocked_then_released(client: SignedClient) -> None:
    """After the excess every request is refused during the block; afterwards the key is served again."""
    for _ in range(4):
        await client.post("/ping")
    assert is_envelope(await client.get("/categories"))
    deadline = time.monotonic() + 10
    while is_envelope(await client.post("/ping")):
        assert time.monotonic() < deadline, "the block never ended"
        await asyncio.sleep(0.02)
    assert (await client.post("/ping")).json()["ok"] is True


async def test_limit_is_per_api_key(sandbox: Sandbox, client: SignedClient) -> None:
    """One key's excess does not limit another key."""
    sandbox.state.add_api_key("second-key", "second-secret")
    for _ in range(4):
        await client.post("/ping")
    async with SignedClient(sandbox.base_url, "second-key", "second-secret") as other:
        assert (await other.post("/ping")).json()["ok"] is True


async def test_rate_limit_off_by_default() -> None:
    """Without rate_limit the sandbox serves any number of requests."""
    async with Sandbox() as sandbox, SignedClient(sandbox.base_url) as client:
        for _ in range(70):
            assert (await client.post("/ping")).status == 200


def test_window_slides() -> None:
    """Hits older than the window no longer count against the limit."""
    now = [0.0]
    limiter = RateLimiter(lambda: now[0])
    assert all(limiter.allow("k", 2, 10, 30) for _ in range(2))
    now[0] = 10.5
    assert limiter.allow("k", 2, 10, 30)
    assert limiter.allow("k", 2, 10, 30)
    assert not limiter.allow("k", 2, 10, 30)
    assert limiter.blocked("k")
    now[0] = 40.6
    assert limiter.allow("k", 2, 10, 30)
