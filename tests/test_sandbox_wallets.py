"""Several API keys on one sandbox, each with its own wallet, and two sandboxes side by side as two
upstreams."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from procurd.sandbox import Sandbox, SandboxConfig, SandboxStateError
from procurd.sandbox.testing import ControlClient, SignedClient


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox() as sandbox:
        yield sandbox


@pytest.fixture
async def control(sandbox: Sandbox) -> AsyncIterator[ControlClient]:
    async with ControlClient(sandbox.base_url) as control:
        yield control


async def buy(client: SignedClient, sandbox: Sandbox, number: str, price: str = "10.00") -> dict[str, Any]:
    sku = sandbox.state.first_sku("manual")
    sandbox.state.set_sku_stock(sku.id, -1)
    sandbox.state.set_sku_price(sku.id, price)
    data: dict[str, Any] = (
        await client.create_order(sku.id, 1, downstream_order_no=number, manual_form_data={"account": "a"})
    ).json()
    return data


async def test_each_key_pays_from_its_own_wallet(sandbox: Sandbox) -> None:
    """Orders by one key debit only that key's wallet; ping shows each key its own balance and user."""
    sandbox.state.add_api_key("second-key", "second-secret", balance="50.00")
    async with (
        SignedClient(sandbox.base_url) as first,
        SignedClient(sandbox.base_url, "second-key", "second-secret") as second,
    ):
        assert (await buy(second, sandbox, "W-1"))["ok"] is True
        assert (await buy(first, sandbox, "W-1"))["ok"] is True
        pings = [(await client.post("/ping")).json() for client in (first, second)]
    assert [(p["user_id"], p["balance"]) for p in pings] == [(1, "990.00"), (2, "40.00")]
    assert sandbox.state.balance("second-key") == Decimal("40.00")


async def test_wallet_of_a_key_is_set_over_the_control_api(sandbox: Sandbox, control: ControlClient) -> None:
    """POST /_sandbox/wallet sets or tops up the wallet of the key named (the configured key by default)
    and leaves the others alone; /_sandbox/state lists every wallet."""
    sandbox.state.add_api_key("second-key", "second-secret")
    answer = await control.post("/wallet", {"api_key": "second-key", "balance": "5.00"})
    assert answer == {"ok": True, "api_key": "second-key", "balance": "5.00"}
    assert (await control.post("/wallet", {"top_up": "0.50"}))["balance"] == "1000.50"
    wallets = (await control.get("/state"))["wallets"]
    assert wallets == {"sandbox-key": "1000.50", "second-key": "5.00"}


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"balance": 5}, 400, "balance"),
        ({"balance": "-1.00"}, 400, "balance"),
        ({"top_up": "x"}, 400, "top_up"),
        ({}, 400, "balance"),
        ({"balance": "1.00", "top_up": "1.00"}, 400, "balance"),
        ({"api_key": 3, "balance": "1.00"}, 400, "api_key"),
        ({"api_key": "nobody", "balance": "1.00"}, 404, None),
    ],
)
async def test_bad_wallet_requests(
    sandbox: Sandbox, control: ControlClient, body: dict[str, Any], status: int, field: str | None
) -> None:
    """Bad amounts and fields answer 400 naming the field; an unknown key answers 404; nothing changes."""
    data = await control.post("/wallet", body, expect=status)
    assert data.get("field") == field
    assert sandbox.state.balance() == Decimal("1000.00")


async def test_api_key_added_over_the_control_api(sandbox: Sandbox, control: ControlClient) -> None:
    """POST /_sandbox/api_keys adds a key that signs requests at once, with its own wallet and user; the
    same key again is a 409 conflict and a missing secret a 400."""
    added = await control.post("/api_keys", {"api_key": "k2", "api_secret": "s2", "balance": "12.00"})
    assert added == {"ok": True, "api_key": "k2", "user_id": 2, "balance": "12.00"}
    async with SignedClient(sandbox.base_url, "k2", "s2") as client:
        ping = (await client.post("/ping")).json()
    assert (ping["user_id"], ping["balance"]) == (2, "12.00")
    again = await control.post("/api_keys", {"api_key": "k2", "api_secret": "other"}, expect=409)
    assert again["error_code"] == "conflict"
    assert (await control.post("/api_keys", {"api_key": "k3"}, expect=400))["field"] == "api_secret"
    with pytest.raises(SandboxStateError):
        sandbox.state.add_api_key("k2", "s2")


async def test_two_sandboxes_are_two_independent_upstreams() -> None:
    """Two sandboxes run side by side with separate catalogues, wallets, orders, request logs and limits,
    even under the same key and downstream order number."""
    config = SandboxConfig(rate_limit=True, rate_limit_requests=3)
    async with (
        Sandbox(config) as first,
        Sandbox(SandboxConfig(site_name="second upstream", seed=2)) as second,
        SignedClient(first.base_url) as to_first,
        SignedClient(second.base_url) as to_second,
    ):
        assert (await buy(to_first, first, "SAME-1", "3.00"))["ok"] is True
        assert (await buy(to_second, second, "SAME-1", "7.00"))["ok"] is True
        for _ in range(3):
            await to_first.post("/ping")
        pings = [(await client.post("/ping")).json() for client in (to_first, to_second)]
        assert pings[0]["status_code"] == 429
        assert (pings[1]["site_name"], pings[1]["balance"]) == ("second upstream", "993.00")
        assert first.state.balance() == Decimal("997.00")
        assert [len(s.orders_for("SAME-1")) for s in (first, second)] == [1, 1]
        assert first.state.product(1).title != second.state.product(1).title
        assert [s.request_counts["*"] for s in (first, second)] == [5, 2]
