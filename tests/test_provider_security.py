"""The provider facing a downstream it cannot trust: callbacks that go to public addresses only, cancels that
say what happened, one timestamp window both ways, and secrets rotated without an outage.

One provider daemon B sells its mirror of a sandbox top to one account, with the default configuration a
downstream could abuse: the admin listener on loopback without a token, and callbacks limited to public
addresses (``[provider] allow_private_callback_url`` off). B's callback sender resolves names through a DNS of
the test's own (``downstream.test`` is 127.0.0.1), never the machine's resolver or hosts file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp.abc import ResolveResult
from sqlalchemy import update

from procurd.core.provider import ProviderOrder
from procurd.daemon import Daemon
from procurd.db.provider_schema import provider_old_secrets
from procurd.protocol.destinations import NotPublic, PublicResolver
from procurd.protocol.dujiao.callback import CALLBACK_PATH
from procurd.protocol.dujiao.signing import sign
from procurd.provider.callbacks import CallbackSender
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import CallbackReceiver, SignedClient
from procurd.systemd import Notifier
from provider_support import (
    NamedResolver,
    ProviderSite,
    add_account,
    ledger,
    provider_order_of,
    provider_settings,
    settled,
)
from support import AdminClient, mirror, sql_execute, wait_until
from test_provider_conformance import module_database_url

__all__ = ["module_database_url"]  # a fixture of this module too

pytestmark = pytest.mark.asyncio(loop_scope="module")

ACCOUNT = "shopC"
DOWNSTREAM = "downstream.test"  # what the test's DNS answers 127.0.0.1 for


@dataclass
class Provider:
    top: Sandbox
    b: Daemon
    site: ProviderSite
    signed: SignedClient
    admin: AdminClient
    resolver: NamedResolver
    skus: list[int]

    async def order(self, number: str, **fields: str) -> dict[str, object]:
        answer = await self.signed.create_order(self.skus[0], 1, downstream_order_no=number, **fields)
        assert answer.status == 200, answer.body
        body: dict[str, object] = answer.json()
        return body

    async def provider_order(self, number: str) -> ProviderOrder:
        account = await self.b.operations.provider.accounts.get(ACCOUNT)
        return await wait_until(lambda: provider_order_of(self.b.operations, account.id, number))

    async def metric(self, name: str, **labels: str) -> float:
        """One counter of B's ``/metrics`` (0 when no such series was counted)."""
        async with self.admin.session.get(f"{self.admin.base}/metrics") as response:
            text = await response.text()
        for line in text.splitlines():
            found = re.fullmatch(rf"{name}\{{(?P<labels>[^}}]*)\}} (?P<value>\S+)", line)
            if found and all(f'{key}="{value}"' in found["labels"] for key, value in labels.items()):
                return float(found["value"])
        return 0.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def provider(module_database_url: str) -> AsyncIterator[Provider]:
    config = SandboxConfig(products=3, skus_per_product=1, manual_ratio=0, allow_private_callbacks=True)
    async with Sandbox(config) as top:
        settings = provider_settings(
            module_database_url,
            ("top", top),
            provider={"allow_private_callback_url": False, "rate_limit_per_minute": 10_000},
        )
        await mirror(settings)
        resolver = NamedResolver({DOWNSTREAM: ["127.0.0.1"]})
        daemon = Daemon(settings, notifier=Notifier({}))
        daemon.operations.provider.sender = CallbackSender(
            settings.provider, resolver=resolver, metrics=daemon.runtime.metrics
        )
        await daemon.start()
        try:
            await settled(daemon)
            site = await add_account(daemon.operations, ACCOUNT, balance="10000.00")
            skus = [
                sku.id for product in top.state.active_products() for sku in product.skus if sku.is_active
            ]
            async with (
                SignedClient(site.base_url, site.api_key, site.api_secret, site.header_prefix) as signed,
                aiohttp.ClientSession() as session,
            ):
                yield Provider(top, daemon, site, signed, AdminClient(settings, session), resolver, skus)
        finally:
            await daemon.shutdown()


# --- callback addresses -------------------------------------------------------------------------------------

# Hosts a resolver or an HTTP client reads as an address, written in a form that is not canonical.
SHORTHAND_HOSTS = (
    "127.1", "2130706433", "0x7f000001", "0x7f.0.0.1", "0x7f.1", "0177.0.0.1", "①②⑦.０.０.①", "127。0。0。1",
    "10.1", "192.168.1", "0xa000001", "0xc0a80001", "0xa9fea9fe",
)  # fmt: skip
# Canonical literals that are not public addresses.
PRIVATE_HOSTS = (
    "127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
    "224.0.0.1", "[::1]", "[::]", "[fe80::1]", "[fc00::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]",
    "[::127.0.0.1]", "[2002:7f00:1::]", "[2002:a00:1::]", "[64:ff9b::a9fe:a9fe]", "localhost",
)  # fmt: skip


