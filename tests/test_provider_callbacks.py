"""The provider's callbacks to downstream sites: each provider order's status pushed to its ``callback_url``,
signed with the account's key and secret over ``/api/v1/upstream/callback`` (seed 000 4.8 and part 5), from a
durable outbox with backoff, a delivery log, give-up after ``[provider] callback_give_up_seconds``, the alert
``provider_callbacks_failing``, and a replay by an operator.

A chain of real servers: the sandbox upstream, a provider daemon mirroring it, and a downstream endpoint of
the test's own that records each push and answers it as the test planned. The signature is checked here by
hand (HMAC-SHA256 over method, fixed path, timestamp and the body's MD5), not with procurd's own code. Each
order's callback state and delivery log are read from the admin API (``GET /api/v1/provider/orders/{id}``).

Backoff is checked in what the dispatcher records (each failed try's time and the next try's time, whose
difference is ``retry_in``: 30 s, 60 s, 120 s ...); the test does not wait those seconds: once it has read
the schedule it makes the next try due now in ``provider_callbacks`` (what the passing of that time would
do) and wakes the dispatcher as the state path does.

The sender's 15 s timeout has no setting, so the no-answer path is driven by a downstream that holds the
connection (the try is in flight: not logged, nothing sent twice) and then drops it without an answer; the
try is then logged without an HTTP status, like a timeout, and retried at the next step of the backoff.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiohttp import web
from sqlalchemy import select, update

from procurd.daemon import Daemon
from procurd.db.provider_schema import provider_callbacks
from procurd.db.schema import alerts
from procurd.db.types import utcnow
from procurd.provider.callbacks import retry_in
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import ControlClient, SignedClient
from provider_support import ProviderSite, add_account, provider_settings
from support import AdminClient, captured_log, mirror, running_daemon, sql_execute, sql_rows, wait_until

CALLBACK_PATH = "/api/v1/upstream/callback"
STATUS_ORDER = {"paid": 0, "fulfilling": 1, "partially_delivered": 2, "delivered": 3, "completed": 4}
HOLD = None  # a planned "answer": hold the connection until released, then drop it without an answer
TIMEOUT = 3  # callback_timeout_seconds where a test needs a try to time out (room for the checks before)


@dataclass(frozen=True)
class Push:
    """One callback as the downstream received it."""

    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        data = json.loads(self.body)
        assert isinstance(data, dict)
        return data

    @property
    def status(self) -> str:
        return str(self.json()["status"])

    def signed_by(self, site: ProviderSite) -> bool:
        """Whether the push carries ``site``'s key and a valid seed 000 part 5 signature over POST and the
        fixed path ``/api/v1/upstream/callback`` (computed here by hand)."""
        prefix = site.header_prefix
        stamp = self.headers.get(f"{prefix}-Timestamp", "")
        digest = hashlib.md5(self.body, usedforsecurity=False).hexdigest()
        text = "\n".join(("POST", CALLBACK_PATH, stamp, digest)).encode()
        expected = hmac.new(site.api_secret.encode(), text, hashlib.sha256).hexdigest()
        return self.headers.get(f"{prefix}-Api-Key") == site.api_key and hmac.compare_digest(
            expected, self.headers.get(f"{prefix}-Signature", "")
        )

    def timestamp(self, site: ProviderSite) -> int:
        return int(self.headers[f"{site.header_prefix}-Timestamp"])


@dataclass
class Downstream:
    """A downstream site's callback endpoint on 127.0.0.1: records every push and answers it with the next
    answer planned for its status (``(http_status, body)``, or :data:`HOLD`), ``{"ok": true, "message":
    "received"}`` when none is planned."""

    path: str = "/hooks/procurd"
    pushes: list[Push] = field(default_factory=list)
    plans: dict[str, list[tuple[int, Any] | None]] = field(default_factory=dict)
    failing: bool = False  # every push answered HTTP 500 while set
    split: bool = False  # the success answer written in two pieces, the second a moment after the first
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    _runner: web.AppRunner | None = None

    def plan(self, status: str, *answers: tuple[int, Any] | None) -> None:
        self.plans.setdefault(status, []).extend(answers)

    def of_status(self, status: str) -> list[Push]:
        return [push for push in self.pushes if push.status == status]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        push = Push(request.path, dict(request.headers), await request.read())
        self.pushes.append(push)
        planned = self.plans.get(push.status)
        if planned:
            answer = planned.pop(0)
            if answer is HOLD:
                self.holding.set()
                await self.release.wait()
                assert request.transport is not None
                request.transport.close()  # no answer at all
                return web.Response()
            status, body = answer
        elif self.failing:
            status, body = 500, {"ok": False, "message": "down"}
        elif self.split:
            return await self._in_pieces(request, json.dumps({"ok": True, "message": "received"}).encode())
        else:
            status, body = 200, {"ok": True, "message": "received"}
        return web.json_response(body, status=status)

    @staticmethod
    async def _in_pieces(request: web.Request, body: bytes) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(body[:9])
        await asyncio.sleep(0.1)  # the first piece is on its way alone
        await response.write(body[9:])
        await response.write_eof()
        return response

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self._runner = runner
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}{self.path}"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()


@dataclass
class Chain:
    """The sandbox, a provider daemon selling its mirror, and one account's signed client."""

    sandbox: Sandbox
    daemon: Daemon
    site: ProviderSite
    client: SignedClient
    admin: AdminClient
    sku_id: int

    async def order(self, downstream: Downstream, number: str) -> int:
        """A paid order of one unit with its callback to ``downstream``; its provider order id."""
        answer = await self.client.create_order(
            self.sku_id, 1, downstream_order_no=number, callback_url=downstream.url
        )
        body = answer.json()
        assert (answer.status, body["ok"], body["status"]) == (200, True, "paid"), body
        return int(body["order_id"])

    async def detail(self, order_id: int) -> dict[str, Any]:
        """The provider order with its callback state and delivery log (the newest try first), as the admin
        API shows it."""
        status, body = await self.admin.call("GET", f"/api/v1/provider/orders/{order_id}")
        assert status == 200, body
        return body["order"]  # type: ignore[no-any-return]

    async def tries(self, order_id: int, count: int) -> dict[str, Any]:
        """The order's detail once its delivery log holds ``count`` tries that ended (not in flight)."""

        async def logged() -> dict[str, Any] | None:
            detail = await self.detail(order_id)
            ended = [t for t in detail["callback_log"] if t["outcome"] != "in_flight"]
            return detail if len(ended) >= count else None

        return await wait_until(logged)

    async def due_now(self, order_id: int) -> None:
        """Let the wait the dispatcher scheduled pass: the pending callback's next try is due now."""
        statement = (
            update(provider_callbacks)
            .where(provider_callbacks.c.order_id == order_id, provider_callbacks.c.pending.is_(True))
            .values(next_attempt_at=utcnow())
        )
        assert await sql_execute(self.daemon.runtime.database, statement) == 1
        self.daemon.runtime.service.wakeups.provider_callbacks.set()

    async def upstream_order(self, order_id: int) -> int:
        """The id of the sandbox's order bought for provider order ``order_id``, once it is bought."""

        async def bought() -> int | None:
            procurement = (await self.detail(order_id))["procurement"]["procurements"][0]
            return procurement["upstream_order_id"]  # type: ignore[no-any-return]

        return await wait_until(bought)

    async def deliver_upstream(self, order_id: int) -> dict[str, Any]:
        """The sandbox delivers the upstream order bought for provider order ``order_id``: its fulfillment."""
        upstream_order_id = await self.upstream_order(order_id)
        async with ControlClient(self.sandbox.base_url) as control:
            answer = await control.post(f"/orders/{upstream_order_id}/deliver", {})
        return answer["order"]["fulfillment"]  # type: ignore[no-any-return]


