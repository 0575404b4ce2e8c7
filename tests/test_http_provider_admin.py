"""The provider's admin API over real sockets: accounts, wallets and ledgers, orders received from downstream
sites with their procurement and callbacks, and the provider's metrics.

A provider daemon runs over the sandbox; downstream sites are played by the independent signed client of
``procurd.sandbox.testing`` (and its callback receiver). Every test ends with each wallet's balance equal to
the sum of its ledger.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from sqlalchemy import func, select

from procurd.config import Settings
from procurd.core.orders import MAX_NOTE_CHARS
from procurd.db.provider_schema import provider_accounts, provider_ledger
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import CallbackReceiver, SignedClient
from provider_support import provider_settings, public_base_url
from support import AdminClient, captured_log, mirror, running_daemon, sql_rows, wait_until
from test_http_openapi import load_document

GOLD = {"slug": "gold", "name": {"en": "Gold"}, "discount_percent": "5"}
PRODUCTS = 3
ACCOUNTS = "/api/v1/provider/accounts"
ORDERS = "/api/v1/provider/orders"
# Amounts a wallet movement refuses: not a decimal string of ASCII digits and a point, not above zero, finer
# than a cent, too large (Decimal alone would read a sign, an exponent, underscores, other scripts' digits).
BAD_AMOUNTS = (
    "abc", 10, "0", "0.00", "-5", "1.001", "", "  ", None, "NaN", "Infinity", "1e999", "100000000000000.00",
    "+5", "1e2", "1_000", "\u0661", "\uff11", "5.",
)  # fmt: skip


DOCUMENT = load_document()
TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "object": (dict,),
    "array": (list,), "null": (type(None),),
}  # fmt: skip


def resolve(node: Mapping[str, Any]) -> tuple[Mapping[str, Any], str | None]:
    """A schema or response with its ``$ref`` followed, and the component's name when it was one."""
    name = None
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        target: Any = DOCUMENT
        for part in node["$ref"][2:].split("/"):
            target = target[part]
        node = target
    return node, name


def properties_of(schema: Mapping[str, Any]) -> dict[str, Any]:
    schema, _ = resolve(schema)
    found = dict(schema.get("properties", {}))
    for branch in schema.get("allOf", []):
        found.update(properties_of(branch))
    return found


def conform(
    schema: Mapping[str, Any], value: Any, where: str, strict: bool = False, whole: bool = True
) -> None:
    """``value`` is what ``schema`` describes. ``strict`` (the provider's own schemas): every member of an
    object is documented too (checked where the ``whole`` object is described, not in one part of an
    ``allOf``)."""
    schema, name = resolve(schema)
    if name is not None:
        strict = name.startswith("Provider")
    for branch in schema.get("allOf", []):
        conform(branch, value, where, strict, whole=False)
    if "oneOf" in schema:
        passed = 0
        for option in schema["oneOf"]:
            try:
                conform(option, value, where, strict)
            except AssertionError:
                continue
            passed += 1
        assert passed == 1, (where, value)
    if "const" in schema:
        assert value == schema["const"], where
    if "enum" in schema:
        assert value in schema["enum"], (where, value)
    kinds = schema.get("type")
    if kinds is not None:
        allowed = tuple(t for kind in ([kinds] if isinstance(kinds, str) else kinds) for t in TYPES[kind])
        assert isinstance(value, allowed), (where, value)
        assert bool in allowed or not isinstance(value, bool), (where, value)
    if isinstance(value, str) and "pattern" in schema:
        assert re.search(schema["pattern"], value), (where, value)
    if isinstance(value, dict):
        for key in schema.get("required", []):
            assert key in value, (where, key)
        documented = properties_of(schema)
        if strict and whole and documented and schema.get("additionalProperties") is None:
            assert set(value) <= set(documented), (where, sorted(set(value) - set(documented)))
        for key, item in value.items():
            if key in schema.get("properties", {}):
                conform(schema["properties"][key], item, f"{where}.{key}", strict)
            elif isinstance(schema.get("additionalProperties"), dict):
                conform(schema["additionalProperties"], item, f"{where}.{key}", strict)
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            conform(schema["items"], item, f"{where}[{index}]", strict)


