"""The real sites' rate limit on the sandbox (HTTP 200 envelope with status_code 429, then a block), its
settings, and the request log that shows which requests it refused."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from procurd.protocol.dujiao.ratelimit import RateLimiter
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import ApiResponse, ControlClient, ManualClock, SignedClient


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def sandbox(clock: ManualClock) -> AsyncIterator[Sandbox]:
    config = SandboxConfig(
        rate_limit=True, rate_limit_requests=6, rate_limit_window_seconds=6, rate_limit_block_seconds=3
    )
    async with Sandbox(config, clock=clock) as sandbox:
        yield sandbox


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[SignedClient]:
    async with SignedClient(sandbox.base_url) as client:
        yield client


@pytest.fixture
async def control(sandbox: Sandbox) -> AsyncIterator[ControlClient]:
    async with ControlClient(sandbox.base_url) as control:
        yield control


def is_envelope(response: ApiResponse) -> bool:
    data = response.json()
    return response.status == 200 and data.get("status_code") == 429


async def pings(client: SignedClient, count: int) -> list[bool]:
    """For each of ``count`` pings: whether the rate limit refused it."""
    return [is_envelope(await client.post("/ping")) for _ in range(count)]


def test_defaults_are_the_real_sites() -> None:
    """Out of the box the limit is off; switched on it is 60 requests per 60 s per key and a 30 s block."""
    config = SandboxConfig()
    assert config.rate_limit is False
    limits = (config.rate_limit_requests, config.rate_limit_window_seconds, config.rate_limit_block_seconds)
    assert limits == (60, 60, 30)


async def test_sixty_a_minute_then_thirty_seconds_blocked(clock: ManualClock) -> None:
    """With the real sites' numbers the 61st request in a minute gets the envelope, and the key stays blocked
    for 30 s (even once the minute is over), then is served again."""
    async with (
        Sandbox(SandboxConfig(rate_limit=True), clock=clock) as sandbox,
        SignedClient(sandbox.base_url) as client,
    ):
        assert await pings(client, 60) == [False] * 60
        clock.advance(59)
        assert await pings(client, 1) == [True]
        clock.advance(29.9)
        assert await pings(client, 1) == [True]
        clock.advance(0.1)
        assert await pings(client, 1) == [False]


async def test_excess_request_gets_the_storefront_envelope(client: SignedClient) -> None:
    """The request over the limit is answered HTTP 200 with {status_code: 429, msg, data.request_id}."""
    assert await pings(client, 6) == [False] * 6
    response = await client.post("/ping")
    data = response.json()
    assert response.status == 200
    assert (data["status_code"], data["msg"]) == (429, "too many requests")
    assert data["data"]["request_id"]
    assert "ok" not in data


async def test_key_is_blocked_for_the_block_then_released(clock: ManualClock, client: SignedClient) -> None:
    """After the excess every request of the key is refused until the block ends; then a new window starts."""
    assert await pings(client, 7) == [False] * 6 + [True]
    clock.advance(2.9)
    assert is_envelope(await client.get("/categories"))
    clock.advance(0.1)
    assert await pings(client, 7) == [False] * 6 + [True]


async def test_window_slides(clock: ManualClock, client: SignedClient) -> None:
    """Requests older than the window no longer count: 6 now and 6 more 6 s later are all served."""
    assert await pings(client, 6) == [False] * 6
    clock.advance(6)
    assert await pings(client, 6) == [False] * 6


async def test_limit_is_per_api_key(sandbox: Sandbox, client: SignedClient) -> None:
    """One key's excess does not limit another key."""
    sandbox.state.add_api_key("second-key", "second-secret")
    await pings(client, 7)
    async with SignedClient(sandbox.base_url, "second-key", "second-secret") as other:
        assert await pings(other, 6) == [False] * 6


async def test_rate_limit_off_by_default() -> None:
    """Without rate_limit the sandbox serves any number of requests."""
    async with Sandbox() as sandbox, SignedClient(sandbox.base_url) as client:
        for _ in range(70):
            assert (await client.post("/ping")).status == 200