@asynccontextmanager
async def provider_chain(
    database_url: str, *, auto_deliver: bool = True, **provider: Any
) -> AsyncIterator[Chain]:
    config = SandboxConfig(
        products=3,
        skus_per_product=1,
        manual_ratio=0,
        allow_private_callbacks=True,
        auto_deliver=auto_deliver,
    )
    async with Sandbox(config) as sandbox:
        settings = provider_settings(database_url, ("main", sandbox), provider=provider)
        await mirror(settings)
        async with running_daemon(settings) as daemon:
            site = await add_account(daemon.operations, "downstream")
            async with (
                SignedClient(site.base_url, site.api_key, site.api_secret) as client,
                aiohttp.ClientSession() as session,
            ):

                async def offered() -> int | None:
                    for product in await client.list_all_products():
                        for sku in product["skus"]:
                            if sku["is_active"] and sku["stock_status"] != "out_of_stock":
                                return int(sku["id"])
                    return None

                admin = AdminClient(settings, session)
                yield Chain(sandbox, daemon, site, client, admin, await wait_until(offered))


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text)


def scheduled_wait(detail: dict[str, Any]) -> timedelta:
    """How long after its latest failed try the dispatcher scheduled the next one."""
    return instant(detail["callback"]["next_attempt_at"]) - instant(detail["callback_log"][0]["at"])