async def test_callback_urls_that_are_no_name_or_public_address_are_refused(provider: Provider) -> None:
    """An order whose ``callback_url`` host is an address in a shorthand or numeric form, or a canonical
    address that is not public, is refused 400 ``invalid_callback_url`` naming the setting that decides it
    (the provider's own ``[provider] allow_private_callback_url``); nothing is charged or created."""
    before = await provider.b.operations.provider.accounts.get(ACCOUNT)
    moves = await ledger(provider.b.operations, ACCOUNT)
    for number, host in enumerate((*SHORTHAND_HOSTS, *PRIVATE_HOSTS)):
        url = f"http://{host}:8081/api/v1/orders/SF-DEMO-1/cancel"
        answer = await provider.signed.create_order(
            provider.skus[0], 1, downstream_order_no=f"CB-{number}", callback_url=url
        )
        assert (answer.status, answer.error_code) == (400, "invalid_callback_url"), (host, answer.body)
        message = answer.json()["error_message"]
        assert "[provider] allow_private_callback_url" in message, message
        if host in SHORTHAND_HOSTS:
            assert "not canonical" in message, (host, message)
    after = await provider.b.operations.provider.accounts.get(ACCOUNT)
    assert after.balance_cents == before.balance_cents
    assert await ledger(provider.b.operations, ACCOUNT) == moves
    _, orders = await provider.b.operations.provider.orders(ACCOUNT, None, 1, 100)
    assert not [order for order in orders if str(order["downstream_order_no"]).startswith("CB-")]


async def test_a_name_resolving_to_loopback_is_never_called_and_the_admin_listener_never_reached(
    provider: Provider,
) -> None:
    """The exploit: a downstream names a host resolving to 127.0.0.1 and the path of B's own admin API that
    cancels the shop's order SF-DEMO-1. The order is accepted (a name is not resolved at creation), but when
    B calls back the name is resolved, found to have no public address, and nothing is sent: the admin
    listener never sees the request, SF-DEMO-1 is not canceled. The refused try is in the order's delivery
    log with its reason, counted, and waits for its retry like any failed try."""
    b = provider.b
    admin_port = b.settings.server.admin_port
    provider.top.faults.hold_delivery_next()
    item = {"upstream": "top", "sku_id": provider.skus[1], "quantity": 1}
    shop = await provider.admin.submit("SF-DEMO-1", item)
    assert shop["status"] in ("paid", "fulfilling")
    await provider.admin.wait_state("SF-DEMO-1", "submitted")

    target = f"http://{DOWNSTREAM}:{admin_port}/api/v1/orders/SF-DEMO-1/cancel"
    await provider.order("EXPLOIT-1", callback_url=target)
    order = await provider.provider_order("EXPLOIT-1")

    async def refused_try() -> dict[str, Any] | None:
        # A try is in the log from its claim on (in flight); wait for its outcome.
        detail = await b.operations.provider.order_detail(order.id)
        log = detail["callback_log"]
        return detail if log and log[0]["outcome"] != "in_flight" else None

    detail = await wait_until(refused_try)
    (attempt,) = detail["callback_log"]
    assert (attempt["ok"], attempt["http_status"]) == (False, None)
    message = str(attempt["message"])
    assert message.startswith("refused, nothing sent: host downstream.test resolves to no public"), message
    assert "127.0.0.1, a loopback address" in message
    state = detail["callback"]
    assert (state["pending"], state["given_up_at"]) == (True, None)
    assert state["next_attempt_at"] is not None
    assert str(state["last_error"]).startswith("refused, nothing sent")
    assert DOWNSTREAM in provider.resolver.asked  # resolved when the callback was sent

    assert (await provider.admin.order("SF-DEMO-1"))["status"] != "canceled"
    cancels = await provider.metric(
        "procurd_http_requests_total", listener="admin", route="/api/v1/orders/{order_no}/cancel"
    )
    assert cancels == 0, "the admin listener was reached"
    assert await provider.metric("procurd_provider_callbacks_refused_total", account=ACCOUNT) >= 1


