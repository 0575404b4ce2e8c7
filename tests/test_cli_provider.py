"""``procurd provider`` and the provider's part of ``procurd status``, as an operator types them.

A provider daemon runs over the sandbox in this test's loop; each command runs in a worker thread with its own
event loop on the same database (as from a shell). Downstream sites are played by the independent signed
client of ``procurd.sandbox.testing``. Every test ends with each wallet's balance equal to the sum of its
ledger.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from sqlalchemy import func, select

from procurd.config import Settings
from procurd.daemon import Daemon
from procurd.db.provider_schema import provider_accounts, provider_ledger
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import ApiResponse, CallbackReceiver, SignedClient
from provider_support import provider_config, public_base_url
from support import forget_cached_loggers, mirror, run_cli, running_daemon, sql_rows, wait_until

LEVELS = [
    {"slug": "gold", "name": {"en": "Gold"}, "discount_percent": "5"},
    {"slug": "silver", "name": {"en": "Silver", "zh-CN": "白银会员"}, "discount_percent": "2"},
]
PRODUCTS = 3
SECRET = re.compile(r"\bapi_secret\s+([0-9a-f]{64})\b")
KEY = re.compile(r"\bapi_key\s+(pk_[0-9a-f]+)\b")


def to_toml(config: Mapping[str, Any]) -> str:
    """``config`` as a TOML file: a table per section (an array of tables for a list of them), nested
    tables and lists of them inline."""
    lines: list[str] = []
    for section, values in config.items():
        blocks = values if isinstance(values, list) else [values]
        for block in blocks:
            lines.append(f"[[{section}]]" if isinstance(values, list) else f"[{section}]")
            lines.extend(f"{key} = {_value(item)}" for key, item in block.items())
            lines.append("")
    return "\n".join(lines)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(key)} = {_value(item)}" for key, item in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


@dataclass
class Shell:
    """A provider daemon over the sandbox and a procurd.toml for the command line on its database."""

    settings: Settings
    daemon: Daemon
    config: Path
    database_url: str

    async def run(self, *args: str) -> Result:
        return await run_cli(self.config, *args)

    async def ok(self, *args: str) -> Result:
        result = await self.run(*args)
        assert result.exit_code == 0, (args, result.stdout, result.stderr)
        return result

    async def logged(self, *args: str) -> Result:
        """A command that succeeds, with its log at debug level on stderr (procurd's loggers bound afresh
        before and after it: each keeps the configuration of its first use)."""
        forget_cached_loggers()
        try:
            return await self.ok(*args, "--log-level", "debug", "--log-format", "json")
        finally:
            forget_cached_loggers()

    async def json(self, *args: str) -> Any:
        return json.loads((await self.ok(*args, "--json")).stdout)

    async def refused(self, code: str, *args: str) -> Result:
        """A command the provider's operation refuses: exit code 1 and ``procurd: CODE: ...``."""
        result = await self.run(*args)
        assert result.exit_code == 1, (args, result.stdout, result.stderr)
        assert f"procurd: {code}: " in result.stderr, result.stderr
        return result

    async def add(self, name: str, topup: str | None = None) -> tuple[str, str]:
        """A new account (and its wallet topped up): its API key and secret."""
        created = await self.json("provider", "account", "add", name)
        if topup is not None:
            await self.ok("provider", "topup", name, topup, "--note", "opening balance")
        return created["api_key"], created["api_secret"]

    def client(self, api_key: str, secret: str) -> SignedClient:
        return SignedClient(public_base_url(self.settings), api_key, secret)


@pytest.fixture
async def shell(database_url: str, tmp_path: Path) -> AsyncIterator[Shell]:
    """A provider selling the sandbox's small catalogue at cost plus 10 % with two levels (gold, silver),
    and a configuration file for the command line."""
    config = SandboxConfig(
        products=PRODUCTS, manual_ratio=0, allow_private_callbacks=True, balance=Decimal(10**6)
    )
    async with Sandbox(config) as sandbox:
        # Tests wait for a change to reach the daemon by asking it again: no rate limit gets in the way.
        provider = {"levels": LEVELS, "rate_limit_per_minute": 100_000}
        data = provider_config(database_url, ("top", sandbox), provider=provider)
        path = tmp_path / "procurd.toml"
        path.write_text(to_toml(data), encoding="utf-8")
        settings = Settings(**data)
        await mirror(settings)
        async with running_daemon(settings) as daemon:
            yield Shell(settings, daemon, path, database_url)
            await balances_match_ledgers(database_url)