def check_documented(method: str, path: str, status: int, answer: Any) -> None:
    """The answer of a provider route is one its operation documents for that status, in that shape."""
    segments = path.partition("?")[0].split("/")
    for template in DOCUMENT["paths"]:
        parts = template.split("/")
        if len(parts) == len(segments) and all(
            part == segment or (part.startswith("{") and segment)
            for part, segment in zip(parts, segments, strict=True)
        ):
            break
    else:
        return  # no route of the document: the router's own 404
    operation = DOCUMENT["paths"][template].get(method.lower())
    assert operation is not None, (method, template)
    response = operation["responses"].get(str(status))
    assert response is not None, (
        f"{method} {template} answered {status}, which it does not document: {answer}"
    )
    schema = resolve(response)[0]["content"]["application/json"]["schema"]
    conform(schema, answer, f"{method} {template} {status}")


@dataclass
class Provider:
    """A provider daemon over the sandbox, its admin API, and the database both use."""

    settings: Settings
    admin: AdminClient
    session: aiohttp.ClientSession
    database_url: str

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        """The admin API's answer, checked against the OpenAPI document."""
        status, answer = await self.admin.call(method, path, body)
        check_documented(method, path, status, answer)
        return status, answer

    async def raw(self, method: str, path: str, data: bytes) -> tuple[int, dict[str, Any]]:
        """A request with ``data`` as its body, as it is (the answer checked against the document)."""
        async with self.session.request(
            method, self.admin.base + path, data=data, headers=self.admin.headers
        ) as response:
            answer = await response.json()
            check_documented(method, path, response.status, answer)
            return response.status, answer

    async def ok(self, method: str, path: str, body: Any = None, status: int = 200) -> dict[str, Any]:
        got, answer = await self.call(method, path, body)
        assert got == status, answer
        assert answer["ok"] is True
        return answer

    async def refused(self, method: str, path: str, body: Any, status: int, code: str) -> dict[str, Any]:
        got, answer = await self.call(method, path, body)
        assert (got, answer["ok"], answer.get("error_code")) == (status, False, code), answer
        assert answer["error_message"]
        return answer

    async def add(self, name: str, topup: str | None = None) -> tuple[dict[str, Any], str]:
        """A new account (and its wallet topped up): its view and its secret."""
        created = await self.ok("POST", ACCOUNTS, {"name": name}, status=201)
        if topup is not None:
            await self.ok("POST", f"{ACCOUNTS}/{name}/topup", {"amount": topup, "note": "opening balance"})
        account: dict[str, Any] = created["account"]
        return account, created["api_secret"]

    async def account(self, name: str) -> dict[str, Any]:
        view: dict[str, Any] = (await self.ok("GET", f"{ACCOUNTS}/{name}?page_size=100"))["account"]
        return view

    def client(self, api_key: str, secret: str) -> SignedClient:
        """A downstream site signing with ``api_key`` and ``secret``."""
        return SignedClient(public_base_url(self.settings), api_key, secret)


@pytest.fixture
async def provider(database_url: str) -> AsyncIterator[Provider]:
    """A provider selling the sandbox's small catalogue at cost plus 10 %, with a gold level, its offered
    catalogue complete."""
    config = SandboxConfig(
        products=PRODUCTS, manual_ratio=0, allow_private_callbacks=True, balance=Decimal(10**6)
    )
    async with Sandbox(config) as sandbox:
        settings = provider_settings(database_url, ("top", sandbox), provider={"levels": [GOLD]})
        await mirror(settings)
        async with running_daemon(settings), aiohttp.ClientSession() as session:
            found = Provider(settings, AdminClient(settings, session), session, database_url)
            yield found
            await balances_match_ledgers(found)


async def balances_match_ledgers(provider: Provider) -> None:
    """Every wallet holds the sum of its ledger, as stored and as the admin API shows it."""
    url = provider.database_url
    accounts = await sql_rows(
        url, select(provider_accounts.c.id, provider_accounts.c.name, provider_accounts.c.balance_cents)
    )
    sums = await sql_rows(
        url,
        select(provider_ledger.c.account_id, func.sum(provider_ledger.c.amount_cents)).group_by(
            provider_ledger.c.account_id
        ),
    )
    totals = {int(account_id): int(total) for account_id, total in sums}
    for account_id, name, balance_cents in accounts:
        assert balance_cents == totals.get(account_id, 0), name
        view = await provider.account(name)
        shown = sum(Decimal(entry["amount"]) for entry in view["ledger"]["items"])
        assert view["ledger"]["total"] == len(view["ledger"]["items"])
        assert Decimal(view["balance"]) == shown == Decimal(balance_cents) / 100, name


