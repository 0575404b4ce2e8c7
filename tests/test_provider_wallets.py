"""Provider wallets under concurrency: two real ``procurd run`` processes selling the sandbox's catalogue from
one database, and every downstream account ordering from both at once for more than its wallet holds.

What is asserted, and why it holds exactly: every order an account places is decided in one transaction of
the state path that locks the account's row (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite has one writer
at a time) and allocates the provider order's id while it holds it. So, per account, the provider orders
taken in id order are the order in which the decisions were made, and each decision saw the balance the one
before left: replaying them from the starting balance (an order is paid if the running balance covers its
amount, then the running balance drops by it; otherwise it is refused) must give exactly the outcome each
order got. Consequences checked as well: no balance below zero at any point (every ledger row's balance
after, and samples taken during the burst), the sum charged is at most the starting balance, and what is
left is less than the cheapest refused order's amount. Every refusal is HTTP 200 ``payment_failed`` with the
order ``canceled`` (and bought nowhere); every accepted order is charged once (one ``order`` row in the
ledger), bought once, and delivered; the ledger's rows form one chain per account whose sum is the balance.

With hand debits racing the orders the decisions interleave with the debits in an order the records cannot
fully tell (a refused debit leaves no row), so there the exact replay is replaced by what holds in any
order: the ledger chain, nothing ever below zero, and every refused order or debit larger than what the
wallet holds at the end (balances only go down during the race).

The instances run on a database of the test run's kind: PostgreSQL when PROCURD_TEST_POSTGRES_URL is set
(the case that matters: row locks across processes), otherwise two processes on one SQLite file. They serve
both tests of the module; each test has accounts of its own.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import func, select

from fault_support import fault_sandbox_config, orderable_skus, report
from procurd.core.provider import cents_text, to_cents
from procurd.core.refusals import Refused
from procurd.db.database import Database, open_database
from procurd.db.provider_schema import provider_accounts, provider_ledger, provider_orders
from procurd.db.schema import procurements
from procurd.operations import Operations, open_operations
from procurd.sandbox import Sandbox
from procurd.sandbox.testing import ApiResponse, SignedClient
from provider_support import ProviderSite, add_account, provider_config, public_base_url
from scale_cluster import DaemonProcess, cluster, own_database, settings_of
from support import mirror, sql_rows, wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")

ORDERS_PER_INSTANCE = 6  # per account: 12 orders, half to each instance, all at once
# What each account's wallet holds, as a share of what its orders cost in all (0: refused from the start).
WALLET_SHARES = ("0", "0.25", "0.4", "0.5", "0.5", "0.6", "0.75", "1")
DEBIT_ACCOUNTS = 4
DEBITS_PER_ACCOUNT = 6
RACE_WAVES = 3  # of orders and debits racing each other
DEBIT_SHARE = "0.5"  # of what an account's orders and debits come to in all
DELIVERY_TIMEOUT_SECONDS = 30.0

Plan = list[tuple[str, int, int]]  # (downstream_order_no, sku_id, quantity) for each of an account's orders


@dataclass
class Providers:
    """Two provider instances on one database selling the sandbox's catalogue, and the test's own handles."""

    top: Sandbox
    database_url: str
    database: Database  # the test's reads
    operations: Operations  # accounts, top-ups and hand debits: a third process-like participant
    daemons: list[DaemonProcess]
    prices: dict[int, int]  # offered SKU id: price in cents

    def clients(self, sites: dict[str, ProviderSite]) -> dict[str, list[SignedClient]]:
        """For each account, a signed client of each instance."""
        return {
            name: [
                SignedClient(public_base_url(daemon.settings), site.api_key, site.api_secret, timeout=30)
                for daemon in self.daemons
            ]
            for name, site in sites.items()
        }


def wallet_config(database_url: str, top: Sandbox) -> dict[str, Any]:
    return provider_config(
        database_url,
        ("top", top),
        procurement={"poll_initial_seconds": 0.3, "poll_max_seconds": 0.5},
        provider={"rate_limit_per_minute": 100000},
    )


async def offered_prices(client: SignedClient) -> dict[int, int]:
    """The SKUs an instance offers and their prices in cents, once its offered catalogue is filled."""

    async def listed() -> list[dict[str, Any]] | None:
        return await client.list_all_products() or None

    products = await wait_until(listed, timeout=20, interval=0.1)
    return {sku["id"]: to_cents(sku["price_amount"]) for product in products for sku in product["skus"]}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def providers(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path | None, postgres_template: str | None
) -> AsyncIterator[Providers]:
    """Two ``procurd run`` processes with ``[provider]`` on, on one database, for every test of the module
    (each test uses accounts of its own); neither may log an internal error."""
    directory = tmp_path_factory.mktemp("wallets")
    async with (
        Sandbox(fault_sandbox_config(products=6)) as top,
        own_database(directory, "providers", sqlite_template, postgres_template) as database_url,
    ):
        orderable_skus(top)  # unlimited stock: only wallets refuse orders here
        configs = {name: wallet_config(database_url, top) for name in ("a", "b")}
        await mirror(settings_of(configs["a"]))
        database = open_database(database_url)
        try:
            async with (
                open_operations(settings_of(configs["a"])) as operations,
                cluster(directory, configs) as daemons,
            ):
                probe = await add_account(operations, "probe", balance="0")
                clients = Providers(top, database_url, database, operations, daemons, {}).clients(
                    {"probe": probe}
                )["probe"]
                try:
                    prices, _ = await asyncio.gather(*(offered_prices(client) for client in clients))
                finally:
                    await close_all({"probe": clients})
                yield Providers(top, database_url, database, operations, daemons, prices)
                for daemon in daemons:
                    assert not daemon.log_events("http.internal_error"), daemon.name
        finally:
            await database.close()


@dataclass(frozen=True)
class Placed:
    """One order as its account placed it and the answer it got."""

    account: str
    instance: int
    downstream_order_no: str
    answer: ApiResponse


def plan_orders(account: str, prices: dict[int, int], rng: random.Random) -> Plan:
    skus = sorted(prices)
    return [
        (f"{account}-{index:02d}", rng.choice(skus), rng.choice((1, 1, 2)))
        for index in range(2 * ORDERS_PER_INSTANCE)
    ]


def cost(plan: Plan, prices: dict[int, int]) -> int:
    return sum(prices[sku_id] * quantity for _, sku_id, quantity in plan)


async def place(
    clients: list[SignedClient], account: str, index: int, number: str, sku: int, qty: int
) -> Placed:
    """One order, to the instance its position picks (the two alternate)."""
    instance = index % 2
    answer = await clients[instance].create_order(sku, qty, downstream_order_no=number)
    return Placed(account, instance, number, answer)


def placements(clients: dict[str, list[SignedClient]], plans: dict[str, Plan]) -> list[Any]:
    """Every account's orders as coroutines to run at once."""
    return [
        place(clients[account], account, index, number, sku_id, quantity)
        for account, plan in plans.items()
        for index, (number, sku_id, quantity) in enumerate(plan)
    ]