async def balances_match_ledgers(database_url: str) -> None:
    """Every wallet holds the sum of its ledger."""
    accounts = await sql_rows(
        database_url,
        select(provider_accounts.c.id, provider_accounts.c.name, provider_accounts.c.balance_cents),
    )
    sums = await sql_rows(
        database_url,
        select(provider_ledger.c.account_id, func.sum(provider_ledger.c.amount_cents)).group_by(
            provider_ledger.c.account_id
        ),
    )
    totals = {int(account_id): int(total) for account_id, total in sums}
    for account_id, name, balance_cents in accounts:
        assert balance_cents == totals.get(account_id, 0), name


async def ping(client: SignedClient) -> ApiResponse:
    return await client.post("/ping")


async def answered(client: SignedClient, status: int, error_code: str | None = None) -> dict[str, Any]:
    """The daemon's answer to a ping once it is ``status`` (with ``error_code``): a change made by a command
    reaches a running daemon's signed API within a second (it keeps the accounts it looked up that long)."""

    async def seen() -> dict[str, Any] | None:
        answer = await ping(client)
        body: dict[str, Any] = answer.json()
        wanted = (status, error_code, status == 200)
        return body if (answer.status, answer.error_code, body["ok"]) == wanted else None

    return await wait_until(seen, interval=0.05)


async def offered_sku(client: SignedClient) -> int:
    """An offered SKU id, once the offered catalogue holds every product."""

    async def complete() -> list[dict[str, Any]] | None:
        products = await client.list_all_products()
        return products if len(products) == PRODUCTS else None

    products = await wait_until(complete)
    sku: int = products[0]["skus"][0]["id"]
    return sku


# --- accounts -----------------------------------------------------------------------------------------------


async def test_account_add_prints_the_secret_once_and_nothing_else_shows_it(shell: Shell) -> None:
    """``account add`` prints the API key and the secret once (``--json``: exactly name, api_key and
    api_secret), and the secret signs requests at once; ``list`` and ``show`` (with ``--json``) never print
    it, nor does the log at debug level; a taken or malformed name is refused."""
    added = await shell.logged("provider", "account", "add", "shop-b")
    [secret] = SECRET.findall(added.stdout)
    [key] = KEY.findall(added.stdout)
    assert added.stdout.count(secret) == 1
    assert "shown this once" in added.stdout
    assert "provider.account_added" in added.stderr
    assert secret not in added.stderr

    created = await shell.json("provider", "account", "add", "shop-c")
    assert set(created) == {"name", "api_key", "api_secret"}
    assert created["name"] == "shop-c"
    assert re.fullmatch("[0-9a-f]{64}", created["api_secret"])
    for api_key, api_secret in ((key, secret), (created["api_key"], created["api_secret"])):
        async with shell.client(api_key, api_secret) as client:
            assert (await ping(client)).json()["ok"] is True

    listed = await shell.ok("provider", "account", "list")
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert ["shop-b", "active", "-", "0.00", "CNY", "0"] in rows
    assert ["shop-c", "active", "-", "0.00", "CNY", "0"] in rows
    assert "2 accounts" in listed.stdout
    as_json = await shell.json("provider", "account", "list")
    assert (as_json["ok"], as_json["provider_enabled"], as_json["currency"]) == (True, True, "CNY")
    assert [(item["name"], item["api_key"]) for item in as_json["items"]] == [
        ("shop-b", key),
        ("shop-c", created["api_key"]),
    ]
    shown = await shell.ok("provider", "account", "show", "shop-b")
    assert "account shop-b: active" in shown.stdout
    assert key in shown.stdout
    assert "no wallet movements" in shown.stdout
    shown_json = await shell.json("provider", "account", "show", "shop-b")
    assert (shown_json["account"]["balance"], shown_json["account"]["ledger"]["total"]) == ("0.00", 0)
    for output in (listed.stdout, json.dumps(as_json), shown.stdout, json.dumps(shown_json)):
        assert secret not in output
        assert created["api_secret"] not in output

    await shell.refused("account_exists", "provider", "account", "add", "shop-b")
    for name in ("_shop", "shop b", "a" * 65):
        await shell.refused("invalid_account_name", "provider", "account", "add", name)
    refused = await shell.run("provider", "account", "add", "shop-b", "--json")
    assert (refused.exit_code, json.loads(refused.stdout)["error_code"]) == (1, "account_exists")
    await shell.refused("account_not_found", "provider", "account", "show", "nobody")
    assert len((await shell.json("provider", "account", "list"))["items"]) == 2


