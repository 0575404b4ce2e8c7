"""Signed callbacks from the sandbox to a real receiver on 127.0.0.1: body, signature, retries, knobs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from procurd.protocol.dujiao.signing import signature_matches
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import CallbackReceiver, SignedClient, wait_until

FAST_RETRIES = (0.01, 0.01, 0.01, 0.01)


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig(allow_private_callbacks=True, callback_retry_delays=FAST_RETRIES)
    async with Sandbox(config) as sandbox:
        yield sandbox


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[SignedClient]:
    async with SignedClient(sandbox.base_url) as client:
        yield client


@pytest.fixture
async def receiver() -> AsyncIterator[CallbackReceiver]:
    async with CallbackReceiver() as receiver:
        yield receiver


async def order(
    sandbox: Sandbox, client: SignedClient, receiver: CallbackReceiver, kind: str = "auto", **fields: Any
) -> dict[str, Any]:
    sku = sandbox.state.first_sku(kind)
    sandbox.state.set_sku_stock(sku.id, -1)
    sandbox.state.set_balance("100000.00")
    extra: dict[str, Any] = {"manual_form_data": {"account": "a1"}} if kind == "manual" else {}
    response = await client.create_order(sku.id, 2, callback_url=receiver.url, **extra, **fields)
    data: dict[str, Any] = response.json()
    assert data["ok"] is True
    return data


async def test_delivery_callback_is_signed_over_the_fixed_path(
    sandbox: Sandbox, client: SignedClient, receiver: CallbackReceiver
) -> None:
    """The delivery push is POSTed to the callback URL and signed over /api/v1/upstream/callback."""
    created = await order(sandbox, client, receiver, downstream_order_no="D-1")
    (callback,) = await receiver.wait_for(1)
    assert callback.path == "/hooks/upstream"
    assert callback.signature_valid
    headers = callback.headers
    assert headers["Service-Api-Key"] == "sandbox-key"
    assert signature_matches(
        "sandbox-secret",
        "POST",
        "/api/v1/upstream/callback",
        headers["Service-Timestamp"],
        callback.body,
        headers["Service-Signature"],
    )
    body = callback.json()
    assert body["event"] == "order.fulfilled"
    assert (body["order_id"], body["order_no"]) == (created["order_id"], created["order_no"])
    assert (body["downstream_order_no"], body["status"]) == ("D-1", "delivered")
    assert body["fulfillment"]["payload"].count("\n") == 1
    assert isinstance(body["timestamp"], int)


async def test_callback_uses_the_configured_header_prefix(receiver: CallbackReceiver) -> None:
    """With prefix Dujiao-Next the callback carries Dujiao-Next-* headers."""
    config = SandboxConfig(allow_private_callbacks=True, header_prefix="Dujiao-Next")
    async with (
        Sandbox(config) as sandbox,
        SignedClient(sandbox.base_url, header_prefix="Dujiao-Next") as client,
        CallbackReceiver(header_prefix="Dujiao-Next") as prefixed,
    ):
        await order(sandbox, client, prefixed)
        (callback,) = await prefixed.wait_for(1)
    assert "Dujiao-Next-Signature" in callback.headers
    assert callback.signature_valid


async def test_manual_delivery_and_completion_push_fulfilled(
    sandbox: Sandbox, client: SignedClient, receiver: CallbackReceiver
) -> None:
    """deliver() and complete() each push order.fulfilled with the fulfillment, in that order."""
    created = await order(sandbox, client, receiver, "manual", downstream_order_no="M-1")
    await sandbox.wait_callbacks_idle()
    assert receiver.received == []
    await sandbox.deliver(created["order_id"], payload="account topped up")
    await sandbox.complete(created["order_id"])
    await sandbox.wait_callbacks_idle()
    bodies = receiver.payloads()
    assert [(b["event"], b["status"]) for b in bodies] == [
        ("order.fulfilled", "delivered"),
        ("order.fulfilled", "completed"),
    ]
    assert bodies[1]["fulfillment"]["payload"] == "account topped up"


async def test_other_statuses_push_status_changed(
    sandbox: Sandbox, client: SignedClient, receiver: CallbackReceiver
) -> None:
    """A forced status other than delivered or completed pushes order.status_changed without fulfillment."""
    created = await order(sandbox, client, receiver, "manual")
    await sandbox.set_status(created["order_id"], "fulfilling")
    (callback,) = await receiver.wait_for(1)
    assert (callback.json()["event"], callback.json()["status"]) == ("order.status_changed", "fulfilling")
    assert "fulfillment" not in callback.json()


async def test_cancel_and_refund_send_no_callback(
    sandbox: Sandbox, client: SignedClient, receiver: CallbackReceiver
) -> None:
    """Upstream cancellations and refunds push nothing, like the real sites."""
    first = await order(sandbox, client, receiver, "manual")
    second = await order(sandbox, client, receiver, "manual")
    sandbox.cancel_upstream(first["order_id"])
    sandbox.refund(second["order_id"])
    await sandbox.wait_callbacks_idle()
    assert receiver.received == []


async def test_no_callback_url_no_callback(sandbox: Sandbox, client: SignedClient) -> None:
    """An order without callback_url is delivered without any push."""
    sku = sandbox.state.first_sku()
    sandbox.state.set_sku_stock(sku.id, -1)
    await client.create_order(sku.id, 1)
    await sandbox.wait_callbacks_idle()
    assert sandbox.callback_log == []


async def test_failed_callback_is_retried_until_accepted(
    sandbox: Sandbox, client: SignedClient, receiver: CallbackReceiver
) -> None:
    """An HTTP 500, then a 200 without ok true, are retried; the third try succeeds."""
    receiver.answer_next(500)
    receiver.answer_next(200, {"ok": False, "message": "later"})
    await order(sandbox, client, receiver)
    await sandbox.wait_callbacks_idle()
    assert len(receiver.received) == 3
    assert [(a.attempt, a.http_status, a.ok) for a in sandbox.callback_log] == [
        (1, 500, False),
        (2, 200, False),
        (3, 200, True),
    ]
    assert len({r.body for r in receiver.received}) == 1


async def test_callback_gives_up_after_five_tries(
    sandbox: Sandbox, client: SignedClient, receiver: CallbackReceiver
) -> None:
    """A receiver that always fails gets exactly five tries (one plus four retries), then nothing."""
    receiver.answer_next(503, count=100)
    await order(sandbox, client, receiver)
    await sandbox.wait_callbacks_idle()
    assert [a.attempt for a in sandbox.callback_log] == [1, 2, 3, 4, 5]
    assert sandbox.callbacks.stats["abandoned"] == 1


async def test_callback_timeout_counts_as_failure(
    sandbox: Sandbox, client: SignedClient, receiver: CallbackReceiver
) -> None:
    """A receiver that does not answer within the timeout is tried again."""
    sandbox.config.callback_timeout_seconds = 0.2
    receiver.hang_next()
    await order(sandbox, client, receiver)
    await sandbox.wait_callbacks_idle()
    assert [(a.ok, a.error) for a in sandbox.callback_log] == [(False, "timed out"), (True, None)]


async def test_unreachable_receiver_is_logged_as_error(sandbox: Sandbox, client: SignedClient) -> None:
    """A callback URL nobody listens on is tried five times, each logged with a connection error."""
    async with CallbackReceiver() as gone:
        url = gone.url
    sku = sandbox.state.first_sku()
    await client.create_order(sku.id, 1, callback_url=url)
    await sandbox.wait_callbacks_idle()
    assert len(sandbox.callback_log) == 5
    assert all(a.http_status is None and a.error for a in sandbox.callback_log)


async def test_drop_callbacks_knob(
    sandbox: Sandbox, client: SignedClient, receiver: CallbackReceiver
) -> None:
    """drop_callbacks_next loses the next callback entirely; the one after is sent."""
    sandbox.faults.drop_callbacks_next()
    first = await order(sandbox, client, receiver, "manual")
    await sandbox.deliver(first["order_id"])
    await sandbox.complete(first["order_id"])
    await sandbox.wait_callbacks_idle()
    assert [p["status"] for p in receiver.payloads()] == ["completed"]
    assert sandbox.callbacks.stats["dropped"] == 1


async def test_duplicate_callbacks_knob(
    sandbox: Sandbox, client: SignedClient, receiver: CallbackReceiver
) -> None:
    """duplicate_callbacks_next sends the next callback twice with the same body."""
    sandbox.faults.duplicate_callbacks_next()
    await order(sandbox, client, receiver)
    await sandbox.wait_callbacks_idle()
    assert len(receiver.received) == 2
    assert receiver.received[0].body == receiver.received[1].body


async def test_delay_callbacks_knob(
    sandbox: Sandbox, client: SignedClient, receiver: CallbackReceiver
) -> None:
    """delay_callbacks holds every callback back; it still arrives, after the order is delivered."""
    sandbox.faults.delay_callbacks(0.2)
    created = await order(sandbox, client, receiver)
    await wait_until(lambda: sandbox.state.order(created["order_id"]).status == "delivered")
    assert sandbox.callbacks.tasks.busy
    await receiver.wait_for(1)


async def test_callbacks_of_one_order_keep_their_order(
    sandbox: Sandbox, client: SignedClient, receiver: CallbackReceiver
) -> None:
    """When the first push of an order fails, a later push of that order still arrives after it."""
    receiver.answer_next(500)
    created = await order(sandbox, client, receiver, "manual")
    await sandbox.deliver(created["order_id"])
    await sandbox.complete(created["order_id"])
    await sandbox.wait_callbacks_idle()
    statuses = [p["status"] for p in receiver.payloads()]
    assert statuses[0] == "delivered"
    assert statuses.index("completed") > 0


async def test_close_cancels_pending_retries(receiver: CallbackReceiver) -> None:
    """Closing the sandbox while a callback waits for a long retry ends promptly and cleanly."""
    config = SandboxConfig(allow_private_callbacks=True, callback_retry_delays=(3600,))
    sandbox = Sandbox(config)
    await sandbox.start()
    receiver.answer_next(500)
    async with SignedClient(sandbox.base_url) as own:
        await order(sandbox, own, receiver)
        await receiver.wait_for(1)
    assert sandbox.callbacks.tasks.busy
    await sandbox.close()
    assert not sandbox.callbacks.tasks.busy