async def test_the_sender_connects_only_to_checked_addresses(provider: Provider) -> None:
    """With callbacks limited to public addresses, B's sender refuses a URL whose host is a private literal
    or a shorthand for one (written before such URLs were refused at creation) without resolving or sending
    anything, and a name whose every address is private; :class:`PublicResolver` hands the connection only
    the public addresses of a name, whatever else the name answers, and checks every answer again (a name
    that answers a public address once and loopback the next time gains nothing). With
    ``allow_private_callback_url`` the same name reaches the receiver on loopback, through the same
    injected resolver."""
    base = await provider.provider_order("EXPLOIT-1")
    account = await provider.b.operations.provider.accounts.get(ACCOUNT)
    async with CallbackReceiver(account.api_key, provider.site.api_secret) as receiver:
        port = int(receiver.url.split(":")[2].split("/")[0])
        resolver = NamedResolver({DOWNSTREAM: ["127.0.0.1"]})
        public_only = CallbackSender(provider.b.settings.provider, resolver=resolver)
        try:
            for host in ("127.0.0.1", "0x7f000001", "127.1", "[::1]", DOWNSTREAM):
                order = dataclasses.replace(base, callback_url=f"http://{host}:{port}/hooks/upstream")
                delivery = await public_only.send(account, order)
                assert (delivery.ok, delivery.refused) == (False, True), (host, delivery)
        finally:
            await public_only.close()
        assert resolver.asked == [DOWNSTREAM]  # literals are judged as written, never resolved
        assert receiver.received == []

        allowing = provider.b.settings.provider.model_copy(update={"allow_private_callback_url": True})
        sender = CallbackSender(allowing, resolver=resolver)
        try:
            order = dataclasses.replace(base, callback_url=f"http://{DOWNSTREAM}:{port}/hooks/upstream")
            delivery = await sender.send(account, order)
        finally:
            await sender.close()
        assert (delivery.ok, delivery.http_status, delivery.refused) == (True, 200, False), delivery
        (received,) = receiver.received
        assert received.signature_valid

    mixed = PublicResolver(NamedResolver({"mixed.test": ["127.0.0.1", "93.184.216.34", "::1", "10.0.0.7"]}))
    assert [result["host"] for result in await mixed.resolve("mixed.test", 80)] == ["93.184.216.34"]

    class Rebinding(NamedResolver):
        async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
        ) -> list[ResolveResult]:
            answers = await super().resolve(host, port, family)
            self.names[host] = ["127.0.0.1"]  # the next answer is loopback
            return answers

    rebinding = PublicResolver(Rebinding({"rebind.test": ["93.184.216.34"]}))
    assert [result["host"] for result in await rebinding.resolve("rebind.test", 80)] == ["93.184.216.34"]
    with pytest.raises(NotPublic, match=r"rebind\.test resolves to no public address \(127\.0\.0\.1, a"):
        await rebinding.resolve("rebind.test", 80)


# --- cancels and the timestamp window -----------------------------------------------------------------------


async def test_concurrent_cancels_of_one_order_answer_canceled_and_refund_once(provider: Provider) -> None:
    """20 cancels of one order at once (a downstream that lost the first answer and asks again): every one
    answers 200 ``canceled``, the top's order is canceled once, the wallet refunded once; a cancel after that
    answers 200 ``canceled`` too, as a repeated order answers the existing one."""
    provider.top.faults.pending_payment_next()  # the top takes it unpaid: it can still be canceled there
    before = await provider.b.operations.provider.accounts.get(ACCOUNT)
    await provider.order("CANCEL-20")
    order = await provider.provider_order("CANCEL-20")

    async def submitted() -> bool:
        view = await provider.b.operations.orders.view(order.order_no)
        return bool(view["procurements"][0]["state"] == "submitted")

    await wait_until(submitted)
    answers = await asyncio.gather(*(provider.signed.post(f"/orders/{order.id}/cancel") for _ in range(20)))
    assert [(a.status, a.json().get("status"), a.json().get("ok")) for a in answers] == [
        (200, "canceled", True)
    ] * 20, [a.body for a in answers]
    again = await provider.signed.post(f"/orders/{order.id}/cancel")
    assert (again.status, again.json()["status"]) == (200, "canceled")

    (top_order,) = provider.top.orders_for(order.order_no)
    assert top_order.status == "canceled"
    moves = [e.kind for e in await ledger(provider.b.operations, ACCOUNT) if e.order_id == order.id]
    assert moves == ["order", "refund"]
    after = await provider.b.operations.provider.accounts.get(ACCOUNT)
    assert after.balance_cents == before.balance_cents


async def at_the_start_of_a_second() -> float:
    """The wall clock early in a second (at most 0.4 s into it): what follows is answered within it."""
    return await wait_until(lambda: (now := time.time()) - math.floor(now) < 0.4 and now, interval=0.01)