def outcome(placed: Placed) -> str:
    """``paid`` or ``payment_failed``, after checking the answer has the shape seed 000 gives each."""
    answer = placed.answer
    assert answer.status == 200, (placed.downstream_order_no, answer.status, answer.body)
    body = answer.json()
    if body["ok"]:
        assert body["status"] == "paid", body
        return "paid"
    assert body["error_code"] == "payment_failed", body
    assert body["status"] == "canceled", body
    assert isinstance(body["order_id"], int), body
    assert body["order_no"], body
    return "payment_failed"


class BalanceSampler:
    """Reads every wallet's balance again and again while the burst runs; keeps the lowest seen."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.lowest: int | None = None
        self.samples = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        statement = select(func.min(provider_accounts.c.balance_cents))
        while not self._stop.is_set():
            value = await self.database.read(lambda tx: tx.connection.execute(statement).scalar_one())
            self.samples += 1
            if value is not None and (self.lowest is None or value < self.lowest):
                self.lowest = int(value)
            await asyncio.sleep(0.005)  # the next sample, not a wait for anything

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Wallet:
    """An account's records after the run."""

    id: int
    balance: int
    orders: list[Any]  # its provider orders, by id
    ledger: list[Any]  # its ledger rows, by id


async def wallets(database_url: str) -> dict[str, Wallet]:
    accounts = await sql_rows(database_url, select(provider_accounts))
    orders = await sql_rows(database_url, select(provider_orders).order_by(provider_orders.c.id))
    ledger = await sql_rows(database_url, select(provider_ledger).order_by(provider_ledger.c.id))
    return {
        account.name: Wallet(
            account.id,
            account.balance_cents,
            [row for row in orders if row.account_id == account.id],
            [row for row in ledger if row.account_id == account.id],
        )
        for account in accounts
    }