async def offered_skus(client: SignedClient) -> list[int]:
    """The offered SKU ids, once the offered catalogue holds every product."""

    async def complete() -> list[dict[str, Any]] | None:
        products = await client.list_all_products()
        return products if len(products) == PRODUCTS else None

    products = await wait_until(complete)
    return [sku["id"] for product in products for sku in product["skus"]]


# --- accounts -----------------------------------------------------------------------------------------------


async def test_an_account_is_created_with_its_secret_in_that_answer_only(provider: Provider) -> None:
    """POST /accounts answers 201 with the API key and secret, which signs requests at once; the list and the
    account's view never carry the secret, nor does any log line; a taken or malformed name is refused and
    creates nothing."""
    with captured_log("debug") as log:
        created = await provider.ok("POST", ACCOUNTS, {"name": "shop-b"}, status=201)
        account, secret = created["account"], created["api_secret"]
        assert re.fullmatch("[0-9a-f]{64}", secret)
        assert (account["name"], account["status"], account["level"], account["balance"]) == (
            "shop-b", "active", None, "0.00",
        )  # fmt: skip
        assert "api_secret" not in account
        async with provider.client(account["api_key"], secret) as client:
            ping = (await client.post("/ping")).json()
        assert (ping["ok"], ping["user_id"], ping["balance"]) == (True, account["id"], "0.00")

        listed = await provider.ok("GET", ACCOUNTS)
        assert (listed["provider_enabled"], listed["currency"]) == (True, "CNY")
        assert [item["name"] for item in listed["items"]] == ["shop-b"]
        shown = await provider.account("shop-b")
        assert shown["api_key"] == account["api_key"]
        for answer in (listed, shown):
            assert secret not in json.dumps(answer)

        await provider.refused("POST", ACCOUNTS, {"name": "shop-b"}, 409, "account_exists")
        for name in ("", "-shop", "a" * 65, "shop b", "shop/b", "shöp", 5, None):
            await provider.refused("POST", ACCOUNTS, {"name": name}, 400, "invalid_account_name")
        await provider.refused("POST", ACCOUNTS, {}, 400, "invalid_account_name")
        await provider.refused("POST", ACCOUNTS, {"name": "x", "secret": "mine"}, 400, "invalid_request")
        await provider.refused("POST", ACCOUNTS, ["x"], 400, "invalid_request")
        assert (await provider.raw("POST", ACCOUNTS, b"{name"))[1]["error_code"] == "invalid_json"
        assert [item["name"] for item in (await provider.ok("GET", ACCOUNTS))["items"]] == ["shop-b"]
    text = log.getvalue()
    assert "provider.account_added" in text
    assert secret not in text