async def test_a_timestamp_60_s_old_is_as_fresh_as_one_60_s_ahead(provider: Provider) -> None:
    """Early in a second, a request signed exactly 60 s before that second and one exactly 60 s after it
    are both accepted, by the provider's signed API and by B's own callback receiver (both count whole
    seconds; 60 s old used to be refused whenever the clock was past the second's start)."""
    top = provider.top.config
    public = f"http://127.0.0.1:{provider.b.settings.server.public_port}"
    async with aiohttp.ClientSession() as session:
        for shift in (-60, 60):
            second = math.floor(await at_the_start_of_a_second())
            ping = await provider.signed.post("/ping", timestamp=second + shift)
            assert ping.status == 200, (shift, ping.body)
            body = b'{"order_id": 1, "downstream_order_no": "NOBODY", "status": "paid"}'
            headers = {
                "Service-Api-Key": top.api_key,
                "Service-Timestamp": str(second + shift),
                "Service-Signature": sign(top.api_secret, "POST", CALLBACK_PATH, second + shift, body),
            }
            async with session.post(public + CALLBACK_PATH, data=body, headers=headers) as response:
                answer = await response.json()
            assert answer.get("error_code") not in ("timestamp_expired", "invalid_signature"), (shift, answer)
            assert response.status == 404, (shift, answer)  # checked, signed, and about no order of B's


# --- rotation without an outage -----------------------------------------------------------------------------


async def test_the_previous_secret_works_inside_the_overlap_is_counted_and_ends_after_it(
    provider: Provider,
) -> None:
    """After a rotation through the admin API (``overlap_hours``), requests signed with the previous secret
    are accepted and counted (the account's view and ``procurd_provider_old_secret_requests``) while the new
    one works too; once the overlap is over they answer 401 ``invalid_signature``. Callbacks are signed with
    the new secret from the rotation on. ``{"now": true}`` ends every secret but the new one at once."""
    b = provider.b
    site = await add_account(b.operations, "rotating", balance="10.00")
    status, rotated = await provider.admin.call(
        "POST", "/api/v1/provider/accounts/rotating/rotate", {"overlap_hours": 1}
    )
    assert status == 200, rotated
    assert set(rotated) == {"ok", "account", "api_secret", "old_valid_until"}
    assert "old_secrets" not in rotated["account"]
    new_secret = rotated["api_secret"]
    async with (
        SignedClient(site.base_url, site.api_key, site.api_secret, site.header_prefix) as old,
        SignedClient(site.base_url, site.api_key, new_secret, site.header_prefix) as new,
    ):
        assert (await new.post("/ping")).status == 200
        assert [(await old.post("/ping")).status for _ in range(3)] == [200] * 3
        status, shown = await provider.admin.call("GET", "/api/v1/provider/accounts/rotating")
        (previous,) = shown["account"]["old_secrets"]
        assert previous["valid_until"] == rotated["old_valid_until"]
        assert previous["requests"] == 3
        assert await provider.metric("procurd_provider_old_secret_requests_total", account="rotating") == 3

        # Callbacks: signed with the account's secret as it is now, the new one.
        account = await b.operations.provider.accounts.get("rotating")
        await provider.order("ROTATION-1")
        base = await provider.provider_order("ROTATION-1")
        async with CallbackReceiver(site.api_key, new_secret) as receiver:
            allowing = b.settings.provider.model_copy(update={"allow_private_callback_url": True})
            sender = CallbackSender(allowing)
            try:
                delivery = await sender.send(account, dataclasses.replace(base, callback_url=receiver.url))
            finally:
                await sender.close()
            assert delivery.ok
            assert [callback.signature_valid for callback in receiver.received] == [True]

        # The overlap ends (as an hour later): the previous secret is refused, the new one goes on.
        ended = update(provider_old_secrets).values(valid_until=datetime.now(UTC) - timedelta(seconds=1))
        assert await sql_execute(b.runtime.database, ended) >= 1

        async def refused() -> bool:
            return (await old.post("/ping")).error_code == "invalid_signature"

        await wait_until(refused)
        assert (await new.post("/ping")).status == 200

    status, leaked = await provider.admin.call(
        "POST", "/api/v1/provider/accounts/rotating/rotate", {"now": True}
    )
    assert (status, leaked["old_valid_until"]) == (200, None)
    async with SignedClient(site.base_url, site.api_key, new_secret, site.header_prefix) as previous_client:
        assert (await previous_client.post("/ping")).error_code == "invalid_signature"
    refusals = [({"overlap_hours": -1}, "invalid_overlap"), ({"overlap_hours": "2"}, "invalid_overlap"),
                ({"now": "yes"}, "invalid_request"), ({"later": 1}, "invalid_request")]  # fmt: skip
    for body, code in refusals:
        status, answer = await provider.admin.call("POST", "/api/v1/provider/accounts/rotating/rotate", body)
        assert (status, answer["error_code"]) == (400, code), (body, answer)