async def test_topup_debit_and_the_ledger(shell: Shell) -> None:
    """``topup`` and ``debit`` move the wallet with a note each and ``ledger`` lists the movements the newest
    first; a debit beyond the balance is refused and changes nothing, as are malformed amounts; the balance
    is the ledger's sum."""
    await shell.add("shop-b")
    topup = await shell.ok("provider", "topup", "shop-b", "100.00", "--note", "bank transfer 17")
    assert "topup of 100.00 CNY on shop-b: balance now 100.00" in topup.stdout
    debit = await shell.json("provider", "debit", "shop-b", "30.50", "--note", "goodwill")
    assert (debit["ok"], debit["kind"], debit["amount"], debit["balance"]) == (
        True,
        "debit",
        "-30.50",
        "69.50",
    )

    beyond = await shell.refused(
        "insufficient_balance", "provider", "debit", "shop-b", "69.51", "--note", "x"
    )
    assert "69.50" in beyond.stderr
    beyond_json = await shell.run("provider", "debit", "shop-b", "100", "--note", "x", "--json")
    assert json.loads(beyond_json.stdout)["error_code"] == "insufficient_balance"
    for amount in ("abc", "0", "-5", "1.001", "NaN", "1e2", "1_000", "\u0661"):
        for movement in ("topup", "debit"):  # after --, "-5" is not an option
            await shell.refused("invalid_amount", "provider", movement, "--note", "x", "shop-b", "--", amount)
    for movement in ("topup", "debit"):  # without --, a negative amount is still read as the amount
        negative = await shell.refused("invalid_amount", "provider", movement, "shop-b", "-5", "--note", "x")
        assert "amount must be positive" in negative.stderr, negative.stderr
    zero = await shell.refused("invalid_amount", "provider", "topup", "shop-b", "0", "--note", "x")
    assert "amount must be positive (above zero)" in zero.stderr
    await shell.refused("note_required", "provider", "topup", "shop-b", "1.00", "--note", "  ")
    await shell.refused("account_not_found", "provider", "topup", "nobody", "1.00", "--note", "x")
    missing_note = await shell.run("provider", "topup", "shop-b", "1.00")
    assert missing_note.exit_code == 2
    assert "--note" in missing_note.stderr

    ledger = await shell.ok("provider", "ledger", "shop-b")
    assert "ledger" in ledger.stdout
    assert "bank transfer 17" in ledger.stdout
    assert "goodwill" in ledger.stdout
    assert "2 movements; page 1 of 1" in ledger.stdout
    entries = await shell.json("provider", "ledger", "shop-b")
    assert [(e["kind"], e["amount"], e["balance_after"]) for e in entries["items"]] == [
        ("debit", "-30.50", "69.50"),
        ("topup", "100.00", "100.00"),
    ]
    assert sum(Decimal(e["amount"]) for e in entries["items"]) == Decimal("69.50")
    page = await shell.json("provider", "ledger", "shop-b", "--page", "2", "--page-size", "1")
    assert (page["total"], [e["kind"] for e in page["items"]]) == (2, ["topup"])
    shown = await shell.ok("provider", "account", "show", "shop-b")
    assert "69.50 CNY" in shown.stdout
    assert "bank transfer 17" in shown.stdout


