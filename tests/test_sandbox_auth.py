"""The sandbox authenticates requests like the real sites: check order, statuses and error codes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from procurd.protocol.dujiao.signing import sign
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import ManualClock, SignedClient

VECTOR_SECRET = "your_api_secret"
VECTOR_TIMESTAMP = 1772366400


def pinned_clock_config(at: int, **overrides: object) -> SandboxConfig:
    """A config whose clock reads ``at`` (plus the few milliseconds a test takes)."""
    return SandboxConfig(clock_offset_seconds=at - time.time(), **overrides)  # type: ignore[arg-type]


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox() as sandbox:
        yield sandbox


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[SignedClient]:
    async with SignedClient(sandbox.base_url) as client:
        yield client


async def test_published_order_vector_is_accepted() -> None:
    """The seed's POST /orders example (key, timestamp, body, signature) is accepted byte for byte."""
    config = pinned_clock_config(VECTOR_TIMESTAMP, api_key="your_api_key", api_secret=VECTOR_SECRET)
    async with Sandbox(config) as sandbox, SignedClient(sandbox.base_url, "your_api_key", "x") as client:
        sandbox.state.set_sku_stock(1, -1)
        response = await client.request(
            "POST",
            "/orders",
            body=b'{"sku_id":1,"quantity":1}',
            timestamp=VECTOR_TIMESTAMP,
            signature="88444ca5a52c0ebfb343ac92fc81723552f70fcbf589c22c0801f94458e2da7f",
        )
    assert response.status == 200
    assert response.json()["ok"] is True


async def test_published_ping_vector_is_accepted() -> None:
    """The seed's empty-body POST /ping example is accepted byte for byte."""
    config = pinned_clock_config(VECTOR_TIMESTAMP, api_key="your_api_key", api_secret=VECTOR_SECRET)
    async with Sandbox(config) as sandbox, SignedClient(sandbox.base_url, "your_api_key", "x") as client:
        response = await client.request(
            "POST",
            "/ping",
            timestamp=VECTOR_TIMESTAMP,
            signature="356c05176544b817cea6fcd96e9b7f57a64b2f86ece3748e939944d2c2076dca",
        )
    assert response.status == 200
    assert response.json()["protocol_version"] == "1.0"


@pytest.mark.parametrize("header", ["Service-Api-Key", "Service-Timestamp", "Service-Signature"])
async def test_missing_header_is_401(client: SignedClient, header: str) -> None:
    """Leaving out any one of the three headers answers 401 missing_auth_headers."""
    response = await client.post("/ping", omit_headers=[header])
    assert response.status == 401
    assert response.json() == {
        "ok": False,
        "error_code": "missing_auth_headers",
        "error_message": "signature headers are missing",
    }


@pytest.mark.parametrize("stamp", ["abc", "1.5e9", "", "17723664001234"])
async def test_unparseable_timestamp_is_401(client: SignedClient, stamp: str) -> None:
    """A timestamp that is not plain Unix seconds answers 401 invalid_timestamp (empty: missing headers)."""
    response = await client.post("/ping", timestamp=stamp)
    assert response.status == 401
    assert response.error_code == ("missing_auth_headers" if stamp == "" else "invalid_timestamp")


@pytest.mark.parametrize(("shift", "fresh"), [(-61, False), (61, False), (-59, True), (59, True)])
async def test_timestamp_tolerance_is_60_seconds(shift: int, fresh: bool) -> None:
    """Timestamps 61 s away either way answer 401 timestamp_expired; 59 s away are accepted."""
    now = int(time.time()) + 5000
    async with Sandbox(pinned_clock_config(now)) as sandbox, SignedClient(sandbox.base_url) as client:
        response = await client.post("/ping", timestamp=now + shift)
    if fresh:
        assert response.status == 200
    else:
        assert response.status == 401
        assert response.error_code == "timestamp_expired"


async def test_timestamp_window_is_the_same_both_ways_within_a_second() -> None:
    """With the site's clock 0.7 s into a second, a timestamp exactly 60 s old is accepted as one exactly
    60 s ahead is (the window is counted in whole seconds on both sides), and 61 s either way is not."""
    second = int(time.time()) + 5000
    async with (
        Sandbox(SandboxConfig(), clock=ManualClock(second + 0.7)) as sandbox,
        SignedClient(sandbox.base_url) as client,
    ):
        edges = [await client.post("/ping", timestamp=second + shift) for shift in (-60, 60)]
        beyond = [await client.post("/ping", timestamp=second + shift) for shift in (-61, 61)]
    assert [answer.status for answer in edges] == [200, 200]
    assert [(answer.status, answer.error_code) for answer in beyond] == [(401, "timestamp_expired")] * 2


async def test_clock_offset_moves_the_sandbox_clock() -> None:
    """With the sandbox's clock 120 s ahead, a client on wall time is expired and one on its time is not."""
    async with (
        Sandbox(SandboxConfig(clock_offset_seconds=120)) as sandbox,
        SignedClient(sandbox.base_url) as client,
    ):
        assert (await client.post("/ping")).error_code == "timestamp_expired"
        assert (await client.post("/ping", timestamp=int(time.time()) + 120)).status == 200


async def test_wrong_secret_is_401_invalid_signature(sandbox: Sandbox) -> None:
    """A request signed with another secret answers 401 invalid_signature."""
    async with SignedClient(sandbox.base_url, api_secret="not-the-secret") as client:
        response = await client.post("/ping")
    assert response.status == 401
    assert response.error_code == "invalid_signature"