async def test_a_delivered_order_is_pushed_signed_with_the_seed_fields_and_its_fulfillment(
    database_url: str,
) -> None:
    """A delivered order's callback reaches the downstream's URL (whatever its path) signed with the
    account's key and secret over ``/api/v1/upstream/callback``; it has seed 000 4.8's fields and the
    upstream's fulfillment, as ``GET /orders/{id}`` shows it; the delivery log records the try. Neither the
    account's secret nor the delivered goods are in procurd's log."""
    with captured_log("info") as log:
        async with provider_chain(database_url, auto_deliver=False) as chain, Downstream() as downstream:
            order_id = await chain.order(downstream, "D-1")
            fulfillment = await chain.deliver_upstream(order_id)
            await wait_until(lambda: downstream.of_status("delivered"))
            push = downstream.of_status("delivered")[0]
            assert push.path == downstream.path
            assert push.signed_by(chain.site)
            body = push.json()
            assert abs(push.timestamp(chain.site) - time.time()) < 60
            detail = await chain.tries(order_id, len(downstream.pushes))
            assert body == {
                "event": "order.fulfilled",
                "order_id": order_id,
                "order_no": detail["order_no"],
                "downstream_order_no": "D-1",
                "status": "delivered",
                "timestamp": push.timestamp(chain.site),
                "fulfillment": body["fulfillment"],
            }
            passed = body["fulfillment"]
            assert {key: passed[key] for key in ("type", "status", "payload", "delivery_data")} == {
                key: fulfillment[key] for key in ("type", "status", "payload", "delivery_data")
            }
            assert set(passed) >= {"type", "status", "payload", "delivery_data", "delivered_at"}
            assert passed["delivered_at"]
            queried = (await chain.client.get(f"/orders/{order_id}")).json()
            assert queried["status"] == "delivered"
            assert queried["fulfillment"] == passed

            assert all(p.signed_by(chain.site) for p in downstream.pushes)
            assert [p.status for p in downstream.pushes] == ["delivered"]  # a new order's status is answered
            latest = detail["callback_log"][0]
            assert latest == {
                "at": latest["at"], "status": "delivered", "http_status": 200, "ok": True,
                "message": "received", "replay": False, "outcome": "ok",
            }  # fmt: skip
            state = detail["callback"]
            assert state["status"] == "delivered"
            assert state["pending"] is False
            assert state["delivered_at"]
    text = log.getvalue()
    assert "provider.callback_delivered" in text
    assert chain.site.api_secret not in text
    assert all(line not in text for line in passed["payload"].splitlines())