async def test_topups_and_debits_move_the_wallet_and_a_refused_movement_changes_nothing(
    provider: Provider,
) -> None:
    """A top-up and a debit are ledger rows with their notes and the balance after; a debit beyond the
    balance is refused 409 and changes nothing, as every malformed amount or note is refused 400; the
    ledger pages, the newest first."""
    await provider.add("shop-b")
    topup = await provider.ok("POST", f"{ACCOUNTS}/shop-b/topup", {"amount": "100.00", "note": "transfer 1"})
    assert (topup["kind"], topup["amount"], topup["balance"], topup["currency"], topup["note"]) == (
        "topup", "100.00", "100.00", "CNY", "transfer 1",
    )  # fmt: skip
    debit = await provider.ok("POST", f"{ACCOUNTS}/shop-b/debit", {"amount": "30.5", "note": " goodwill "})
    assert (debit["kind"], debit["amount"], debit["balance"], debit["note"]) == (
        "debit", "-30.50", "69.50", "goodwill",
    )  # fmt: skip
    beyond = await provider.refused(
        "POST",
        f"{ACCOUNTS}/shop-b/debit",
        {"amount": "69.51", "note": "too much"},
        409,
        "insufficient_balance",
    )
    assert "69.50" in beyond["error_message"]

    for movement in ("topup", "debit"):
        path = f"{ACCOUNTS}/shop-b/{movement}"
        for amount in BAD_AMOUNTS:
            await provider.refused("POST", path, {"amount": amount, "note": "n"}, 400, "invalid_amount")
        await provider.refused("POST", path, {"note": "n"}, 400, "invalid_amount")
        number = await provider.raw("POST", path, b'{"amount": 10.5, "note": "n"}')
        assert (number[0], number[1]["error_code"]) == (400, "invalid_amount")
        for note in (None, "", "   ", 5):
            await provider.refused("POST", path, {"amount": "1.00", "note": note}, 400, "note_required")
        await provider.refused("POST", path, {"amount": "1.00"}, 400, "note_required")
        await provider.refused(
            "POST", path, {"amount": "1.00", "note": "n" * (MAX_NOTE_CHARS + 1)}, 400, "invalid_request"
        )
        await provider.refused(
            "POST", path, {"amount": "1.00", "note": "n", "kind": "x"}, 400, "invalid_request"
        )
        await provider.refused(
            "POST", f"{ACCOUNTS}/nobody/{movement}", {"amount": "1.00", "note": "n"}, 404, "account_not_found"
        )
        await provider.refused(
            "POST",
            f"{ACCOUNTS}/no%20body/{movement}",
            {"amount": "1.00", "note": "n"},
            404,
            "account_not_found",
        )

    view = await provider.account("shop-b")
    assert view["balance"] == "69.50"
    assert [(e["kind"], e["amount"], e["balance_after"], e["note"]) for e in view["ledger"]["items"]] == [
        ("debit", "-30.50", "69.50", "goodwill"),
        ("topup", "100.00", "100.00", "transfer 1"),
    ]
    second = (await provider.ok("GET", f"{ACCOUNTS}/shop-b?page=2&page_size=1"))["account"]["ledger"]
    assert (second["total"], second["page"], second["page_size"]) == (2, 2, 1)
    assert [entry["kind"] for entry in second["items"]] == ["topup"]
    for query in ("page=0", "page_size=0", "page_size=101", "page=x", "page=1000001"):
        await provider.refused("GET", f"{ACCOUNTS}/shop-b?{query}", None, 400, "invalid_query")
    await provider.refused("GET", f"{ACCOUNTS}/nobody", None, 404, "account_not_found")
    await provider.refused("GET", f"{ACCOUNTS}/{'a' * 65}", None, 404, "account_not_found")


async def test_disable_enable_and_rotate_act_on_the_signed_api_at_once(provider: Provider) -> None:
    """A disabled account's signed requests answer 401 invalid_api_key until it is enabled; rotating gives a
    new secret (in that answer only, never in a log line) with which requests work, while the old one's keep
    working for the overlap (counted in the account's view); rotating with ``now`` ends the old ones at
    once: their requests answer 401 invalid_signature."""
    account, secret = await provider.add("shop-b", topup="10.00")
    key = account["api_key"]
    async with provider.client(key, secret) as old:
        assert (await old.post("/ping")).json()["ok"] is True

        disabled = await provider.ok("POST", f"{ACCOUNTS}/shop-b/disable")
        assert disabled["account"]["status"] == "disabled"
        answer = await old.post("/ping")
        assert (answer.status, answer.error_code) == (401, "invalid_api_key")
        listed = (await provider.ok("GET", ACCOUNTS))["items"]
        assert [(item["name"], item["status"]) for item in listed] == [("shop-b", "disabled")]
        assert (await provider.ok("POST", f"{ACCOUNTS}/shop-b/disable"))["account"]["status"] == "disabled"

        enabled = await provider.ok("POST", f"{ACCOUNTS}/shop-b/enable", {})
        assert enabled["account"]["status"] == "active"
        assert (await old.post("/ping")).json()["ok"] is True

        with captured_log("debug") as log:
            rotated = await provider.ok("POST", f"{ACCOUNTS}/shop-b/rotate")
        new_secret = rotated["api_secret"]
        assert re.fullmatch("[0-9a-f]{64}", new_secret)
        assert new_secret != secret
        assert rotated["account"]["api_key"] == key
        assert "provider.account_secret_rotated" in log.getvalue()
        assert new_secret not in log.getvalue()
        assert new_secret not in json.dumps(await provider.ok("GET", ACCOUNTS))
        assert new_secret not in json.dumps(await provider.account("shop-b"))

        assert (await old.post("/ping")).status == 200  # inside the overlap
        (previous,) = (await provider.account("shop-b"))["old_secrets"]
        assert (previous["requests"], previous["valid_until"]) == (1, rotated["old_valid_until"])
        ended = await provider.ok("POST", f"{ACCOUNTS}/shop-b/rotate", {"now": True})
        assert ended["old_valid_until"] is None
        answer = await old.post("/ping")
        assert (answer.status, answer.error_code) == (401, "invalid_signature")
    async with provider.client(key, new_secret) as new:
        answer = await new.post("/ping")
        assert (answer.status, answer.error_code) == (401, "invalid_signature")
    async with provider.client(key, ended["api_secret"]) as new:
        ping = (await new.post("/ping")).json()
    assert (ping["ok"], ping["balance"]) == (True, "10.00")

    for action in ("disable", "enable", "rotate"):
        await provider.refused("POST", f"{ACCOUNTS}/nobody/{action}", None, 404, "account_not_found")
        await provider.refused("POST", f"{ACCOUNTS}/shop-b/{action}", {"note": "x"}, 400, "invalid_request")
    assert (await provider.account("shop-b"))["status"] == "active"


