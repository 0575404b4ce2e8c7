"""Offers over real sockets: the admin API and the command line, intake by offer, failover across two
sandbox upstreams, and the limit every item is bought under (its own, or its selling price converted back).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from procurd.daemon import Daemon
from procurd.db.stores import Tx
from procurd.http.testing import Stack, procurd_stack
from procurd.sandbox import Sandbox, SandboxConfig
from support import AdminClient, mirror, run_cli, running_daemon, settings_for, wait_until
from test_cli_orders import write_config

FAST_CALLBACKS = (0.1, 0.2, 0.3, 0.5)


def sandbox_config(api_key: str, secret: str) -> SandboxConfig:
    return SandboxConfig(
        products=2, balance=Decimal("1000"), allow_private_callbacks=True,
        callback_retry_delays=FAST_CALLBACKS, api_key=api_key, api_secret=secret,
    )  # fmt: skip


async def control(sandbox: Sandbox, path: str, body: Any) -> None:
    """The sandbox's control API over HTTP (what a test changes at the upstream)."""
    url = f"{sandbox.base_url}/_sandbox{path}"
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        assert response.status == 200, await response.text()


# --- the admin API ------------------------------------------------------------------------------------------


@pytest.fixture
async def stack(database_url: str) -> AsyncIterator[Stack]:
    """procurd on the sandbox as two upstreams (main, second), both mirrored, no workers running."""
    async with procurd_stack(database_url) as running:
        await running.sync("main")
        await running.sync("second")
        yield running