async def test_signature_covers_the_exact_body(client: SignedClient) -> None:
    """A signature over one body does not authenticate a body that differs only in white space."""
    stamp = int(time.time())
    signature = sign("sandbox-secret", "POST", "/api/v1/upstream/orders", stamp, b'{"sku_id":1,"quantity":1}')
    response = await client.request(
        "POST", "/orders", body=b'{"sku_id": 1, "quantity": 1}', timestamp=stamp, signature=signature
    )
    assert response.error_code == "invalid_signature"


async def test_signature_covers_the_path_without_query(client: SignedClient) -> None:
    """The query string is not signed, but the path is: a signature over another path is refused."""
    listed = await client.get("/products", {"page": 2, "page_size": 5})
    assert listed.status == 200
    wrong_path = await client.get("/products", {"page": 2}, sign_path="/api/v1/upstream/categories")
    assert wrong_path.error_code == "invalid_signature"


async def test_unknown_key_is_403(sandbox: Sandbox) -> None:
    """A key the site does not know answers 403 invalid_api_key."""
    async with SignedClient(sandbox.base_url, api_key="who-is-this") as client:
        response = await client.post("/ping")
    assert response.status == 403
    assert response.error_code == "invalid_api_key"


async def test_disabled_key_is_403(sandbox: Sandbox, client: SignedClient) -> None:
    """A disabled key answers 403 invalid_api_key, and works again once enabled."""
    sandbox.state.disable_api_key("sandbox-key")
    response = await client.post("/ping")
    assert (response.status, response.error_code) == (403, "invalid_api_key")
    sandbox.state.enable_api_key("sandbox-key")
    assert (await client.post("/ping")).status == 200


async def test_disabled_user_is_403(sandbox: Sandbox, client: SignedClient) -> None:
    """A key whose user account is banned answers 403 user_disabled."""
    sandbox.state.disable_user("sandbox-key")
    response = await client.post("/ping")
    assert (response.status, response.error_code) == (403, "user_disabled")


async def test_check_order_timestamp_before_credential(sandbox: Sandbox) -> None:
    """An expired timestamp from an unknown key reports the timestamp: it is checked first."""
    async with SignedClient(sandbox.base_url, api_key="who-is-this") as client:
        response = await client.post("/ping", timestamp=int(time.time()) - 3600)
    assert response.error_code == "timestamp_expired"


async def test_check_order_credential_before_signature(sandbox: Sandbox) -> None:
    """A disabled user with a bad signature reports user_disabled: credentials come before the signature."""
    sandbox.state.disable_user("sandbox-key")
    async with SignedClient(sandbox.base_url, api_secret="wrong") as client:
        response = await client.post("/ping")
    assert response.error_code == "user_disabled"


async def test_body_over_10_mb_is_413(client: SignedClient) -> None:
    """A body one byte over 10 MB answers 413, before the signature is even checked."""
    body = b"x" * (10 * 1024 * 1024 + 1)
    response = await client.request("POST", "/orders", body=body, signature="0" * 64)
    assert response.status == 413
    assert response.json()["ok"] is False
    assert response.error_code == "request_too_large"


async def test_body_of_exactly_10_mb_is_read(client: SignedClient) -> None:
    """A signed body of exactly 10 MB passes the size check and is judged as JSON (bad_request)."""
    response = await client.request("POST", "/orders", body=b" " * (10 * 1024 * 1024 - 2) + b"[]")
    assert response.status == 400
    assert response.error_code == "bad_request"


async def test_header_prefix_is_configurable() -> None:
    """With prefix Dujiao-Next the headers are Dujiao-Next-*, and Service-* headers are missing ones."""
    async with Sandbox(SandboxConfig(header_prefix="Dujiao-Next")) as sandbox:
        async with SignedClient(sandbox.base_url, header_prefix="Dujiao-Next") as client:
            assert (await client.post("/ping")).status == 200
        async with SignedClient(sandbox.base_url) as client:
            assert (await client.post("/ping")).error_code == "missing_auth_headers"


async def test_unknown_path_is_404_with_error_body(client: SignedClient) -> None:
    """An unknown path under the API answers 404 with the API's error body."""
    response = await client.get("/nothing/here")
    assert response.status == 404
    assert response.json()["ok"] is False
    assert response.error_code == "not_found"


async def test_wrong_method_is_405(client: SignedClient) -> None:
    """A known path with the wrong method answers 405 with the API's error body."""
    response = await client.get("/ping")
    assert response.status == 405
    assert response.error_code == "method_not_allowed"


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'"text"', b""])
async def test_malformed_order_body_is_400(client: SignedClient, body: bytes) -> None:
    """A body that is not a JSON object answers 400 bad_request."""
    response = await client.request("POST", "/orders", body=body)
    assert response.status == 400
    assert response.error_code == "bad_request"


async def test_requests_are_counted_per_endpoint(sandbox: Sandbox, client: SignedClient) -> None:
    """Every request to an endpoint is counted under its name and under '*', refused ones included."""
    await client.post("/ping")
    await client.post("/ping", omit_headers=["Service-Signature"])
    await client.get("/categories")
    assert sandbox.request_counts["ping"] == 2
    assert sandbox.request_counts["categories"] == 1
    assert sandbox.request_counts["*"] == 3