async def test_a_level_is_one_of_the_configured_slugs_or_none(provider: Provider) -> None:
    """PUT .../level gives the account a configured level (ping answers it, products show member prices),
    refuses an unknown slug naming the configured ones and changing nothing, and null takes it away."""
    account, secret = await provider.add("shop-b")
    path = f"{ACCOUNTS}/shop-b/level"
    assert (await provider.ok("PUT", path, {"level": "gold"}))["account"]["level"] == "gold"
    async with provider.client(account["api_key"], secret) as client:
        assert (await client.post("/ping")).json()["member_level"]["slug"] == "gold"
        await offered_skus(client)
        [product, *_] = await client.list_all_products()
        assert Decimal(product["member_price"]) < Decimal(product["original_price"])

        unknown = await provider.refused("PUT", path, {"level": "platinum"}, 400, "unknown_level")
        assert "gold" in unknown["error_message"]
        bad_slug = await provider.refused("PUT", path, {"level": "no such level!"}, 400, "unknown_level")
        assert "gold" in bad_slug["error_message"]
        for body in ({"level": 3}, {"level": ["gold"]}, {}, {"level": "gold", "name": "x"}):
            await provider.refused("PUT", path, body, 400, "invalid_request")
        await provider.refused("PUT", f"{ACCOUNTS}/nobody/level", {"level": "gold"}, 404, "account_not_found")
        assert (await provider.account("shop-b"))["level"] == "gold"

        assert (await provider.ok("PUT", path, {"level": None}))["account"]["level"] is None
        assert (await client.post("/ping")).json()["member_level"] is None


# --- orders ---------------------------------------------------------------------------------------------