async def test_failed_tries_are_logged_and_retried_on_the_backoff_until_the_downstream_takes_it(
    database_url: str,
) -> None:
    """The downstream answers the delivered callback HTTP 500, then does not answer within
    ``callback_timeout_seconds``, then answers ``{"ok": false}``, then takes it. Each try is in the order's
    delivery log with its HTTP status and message; after each failure the next try is scheduled
    ``retry_in(n)`` later (30 s, 60 s, 120 s); a try in flight is logged once it ends (no HTTP status when no
    answer came); in the end it is delivered, every push signed and carrying the fulfillment."""
    async with (
        provider_chain(database_url, auto_deliver=False, callback_timeout_seconds=TIMEOUT) as chain,
        Downstream() as downstream,
    ):
        order_id = await chain.order(downstream, "D-2")
        downstream.plan(
            "delivered", (500, {"ok": False, "message": "internal trouble"}), HOLD, (200, {"ok": False})
        )
        await chain.deliver_upstream(order_id)

        detail = await chain.tries(order_id, 1)
        latest = detail["callback_log"][0]
        assert (latest["status"], latest["http_status"], latest["ok"], latest["message"]) == (
            "delivered", 500, False, "internal trouble",
        )  # fmt: skip
        assert detail["callback"]["attempts"] == 1
        assert detail["callback"]["pending"] is True
        assert scheduled_wait(detail) == timedelta(seconds=retry_in(1)) == timedelta(seconds=30)
        assert detail["callback"]["last_error"] == "HTTP 500: internal trouble"

        await chain.due_now(order_id)
        await asyncio.wait_for(downstream.holding.wait(), 20)
        # In flight: in the log as in flight (so that a crash now leaves it there), its state unchanged, not
        # sent a second time meanwhile.
        in_flight = await chain.detail(order_id)
        assert [(t["outcome"], t["http_status"], t["message"]) for t in in_flight["callback_log"]] == [
            ("in_flight", None, "in flight: no answer yet"), ("failed", 500, "internal trouble"),
        ]  # fmt: skip
        assert in_flight["callback"]["attempts"] == 1
        assert len(downstream.of_status("delivered")) == 2

        detail = await chain.tries(order_id, 2)  # the sender gave up waiting for an answer
        downstream.release.set()
        latest = detail["callback_log"][0]
        assert (latest["status"], latest["http_status"], latest["ok"]) == ("delivered", None, False)
        assert latest["message"] == f"no answer within {TIMEOUT:g} s"
        assert detail["callback"]["last_error"] == f"no answer: no answer within {TIMEOUT:g} s"
        assert scheduled_wait(detail) == timedelta(seconds=retry_in(2)) == timedelta(seconds=60)
        assert len(downstream.of_status("delivered")) == 2

        await chain.due_now(order_id)
        detail = await chain.tries(order_id, 3)
        latest = detail["callback_log"][0]
        assert (latest["status"], latest["http_status"], latest["ok"], latest["message"]) == (
            "delivered", 200, False, None,
        )  # fmt: skip
        assert detail["callback"]["last_error"] == "HTTP 200"
        assert scheduled_wait(detail) == timedelta(seconds=retry_in(3)) == timedelta(seconds=120)

        await chain.due_now(order_id)
        detail = await chain.tries(order_id, 4)
        latest = detail["callback_log"][0]
        assert (latest["status"], latest["http_status"], latest["ok"], latest["message"]) == (
            "delivered", 200, True, "received",
        )  # fmt: skip
        state = detail["callback"]
        assert state["pending"] is False
        assert state["delivered_at"]
        assert state["next_attempt_at"] is None
        assert state["attempts"] == 4
        assert state["last_error"] is None
        assert [(t["status"], t["http_status"], t["ok"]) for t in reversed(detail["callback_log"])] == [
            ("delivered", 500, False), ("delivered", None, False),
            ("delivered", 200, False), ("delivered", 200, True),
        ]  # fmt: skip

        pushes = downstream.of_status("delivered")
        assert len(pushes) == 4
        assert all(push.signed_by(chain.site) for push in pushes)
        assert all(push.json()["fulfillment"] == detail["fulfillment"] for push in pushes)
        assert detail["status"] == "delivered"


