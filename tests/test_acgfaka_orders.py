"""procurd buying from an acg-faka shop (the sandbox shop, over real sockets) through its daemon: card goods
delivered from the trade's answer, manual goods polled until the seller types them in, each refusal, the
answers that leave the outcome unknown (never sent again), the sold-out race, the price check before the
trade, and one trade at a time per member account."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import aiohttp
import pytest
from sqlalchemy import select

from acgfaka_support import CARD, MANUAL, PLAIN, Choice, Mirrored, acg_block, mirror_shop, running_shop
from procurd.config import Settings
from procurd.core.clock import utcnow
from procurd.core.trades import Trade, TradeState
from procurd.db.database import open_database
from procurd.db.schema import alerts, outbox, upstream_trades
from procurd.operations.reconcile import ReconcileReport, reconcile
from procurd.operations.runtime import Runtime
from procurd.operations.trades import DatabaseTrades
from procurd.protocol.acgfaka import request_no
from procurd.protocol.acgfaka.refusals import SOLD_OUT_NOTICE
from procurd.sandbox.acgfaka import DEFAULT_APP_ID, AcgFakaSandbox
from procurd.sandbox.acgfaka.testing import ControlClient
from procurd.upstream.errors import OutcomeUnknown
from procurd.upstream.models import CreateOrderRequest
from support import AdminClient, config_data, running_daemon, sql_rows, wait_until

MONTH = Choice(CARD, "月卡", (("区服", "一区"),))  # 10.00


def acg_settings(database_url: str, shop: AcgFakaSandbox, **block: Any) -> Settings:
    data = config_data(
        database_url, storefront={"webhook_url": "http://127.0.0.1:9/events", "webhook_secret": "s" * 32}
    )
    data["upstreams"] = [acg_block(shop, **block)]
    return Settings(**data)


@asynccontextmanager
async def acg_daemon(settings: Settings) -> AsyncIterator[AdminClient]:
    async with running_daemon(settings), aiohttp.ClientSession() as session:
        yield AdminClient(settings, session)


def shop_orders(shop: AcgFakaSandbox) -> list[Any]:
    return list(shop.shop.orders.values())


def trades_sent(shop: AcgFakaSandbox) -> int:
    return int(shop.request_counts.get("trade", 0))


async def mirrored(admin: AdminClient, before: Mirrored) -> bool:
    """Whether the daemon's first catalogue pass of the shop has ended (the pass that mirrored the shop
    ``before`` the daemon started ended earlier)."""
    _, body = await admin.call("GET", "/api/v1/status")
    [upstream] = body["upstreams"]
    sync = upstream["last_sync"]
    started = datetime.fromisoformat(sync["started_at"])
    assert before.report.finished_at is not None
    return started > before.report.finished_at and sync["status"] in ("ok", "failed")


async def exception_of(admin: AdminClient, order_no: str) -> dict[str, Any]:
    order = await admin.wait_state(order_no, "exception")
    [item] = order["procurements"]
    return item  # type: ignore[no-any-return]


async def test_a_card_order_is_delivered_from_the_trades_answer(database_url: str) -> None:
    """Two cards bought in one trade under the procurement's request number, after a price check: the
    procurement goes straight to delivered with the goods, the amount the shop charged, and the storefront's
    order.delivered event."""
    async with running_shop() as shop:
        settings = acg_settings(database_url, shop)
        before = await mirror_shop(settings, MONTH)
        [sku] = before.skus
        async with acg_daemon(settings) as admin:
            await wait_until(lambda: mirrored(admin, before))  # the daemon's own pass asks its own prices
            priced = shop.request_counts.get("valuation", 0)
            item = {"upstream": "acg", "sku_id": sku, "quantity": 2, "max_unit_price": "12.00"}
            await admin.submit("C1", item)
            order = await admin.wait_status("C1", "delivered")
        [procurement] = order["procurements"]
        [bought] = shop_orders(shop)
        assert bought.request_no == request_no(procurement["downstream_order_no"], str(DEFAULT_APP_ID))
        assert (bought.num, bought.race, bought.sku) == (2, "月卡", {"区服": "一区"})
        assert procurement["fulfillment"]["payload_line_count"] == 2
        assert procurement["fulfillment"]["type"] == "auto"
        assert (procurement["amount"], procurement["upstream_order_no"]) == ("20.00", bought.trade_no)
        assert shop.request_counts["valuation"] == priced + 1  # the price check right before the trade
        assert trades_sent(shop) == 1
        events = await sql_rows(database_url, select(outbox.c.event).where(outbox.c.order_no == "C1"))
        assert [row.event for row in events][-1] == "order.delivered"
        agreeing = await reconcile_once(settings)
        assert (agreeing.checked, agreeing.findings, agreeing.errors) == (1, [], 0)
        del shop.shop.orders[bought.trade_no]  # the shop no longer holds it
        missing = await reconcile_once(settings)
        [finding] = missing.findings
        assert (finding.order_no, finding.upstream_order_id) == ("C1", int(bought.trade_no))


async def reconcile_once(settings: Settings) -> ReconcileReport:
    """One manual reconciliation pass (asks the shop's ``query`` of each trade)."""
    runtime = Runtime.build(settings)
    try:
        report = await reconcile(
            runtime.service,
            runtime.clients,
            runtime.alerts,
            window_seconds=3600,
            repair=False,
            trigger="manual",
        )
    finally:
        await runtime.close()
    return report


async def test_a_manual_order_is_delivered_when_the_seller_types_the_goods_in(database_url: str) -> None:
    """The trade answers the manual notice: the procurement waits (submitted), its polls ask ``query``, and
    the goods the seller types in deliver it; the buyer input went with the trade."""
    async with running_shop() as shop:
        settings = acg_settings(database_url, shop)
        [sku] = (await mirror_shop(settings, Choice(MANUAL))).skus  # 30.00, by hand
        async with acg_daemon(settings) as admin:
            form = {"game_uid": "1234567"}
            await admin.submit(
                "M1", {"upstream": "acg", "sku_id": sku, "quantity": 1, "manual_form_data": form}
            )
            waiting = await admin.wait_state("M1", "submitted")
            [bought] = shop_orders(shop)
            assert waiting["procurements"][0]["upstream_status"] == "fulfilling"
            assert bought.widget["game_uid"]["value"] == "1234567"
            await wait_until(lambda: shop.request_counts.get("query", 0) >= 1)
            shop.shop.deliver(bought.trade_no, "ACCOUNT-1 PASSWORD-1")
            order = await admin.wait_status("M1", "delivered")
        [procurement] = order["procurements"]
        assert procurement["fulfillment"]["payload_line_count"] == 1
        assert trades_sent(shop) == 1


REFUSALS = [
    ("库存不足", "insufficient_stock"),
    ("余额不足", "insufficient_balance"),
    ("此商品类型不存在[月卡]", "sku_unavailable"),
    ("当前商品已停售", "product_unavailable"),
]


async def test_each_refusal_is_an_exception_with_procurds_reason_and_nothing_bought(
    database_url: str,
) -> None:
    """Each known refusal of the trade is the exception of its reason; nothing is bought, and the item,
    sure to hold no order, may be canceled."""
    async with running_shop() as shop:
        settings = acg_settings(database_url, shop)
        [sku] = (await mirror_shop(settings, MONTH)).skus
        async with acg_daemon(settings) as admin, ControlClient(shop.base_url) as control:
            for number, (text, reason) in enumerate(REFUSALS):
                await control.post("/faults", {"knob": "refuse_next", "endpoint": "trade", "msg": text})
                await admin.submit(f"R{number}", {"upstream": "acg", "sku_id": sku, "quantity": 1})
                item = await exception_of(admin, f"R{number}")
                assert (item["exception_reason"], item["last_error_code"]) == (reason, reason)
            status, _ = await admin.call("POST", "/api/v1/orders/R0/cancel", {})
            assert status == 200
        assert shop_orders(shop) == []
        assert trades_sent(shop) == len(REFUSALS)


async def test_a_buyer_input_the_shop_refuses_is_input_rejected(database_url: str) -> None:
    """A game id the shop's rule refuses (procurd checks only that it is there) is refused with the
    commodity's own text for that input, which proves nothing was bought: exception ``input_rejected``, not
    ``outcome_unknown``, and the item may be canceled."""
    async with running_shop() as shop:
        settings = acg_settings(database_url, shop)
        [sku] = (await mirror_shop(settings, Choice(MANUAL))).skus  # 30.00, by hand
        async with acg_daemon(settings) as admin:
            form = {"game_uid": "12"}  # the shop's rule: 5 to 12 digits
            await admin.submit(
                "I1", {"upstream": "acg", "sku_id": sku, "quantity": 1, "manual_form_data": form}
            )
            item = await exception_of(admin, "I1")
            assert (item["exception_reason"], item["last_error_code"]) == ("input_rejected", "input_rejected")
            assert "游戏ID格式错误" in item["last_error_message"]
            status, _ = await admin.call("POST", "/api/v1/orders/I1/cancel", {})
            assert status == 200
        assert shop_orders(shop) == []
        assert trades_sent(shop) == 1


async def settled(admin: AdminClient, order_no: str) -> dict[str, Any]:
    """The order's one procurement once its trade was answered (delivered, waiting on the shop, or an
    exception)."""

    async def answered() -> dict[str, Any] | None:
        [procurement] = (await admin.order(order_no))["procurements"]
        return procurement if procurement["state"] in ("delivered", "submitted", "exception") else None

    return await wait_until(answered)


async def test_goods_the_shop_imported_are_read_as_the_other_shops_answer(database_url: str) -> None:
    """Goods the shop imported from another shop are mirrored as manual (with no buyer inputs: each order
    sends an empty form), but their answer is that shop's and never refreshed: its cards deliver at once,
    and its delivery notice is a paid order without its goods (``not_delivered``), never polled as a
    notice."""
    async with running_shop() as shop, ControlClient(shop.base_url) as control:
        category = next(iter(shop.shop.categories))
        for code, spec in (
            ("IMPORTED-CARDS", {"delivery_way": 0}),
            ("IMPORTED-HAND", {"delivery_way": 1, "stock": 5}),
        ):
            await control.post(
                "/commodities",
                {
                    "code": code,
                    "name": code,
                    "category_id": category,
                    "price": "8.00",
                    "shared_id": 3,
                    **spec,
                },
            )
        await control.post("/commodities/IMPORTED-CARDS/cards", {"cards": [{"secret": "UP-1"}]})
        settings = acg_settings(database_url, shop)
        mirrored_shop = await mirror_shop(settings, Choice("IMPORTED-CARDS"), Choice("IMPORTED-HAND"))
        cards, by_hand = mirrored_shop.skus
        form: dict[str, str] = {}  # goods without buyer inputs: an empty form
        async with acg_daemon(settings) as admin:
            await admin.submit(
                "X1", {"upstream": "acg", "sku_id": cards, "quantity": 1, "manual_form_data": form}
            )
            delivered = await settled(admin, "X1")
            await admin.submit(
                "X2", {"upstream": "acg", "sku_id": by_hand, "quantity": 1, "manual_form_data": form}
            )
            undelivered = await settled(admin, "X2")
        assert (delivered["state"], delivered["fulfillment"]["payload_line_count"]) == ("delivered", 1)
        assert (undelivered["state"], undelivered["exception_reason"]) == ("exception", "not_delivered")
        assert "never refreshed" in undelivered["last_error_message"]
        assert len(shop_orders(shop)) == 2
        assert trades_sent(shop) == 2


@pytest.mark.parametrize(
    ("fault", "bought", "cause", "resent"),
    [
        ({"knob": "lost_answer_next"}, 1, "lost_answer", "outcome_unknown"),
        ({"knob": "crash_next", "endpoint": "trade"}, 0, "not_json", "delivered"),
        (
            {"knob": "error_after_commit_next", "msg": "连接失败, 疑似被对方防火墙拦截"},
            1,
            "unrecognised_refusal",
            "outcome_unknown",
        ),
    ],
    ids=["lost-answer", "html-crash", "error-after-commit"],
)
async def test_an_unknown_outcome_is_never_sent_again(
    database_url: str, fault: dict[str, Any], bought: int, cause: str, resent: str
) -> None:
    """A trade whose answer leaves the outcome unknown is exception ``outcome_unknown``, shown with what a
    person needs (the request number, the balance before and after, the purchase records). It is sent once:
    not by the backoff, not by a person's ordinary retry (refused), not after a restart, not by the adapter
    asked again. A person who says nothing was bought sends it again under the same number: the shop that
    made the first one refuses the number (``outcome_unknown`` again, never a second purchase); the one that
    did not sells it once."""
    async with running_shop() as shop:
        settings = acg_settings(database_url, shop)
        [sku] = (await mirror_shop(settings, MONTH)).skus
        async with acg_daemon(settings) as admin, ControlClient(shop.base_url) as control:
            await control.post("/faults", fault)
            await admin.submit("U1", {"upstream": "acg", "sku_id": sku, "quantity": 1})
            item = await exception_of(admin, "U1")
            number = request_no(item["downstream_order_no"], str(DEFAULT_APP_ID))
            message = item["last_error_message"]
            assert item["exception_reason"] == "outcome_unknown"
            assert f"({cause})" in message
            assert number in message
            assert "balance before 1000" in message
            assert "balance after" in message
            assert f"{shop.base_url}/user/personal/purchaseRecord" in message
            retry = f"/api/v1/exceptions/{item['id']}/retry"
            status, refused = await admin.call("POST", retry, {})
            assert (status, refused["error_code"]) == (409, "outcome_unknown"), refused
            [alert] = await sql_rows(database_url, select(alerts.c.message).where(alerts.c.subject == "U1"))
            assert alert.message.startswith("outcome_unknown: order U1")
            assert "procurd never sends it again" in alert.message
        runtime = Runtime.build(settings)
        try:
            again = CreateOrderRequest(
                sku_id=sku, quantity=1, downstream_order_no=item["downstream_order_no"]
            )
            with pytest.raises(OutcomeUnknown) as raised:
                await runtime.client("acg").create_order(again)
            assert raised.value.cause == "sent_before"
        finally:
            await runtime.close()
        assert len(shop_orders(shop)) == bought
        assert trades_sent(shop) == 1
        async with acg_daemon(settings) as admin:
            assert (await admin.order("U1"))["procurements"][0]["state"] == "exception"
            status, refused = await admin.call("POST", retry, {"nothing_bought": True})
            assert (status, refused["error_code"]) == (400, "note_required"), refused
            status, _ = await admin.call("POST", retry, {"nothing_bought": True, "note": "no such purchase"})
            assert status == 200

            async def settled_again() -> dict[str, Any] | None:
                [procurement] = (await admin.order("U1"))["procurements"]
                done = (
                    procurement["state"] == "delivered" or procurement["last_error_code"] == "outcome_unknown"
                )
                return procurement if done and procurement["attempts"] == 1 else None

            after = await wait_until(settled_again)
        assert (after["state"], after["exception_reason"]) == (
            ("delivered", None) if resent == "delivered" else ("exception", "outcome_unknown")
        )
        if resent == "outcome_unknown":
            assert "(duplicate_request)" in after["last_error_message"]
        assert len(shop_orders(shop)) == 1
        assert trades_sent(shop) == 2


async def test_a_bulk_retry_leaves_what_it_never_sends_again_out_of_what_remains(database_url: str) -> None:
    """The two oldest exceptions are an unknown outcome and a paid order without its goods, the newest a
    refusal: a bulk retry sends the refusal again, says the other two are skipped with their reasons, and
    counts nothing as remaining (they are not retried, and never will be by a bulk retry)."""
    async with running_shop() as shop:
        settings = acg_settings(database_url, shop)
        before = await mirror_shop(settings, Choice(PLAIN))
        [sku] = before.skus
        async with (
            acg_daemon(settings) as admin,
            ControlClient(shop.base_url) as control,
        ):
            # the daemon's own pass ends first: one after the sold-out race would mirror no stock left
            await wait_until(lambda: mirrored(admin, before))
            faults = [
                ("B1", {"knob": "lost_answer_next"}),
                ("B2", {"knob": "sold_out_race_next"}),
                ("B3", {"knob": "refuse_next", "endpoint": "trade", "msg": "库存不足"}),
            ]
            ids = {}
            for order_no, fault in faults:
                await control.post("/faults", fault)
                await admin.submit(order_no, {"upstream": "acg", "sku_id": sku, "quantity": 1})
                ids[order_no] = (await exception_of(admin, order_no))["id"]
            # the sold-out race took every card: the shop is stocked again
            await control.post(f"/commodities/{PLAIN}/cards", {"cards": [{"secret": "P-new"}]})
            for first in (True, False):  # the second finds nothing left to send, and still says why
                status, body = await admin.call(
                    "POST", "/api/v1/exceptions/retry", {"upstream": "acg", "limit": 2}
                )
                assert status == 200, body
                assert (body["retried"], body["remaining"]) == ([ids["B3"]] if first else [], 0)
                skipped = [(item["id"], item["error_code"]) for item in body["skipped"]]
                assert skipped == [(ids["B1"], "outcome_unknown"), (ids["B2"], "not_delivered")]
                assert "settle it with the upstream" in body["skipped"][0]["message"]
                if first:
                    await admin.wait_status("B3", "delivered")
        assert trades_sent(shop) == 4  # B3 twice, B1 and B2 once


async def test_a_trade_an_instance_died_during_is_never_sent_again(database_url: str) -> None:
    """An instance wrote its trade and died before the answer (the row says "sending"): the procurement,
    taken again, sends nothing, not even the price check, and is ``outcome_unknown`` with what was known."""
    async with running_shop() as shop:
        settings = acg_settings(database_url, shop)
        before = await mirror_shop(settings, MONTH)
        [sku] = before.skus
        database = open_database(database_url)
        try:
            number = request_no("K1", str(DEFAULT_APP_ID))
            sending = Trade(
                upstream="acg", request_no=number, downstream_order_no="K1", code=CARD, quantity=1,
                state=TradeState.SENDING, sent_at=utcnow(), balance_before="1000.00",
            )  # fmt: skip
            await DatabaseTrades(database, "gone:1").begin(sending)
        finally:
            await database.close()
        async with acg_daemon(settings) as admin:
            await wait_until(lambda: mirrored(admin, before))  # the daemon's own pass asks its own prices
            priced = shop.request_counts.get("valuation", 0)
            await admin.submit("K1", {"upstream": "acg", "sku_id": sku, "quantity": 1})
            item = await exception_of(admin, "K1")
        assert item["exception_reason"] == "outcome_unknown"
        assert "(sent_before)" in item["last_error_message"]
        assert "balance before 1000.00" in item["last_error_message"]
        assert shop.request_counts.get("valuation", 0) == priced
        assert trades_sent(shop) == 0


async def test_the_sold_out_race_is_a_paid_order_without_goods(database_url: str) -> None:
    """Another buyer takes the cards while the trade is paid: the shop answers its sold-out notice;
    exception ``not_delivered`` with the shop's trade number and amount, not retried, not cancelable."""
    async with running_shop() as shop:
        settings = acg_settings(database_url, shop)
        [sku] = (await mirror_shop(settings, Choice(PLAIN))).skus
        async with acg_daemon(settings) as admin, ControlClient(shop.base_url) as control:
            await control.post("/faults", {"knob": "sold_out_race_next"})
            await admin.submit("S1", {"upstream": "acg", "sku_id": sku, "quantity": 1})
            item = await exception_of(admin, "S1")
            [bought] = shop_orders(shop)
            assert bought.secret.strip() == SOLD_OUT_NOTICE
            assert (item["exception_reason"], item["upstream_order_no"]) == ("not_delivered", bought.trade_no)
            assert item["amount"] == "5.00"
            assert f"{shop.base_url}/user/personal/purchaseRecord" in item["last_error_message"]
            status, refused = await admin.call("POST", f"/api/v1/exceptions/{item['id']}/retry", {})
            assert (status, refused["error_code"]) == (409, "not_delivered"), refused
            status, canceled = await admin.call("POST", "/api/v1/orders/S1/cancel", {})
            assert status != 200, canceled
        assert trades_sent(shop) == 1


async def test_a_price_above_the_limit_is_refused_before_the_trade(database_url: str) -> None:
    """The mirror still says 10.00 but the shop now asks 15.00: the valuation right before the trade
    refuses it (``price_above_limit``); nothing is bought."""
    async with running_shop() as shop:
        settings = acg_settings(database_url, shop)
        before = await mirror_shop(settings, MONTH)
        [sku] = before.skus
        async with acg_daemon(settings) as admin, ControlClient(shop.base_url) as control:
            await wait_until(lambda: mirrored(admin, before))  # its own pass read 10.00 too
            await control.post(f"/commodities/{CARD}", {"races": {"月卡": "15.00", "年卡": "100.00"}})
            await admin.submit(
                "P1", {"upstream": "acg", "sku_id": sku, "quantity": 1, "max_unit_price": "12.00"}
            )
            item = await exception_of(admin, "P1")
        assert item["exception_reason"] == "price_above_limit"
        assert "15.00" in item["last_error_message"]
        assert "max_unit_price 12.00" in item["last_error_message"]
        assert shop_orders(shop) == []
        assert trades_sent(shop) == 0


async def test_one_trade_at_a_time_per_member_account(database_url: str) -> None:
    """While another instance holds the member account's trade lease, nothing is traded (the submission is
    put off, not counted as an attempt); once it lets go, the order is bought, once."""
    async with running_shop() as shop:
        settings = acg_settings(database_url, shop, trade_timeout_seconds=0.5)
        before = await mirror_shop(settings, MONTH)
        [sku] = before.skus
        database = open_database(database_url)
        other = DatabaseTrades(database, "elsewhere:1")
        account = f"acg-faka trades {DEFAULT_APP_ID}@{shop.base_url.split('//')[1]}"
        try:
            assert await other.hold(account, "t", 600)
            async with acg_daemon(settings) as admin:
                await wait_until(lambda: mirrored(admin, before))  # the daemon's own pass asks its prices
                priced = shop.request_counts.get("valuation", 0)
                await admin.submit("L1", {"upstream": "acg", "sku_id": sku, "quantity": 1})

                async def put_off() -> bool:
                    rows = await sql_rows(database_url, select(upstream_trades))
                    order = await admin.order("L1")
                    return not rows and order["procurements"][0]["last_error_code"] == "rate_limited"

                await wait_until(put_off)
                assert trades_sent(shop) == 0
                assert shop.request_counts.get("valuation", 0) == priced
                await other.let_go(account, "t")
                order = await admin.wait_status("L1", "delivered")
        finally:
            await database.close()
        assert order["procurements"][0]["attempts"] == 1
        assert len(shop_orders(shop)) == 1
        assert trades_sent(shop) == 1


def test_the_limit_goes_to_the_adapter_and_never_on_dujiao_nexts_wire() -> None:
    """The item's limit and fulfillment type reach an adapter with the submission, and Dujiao-Next's body
    (seed 000's POST /orders) stays what it was."""
    carried = CreateOrderRequest(
        sku_id=7,
        quantity=2,
        downstream_order_no="A1",
        unit_limit="9.90",
        limit_given=True,
        fulfillment_type="auto",
    )
    plain = CreateOrderRequest(sku_id=7, quantity=2, downstream_order_no="A1")
    assert (carried.unit_limit, carried.limit_given, carried.fulfillment_type) == ("9.90", True, "auto")
    assert carried.body() == plain.body() == b'{"sku_id":7,"quantity":2,"downstream_order_no":"A1"}'


async def test_two_instances_never_trade_at_once_for_one_member_account(database_url: str) -> None:
    """Instance one's trade hangs until its client gives up; instance two, asked for another order meanwhile,
    waits for the member account's lease: the shop sees two's first request only after one's trade and the
    balance read after it, never in between."""
    async with running_shop() as shop, ControlClient(shop.base_url) as control:
        first, second = (await mirror_shop(acg_settings(database_url, shop), MONTH, Choice(PLAIN))).skus
        mirroring = len(shop.requests)  # the pass's requests
        one = Runtime.build(acg_settings(database_url, shop, trade_timeout_seconds=0.5), instance="one:1")
        two = Runtime.build(acg_settings(database_url, shop, trade_timeout_seconds=10), instance="two:2")
        try:
            await control.post("/faults", {"knob": "hang_after_next"})
            hanging = asyncio.create_task(
                one.client("acg").create_order(
                    CreateOrderRequest(sku_id=first, quantity=1, downstream_order_no="H1")
                )
            )
            await wait_until(lambda: trades_sent(shop) == 1)
            created = await two.client("acg").create_order(
                CreateOrderRequest(sku_id=second, quantity=1, downstream_order_no="H2")
            )
            with pytest.raises(OutcomeUnknown):
                await hanging
        finally:
            await one.close()
            await two.close()
        assert created.status == "delivered"
        assert [record.endpoint for record in shop.requests[mirroring:]] == [
            "valuation", "connect", "trade", "connect",  # one: its trade hangs, then the balance after
            "valuation", "connect", "trade",  # two, once one let go
        ]  # fmt: skip
        assert len(shop_orders(shop)) == 2


async def test_two_instances_never_trade_at_once_while_the_request_budget_makes_one_wait(
    database_url: str,
) -> None:
    """One request a second for the member across both instances: instance one's purchase waits for its
    slots longer than its lease's length (from its short timeouts), and its trade hangs. The lease is
    renewed while the purchase is in flight, so instance two's first request still reaches the shop only
    after one's trade and the balance read after it."""
    async with running_shop() as shop, ControlClient(shop.base_url) as control:
        first, second = (await mirror_shop(acg_settings(database_url, shop), MONTH, Choice(PLAIN))).skus
        mirroring = len(shop.requests)  # the pass's requests
        valued = shop.request_counts["valuation"]
        slow = {"max_requests_per_second": 1}
        one = Runtime.build(
            acg_settings(database_url, shop, trade_timeout_seconds=0.3, timeout_seconds=0.3, **slow),
            instance="one:1",
        )
        two = Runtime.build(
            acg_settings(database_url, shop, trade_timeout_seconds=20, **slow), instance="two:2"
        )
        try:
            await control.post("/faults", {"knob": "hang_after_next"})
            hanging = asyncio.create_task(
                one.client("acg").create_order(
                    CreateOrderRequest(sku_id=first, quantity=1, downstream_order_no="W1")
                )
            )
            await wait_until(lambda: shop.request_counts["valuation"] == valued + 1)
            created = await two.client("acg").create_order(
                CreateOrderRequest(sku_id=second, quantity=1, downstream_order_no="W2")
            )
            with pytest.raises(OutcomeUnknown):
                await hanging
        finally:
            await one.close()
            await two.close()
        assert created.status == "delivered"
        assert [record.endpoint for record in shop.requests[mirroring:]] == [
            "valuation", "connect", "trade", "connect",  # one, each request a slot apart; its trade hangs
            "valuation", "connect", "trade",  # two, once one let go
        ]  # fmt: skip