async def test_limit_is_set_over_the_control_api(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """POST /_sandbox/rate_limit sets the numbers, answers them, starts every key afresh and shows in
    /_sandbox/state."""
    await pings(client, 7)
    answer = await control.post(
        "/rate_limit", {"enabled": True, "requests": 2, "window_seconds": 10, "block_seconds": 5}
    )
    assert answer == {"ok": True, "enabled": True, "requests": 2, "window_seconds": 10, "block_seconds": 5}
    assert (await control.get("/state"))["rate_limit"] == {
        "enabled": True,
        "requests": 2,
        "window_seconds": 10,
        "block_seconds": 5,
    }
    assert await pings(client, 3) == [False, False, True]
    await control.post("/rate_limit", {"enabled": False})
    assert await pings(client, 3) == [False] * 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"requests": 0}, "requests"),
        ({"requests": "6"}, "requests"),
        ({"window_seconds": 0}, "window_seconds"),
        ({"block_seconds": -1}, "block_seconds"),
        ({"enabled": "yes"}, "enabled"),
        ({"limit": 6}, "limit"),
    ],
)
async def test_bad_rate_limit_settings_are_400(
    sandbox: Sandbox, control: ControlClient, body: dict[str, object], field: str
) -> None:
    """A bad or unknown rate-limit setting answers 400 naming the field, and changes nothing."""
    data = await control.post("/rate_limit", {"requests": 9, **body}, expect=400)
    assert (data["error_code"], data["field"]) == ("bad_request", field)
    assert field in data["error_message"]
    assert sandbox.config.rate_limit_requests == 6


async def test_request_log_counts_per_key_and_endpoint(
    sandbox: Sandbox, clock: ManualClock, client: SignedClient, control: ControlClient
) -> None:
    """GET /_sandbox/requests lists each request with its arrival on the site's clock, key, endpoint and
    whether it was rate-limited, and counts them per key and endpoint."""
    sandbox.state.add_api_key("second-key", "second-secret")
    started = clock.now
    await client.get("/categories")
    clock.advance(1)
    await pings(client, 6)
    async with SignedClient(sandbox.base_url, "second-key", "second-secret") as other:
        await other.get("/products")
    log = await control.get("/requests")
    assert log["total"] == {"requests": 8, "rate_limited": 1}
    assert log["by_key"] == {
        "sandbox-key": {
            "categories": {"requests": 1, "rate_limited": 0},
            "ping": {"requests": 6, "rate_limited": 1},
            "*": {"requests": 7, "rate_limited": 1},
        },
        "second-key": {
            "products": {"requests": 1, "rate_limited": 0},
            "*": {"requests": 1, "rate_limited": 0},
        },
    }
    first, *_, limited, last = log["requests"]
    assert first == {
        "at": started, "api_key": "sandbox-key", "endpoint": "categories", "rate_limited": False,
        "authenticated": True,
    }  # fmt: skip
    assert (limited["at"], limited["endpoint"], limited["rate_limited"]) == (started + 1, "ping", True)
    assert limited["authenticated"] is None  # refused before its signature was looked at
    assert last["api_key"] == "second-key"
    assert log["now"] == started + 1


async def test_request_log_since_and_reset(
    clock: ManualClock, client: SignedClient, control: ControlClient
) -> None:
    """?since= keeps the requests that arrived at or after that instant, ?api_key= one key's; a reset
    forgets every request (and the per-endpoint counts of /_sandbox/state)."""
    await client.post("/ping")
    clock.advance(10)
    await client.get("/categories")
    recent = await control.get("/requests", {"since": str(clock.now)})
    assert [r["endpoint"] for r in recent["requests"]] == ["categories"]
    assert recent["since"] == clock.now
    assert (await control.get("/requests", {"api_key": "nobody"}))["total"]["requests"] == 0
    reset = await control.post("/requests/reset")
    assert reset["now"] == clock.now
    assert (await control.get("/requests"))["requests"] == []
    assert (await control.get("/state"))["requests"]["*"] == 0
    bad = await control.get("/requests", {"since": "yesterday"}, expect=400)
    assert bad["field"] == "since"


async def test_unauthenticated_requests_are_logged_without_a_key(
    client: SignedClient, control: ControlClient
) -> None:
    """A request without the key header is logged under the empty key and is never rate-limited."""
    for _ in range(8):
        await client.post("/ping", omit_headers=["Service-Api-Key"])
    assert (await control.get("/requests"))["by_key"][""]["ping"] == {"requests": 8, "rate_limited": 0}


def test_limiter_window_slides_and_blocks() -> None:
    """Hits older than the window no longer count; the hit over the limit blocks the key for the block."""
    clock = ManualClock(0)
    limiter = RateLimiter(clock)
    assert all(limiter.allow("k", 2, 10, 30) for _ in range(2))
    clock.advance(10.5)
    assert limiter.allow("k", 2, 10, 30)
    assert limiter.allow("k", 2, 10, 30)
    assert not limiter.allow("k", 2, 10, 30)
    assert limiter.blocked("k")
    clock.advance(30.1)
    assert limiter.allow("k", 2, 10, 30)