def ledger_chain_problems(name: str, starting: int, wallet: Wallet) -> list[str]:
    """What is wrong with the account's ledger read as a chain from an empty wallet: each row's balance
    after is the one before plus its amount and never below zero, and the last is the balance."""
    problems = []
    balance = 0
    for row in wallet.ledger:
        balance += row.amount_cents
        if row.balance_after_cents != balance:
            problems.append(
                f"{name}: ledger row {row.id} says {row.balance_after_cents}, the chain {balance}"
            )
        if balance < 0:
            problems.append(f"{name}: ledger row {row.id} leaves {balance}")
    if balance != wallet.balance:
        problems.append(f"{name}: the ledger sums to {balance}, the wallet holds {wallet.balance}")
    if wallet.ledger and wallet.ledger[0].amount_cents != starting:
        problems.append(f"{name}: the first ledger row is not the starting top-up")
    return problems


async def open_accounts(
    providers: Providers, starting: dict[str, int]
) -> tuple[dict[str, ProviderSite], dict[str, list[SignedClient]]]:
    """An account per name, its wallet topped up to ``starting`` (cents); its clients of both instances."""
    sites = {}
    for name, cents in starting.items():
        sites[name] = await add_account(
            providers.operations, name, balance=cents_text(cents) if cents else "0"
        )
    return sites, providers.clients(sites)


async def bought_by(database: Database) -> dict[str, list[str]]:
    """For each local order, the numbers its procurements were bought under upstream."""
    statement = select(procurements.c.order_no, procurements.c.downstream_order_no)
    rows = await database.read(lambda tx: tx.connection.execute(statement).all())
    bought: dict[str, list[str]] = {}
    for order_no, number in rows:
        bought.setdefault(order_no, []).append(number)
    return bought


async def wait_delivered(database: Database, accounts: Sequence[str]) -> None:
    """Every paid provider order of ``accounts`` delivered (so that none ends canceled and refunded later)."""
    statement = (
        select(func.count())
        .select_from(provider_orders.join(provider_accounts))
        .where(provider_accounts.c.name.in_(accounts), provider_orders.c.status == "paid")
    )

    async def delivered() -> bool:
        return int(await database.read(lambda tx: tx.connection.execute(statement).scalar_one())) == 0

    await wait_until(delivered, timeout=DELIVERY_TIMEOUT_SECONDS, interval=0.1)


async def close_all(clients: dict[str, list[SignedClient]]) -> None:
    for pair in clients.values():
        for client in pair:
            await client.close()


async def refused_reads_canceled(clients: dict[str, list[SignedClient]], placed: list[Placed]) -> None:
    """A refused order reads ``canceled`` from the other instance too."""
    for p in placed:
        if outcome(p) == "payment_failed":
            other = clients[p.account][1 - p.instance]
            view = (await other.get(f"/orders/{p.answer.json()['order_id']}")).json()
            assert view["status"] == "canceled", view


def check_bought_once(wallet: Wallet, bought: dict[str, list[str]], top: Sandbox) -> None:
    """Each delivered order was bought under one number that the top holds once; a refused one nowhere."""
    held = Counter(order.downstream_order_no for order in top.state.orders.values())
    for order in wallet.orders:
        if order.status == "canceled":
            assert order.order_no not in bought
            continue
        assert order.status == "delivered", (order.id, order.status)
        (number,) = bought[order.order_no]
        assert held[number] == 1, (order.order_no, number)