async def test_a_callback_failing_past_the_give_up_time_is_given_up_alerted_once_and_replayed(
    database_url: str,
) -> None:
    """With ``callback_give_up_seconds`` short, a downstream that keeps failing gets the callback given up
    at the first try past that time (shown in the order's callback state and log). The checks raise
    ``provider_callbacks_failing`` once for the account: one row, count 1, however often they run. A replay
    while it still fails is logged and changes nothing else. Once the downstream is back, a replay delivers
    the order's status signed afresh, the log shows the replay, and ``GET /orders/{id}`` agrees with what
    was pushed. Nothing secret or delivered is logged."""
    give_up = 0.5
    with captured_log("info") as log:
        async with (
            provider_chain(database_url, callback_give_up_seconds=give_up) as chain,
            Downstream(failing=True) as downstream,
        ):
            order_id = await chain.order(downstream, "D-3")

            async def first_failure() -> dict[str, Any] | None:
                detail = await chain.detail(order_id)
                state = detail["callback"]
                ready = state is not None and state["status"] == "delivered" and state["attempts"] == 1
                return detail if ready else None

            detail = await wait_until(first_failure)
            assert detail["callback"]["pending"] is True
            assert detail["callback"]["given_up_at"] is None
            await chain.daemon.operations.provider.check()
            assert await alert_rows(chain) == []  # failing, not given up, and not for long yet

            first_at = instant(detail["callback"]["first_attempt_at"])
            await wait_until(lambda: utcnow() >= first_at + timedelta(seconds=give_up))
            tried = len(detail["callback_log"])
            await chain.due_now(order_id)
            detail = await chain.tries(order_id, tried + 1)
            state = detail["callback"]
            assert state["given_up_at"]
            assert state["pending"] is False
            assert state["next_attempt_at"] is None
            assert state["delivered_at"] is None
            assert state["last_error"] == "HTTP 500: down"
            latest = detail["callback_log"][0]
            assert (latest["status"], latest["http_status"], latest["ok"]) == ("delivered", 500, False)

            for _ in range(3):
                await chain.daemon.operations.provider.check()
            rows = await alert_rows(chain)
            assert len(rows) == 1, rows
            assert rows[0].subject == "downstream"
            assert rows[0].count == 1
            assert "given up" in rows[0].message

            # A replay while the downstream still fails is logged, and changes nothing else.
            failed = await chain.daemon.operations.provider.replay(order_id)
            latest = failed["callback_log"][0]
            assert (latest["http_status"], latest["ok"], latest["replay"]) == (500, False, True)
            assert failed["callback"] == state

            downstream.failing = False
            last = downstream.pushes[-1]
            await wait_until(lambda: int(time.time()) > last.timestamp(chain.site))
            replayed = await chain.daemon.operations.provider.replay(order_id)
            push = downstream.pushes[-1]
            assert push is not last
            assert push.signed_by(chain.site)
            assert push.timestamp(chain.site) > last.timestamp(chain.site)
            assert push.json()["timestamp"] == push.timestamp(chain.site)
            latest = replayed["callback_log"][0]
            assert (latest["status"], latest["http_status"], latest["ok"], latest["replay"]) == (
                "delivered", 200, True, True,
            )  # fmt: skip
            state = replayed["callback"]
            assert state["delivered_at"]
            assert state["given_up_at"] is None
            assert state["pending"] is False

            queried = (await chain.client.get(f"/orders/{order_id}")).json()
            assert queried["status"] == push.status == replayed["status"] == "delivered"
            assert queried["fulfillment"] == push.json()["fulfillment"]
            payload = queried["fulfillment"]["payload"]

            await chain.daemon.operations.provider.check()
            assert [row.count for row in await alert_rows(chain)] == [1]
    text = log.getvalue()
    assert "provider.callback_given_up" in text
    assert chain.site.api_secret not in text
    assert all(line not in text for line in payload.splitlines())