async def test_orders_are_listed_filtered_and_shown_with_their_procurement_and_callbacks(
    provider: Provider,
) -> None:
    """Orders of downstream sites are listed the newest first, by account and status; one order shows the
    procurement behind it and its callback delivery log; a replay pushes the latest status again, signed
    with the account's key, and is logged as a replay; an order without a callback URL cannot be replayed."""
    account, secret = await provider.add("shop-b", topup="1000.00")
    poor, poor_secret = await provider.add("shop-c", topup="0.01")
    async with (
        provider.client(account["api_key"], secret) as client,
        provider.client(poor["api_key"], poor_secret) as poor_client,
        CallbackReceiver(account["api_key"], secret) as receiver,
    ):
        sku, *_ = await offered_skus(client)
        first = (await client.create_order(sku, downstream_order_no="B-1", callback_url=receiver.url)).json()
        second = (await client.create_order(sku, downstream_order_no="B-2")).json()
        failed = (await poor_client.create_order(sku, downstream_order_no="C-1")).json()
        assert (first["status"], second["status"]) == ("paid", "paid")
        assert failed["error_code"] == "payment_failed"

        async def delivered() -> dict[str, Any] | None:
            view: dict[str, Any] = (await provider.ok("GET", f"{ORDERS}/{first['order_id']}"))["order"]
            callback = view["callback"]
            done = view["status"] == "delivered" and callback is not None and callback["delivered_at"]
            return view if done else None

        order = await wait_until(delivered)

        async def second_delivered() -> bool:
            view = (await provider.ok("GET", f"{ORDERS}/{second['order_id']}"))["order"]
            return bool(view["status"] == "delivered")

        await wait_until(second_delivered)
        assert (order["account"], order["downstream_order_no"], order["order_no"]) == (
            "shop-b", "B-1", first["order_no"],
        )  # fmt: skip
        procurement = order["procurement"]
        assert (procurement["order_no"], procurement["status"]) == (first["order_no"], "delivered")
        assert procurement["procurements"][0]["upstream"] == "top"
        assert order["fulfillment"]["payload"]
        [told] = order["callback_log"]
        assert (told["status"], told["ok"], told["http_status"], told["replay"]) == (
            "delivered",
            True,
            200,
            False,
        )
        pushes = len(receiver.received)

        replayed = (await provider.ok("POST", f"{ORDERS}/{first['order_id']}/callback"))["order"]
        assert [(a["status"], a["ok"], a["replay"]) for a in replayed["callback_log"]] == [
            ("delivered", True, True),
            ("delivered", True, False),
        ]
        assert len(receiver.received) == pushes + 1
        last = receiver.received[-1]
        assert last.signature_valid
        assert (last.json()["order_id"], last.json()["status"]) == (first["order_id"], "delivered")

        no_url = await provider.refused(
            "POST", f"{ORDERS}/{second['order_id']}/callback", None, 409, "no_callback_url"
        )
        assert str(second["order_id"]) in no_url["error_message"]
        assert (await provider.ok("GET", f"{ORDERS}/{second['order_id']}"))["order"]["callback"] is None

    listed = await provider.ok("GET", ORDERS)
    assert listed["total"] == 3
    assert [item["downstream_order_no"] for item in listed["items"]] == ["C-1", "B-2", "B-1"]
    of_b = await provider.ok("GET", f"{ORDERS}?account=shop-b")
    assert [item["downstream_order_no"] for item in of_b["items"]] == ["B-2", "B-1"]
    canceled = await provider.ok("GET", f"{ORDERS}?status=canceled")
    assert [(i["downstream_order_no"], i["account"]) for i in canceled["items"]] == [("C-1", "shop-c")]
    paged = await provider.ok("GET", f"{ORDERS}?page=2&page_size=1")
    assert (paged["total"], [i["downstream_order_no"] for i in paged["items"]]) == (3, ["B-2"])
    assert (await provider.ok("GET", f"{ORDERS}?account=shop-c&status=delivered"))["total"] == 0

    for query in ("status=shipped", "page=0", "page_size=101", "page=-1"):
        await provider.refused("GET", f"{ORDERS}?{query}", None, 400, "invalid_query")
    await provider.refused("GET", f"{ORDERS}?account=nobody", None, 404, "account_not_found")
    await provider.refused("GET", f"{ORDERS}?account=no%20body", None, 404, "account_not_found")
    await provider.refused("GET", f"{ORDERS}/abc", None, 400, "invalid_id")
    await provider.refused("GET", f"{ORDERS}/-1", None, 400, "invalid_id")
    for missing in ("0", "99999", str(2**63)):
        await provider.refused("GET", f"{ORDERS}/{missing}", None, 404, "order_not_found")
    await provider.refused("POST", f"{ORDERS}/99999/callback", None, 404, "order_not_found")
    await provider.refused("POST", f"{ORDERS}/{first['order_id']}/callback", {"x": 1}, 400, "invalid_request")

    shop_b = await provider.account("shop-b")
    assert shop_b["orders"] == {"delivered": 2}
    charged = [e["amount"] for e in shop_b["ledger"]["items"] if e["kind"] == "order"]
    assert len(charged) == 2
    assert (await provider.account("shop-c"))["balance"] == "0.01"


async def test_metrics_show_provider_requests_orders_and_balances(provider: Provider) -> None:
    """After downstream traffic /metrics counts the provider's requests by account, endpoint and outcome and
    its orders by account and outcome (a repeated order is not counted paid twice), and shows each wallet's
    balance."""
    account, secret = await provider.add("shop-b", topup="1000.00")
    async with provider.client(account["api_key"], secret) as client:
        sku, *_ = await offered_skus(client)
        assert (await client.create_order(sku, downstream_order_no="M-1")).json()["ok"] is True
        assert (await client.create_order(sku, downstream_order_no="M-1")).json()["ok"] is True
        async with provider.client(account["api_key"], "0" * 64) as forged:
            assert (await forged.post("/ping")).status == 401
    balance = (await provider.account("shop-b"))["balance"]
    async with provider.session.get(provider.admin.base + "/metrics") as response:
        assert response.status == 200
        text = await response.text()

    def value(name: str, **labels: str) -> float:
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{key}="{item}"' in line for key, item in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no {name} with {labels}")

    assert (
        value("procurd_provider_requests_total", account="shop-b", endpoint="orders.create", outcome="ok")
        == 2
    )
    assert value("procurd_provider_requests_total", account="shop-b", endpoint="products", outcome="ok") >= 1
    assert value("procurd_provider_requests_total", outcome="invalid_signature") == 1
    assert value("procurd_provider_orders_total", account="shop-b", outcome="paid") == 1
    assert Decimal(
        str(value("procurd_provider_account_balance", account="shop-b", currency="CNY"))
    ) == Decimal(balance)