async def test_concurrent_orders_on_two_instances_pay_exactly_what_each_wallet_holds(
    providers: Providers,
) -> None:
    """Eight accounts each send 12 orders at once, half to each of two provider instances on one database,
    for more than their wallets hold: no balance ever below zero, every refusal HTTP 200 payment_failed with
    the order canceled, every accepted order charged and bought once, each wallet its ledger's sum, and the
    orders paid exactly those a wallet deciding them one at a time, in the order recorded, could pay."""
    rng = random.Random(4711)
    names = [f"pay{n}" for n in range(len(WALLET_SHARES))]
    plans = {name: plan_orders(name, providers.prices, rng) for name in names}
    starting = {
        name: int(Decimal(cost(plans[name], providers.prices)) * Decimal(share))
        for name, share in zip(names, WALLET_SHARES, strict=True)
    }
    _, clients = await open_accounts(providers, starting)
    sampler = BalanceSampler(providers.database)
    sampling = asyncio.create_task(sampler.run())
    try:
        placed: list[Placed] = list(await asyncio.gather(*placements(clients, plans)))
    finally:
        sampler.stop()
        await sampling
    try:
        outcomes = {p.downstream_order_no: outcome(p) for p in placed}
        await refused_reads_canceled(clients, placed)
    finally:
        await close_all(clients)
    await wait_delivered(providers.database, names)

    assert sampler.lowest is not None
    assert sampler.lowest >= 0, sampler.lowest
    records = await wallets(providers.database_url)
    bought = await bought_by(providers.database)
    answers = {p.downstream_order_no: p.answer.json() for p in placed}
    figures: dict[str, Any] = {}
    for name in names:
        wallet = records[name]
        assert ledger_chain_problems(name, starting[name], wallet) == []
        # One provider order per order placed, at the listed price times the quantity.
        assert sorted(order.downstream_order_no for order in wallet.orders) == [n for n, _, _ in plans[name]]
        for order, (_, sku_id, quantity) in zip(
            sorted(wallet.orders, key=lambda o: o.downstream_order_no), plans[name], strict=True
        ):
            assert order.amount_cents == providers.prices[sku_id] * quantity
        charges = Counter(row.order_id for row in wallet.ledger if row.kind == "order")
        assert {row.kind for row in wallet.ledger} <= {"topup", "order"}
        # The replay: each order paid exactly when the balance the decisions before it left covered it.
        running = starting[name]
        for order in wallet.orders:
            answered = outcomes[order.downstream_order_no]
            expected = "paid" if order.amount_cents <= running else "payment_failed"
            assert answered == expected, (name, order.id, order.amount_cents, running, answered)
            if answered == "paid":
                running -= order.amount_cents
                assert charges[order.id] == 1
                assert answers[order.downstream_order_no]["amount"] == cents_text(order.amount_cents)
            else:
                assert order.status == "canceled", order
                assert order.refunded_cents == 0, order
                assert charges[order.id] == 0
        assert running == wallet.balance
        check_bought_once(wallet, bought, providers.top)
        charged = sum(order.amount_cents for order in wallet.orders if order.status == "delivered")
        refused = [order.amount_cents for order in wallet.orders if order.status == "canceled"]
        assert charged <= starting[name]
        assert wallet.balance == starting[name] - charged
        assert all(amount > wallet.balance for amount in refused)
        figures[name] = {
            "starting": cents_text(starting[name]),
            "paid": len(charges),
            "refused": len(refused),
        }
    assert any(f["refused"] for f in figures.values())
    assert any(f["paid"] for f in figures.values())
    by_instance = Counter((p.instance, outcomes[p.downstream_order_no]) for p in placed)
    report(
        "provider_wallets",
        samples=sampler.samples,
        accounts=figures,
        by_instance={f"{instance}/{result}": n for (instance, result), n in sorted(by_instance.items())},
    )


@dataclass(frozen=True)
class Debit:
    """One hand debit and the balance it left, or why it was refused."""

    account: str
    cents: int
    after: int | None
    refusal: tuple[int, str] | None = None


async def debit(operations: Operations, account: str, cents: int) -> Debit:
    """A hand debit of ``cents`` by the provider's debit operation; refused only for a short wallet."""
    try:
        moved = await operations.provider.accounts.move(account, cents_text(cents), "hand debit", topup=False)
    except Refused as refused:
        return Debit(account, cents, None, (refused.status, refused.code))
    return Debit(account, cents, to_cents(moved["balance"]))


def debits_amid_charges(wallet: Wallet) -> int:
    """How many of the wallet's debit rows have order charges both before and after them."""
    kinds = [row.kind for row in wallet.ledger]
    return sum(
        1
        for index, kind in enumerate(kinds)
        if kind == "debit" and "order" in kinds[:index] and "order" in kinds[index + 1 :]
    )