async def test_a_newer_status_replaces_an_older_one_being_retried(database_url: str) -> None:
    """The upstream reports the order ``fulfilling``; that callback fails once and its retry is in flight (the
    downstream holds it) when the order is delivered: the delivered status replaces the older one; once the
    held try ends, the downstream is told ``delivered`` and never ``fulfilling`` again, and nothing is left
    pending."""
    async with provider_chain(database_url, auto_deliver=False) as chain, Downstream() as downstream:
        downstream.plan("fulfilling", (500, {"ok": False, "message": "not now"}), HOLD)
        order_id = await chain.order(downstream, "D-4")
        upstream_order_id = await chain.upstream_order(order_id)
        async with ControlClient(chain.sandbox.base_url) as control:
            await control.post(f"/orders/{upstream_order_id}/status", {"status": "fulfilling"})
        detail = await chain.tries(order_id, 1)
        assert detail["callback"]["status"] == "fulfilling"
        assert detail["callback"]["attempts"] == 1
        assert detail["status"] == "fulfilling"

        await chain.due_now(order_id)
        await asyncio.wait_for(downstream.holding.wait(), 20)
        await chain.deliver_upstream(order_id)

        async def replaced() -> bool:
            state = (await chain.detail(order_id))["callback"]
            return bool(state["status"] == "delivered" and state["pending"])

        await wait_until(replaced)
        assert downstream.of_status("delivered") == []  # not before the older try has ended
        downstream.release.set()

        await wait_until(lambda: downstream.of_status("delivered"))
        detail = await chain.tries(order_id, 3)
        assert [(t["status"], t["ok"]) for t in reversed(detail["callback_log"])] == [
            ("fulfilling", False), ("fulfilling", False), ("delivered", True),
        ]  # fmt: skip
        state = detail["callback"]
        assert state["status"] == "delivered"
        assert state["pending"] is False
        assert state["delivered_at"]
        told = [push.status for push in downstream.pushes]
        assert told == ["fulfilling", "fulfilling", "delivered"]
        assert all(push.signed_by(chain.site) for push in downstream.pushes)
        assert detail["status"] == "delivered"


async def test_a_downstream_that_holds_its_callback_does_not_hold_up_the_others(database_url: str) -> None:
    """While one downstream holds the connection of its callback (a try in flight until the sender's
    timeout), another order's callback to another downstream is sent and delivered; the held try is in the
    log as in flight, and gets its outcome once it ends."""
    async with (
        provider_chain(database_url, auto_deliver=False) as chain,
        Downstream() as slow,
        Downstream() as other,
    ):
        slow.plan("delivered", HOLD)
        held = await chain.order(slow, "D-6")
        meanwhile = await chain.order(other, "D-7")
        await chain.deliver_upstream(held)
        await asyncio.wait_for(slow.holding.wait(), 20)
        await chain.deliver_upstream(meanwhile)

        await wait_until(lambda: other.of_status("delivered"))
        detail = await chain.tries(meanwhile, 1)
        assert detail["callback"]["delivered_at"]
        [flying] = (await chain.detail(held))["callback_log"]  # still in flight
        assert flying["outcome"] == "in_flight"

        slow.release.set()
        detail = await chain.tries(held, 1)
        latest = detail["callback_log"][0]
        assert (latest["http_status"], latest["ok"]) == (None, False)
        assert detail["callback"]["pending"] is True


async def test_an_answer_that_arrives_in_pieces_is_read_to_its_end(database_url: str) -> None:
    """A downstream that writes its answer in two pieces (a chunked response, the second piece a moment
    later) is read to its end: the callback is delivered at the first try, the answer's message logged."""
    async with provider_chain(database_url) as chain, Downstream(split=True) as downstream:
        order_id = await chain.order(downstream, "D-5")
        await wait_until(lambda: downstream.of_status("delivered"))
        detail = await chain.tries(order_id, 1)
        latest = detail["callback_log"][0]
        assert (latest["status"], latest["http_status"], latest["ok"], latest["message"]) == (
            "delivered", 200, True, "received",
        )  # fmt: skip
        assert detail["callback"]["delivered_at"]
        assert len(downstream.pushes) == 1


async def alert_rows(chain: Chain) -> list[Any]:
    statement = select(alerts).where(alerts.c.kind == "provider_callbacks_failing")
    return list(await sql_rows(chain.daemon.runtime.database, statement))