async def test_levels_disable_and_enable_act_on_the_signed_api(shell: Shell) -> None:
    """``set-level`` takes a configured slug (an unknown one is refused naming the configured slugs) or
    ``none``; ``disable`` makes the account's requests answer 401 until ``enable``."""
    key, secret = await shell.add("shop-b", topup="10.00")
    unknown = await shell.refused("unknown_level", "provider", "account", "set-level", "shop-b", "platinum")
    assert "gold" in unknown.stderr
    assert "silver" in unknown.stderr
    await shell.refused("account_not_found", "provider", "account", "set-level", "nobody", "gold")
    async with shell.client(key, secret) as client:
        assert (await ping(client)).json()["member_level"] is None
        gold = await shell.ok("provider", "account", "set-level", "shop-b", "gold")
        assert "account shop-b: level gold" in gold.stdout

        async def level_shown(slug: str | None) -> dict[str, Any]:
            async def seen() -> dict[str, Any] | None:
                level: dict[str, Any] | None = (await ping(client)).json()["member_level"]
                return {"level": level} if (level and level["slug"]) == slug else None

            return await wait_until(seen, interval=0.05)

        await level_shown("gold")
        silver = await shell.json("provider", "account", "set-level", "shop-b", "silver")
        assert (silver["ok"], silver["account"]["level"]) == (True, "silver")
        shown = await level_shown("silver")
        assert shown["level"]["name"] == {"en": "Silver", "zh-CN": "白银会员"}
        assert "level none" in (await shell.ok("provider", "account", "set-level", "shop-b", "none")).stdout
        await level_shown(None)

        disabled = await shell.ok("provider", "account", "disable", "shop-b")
        assert "account shop-b is disabled" in disabled.stdout
        await answered(client, 401, "invalid_api_key")
        rows = [line.split() for line in (await shell.ok("provider", "account", "list")).stdout.splitlines()]
        assert ["shop-b", "disabled", "-", "10.00", "CNY", "0"] in rows
        enabled = await shell.json("provider", "account", "enable", "shop-b")
        assert enabled["account"]["status"] == "active"
        assert "api_secret" not in enabled["account"]
        assert (await answered(client, 200))["ok"] is True
        await shell.refused("account_not_found", "provider", "account", "disable", "nobody")


def hours_ahead(stamp: str) -> float:
    return (datetime.fromisoformat(stamp) - datetime.now(UTC)).total_seconds() / 3600


async def test_rotate_keeps_the_previous_secret_for_the_overlap_and_now_ends_it(shell: Shell) -> None:
    """``rotate`` prints a new secret once; the previous one keeps working for ``[provider]
    rotation_overlap_hours`` (168) and the requests still signed with it are counted in ``account show``;
    ``--overlap HOURS`` sets the window (``--json``: ``name``, ``api_key``, ``api_secret``,
    ``old_valid_until``); ``--now`` ends every secret but the new one at once."""
    key, secret = await shell.add("shop-b", topup="10.00")
    rotated = await shell.logged("provider", "account", "rotate", "shop-b")
    [new_secret] = SECRET.findall(rotated.stdout)
    assert rotated.stdout.count(new_secret) == 1
    assert KEY.findall(rotated.stdout) == [key]
    assert new_secret != secret
    assert "The previous secret keeps working until" in rotated.stdout
    assert "provider.account_secret_rotated" in rotated.stderr
    assert new_secret not in rotated.stderr
    assert secret not in rotated.stderr
    async with shell.client(key, secret) as old, shell.client(key, new_secret) as new:
        assert (await answered(new, 200))["balance"] == "10.00"  # the daemon has seen the rotation
        for _ in range(4):  # a downstream that has not switched yet
            answer = await ping(old)
            assert (answer.status, answer.json()["ok"]) == (200, True)
    view = (await shell.json("provider", "account", "show", "shop-b"))["account"]
    (previous,) = view["old_secrets"]
    assert 167.9 < hours_ahead(previous["valid_until"]) <= 168
    assert previous["requests"] == 4
    assert previous["last_used_at"] is not None
    shown = await shell.ok("provider", "account", "show", "shop-b")
    assert "4 requests signed with it, the latest" in shown.stdout

    again = await shell.json("provider", "account", "rotate", "shop-b", "--overlap", "2")
    assert set(again) == {"name", "api_key", "api_secret", "old_valid_until"}
    assert 1.9 < hours_ahead(again["old_valid_until"]) <= 2
    async with (
        shell.client(key, secret) as first,
        shell.client(key, new_secret) as second,
        shell.client(key, again["api_secret"]) as third,
    ):
        await answered(third, 200)
        assert (await ping(first)).status == 200  # its own overlap is not shortened by the next rotation
        assert (await ping(second)).status == 200
    windows = [old["valid_until"] for old in (await shell.json("provider", "account", "show", "shop-b"))[
        "account"]["old_secrets"]]  # fmt: skip
    assert [round(hours_ahead(until)) for until in windows] == [2, 168]

    leaked = await shell.json("provider", "account", "rotate", "shop-b", "--now")
    assert leaked["old_valid_until"] is None
    async with (
        shell.client(key, secret) as first,
        shell.client(key, new_secret) as second,
        shell.client(key, again["api_secret"]) as third,
        shell.client(key, leaked["api_secret"]) as current,
    ):
        for ended in (first, second, third):
            await answered(ended, 401, "invalid_signature")
        assert (await answered(current, 200))["ok"] is True
    assert (await shell.json("provider", "account", "show", "shop-b"))["account"]["old_secrets"] == []
    usage = await shell.run("provider", "account", "rotate", "shop-b", "--now", "--overlap", "1")
    assert usage.exit_code == 2
    assert "--now and --overlap" in usage.stderr
    await shell.refused("invalid_overlap", "provider", "account", "rotate", "shop-b", "--overlap", "-1")
    await shell.refused("account_not_found", "provider", "account", "rotate", "nobody")


