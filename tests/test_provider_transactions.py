"""What one provider order costs the database: the transactions a downstream site's ``POST /orders`` opens,
from the request's authentication to its answer.

The provider's signed API is served by procurd's own public listener on 127.0.0.1 (the installation as a
command opens it: no background worker opens transactions meanwhile, so every one counted is the order's),
over a mirror of the sandbox upstream. The order is checked, priced, charged and taken in by the state
path's one write transaction; authenticating it reads the account once.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest
from aiohttp import web

from procurd.core.provider import cents_text
from procurd.db.database import TransactionCounts
from procurd.http.public import make_public_app
from procurd.operations import open_operations
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import SignedClient
from provider_support import add_account, provider_settings, public_base_url
from support import mirror

# Authenticating the request (the account by its key), then the state path's one write transaction.
ORDER_TRANSACTIONS = {"read": 1, "write": 1, "autocommit": 0, "glance": 0}


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig(products=2, skus_per_product=1, manual_ratio=0)) as sandbox:
        yield sandbox


def spent(before: dict[str, int], counts: TransactionCounts) -> dict[str, int]:
    return {kind: count - before[kind] for kind, count in counts.transactions().items()}


async def test_one_provider_order_takes_one_read_and_one_write(database_url: str, sandbox: Sandbox) -> None:
    """A new order (paid from the wallet, taken in for procurement, the wallet checked against the low-balance
    threshold) takes two transactions: the read that authenticates its account and the state path's one
    write. A repeat under the same ``downstream_order_no`` and a refused order (a SKU the provider does not
    offer) are answered from one write transaction each that changes nothing: the wallet is charged once."""
    settings = provider_settings(database_url, ("top", sandbox), provider={"low_balance_threshold": "1.00"})
    await mirror(settings)
    async with open_operations(settings) as operations:
        await operations.catalog.reprice()
        await operations.provider.refresh(full=True)
        lister = await add_account(operations, "lister")
        site = await add_account(operations, "counted")
        runner = web.AppRunner(make_public_app(operations))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", settings.server.public_port).start()
        try:
            base_url = public_base_url(settings)
            async with SignedClient(base_url, lister.api_key, lister.api_secret) as listing:
                products = await listing.list_all_products()
            sku = products[0]["skus"][0]
            # An account whose key the listener has not looked up yet: its order pays for that look-up too.
            async with SignedClient(base_url, site.api_key, site.api_secret) as client:
                counts = operations.runtime.database.counts
                number = f"count-{uuid.uuid4().hex[:8]}"

                before = counts.transactions()
                answer = await client.create_order(sku["id"], 1, downstream_order_no=number)
                assert answer.status == 200, answer.body
                assert answer.json()["status"] == "paid", answer.body
                assert spent(before, counts) == ORDER_TRANSACTIONS

                before = counts.transactions()
                again = await client.create_order(sku["id"], 2, downstream_order_no=number)
                assert again.json()["order_id"] == answer.json()["order_id"], again.body
                refused = await client.create_order(10**9, 1, downstream_order_no=f"{number}-x")
                assert (refused.status, refused.error_code) == (400, "sku_unavailable"), refused.body
                # One write transaction each (the account's key may be looked up again meanwhile).
                assert spent(before, counts)["write"] == 2
                assert spent(before, counts)["read"] <= 2
        finally:
            await runner.cleanup()
        account = await operations.provider.accounts.get("counted")
        assert cents_text(account.balance_cents) == format(
            Decimal("1000.00") - Decimal(sku["price_amount"]), "f"
        )


async def test_orders_taken_in_together_cost_the_same_statements_as_two(
    database_url: str, sandbox: Sandbox
) -> None:
    """Provider orders placed at once are taken in by one write transaction whose statements do not grow with
    their number (the new provider orders and procurements are inserted a batch at a time, not one a row), and
    each order gets its own id back."""
    settings = provider_settings(database_url, ("top", sandbox))
    await mirror(settings)
    async with open_operations(settings) as operations:
        await operations.catalog.reprice()
        await operations.provider.refresh(full=True)
        await add_account(operations, "together", balance="1000000.00")
        site = await operations.provider.accounts.get("together")
        page = await operations.provider.products(site, 1, 100, None, None)
        body = json.loads(gzip.decompress(page.answer) if page.answer[:2] == b"\x1f\x8b" else page.answer)
        sku_id = body["items"][0]["skus"][0]["id"]
        database = operations.runtime.database
        database.count_statements()
        counts = database.counts

        async def place_together(count: int) -> tuple[int, int]:
            before, statements = counts.transactions(), counts.statements
            placed = await asyncio.gather(
                *(
                    operations.provider.create_order(
                        site,
                        sku_id=sku_id,
                        quantity=1,
                        manual_form_data=None,
                        downstream_order_no=f"together-{uuid.uuid4().hex[:8]}",
                        trace_id=None,
                        callback_url=None,
                    )
                    for _ in range(count)
                )
            )
            figures = spent(before, counts)["write"], counts.statements - statements
            for order, created in placed:
                assert created, order
                assert order.status == "paid", order
                found = await operations.provider.order_of(site, order.id)
                assert (found.order_no, found.downstream_order_no) == (
                    order.order_no,
                    order.downstream_order_no,
                )
            return figures

        two = await place_together(2)
        eight = await place_together(8)
        assert two[0] == eight[0] == 1
        assert eight[1] == two[1]