async def call(stack: Stack, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else None
    answer = await stack.request(method, stack.admin_url + path, data, headers)
    assert isinstance(answer.body, dict), answer.text
    return answer.status, answer.body


def two_skus(stack: Stack) -> tuple[int, int]:
    """Two SKUs of auto products that are in stock."""
    first = stack.sandbox.state.first_sku("auto").id
    second = next(
        sku.id
        for product in stack.sandbox.state.active_products()
        if product.fulfillment_type == "auto"
        for sku in product.skus
        if sku.id != first and sku.is_active and sku.stock_quantity != 0
    )
    return first, second


async def test_put_get_list_and_delete_an_offer(stack: Stack) -> None:
    """PUT creates (201) and replaces (200) an offer; GET shows each source as the mirror knows it and the
    one in use with its selling price and stock; the list pages offers by code; DELETE removes it."""
    first, second = two_skus(stack)
    sources = [{"upstream": "main", "sku_id": first}, {"upstream": "second", "sku_id": second}]
    status, created = await call(stack, "PUT", "/api/v1/offers/VOUCHER-10", {"sources": sources})
    assert (status, created["created"]) == (201, True)
    offer = created["offer"]
    assert [(s["upstream"], s["sku_id"], s["available"]) for s in offer["sources"]] == [
        ("main", first, True),
        ("second", second, True),
    ]
    assert offer["in_use"] == {"upstream": "main", "sku_id": first}
    assert offer["stock_status"] == offer["sources"][0]["stock_status"]
    status, replaced = await call(stack, "PUT", "/api/v1/offers/VOUCHER-10", {"sources": sources[::-1]})
    assert (status, replaced["created"], replaced["offer"]["in_use"]["upstream"]) == (200, False, "second")
    await call(stack, "PUT", "/api/v1/offers/A-FIRST", {"sources": sources[:1]})
    status, listed = await call(stack, "GET", "/api/v1/offers?page_size=1&page=2")
    assert (status, listed["total"], [o["code"] for o in listed["items"]]) == (200, 2, ["VOUCHER-10"])
    status, shown = await call(stack, "GET", "/api/v1/offers/VOUCHER-10")
    assert (status, shown["offer"]["sources"][0]["upstream"]) == (200, "second")
    status, deleted = await call(stack, "DELETE", "/api/v1/offers/VOUCHER-10")
    assert (status, deleted["deleted"]) == (200, True)
    status, gone = await call(stack, "GET", "/api/v1/offers/VOUCHER-10")
    assert (status, gone["error_code"]) == (404, "offer_not_found")
    status, again = await call(stack, "DELETE", "/api/v1/offers/VOUCHER-10")
    assert (status, again["error_code"]) == (404, "offer_not_found")


async def test_the_source_in_use_follows_the_mirror(stack: Stack) -> None:
    """When the first source is out of stock in the mirror the offer shows the backup in use, its price and
    stock; with none left it shows none, out of stock."""
    first, second = two_skus(stack)
    sources = [{"upstream": "main", "sku_id": first}, {"upstream": "main", "sku_id": second}]
    await call(stack, "PUT", "/api/v1/offers/V", {"sources": sources})
    await control_stack(stack, f"/skus/{first}", {"stock_quantity": 0})
    await stack.sync("main")
    _, shown = await call(stack, "GET", "/api/v1/offers/V")
    offer = shown["offer"]
    assert offer["in_use"] == {"upstream": "main", "sku_id": second}
    assert (offer["sources"][0]["available"], offer["sources"][0]["reason"]) == (False, "out_of_stock")
    await control_stack(stack, f"/skus/{second}", {"stock_quantity": 0})
    await stack.sync("main")
    _, none_left = await call(stack, "GET", "/api/v1/offers/V")
    assert (none_left["offer"]["in_use"], none_left["offer"]["stock_status"]) == (None, "out_of_stock")


async def control_stack(stack: Stack, path: str, body: Any) -> None:
    await control(stack.sandbox, path, body)


BAD_OFFERS: dict[str, tuple[str, Any, int, str]] = {
    "code with a space": ("/api/v1/offers/has%20space", {"sources": [{"upstream": "main", "sku_id": 1}]}, 400,
                          "invalid_offer_code"),
    "no sources": ("/api/v1/offers/X", {"sources": []}, 400, "invalid_request"),
    "sources not a list": ("/api/v1/offers/X", {"sources": "main:1"}, 400, "invalid_request"),
    "sku_id a string": ("/api/v1/offers/X", {"sources": [{"upstream": "main", "sku_id": "1"}]}, 400,
                        "invalid_request"),
    "extra key": ("/api/v1/offers/X", {"sources": [{"upstream": "main", "sku_id": 1, "x": 1}]}, 400,
                  "invalid_request"),
    "unknown field": ("/api/v1/offers/X", {"sources": [], "price": "1"}, 400, "invalid_request"),
    "other code in body": ("/api/v1/offers/X", {"code": "Y", "sources": []}, 400, "invalid_request"),
    "unknown upstream": ("/api/v1/offers/X", {"sources": [{"upstream": "nope", "sku_id": 1}]}, 422,
                         "unknown_upstream"),
    "not mirrored": ("/api/v1/offers/X", {"sources": [{"upstream": "main", "sku_id": 999999}]}, 422,
                     "sku_not_found"),
    "listed twice": ("/api/v1/offers/X", {"sources": [{"upstream": "main", "sku_id": "{sku}"}] * 2}, 422,
                     "duplicate_source"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_OFFERS), ids=list(BAD_OFFERS))
async def test_a_bad_offer_is_refused_and_changes_nothing(stack: Stack, case: str) -> None:
    """Each bad PUT answers its status and error code; no offer is stored."""
    path, body, expected_status, code = BAD_OFFERS[case]
    sku = stack.sandbox.state.first_sku("auto").id
    body = json.loads(json.dumps(body).replace('"{sku}"', str(sku)))
    status, answer = await call(stack, "PUT", path, body)
    assert (status, answer["error_code"]) == (expected_status, code), answer
    _, listed = await call(stack, "GET", "/api/v1/offers")
    assert listed["total"] == 0


async def test_intake_by_offer(stack: Stack) -> None:
    """An item may name an offer: it is queued at the first source that can be bought; an unknown offer is
    422 offer_not_found, an item naming both an offer and a SKU is 400; a repeat answers 200."""
    first, second = two_skus(stack)
    sources = [{"upstream": "second", "sku_id": first}, {"upstream": "main", "sku_id": second}]
    await call(stack, "PUT", "/api/v1/offers/V", {"sources": sources})
    body = {"order_no": "OF1", "items": [{"offer": "V", "quantity": 1}]}
    status, accepted = await call(stack, "POST", "/api/v1/orders", body)
    assert status == 202, accepted
    [item] = accepted["order"]["procurements"]
    assert (item["offer"], item["upstream"], item["sku_id"], item["state"]) == (
        "V",
        "second",
        first,
        "queued",
    )
    assert item["failovers"] == []
    status, repeat = await call(stack, "POST", "/api/v1/orders", body)
    assert (status, repeat["order"]["procurements"][0]["id"]) == (200, item["id"])
    unknown = {"order_no": "OF2", "items": [{"offer": "NOPE", "quantity": 1}]}
    status, refused = await call(stack, "POST", "/api/v1/orders", unknown)
    assert (status, refused["error_code"]) == (422, "offer_not_found")
    both = {"order_no": "OF3", "items": [{"offer": "V", "sku_id": first, "quantity": 1}]}
    status, refused = await call(stack, "POST", "/api/v1/orders", both)
    assert (status, refused["error_code"]) == (400, "invalid_request")
    assert await stack.operations.views.order("OF2") is None
    assert await stack.operations.views.order("OF3") is None


# --- failover across two upstreams --------------------------------------------------------------------------


async def test_an_offer_fails_over_to_a_second_upstream_with_one_upstream_order(database_url: str) -> None:
    """The first upstream refuses with insufficient_stock (its stock ran out after the mirror last looked):
    procurd moves to the offer's second source on another upstream, buys there, and the order is delivered.
    One upstream order in total; the hop is in failovers and in the audit trail."""
    async with (
        Sandbox(sandbox_config("key-a", "secret-a-123")) as first,
        Sandbox(sandbox_config("key-b", "secret-b-456")) as second,
    ):
        settings = settings_for(database_url, ("main", first), ("backup", second))
        await mirror(settings)
        first_sku = first.state.first_sku("auto").id
        second_sku = second.state.first_sku("auto").id
        async with running_daemon(settings) as daemon, aiohttp.ClientSession() as session:
            # The start-up passes end first: the mirror keeps showing the first source in stock.
            await wait_until(lambda: passes_finished(daemon, 2))
            await control(first, f"/skus/{first_sku}", {"stock_quantity": 0})
            admin = AdminClient(settings, session)
            sources = [
                {"upstream": "main", "sku_id": first_sku},
                {"upstream": "backup", "sku_id": second_sku},
            ]
            status, _ = await admin.call("PUT", "/api/v1/offers/CARD", {"sources": sources})
            assert status == 201
            await admin.submit("F1", {"offer": "CARD", "quantity": 1})

            async def delivered() -> dict[str, Any] | None:
                order = await admin.order("F1")
                return order if order["status"] == "delivered" else None

            order = await wait_until(delivered)
            _, audit = await admin.call("GET", "/api/v1/orders/F1/audit")
        [item] = order["procurements"]
        assert (item["upstream"], item["sku_id"], item["state"]) == ("backup", second_sku, "delivered")
        assert [(hop["upstream"], hop["sku_id"], hop["reason"]) for hop in item["failovers"]] == [
            ("main", first_sku, "insufficient_stock")
        ]
        assert first.state.orders == {}
        assert [o.downstream_order_no for o in second.state.orders.values()] == [item["downstream_order_no"]]
        events = [entry["event"] for entry in audit["audit"]]
        assert "failover" in events
        assert events.count("submitted") == 1


async def passes_finished(daemon: Daemon, count: int) -> bool:
    """At least ``count`` catalogue passes have ended since the mirror was first filled (one per upstream)."""

    def read(tx: Tx) -> int:
        _, runs = tx.console.sync_runs(None, 1, 50)
        return sum(1 for run in runs if run["status"] != "running")

    return await daemon.runtime.database.read(read) >= count + 2


# --- limits -------------------------------------------------------------------------------------------------

PRICING = {"hold_on_cost_increase_percent": "10", "rules": [{"exchange_rate": "2", "markup_percent": "10"}]}


async def test_an_item_without_a_limit_is_limited_by_its_selling_price(database_url: str) -> None:
    """With pricing rules, an item without max_unit_price is limited by its SKU's selling price converted
    back (22.00 at rate 2 → 11.00); when the cost rises past it before the item is sent, the attempt is
    refused as exception price_above_limit and nothing is bought."""
    async with procurd_stack(database_url, pricing=PRICING, upstreams=("main",)) as stack:
        product = stack.sandbox.state.add_product(price="10.00")
        sku = stack.sandbox.state.product(product).skus[0].id
        await stack.sync("main")
        status, accepted = await call(
            stack, "POST", "/api/v1/orders", {"order_no": "L1", "items": [{"sku_id": sku, "quantity": 1}]}
        )
        assert status == 202, accepted
        [item] = accepted["order"]["procurements"]
        assert (item["max_unit_price"], item["unit_limit"], item["state"]) == (None, "11.00", "queued")
        await control(stack.sandbox, f"/skus/{sku}", {"price_amount": "11.50"})
        await stack.sync("main")  # held: the shop still sells at 22.00
        assert await stack.submit_due("main") == 0
        view = await stack.order("L1")
        [refused] = view["procurements"]
        assert (refused["state"], refused["exception_reason"], refused["unit_price"]) == (
            "exception",
            "price_above_limit",
            "11.50",
        )
        assert stack.sandbox.state.orders == {}


async def test_a_given_limit_wins_and_is_checked_at_intake(database_url: str) -> None:
    """max_unit_price given is the limit (not the selling price); a cost already above it is an exception
    at intake."""
    async with procurd_stack(database_url, pricing=PRICING, upstreams=("main",)) as stack:
        product = stack.sandbox.state.add_product(price="10.00")
        sku = stack.sandbox.state.product(product).skus[0].id
        await stack.sync("main")
        items = [{"sku_id": sku, "quantity": 1, "max_unit_price": "10.50"}]
        _, accepted = await call(stack, "POST", "/api/v1/orders", {"order_no": "L2", "items": items})
        assert accepted["order"]["procurements"][0]["unit_limit"] == "10.50"
        low = [{"sku_id": sku, "quantity": 1, "max_unit_price": "9.99"}]
        _, refused = await call(stack, "POST", "/api/v1/orders", {"order_no": "L3", "items": low})
        assert refused["order"]["procurements"][0]["exception_reason"] == "price_above_limit"


# --- the command line ---------------------------------------------------------------------------------------


async def test_offers_from_the_command_line(stack: Stack, tmp_path: Path) -> None:
    """offers set/show/list/delete do what the API does; a bad source or an unknown offer exits 1 with the
    reason; an order can name the offer with order submit --offer."""
    config = write_config(tmp_path / "procurd.toml", stack)
    first, second = two_skus(stack)
    created = await run_cli(config, "offers", "set", "GIFT", "--source", f"main:{first}", "--source",
                            f"main:{second}")  # fmt: skip
    assert created.exit_code == 0, created.stderr
    assert "offer GIFT created" in created.stdout
    shown = await run_cli(config, "offers", "show", "GIFT", "--output", "json")
    assert json.loads(shown.stdout)["offer"]["in_use"] == {"upstream": "main", "sku_id": first}
    listed = await run_cli(config, "offers", "list")
    assert "GIFT" in listed.stdout
    assert "1 offer" in listed.stdout
    bad = await run_cli(config, "offers", "set", "GIFT", "--source", "main-1")
    assert (bad.exit_code, "invalid_source" in bad.stderr) == (1, True)
    missing = await run_cli(config, "offers", "show", "NOPE")
    assert (missing.exit_code, "offer_not_found" in missing.stderr) == (1, True)
    ordered = await run_cli(config, "order", "submit", "--order-no", "CLI1", "--offer", "GIFT")
    assert ordered.exit_code == 0, ordered.stderr
    view = await stack.order("CLI1")
    assert view["procurements"][0]["offer"] == "GIFT"
    deleted = await run_cli(config, "offers", "delete", "GIFT")
    assert (deleted.exit_code, "offer GIFT deleted" in deleted.stdout) == (0, True)