# --- orders ---------------------------------------------------------------------------------------------


async def test_orders_order_show_and_replay(shell: Shell) -> None:
    """``orders`` lists the orders received, the newest first, by account and status; ``order show`` prints
    one with its procurement and callback log; ``order replay`` pushes its latest status again (signed with
    the account's key) and logs the try as a replay; an order without a callback URL is refused."""
    key, secret = await shell.add("shop-b", topup="1000.00")
    poor_key, poor_secret = await shell.add("shop-c", topup="0.01")
    provider = shell.daemon.operations.provider
    async with (
        shell.client(key, secret) as client,
        shell.client(poor_key, poor_secret) as poor,
        CallbackReceiver(key, secret) as receiver,
    ):
        sku = await offered_sku(client)
        first = (await client.create_order(sku, downstream_order_no="B-1", callback_url=receiver.url)).json()
        second = (await client.create_order(sku, downstream_order_no="B-2")).json()
        assert (await poor.create_order(sku, downstream_order_no="C-1")).json()[
            "error_code"
        ] == "payment_failed"

        async def delivered() -> bool:
            one = await provider.order_detail(first["order_id"])
            other = await provider.order_detail(second["order_id"])
            told = one["callback"] is not None and one["callback"]["delivered_at"] is not None
            return one["status"] == other["status"] == "delivered" and told

        await wait_until(delivered)

        listed = await shell.ok("provider", "orders")
        rows = [line.split() for line in listed.stdout.splitlines()[1:4]]
        assert [(row[1], row[2], row[3]) for row in rows] == [
            ("shop-c", "C-1", "canceled"),
            ("shop-b", "B-2", "delivered"),
            ("shop-b", "B-1", "delivered"),
        ]
        # An order refused payment was bought nowhere: no local order number to look up.
        assert "- (payment refused)" in listed.stdout.splitlines()[1]
        assert first["order_no"] in listed.stdout.splitlines()[3]
        refused = (await shell.json("provider", "orders", "--account", "shop-c"))["items"][0]
        assert refused["procured"] is False
        await shell.refused("order_not_found", "order", "show", refused["order_no"])
        refused_shown = await shell.ok("provider", "order", "show", str(refused["id"]))
        assert "not bought (payment refused)" in refused_shown.stdout
        assert "3 orders; page 1 of 1" in listed.stdout
        of_c = await shell.json("provider", "orders", "--account", "shop-c")
        assert [(o["downstream_order_no"], o["status"]) for o in of_c["items"]] == [("C-1", "canceled")]
        delivered_orders = await shell.json("provider", "orders", "--status", "delivered", "--page-size", "1")
        assert (delivered_orders["total"], len(delivered_orders["items"])) == (2, 1)
        bad_status = await shell.run("provider", "orders", "--status", "shipped")
        assert bad_status.exit_code == 2
        assert "canceled" in bad_status.stderr
        await shell.refused("account_not_found", "provider", "orders", "--account", "nobody")
        assert "no provider orders" in (await shell.ok("provider", "orders", "--status", "completed")).stdout

        shown = await shell.ok("provider", "order", "show", str(first["order_id"]))
        assert f"provider order {first['order_id']} of shop-b: delivered" in shown.stdout
        assert f"procurement: order {first['order_no']} delivered (delivered)" in shown.stdout
        assert "callback: told delivered: taken by the downstream" in shown.stdout
        assert "(1 try)" in shown.stdout
        assert "delivered delivered" not in shown.stdout
        assert "callback log" in shown.stdout
        assert secret not in shown.stdout

        pushes = len(receiver.received)
        replayed = await shell.ok("provider", "order", "replay", str(first["order_id"]))
        assert "callback: told delivered: taken by the downstream" in replayed.stdout
        assert "(2 tries)" in replayed.stdout
        assert "replay" in replayed.stdout
        assert len(receiver.received) == pushes + 1
        assert receiver.received[-1].signature_valid
        assert receiver.received[-1].json()["status"] == "delivered"
        again = await shell.json("provider", "order", "replay", str(first["order_id"]))
        assert [a["replay"] for a in again["order"]["callback_log"]] == [True, True, False]

        await shell.refused("no_callback_url", "provider", "order", "replay", str(second["order_id"]))
        await shell.refused("order_not_found", "provider", "order", "show", "99999")
        await shell.refused("order_not_found", "provider", "order", "replay", "99999")
        shown_json = await shell.json("provider", "order", "show", str(second["order_id"]))
        assert (shown_json["order"]["callback"], shown_json["order"]["procurement"]["status"]) == (
            None,
            "delivered",
        )
    assert (await shell.json("provider", "account", "show", "shop-c"))["account"]["balance"] == "0.01"