# --- the provider off, and the admin token ------------------------------------------------------------


async def test_with_the_provider_off_accounts_are_prepared_but_not_served(database_url: str) -> None:
    """With [provider] enabled = false the admin routes still prepare accounts and wallets (the list says the
    provider is off) while the signed API is not served; with an admin token every provider route needs it."""
    async with Sandbox(SandboxConfig(products=1, manual_ratio=0)) as sandbox:
        settings = provider_settings(
            database_url,
            ("top", sandbox),
            provider={"enabled": False},
            server={"admin_token": "t0ken-for-tests"},
        )
        async with running_daemon(settings), aiohttp.ClientSession() as session:
            provider = Provider(settings, AdminClient(settings, session), session, database_url)
            account, secret = await provider.add("shop-b", topup="25.00")
            listed = await provider.ok("GET", ACCOUNTS)
            assert (listed["provider_enabled"], [item["balance"] for item in listed["items"]]) == (
                False,
                ["25.00"],
            )
            assert (await provider.ok("GET", ORDERS))["total"] == 0
            async with provider.client(account["api_key"], secret) as client:
                assert (await client.post("/ping")).status == 404
            for method, path in (("GET", ACCOUNTS), ("POST", f"{ACCOUNTS}/shop-b/rotate"), ("GET", ORDERS)):
                async with session.request(method, provider.admin.base + path) as response:
                    assert response.status == 401
                    assert (await response.json())["error_code"] == "unauthorized"
            await balances_match_ledgers(provider)


async def test_malformed_paths_queries_and_bodies_answer_a_json_refusal_and_change_nothing(
    provider: Provider,
) -> None:
    """Names, ids, queries and bodies no account or order can have are answered 4xx with a JSON error (never
    a 5xx), and leave the account, its wallet and its ledger as they were."""
    await provider.add("shop-b", topup="5.00")
    before = await provider.account("shop-b")
    names = ("%00", "%FF", "a%2Fb", "..", "%E2%80%AE", "a" * 2000, "shop-b%00", "%20shop-b")
    ids = ("%00", "1e3", "%EF%BC%91", "1.0", "0x1", "99999999999999999999999", "-0", "%20")
    paths = [f"{ACCOUNTS}/{name}{tail}" for name in names for tail in ("", "/topup", "/rotate", "/level")]
    paths += [f"{ORDERS}/{order_id}{tail}" for order_id in ids for tail in ("", "/callback")]
    paths += [
        f"{ORDERS}?{query}"
        for query in ("account=%00", "status=%00", "page=%EF%BC%91", "account=" + "a" * 65)
    ]
    paths += [f"{ACCOUNTS}/shop-b?page_size=%00", f"{ACCOUNTS}/shop-b?page=1e2"]
    bodies: list[bytes] = [
        b"", b"null", b"[]", b'"x"', b"{", b'{"amount": "1.00", "note": "a\\u0000b"}',
        b'{"level": "\\ud800"}', b'{"amount": "\\u0661", "note": "x"}',
        b'{"amount": {"$gt": 0}, "note": "x"}', b"\xff\xfe",
    ]  # fmt: skip
    for path in paths:
        method = (
            "PUT" if path.endswith("/level") else "GET" if "?" in path or path.count("/") <= 5 else "POST"
        )
        for body in bodies[:3] if method == "GET" else bodies:
            status, answer = await provider.raw(method, path, body)
            assert 400 <= status < 500, (path, body, answer)
            assert (answer["ok"], bool(answer["error_code"]), bool(answer["error_message"])) == (
                False,
                True,
                True,
            )
    for movement in ("topup", "debit"):
        for body in bodies:
            status, answer = await provider.raw("POST", f"{ACCOUNTS}/shop-b/{movement}", body)
            assert 400 <= status < 500, (movement, body, answer)
    for body in bodies:
        status, answer = await provider.raw("PUT", f"{ACCOUNTS}/shop-b/level", body)
        assert 400 <= status < 500, (body, answer)
    after = await provider.account("shop-b")
    assert after == before