async def race_in_waves(
    providers: Providers,
    clients: dict[str, list[SignedClient]],
    plans: dict[str, Plan],
    debits: dict[str, list[int]],
) -> tuple[list[Placed], list[Debit]]:
    """``RACE_WAVES`` waves; in each, a share of every account's orders and of its debits are sent all at
    once (the debits race the orders), and the next wave starts when they are all answered (so each wallet
    sees debits between charges, not only before or after them)."""
    placed: list[Placed] = []
    debited: list[Debit] = []
    for wave in range(RACE_WAVES):
        orders = placements(clients, {name: plan[wave::RACE_WAVES] for name, plan in plans.items()})
        moves = [
            debit(providers.operations, name, cents)
            for name, amounts in debits.items()
            for cents in amounts[wave::RACE_WAVES]
        ]
        racers = [*orders, *moves]
        random.Random(wave).shuffle(racers)
        for result in await asyncio.gather(*racers):
            if isinstance(result, Placed):
                placed.append(result)
            else:
                debited.append(result)
    return placed, debited


async def test_hand_debits_racing_orders_never_take_a_wallet_below_zero(providers: Providers) -> None:
    """Hand debits (the provider's debit operation, from a third participant) race orders sent to both
    instances, for twice what the wallets hold: no balance ever below zero, each ledger one unbroken chain
    summing to its wallet, each debit taken in full once or refused ``insufficient_balance`` and each order
    charged once or refused ``payment_failed``, and whatever was refused is more than the wallet holds in the
    end."""
    rng = random.Random(1913)
    names = [f"debit{n}" for n in range(DEBIT_ACCOUNTS)]
    plans = {name: plan_orders(name, providers.prices, rng) for name in names}
    prices = sorted(providers.prices.values())
    debits = {name: [rng.choice(prices) for _ in range(DEBITS_PER_ACCOUNT)] for name in names}
    starting = {
        name: int((cost(plans[name], providers.prices) + sum(debits[name])) * Decimal(DEBIT_SHARE))
        for name in names
    }
    _, clients = await open_accounts(providers, starting)
    sampler = BalanceSampler(providers.database)
    sampling = asyncio.create_task(sampler.run())
    try:
        placed, debited = await race_in_waves(providers, clients, plans, debits)
    finally:
        sampler.stop()
        await sampling
    try:
        outcomes = {p.downstream_order_no: outcome(p) for p in placed}
        await refused_reads_canceled(clients, placed)
    finally:
        await close_all(clients)
    await wait_delivered(providers.database, names)

    assert sampler.lowest is not None
    assert sampler.lowest >= 0, sampler.lowest
    records = await wallets(providers.database_url)
    bought = await bought_by(providers.database)
    figures: dict[str, Any] = {}
    for name in names:
        wallet = records[name]
        assert ledger_chain_problems(name, starting[name], wallet) == []
        charges = Counter(row.order_id for row in wallet.ledger if row.kind == "order")
        for order in wallet.orders:
            answered = outcomes[order.downstream_order_no]
            assert charges[order.id] == (1 if answered == "paid" else 0), order
            assert order.status == ("delivered" if answered == "paid" else "canceled"), order
        check_bought_once(wallet, bought, providers.top)
        # Each debit that went through is one ``debit`` row of its amount, leaving the balance it answered.
        debit_rows = Counter(
            (-row.amount_cents, row.balance_after_cents) for row in wallet.ledger if row.kind == "debit"
        )
        mine = [result for result in debited if result.account == name]
        assert len(mine) == DEBITS_PER_ACCOUNT
        assert all(d.refusal in (None, (409, "insufficient_balance")) for d in mine), mine
        assert debit_rows == Counter((d.cents, d.after) for d in mine if d.after is not None)
        assert {row.kind for row in wallet.ledger} <= {"topup", "order", "debit"}
        charged = sum(order.amount_cents for order in wallet.orders if order.status == "delivered")
        taken = sum(amount for amount, _ in debit_rows.elements())
        assert wallet.balance == starting[name] - charged - taken
        refused = [order.amount_cents for order in wallet.orders if order.status == "canceled"]
        refused += [d.cents for d in mine if d.after is None]
        assert all(amount > wallet.balance for amount in refused), (name, wallet.balance, refused)
        figures[name] = {
            "starting": cents_text(starting[name]),
            "orders_paid": len(charges),
            "debits_taken": sum(debit_rows.values()),
            "debits_amid_charges": debits_amid_charges(wallet),
            "refused": len(refused),
        }
    report("provider_wallet_debits", samples=sampler.samples, accounts=figures)