# --- procurd status -------------------------------------------------------------------------------------


async def test_status_shows_the_provider_part_when_it_is_on(shell: Shell, tmp_path: Path) -> None:
    """``procurd status`` shows the provider's accounts (disabled ones counted), the wallets in all and the
    active accounts' lowest ones, orders by status, callbacks pending and failing, and the products offered;
    with the provider off it has no provider part."""
    key, secret = await shell.add("shop-b", topup="500.00")
    await shell.add("shop-c", topup="3.00")
    await shell.add("shop-d", topup="70.00")
    await shell.add("shop-e")
    await shell.ok("provider", "account", "disable", "shop-e")
    async with shell.client(key, secret) as client, CallbackReceiver(key, secret) as receiver:
        receiver.answer_next(500, count=1000)
        sku = await offered_sku(client)
        assert (await client.create_order(sku, downstream_order_no="B-1", callback_url=receiver.url)).json()[
            "ok"
        ]

        async def failing() -> dict[str, Any] | None:
            report = await shell.daemon.operations.housekeeping.status()
            provider: dict[str, Any] = report["provider"]
            done = provider["callbacks"]["failing"] == 1 and provider["orders"] == {"delivered": 1}
            return provider if done else None

        await wait_until(failing)
        status = await shell.ok("status")
    report = await shell.json("status")
    [shop_b] = [entry["balance"] for entry in report["provider"]["balances"] if entry["name"] == "shop-b"]
    balance_total = report["provider"]["balance_total"]
    assert Decimal(balance_total) == sum(Decimal(b["balance"]) for b in report["provider"]["balances"])
    lines = status.stdout.splitlines()
    assert f"provider: 4 accounts (1 disabled); {balance_total} CNY in their wallets" in lines
    fields = {line.split()[0]: line.split(None, 1)[1] for line in lines if line.startswith("  ")}
    assert fields["lowest"] == f"shop-c 3.00 CNY, shop-d 70.00 CNY, shop-b {shop_b} CNY"
    assert fields["orders"] == "1 order: delivered 1"
    assert fields["callbacks"].startswith("1 pending (1 failing), 0 given up")
    assert fields["offered"] == f"{PRODUCTS} products on sale"

    off = tmp_path / "off.toml"
    off.write_text(
        shell.config.read_text(encoding="utf-8").replace("enabled = true", "enabled = false"),
        encoding="utf-8",
    )
    plain = await run_cli(off, "status")
    assert plain.exit_code == 0, plain.stderr
    assert "provider" not in plain.stdout
    assert json.loads((await run_cli(off, "status", "--json")).stdout)["provider"] == {"enabled": False}
    listed = await run_cli(off, "provider", "account", "list")
    assert "the provider is off" in listed.stdout
    assert "shop-b" in listed.stdout
