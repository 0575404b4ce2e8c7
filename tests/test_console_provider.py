"""The provider's pages of the admin web console over real sockets (no browser): accounts with balances and
ledgers, wallet movements, access and levels, orders received with the procurement behind each, their
delivered goods hidden until revealed, the callback delivery log and its replay, the overview's provider part.

Each test runs a provider daemon (``procurd run`` in-process, ``[provider]`` on) over the sandbox, with an
account whose downstream is a :class:`SignedClient` placing orders and a :class:`CallbackReceiver` taking
their callbacks. The browser tests (``test_console_browser.py``) click through the same pages in Chromium.
"""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from console_support import ADMIN_TOKEN, CSP, ConsoleClient, Page
from procurd.core.orders import MAX_NOTE_CHARS
from procurd.daemon import Daemon
from procurd.http.console.data import ProviderOrderDetail
from procurd.http.console.render import Templates
from procurd.http.testing import procurd_stack
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import CallbackReceiver, SignedClient
from provider_support import ProviderSite, add_account, provider_settings, settled
from support import captured_log, mirror, running_daemon, wait_until

LOW_BALANCE = "100.00"
LEVELS = [{"slug": "gold", "name": {"en": "Gold", "zh-CN": "黄金会员"}, "discount_percent": "5"}]
_ALERT = re.compile(r'<p class="flash flash-error" role="alert">(.*?)</p>', re.S)


@dataclass
class Provider:
    """A provider daemon over the sandbox (``[provider]`` on, a low-balance threshold, one level), and a
    person at its console, not signed in yet."""

    sandbox: Sandbox
    daemon: Daemon
    client: ConsoleClient


@dataclass
class Chain(Provider):
    """The provider with account ``shop-c`` (500.00 CNY), its downstream's signed client and callback
    receiver, and an offered SKU."""

    site: ProviderSite
    signed: SignedClient
    receiver: CallbackReceiver
    sku: int


@asynccontextmanager
async def provider_daemon(database_url: str) -> AsyncIterator[Provider]:
    """A provider daemon with no account yet (a small catalogue: two products of one SKU, no manual form)."""
    config = SandboxConfig(products=2, skus_per_product=1, manual_ratio=0, allow_private_callbacks=True)
    async with Sandbox(config) as sandbox:
        settings = provider_settings(
            database_url, ("main", sandbox), server={"admin_token": ADMIN_TOKEN},
            provider={"low_balance_threshold": LOW_BALANCE, "levels": LEVELS},
        )  # fmt: skip
        await mirror(settings)
        async with running_daemon(settings) as daemon:
            client = ConsoleClient(f"http://127.0.0.1:{daemon.admin_port}")
            try:
                yield Provider(sandbox, daemon, client)
            finally:
                await client.close()


@asynccontextmanager
async def provider_chain(database_url: str) -> AsyncIterator[Chain]:
    """:func:`provider_daemon` with account ``shop-c``, its downstream's clients, and the offered catalogue
    refreshed."""
    async with provider_daemon(database_url) as provider:
        site = await add_account(provider.daemon.operations, "shop-c", balance="500.00")
        async with (
            SignedClient(site.base_url, site.api_key, site.api_secret) as signed,
            CallbackReceiver(site.api_key, site.api_secret) as receiver,
        ):
            await settled(provider.daemon)
            products = await signed.list_all_products()
            sku = int(products[0]["skus"][0]["id"])
            yield Chain(provider.sandbox, provider.daemon, provider.client, site, signed, receiver, sku)


@pytest.fixture
async def chain(database_url: str) -> AsyncIterator[Chain]:
    async with provider_chain(database_url) as found:
        yield found


async def place(chain: Chain, number: str, quantity: int = 1, **fields: Any) -> int:
    """A downstream order of ``quantity`` of the offered SKU, with a trace id and the receiver as its
    callback URL; its provider order id."""
    body = {"downstream_order_no": number, "trace_id": f"trace-{number}", "callback_url": chain.receiver.url}
    answer = await chain.signed.create_order(chain.sku, quantity, **{**body, **fields})
    data = answer.json()
    assert answer.status == 200, data
    assert data["ok"] is True, data
    return int(data["order_id"])


async def order_detail(chain: Chain, order_id: int) -> dict[str, Any]:
    return await chain.daemon.operations.provider.order_detail(order_id)


async def delivered(chain: Chain, order_id: int) -> dict[str, Any]:
    """Wait until the order is delivered and its downstream has been told so."""

    async def told() -> dict[str, Any] | None:
        view = await order_detail(chain, order_id)
        callback = view["callback"]
        done = view["status"] == "delivered" and callback is not None and callback["delivered_at"]
        return view if done else None

    return await wait_until(told)


async def account(chain: Chain, name: str = "shop-c") -> dict[str, Any]:
    """The account with its whole ledger, as the admin API shows it."""
    return await chain.daemon.operations.provider.accounts.show(name, 1, 100)


def alert(page: Page) -> str | None:
    """The refusal shown on a page, as a person reads it."""
    found = _ALERT.search(page.text)
    return None if found is None else html.unescape(found.group(1)).strip()


def assert_console_answer(page: Page) -> None:
    assert page.headers["Content-Security-Policy"] == CSP
    assert page.status < 500, page.text[:500]
    assert "Traceback" not in page.text


# --- off and on ---------------------------------------------------------------------------------------------


async def test_without_the_provider_there_is_no_provider_entry_or_page(database_url: str) -> None:
    """With ``[provider] enabled`` false the navigation has no Provider entry, the overview no provider
    part, and every provider page answers 404 provider_disabled (a form post too, changing nothing)."""
    async with procurd_stack(database_url, admin_token=ADMIN_TOKEN) as stack:
        client = ConsoleClient(stack.admin_url)
        try:
            await client.login()
            home = await client.get("/ui/")
            assert home.status == 200
            assert "/ui/provider" not in home.text
            assert 'id="provider"' not in home.text
            for path in ("/ui/provider", "/ui/provider/accounts", "/ui/provider/orders/1"):
                page = await client.get(path)
                assert (page.status, page.error_code) == (404, "provider_disabled"), path
            await client.get("/ui/")
            posted = await client.post("/ui/provider/accounts/x/topup", {"amount": "1", "note": "n"})
            assert (posted.status, posted.error_code) == (404, "provider_disabled")
        finally:
            await client.close()


async def test_an_empty_provider_says_so_once(database_url: str) -> None:
    """A provider with no account yet: the Provider entry leads to the accounts list, which says there are
    none once (and how to add one); the orders list says "No orders." once; the overview's provider part
    shows nothing received."""
    async with provider_daemon(database_url) as provider:
        client = provider.client
        await client.login()
        home = await client.get("/ui/")
        assert '<a href="/ui/provider/accounts">Provider</a>' in home.text
        part = home.text[home.text.index('id="provider"') :]
        assert "none received" in part
        assert "0.00 CNY" in part
        entry = await client.get("/ui/provider")
        assert (entry.status, entry.location) == (303, "/ui/provider/accounts")
        accounts = await client.get("/ui/provider/accounts")
        assert accounts.text.count("No accounts.") == 1
        assert "procurd provider account add NAME" in accounts.text
        assert 'href="/ui/provider/accounts" aria-current="page"' in accounts.text
        orders = await client.get("/ui/provider/orders")
        assert orders.text.count("No orders.") == 1
        assert "<table" not in orders.text


async def test_the_overview_says_why_a_provider_offers_nothing(database_url: str) -> None:
    """A provider whose pricing rules price nothing in its currency offers no product: the overview's
    provider part says so beside the count, with the cause, as procurd status and doctor do."""
    config = SandboxConfig(products=2, skus_per_product=1, manual_ratio=0)
    async with Sandbox(config) as sandbox:
        settings = provider_settings(
            database_url, ("main", sandbox), server={"admin_token": ADMIN_TOKEN},
            pricing={"rules": [{"currency": "USD"}]},
        )  # fmt: skip
        await mirror(settings)
        async with running_daemon(settings) as daemon:
            client = ConsoleClient(f"http://127.0.0.1:{daemon.admin_port}")
            try:
                await client.login()
                home = await client.get("/ui/")
            finally:
                await client.close()
    part = html.unescape(home.text[home.text.index('id="provider"') :])
    assert "0 products listed" in part
    assert (
        '<span class="badge bad">nothing offered</span> <span class="offer-problem">the pricing rules price '
        "the mirrored SKUs in another currency than [provider] currency CNY (2 in USD)"
    ) in part


# --- accounts -----------------------------------------------------------------------------------------------


async def test_accounts_list_shows_balances_levels_orders_and_marks_a_low_balance(chain: Chain) -> None:
    """The accounts list shows each account's name (linked), status, level, balance with its currency and
    orders by status (linked to the filtered orders); a balance below the threshold is marked low; no
    secret is on the page."""
    operations = chain.daemon.operations
    low = await add_account(operations, "shop-low", balance="20.00")
    await operations.provider.accounts.set_status("shop-low", False)
    await operations.provider.accounts.set_level("shop-c", "gold")
    await delivered(chain, await place(chain, "L-1"))
    await chain.client.login()
    page = await chain.client.get("/ui/provider/accounts")
    assert_console_answer(page)
    shop = page.text[page.text.index('id="account-shop-c"') : page.text.index('id="account-shop-low"')]
    poor = page.text[page.text.index('id="account-shop-low"') :]
    assert '<a href="/ui/provider/accounts/shop-c">shop-c</a>' in shop
    assert '<span class="badge ok">active</span>' in shop
    assert '<td data-label="Level">gold</td>' in shop
    balance = (await account(chain))["balance"]
    assert re.search(rf'class="balance">{balance} CNY</td>', shop), shop
    assert "low" not in shop
    assert '<a href="/ui/provider/orders?account=shop-c&amp;status=delivered">delivered</a> 1' in shop
    assert '<span class="badge bad">disabled</span>' in poor
    assert re.search(
        r'class="balance">20.00 CNY <span class="badge warn" title="[^"]*100.00">low</span>', poor
    )
    assert "Low-balance threshold: 100.00 CNY" in page.text
    for secret in (chain.site.api_secret, low.api_secret):
        assert secret not in page.text


async def test_account_page_shows_its_key_never_its_secret_and_pages_its_ledger(chain: Chain) -> None:
    """The account page shows the API key, status, level and balance, never the secret; its ledger is
    paged, newest first, each movement with its kind, amount, balance after, order link and note."""
    order_id = await place(chain, "A-1")
    await delivered(chain, order_id)
    accounts = chain.daemon.operations.provider.accounts
    await accounts.move("shop-c", "5.00", "goodwill <b>credit</b>", topup=True)
    view = await account(chain)
    await chain.client.login()
    page = await chain.client.get("/ui/provider/accounts/shop-c?page_size=2")
    assert_console_answer(page)
    assert f"<code>{chain.site.api_key}</code>" in page.text
    assert chain.site.api_secret not in page.text
    assert re.search(rf'<dd class="balance">{view["balance"]} CNY</dd>', page.text)
    assert "1–2 of 3 movements · page 1 of 2" in page.text
    assert 'rel="next" href="/ui/provider/accounts/shop-c?page=2&amp;page_size=2#ledger"' in page.text
    rows = re.findall(r'<tr id="ledger-(\d+)">', page.text)
    newest, order_row = view["ledger"]["items"][0], view["ledger"]["items"][1]
    assert rows == [str(newest["id"]), str(order_row["id"])]
    first = page.text[page.text.index(f'id="ledger-{newest["id"]}"') :]
    assert 'kind-topup">topup</span>' in first
    assert '<td data-label="Amount" class="amount">5.00</td>' in first
    assert f'<td data-label="Balance after" class="amount">{newest["balance_after"]}</td>' in first
    assert "goodwill &lt;b&gt;credit&lt;/b&gt;" in first
    second = page.text[page.text.index(f'id="ledger-{order_row["id"]}"') :]
    assert 'kind-order">order</span>' in second
    assert f'<a href="/ui/provider/orders/{order_id}">#{order_id}</a>' in second
    older = await chain.client.get("/ui/provider/accounts/shop-c?page_size=2&page=2")
    assert "3–3 of 3 movements · page 2 of 2" in older.text
    assert "test balance" in older.text
    assert 'rel="prev"' in older.text


async def test_account_page_shows_a_previous_secret_in_its_overlap(chain: Chain) -> None:
    """After a rotation the account page shows until when the previous secret works and whether requests
    are still signed with it, never a secret; after ``--now`` it shows none."""
    accounts = chain.daemon.operations.provider.accounts
    _, first = await accounts.add("rotated-c")
    rotation = await accounts.rotate("rotated-c", 24)
    assert rotation.old_valid_until is not None
    await chain.client.login()
    page = await chain.client.get("/ui/provider/accounts/rotated-c")
    assert_console_answer(page)
    (previous,) = re.findall(r'<dt>Previous secret</dt>\s*<dd class="old-secret">(.*?)</dd>', page.text, re.S)
    assert f'<time datetime="{rotation.old_valid_until.isoformat().replace("+00:00", "Z")}"' in previous
    assert "no request signed with it since the rotation" in previous
    assert first not in page.text
    assert rotation.api_secret not in page.text
    await accounts.rotate("rotated-c", end_now=True)
    page = await chain.client.get("/ui/provider/accounts/rotated-c")
    assert "Previous secret" not in page.text


async def test_top_up_and_debit_from_the_account_page(chain: Chain) -> None:
    """Top-up and debit (amount and note) move the wallet through the account operations: each answers
    with a redirect back and a message, and lands in the ledger with its note."""
    await chain.client.login()
    await chain.client.get("/ui/provider/accounts/shop-c")
    topup = await chain.client.post(
        "/ui/provider/accounts/shop-c/topup", {"amount": "50.25", "note": "bank transfer 7781"}
    )
    assert (topup.status, topup.location) == (303, "/ui/provider/accounts/shop-c")
    shown = await chain.client.get(topup.location)
    assert shown.flash == ("ok", "Topped up 50.25 CNY: shop-c now holds 550.25 CNY.")
    debit = await chain.client.post("/ui/provider/accounts/shop-c/debit", {"amount": "0.25", "note": "fee"})
    assert debit.status == 303
    assert (await chain.client.get(debit.location)).flash == (
        "ok",
        "Debited 0.25 CNY: shop-c now holds 550.00 CNY.",
    )
    view = await account(chain)
    assert view["balance"] == "550.00"
    movements = [(e["kind"], e["amount"], e["balance_after"], e["note"]) for e in view["ledger"]["items"]]
    assert movements[:2] == [("debit", "-0.25", "550.00", "fee"),
                             ("topup", "50.25", "550.25", "bank transfer 7781")]  # fmt: skip


async def test_a_refused_wallet_action_shows_the_reason_on_the_page_and_changes_nothing(chain: Chain) -> None:
    """A bad amount, a debit beyond the balance, a missing note and a note too long are each answered with
    the account's page carrying the reason beside the form (and what was typed), with the refusal's
    status; the balance and the ledger stay as they were."""
    await chain.client.login()
    await chain.client.get("/ui/provider/accounts/shop-c")
    before = await account(chain)
    cases = [
        ("topup", {"amount": "ten", "note": "n"}, 400, "amount must be a decimal"),
        ("topup", {"amount": "0", "note": "n"}, 400, "amount must be positive (above zero)"),
        ("topup", {"amount": "1.005", "note": "n"}, 400, "amount must have at most two decimals"),
        ("topup", {"amount": "-5", "note": "n"}, 400, "amount must be positive"),
        ("topup", {"amount": "", "note": "n"}, 400, "amount must be a decimal"),
        ("topup", {"amount": "5.00", "note": "   "}, 400, "note must be a non-empty string"),
        ("debit", {"amount": "5.00"}, 400, "note must be a non-empty string"),
        ("debit", {"amount": "500.01", "note": "too much"}, 409, "holds 500.00 CNY: 500.01 cannot be taken"),
        ("debit", {"amount": "5.00", "note": "n" * (MAX_NOTE_CHARS + 1)}, 400,
         f"note is longer than {MAX_NOTE_CHARS} characters"),
        ("topup", {"amount": "9" * 40, "note": "n"}, 400, "amount is longer than 32 characters"),
    ]  # fmt: skip
    for action, fields, status, reason in cases:
        page = await chain.client.post(f"/ui/provider/accounts/shop-c/{action}", fields)
        assert_console_answer(page)
        assert page.status == status, (fields, page.text[-600:])
        shown = alert(page)
        assert shown is not None, fields
        assert reason in shown, (fields, shown)
        assert shown.endswith(". Nothing was changed."), shown
        form = page.text[page.text.index('role="alert"') :]
        assert form.index(f'action="/ui/provider/accounts/shop-c/{action}"') < form.index("</form>")
        if len(fields.get("note", "")) <= MAX_NOTE_CHARS and fields.get("note", "").strip():
            assert f'value="{fields["note"]}"' in form
        assert '<h2 id="ledger">' in page.text  # the whole account page
    assert await account(chain) == before


async def test_csrf_and_sign_in_guard_every_provider_action(chain: Chain) -> None:
    """Without a session provider pages lead to the login page; a form post without the session's CSRF
    token, or from another site, is refused (403) and neither the wallet nor the account changes nor is a
    callback sent."""
    order_id = await place(chain, "X-1")
    await delivered(chain, order_id)
    pushes = len(chain.receiver.received)
    before = await account(chain)
    anonymous = await chain.client.get("/ui/provider/accounts/shop-c")
    assert (anonymous.status, anonymous.location) == (
        303,
        "/ui/login?next=%2Fui%2Fprovider%2Faccounts%2Fshop-c",
    )
    await chain.client.login()
    await chain.client.get("/ui/provider/accounts/shop-c")
    actions = [
        ("/ui/provider/accounts/shop-c/topup", {"amount": "10.00", "note": "forged"}),
        ("/ui/provider/accounts/shop-c/debit", {"amount": "10.00", "note": "forged"}),
        ("/ui/provider/accounts/shop-c/disable", {}),
        ("/ui/provider/accounts/shop-c/level", {"level": "gold"}),
        (f"/ui/provider/orders/{order_id}/callback", {}),
        (f"/ui/provider/orders/{order_id}/reveal", {}),
    ]
    for path, fields in actions:
        missing = await chain.client.post(path, fields, csrf="")
        cross = await chain.client.post(path, fields, headers={"Sec-Fetch-Site": "cross-site"})
        assert (missing.status, missing.error_code) == (403, "csrf_failed"), path
        assert (cross.status, cross.error_code) == (403, "cross_site"), path
        assert "SBX-" not in missing.text + cross.text
    assert await account(chain) == before
    assert len(chain.receiver.received) == pushes


async def test_disable_enable_and_set_level(chain: Chain) -> None:
    """Disable refuses the account's signed requests (401) and Enable lets them in again; a level chosen
    from the configured ones is what ping answers, "none" takes it away; an unknown level is refused on
    the page and changes nothing."""
    await chain.client.login()
    page = await chain.client.get("/ui/provider/accounts/shop-c")
    assert '<option value="gold">gold · Gold / 黄金会员 (5 % off)</option>' in page.text
    disabled = await chain.client.post("/ui/provider/accounts/shop-c/disable")
    assert disabled.status == 303
    shown = await chain.client.get(disabled.location)
    assert shown.flash == (
        "ok",
        "Account shop-c is disabled: its signed requests are refused until it is enabled again.",
    )
    assert "Enable shop-c" in shown.text
    assert (await chain.signed.post("/ping")).status == 401
    enabled = await chain.client.post("/ui/provider/accounts/shop-c/enable")
    assert (await chain.client.get(enabled.location)).flash == (
        "ok",
        "Account shop-c is enabled: its signed requests are answered again.",
    )
    assert (await chain.signed.post("/ping")).status == 200

    gold = await chain.client.post("/ui/provider/accounts/shop-c/level", {"level": "gold"})
    after = await chain.client.get(gold.location)
    assert after.flash == ("ok", "Account shop-c has level gold now.")
    assert '<option value="gold" selected>' in after.text
    assert (await chain.signed.post("/ping")).json()["member_level"]["slug"] == "gold"
    before = await account(chain)
    unknown = await chain.client.post("/ui/provider/accounts/shop-c/level", {"level": "platinum"})
    assert unknown.status == 400
    assert alert(unknown) == "no level 'platinum' in [[provider.levels]] (gold). Nothing was changed."
    missing = await chain.client.post("/ui/provider/accounts/shop-c/level", {})
    assert (missing.status, alert(missing)) == (400, "choose a level, or none. Nothing was changed.")
    assert await account(chain) == before
    none = await chain.client.post("/ui/provider/accounts/shop-c/level", {"level": ""})
    assert (await chain.client.get(none.location)).flash == ("ok", "Account shop-c has no level now.")
    assert (await chain.signed.post("/ping")).json()["member_level"] is None


# --- orders -------------------------------------------------------------------------------------------------


async def test_orders_list_filters_by_account_and_status_and_pages(chain: Chain) -> None:
    """Orders received are listed newest first, each row linked to its order and to the local order that
    buys it; they filter by account and by status and page; a filter matching nothing says so once."""
    first = await delivered(chain, await place(chain, "O-1"))
    second = await delivered(chain, await place(chain, "O-2", quantity=2))
    await add_account(chain.daemon.operations, "shop-d", balance="1.00")
    await chain.client.login()
    page = await chain.client.get("/ui/provider/orders")
    assert_console_answer(page)
    assert "1–2 of 2 orders · page 1 of 1" in page.text
    ids = re.findall(r'<tr id="provider-order-(\d+)">', page.text)
    assert ids == [str(second["id"]), str(first["id"])]
    row = page.text[page.text.index(f'id="provider-order-{second["id"]}"') :]
    assert f'<a href="/ui/provider/orders/{second["id"]}">#{second["id"]}</a>' in row
    assert f'<a href="/ui/orders/{second["order_no"]}">{second["order_no"]}</a>' in row
    assert "<code>O-2</code>" in row
    assert f"{second['amount']} CNY" in row
    assert f"{chain.sku} ×2" in row
    assert '<option value="shop-d">shop-d</option>' in page.text
    paged = await chain.client.get("/ui/provider/orders?page_size=1&page=2")
    assert "2–2 of 2 orders · page 2 of 2" in paged.text
    assert re.findall(r'<tr id="provider-order-(\d+)">', paged.text) == [str(first["id"])]
    assert 'rel="prev" href="/ui/provider/orders?page_size=1&amp;page=1"' in paged.text
    mine = await chain.client.get("/ui/provider/orders?account=shop-c&status=delivered")
    assert "1–2 of 2 orders" in mine.text
    assert '<option value="delivered" selected>' in mine.text
    for empty in ("/ui/provider/orders?account=shop-d", "/ui/provider/orders?status=canceled"):
        nothing = await chain.client.get(empty)
        assert nothing.text.count("No orders.") == 1, empty
        assert "<table" not in nothing.text


async def test_order_page_shows_the_order_its_procurement_and_callbacks_with_goods_hidden(
    chain: Chain,
) -> None:
    """The order page shows the downstream number, trace id, SKU, quantity, amount, refunded and status,
    the local order behind it (linked), the callback's state and its delivery log; the delivered goods
    are not in the page, nor in the log, until "reveal" (a POST) shows them; no page shows them (or the
    account's secret) before."""
    with captured_log("info") as log:
        order_id = await place(chain, "G-1", quantity=2)
        view = await delivered(chain, order_id)
        [push] = await chain.receiver.wait_for(1)
        goods = push.json()["fulfillment"]["payload"]
        await chain.client.login()
        page = await chain.client.get(f"/ui/provider/orders/{order_id}")
        assert_console_answer(page)
        text = page.text
        assert "<code>G-1</code>" in text
        assert "<code>trace-G-1</code>" in text
        assert f"<dt>SKU</dt><dd>{chain.sku} · product" in text
        assert f"<dt>Quantity</dt><dd>2 × {view['unit_price']}</dd>" in text
        assert f"<dt>Amount</dt><dd>{view['amount']} CNY</dd>" in text
        assert "<dt>Refunded</dt><dd>0.00 CNY</dd>" in text
        assert '<span class="badge state-delivered">delivered</span>' in text
        local = view["order_no"]
        assert f'Local order <a href="/ui/orders/{local}"><code>{local}</code></a>' in text
        assert "2 lines" in text
        assert "Reveal delivered goods" in text
        log_table = text[text.index('class="list callback-log"') :]
        assert '<td data-label="Status told">delivered</td>' in log_table
        assert '<td data-label="HTTP">200</td>' in log_table
        assert '<span class="badge ok">ok</span>' in log_table
        assert '<td data-label="Message" class="detail">received</td>' in log_table
        assert '<dd class="callback-state">\n<span class="badge ok">delivered</span>' in text
        everywhere = ["/ui/", "/ui/provider/accounts", "/ui/provider/accounts/shop-c", "/ui/provider/orders",
                      f"/ui/provider/orders/{order_id}", f"/ui/orders/{local}"]  # fmt: skip
        for path in everywhere:
            shown = (await chain.client.get(path)).text
            assert chain.site.api_secret not in shown, path
            assert all(line not in shown for line in goods.splitlines()), path
        await chain.client.get(f"/ui/provider/orders/{order_id}")

        revealed = await chain.client.post(f"/ui/provider/orders/{order_id}/reveal")
        assert revealed.status == 200
        assert revealed.headers["Cache-Control"] == "no-store"
        assert goods in html.unescape(revealed.text)
        assert "console.goods_revealed" in log.getvalue()
        assert goods.splitlines()[0] not in log.getvalue()


async def test_reveal_of_an_order_not_yet_delivered_is_refused(chain: Chain) -> None:
    """An order whose goods have not come yet has nothing to reveal: its page says "not delivered" and a
    reveal answers 404 fulfillment_not_found."""
    chain.sandbox.faults.hold_delivery_next()
    order_id = await place(chain, "H-1")
    await chain.client.login()
    page = await chain.client.get(f"/ui/provider/orders/{order_id}")
    assert "not delivered" in page.text
    assert "Reveal delivered goods" not in page.text
    refused = await chain.client.post(f"/ui/provider/orders/{order_id}/reveal")
    assert (refused.status, refused.error_code) == (404, "fulfillment_not_found")


async def test_replay_callback_says_how_the_downstream_answered(chain: Chain) -> None:
    """Replay tells the order's latest status again, signed afresh: a downstream answering 500 is said
    so (an error message, a failed replay row in the log), one answering ok is said so too; an order
    placed without a callback URL shows no button and its replay is refused with 409."""
    order_id = await place(chain, "R-1")
    await delivered(chain, order_id)
    await chain.receiver.wait_for(1)
    await chain.client.login()
    await chain.client.get(f"/ui/provider/orders/{order_id}")
    chain.receiver.answer_next(500, {"ok": False, "message": "busy <now>"})
    failed = await chain.client.post(f"/ui/provider/orders/{order_id}/callback")
    assert (failed.status, failed.location) == (303, f"/ui/provider/orders/{order_id}")
    page = await chain.client.get(failed.location)
    assert page.flash == (
        "error",
        "The downstream was told delivered again but did not take it (HTTP 500: busy <now>).",
    )
    rows = page.text[page.text.index('class="list callback-log"') :]
    assert rows.index('<span class="badge">replay</span>') < rows.index(
        '<span class="badge bad">failed</span>'
    )
    assert "busy &lt;now&gt;" in rows
    replayed = await chain.client.post(f"/ui/provider/orders/{order_id}/callback")
    assert (await chain.client.get(replayed.location)).flash == (
        "ok",
        "The downstream was told delivered again and took it (HTTP 200: received).",
    )
    pushes = await chain.receiver.wait_for(3)
    assert [push.json()["status"] for push in pushes] == ["delivered"] * 3
    assert all(push.signature_valid for push in pushes)
    assert len((await order_detail(chain, order_id))["callback_log"]) == 3

    silent = await place(chain, "R-2", callback_url="")
    await wait_until(lambda: order_detail(chain, silent))
    quiet = await chain.client.get(f"/ui/provider/orders/{silent}")
    assert "Replay callback" not in quiet.text
    assert "none given: nothing is pushed" in quiet.text
    refused = await chain.client.post(f"/ui/provider/orders/{silent}/callback")
    assert (refused.status, refused.error_code) == (409, "no_callback_url")
    assert len(chain.receiver.received) == 3


async def test_an_order_refused_payment_links_to_no_local_order(chain: Chain) -> None:
    """An order refused for the account's balance was bought nowhere: its row in the orders list says so
    instead of linking to a local order that does not exist (that page is 404), and its page says there
    is no local order."""
    poor = await add_account(chain.daemon.operations, "shop-poor", balance="0")
    async with SignedClient(poor.base_url, poor.api_key, poor.api_secret) as signed:
        answer = (await signed.create_order(chain.sku, 1, downstream_order_no="NP-1")).json()
    assert answer["error_code"] == "payment_failed"
    _, [refused] = await chain.daemon.operations.provider.orders("shop-poor", None, 1, 10)
    assert (refused["status"], refused["procured"]) == ("canceled", False)
    paid = await place(chain, "NP-2")
    await chain.client.login()
    page = await chain.client.get("/ui/provider/orders")
    row = page.text[page.text.index(f'id="provider-order-{refused["id"]}"') :].split("</tr>")[0]
    assert "not bought (payment refused)" in row
    assert "/ui/orders/" not in row
    paid_no = (await order_detail(chain, paid))["order_no"]
    assert f'<a href="/ui/orders/{paid_no}">{paid_no}</a>' in page.text
    assert (await chain.client.get(f"/ui/orders/{refused['order_no']}")).status == 404
    detail = await chain.client.get(f"/ui/provider/orders/{refused['id']}")
    assert "No local order: nothing was bought for it" in detail.text


async def test_a_replay_of_a_status_never_told_shows_as_told(chain: Chain) -> None:
    """An order still ``paid`` has had nothing to tell its downstream; once *Replay callback* told it, the
    page shows the status told by the replay and how the downstream took it, not "nothing to tell yet"
    beside the replay in the delivery log."""
    chain.sandbox.faults.hold_delivery_next()
    order_id = await place(chain, "RP-1")
    await wait_until(lambda: _procurement_submitted(chain, order_id))
    await chain.client.login()
    before = await chain.client.get(f"/ui/provider/orders/{order_id}")
    assert "nothing to tell yet" in before.text
    replayed = await chain.client.post(f"/ui/provider/orders/{order_id}/callback")
    page = await chain.client.get(replayed.location)
    assert page.flash is not None
    assert page.flash[0] == "ok", page.flash
    assert "nothing to tell yet" not in page.text
    callback = page.text[page.text.index('id="callback"') : page.text.index('id="delivery-log"')]
    assert '<dt>Last status told</dt><dd><span class="badge state-paid">paid</span>' in callback
    assert '<span class="meta">by a replay</span>' in callback
    assert '<span class="badge ok">taken</span>' in callback
    [push] = await chain.receiver.wait_for(1)
    assert push.json()["status"] == "paid"


async def _procurement_submitted(chain: Chain, order_id: int) -> bool:
    procurement = (await order_detail(chain, order_id))["procurement"]
    return procurement is not None and procurement["procurements"][0]["state"] == "submitted"


# --- overview -----------------------------------------------------------------------------------------------


async def test_overview_shows_accounts_balances_orders_and_callbacks(chain: Chain) -> None:
    """The overview's provider part shows the accounts (the disabled and the low ones named), the total
    balance, orders by status (linked) and callbacks pending and failing, as the status report counts
    them."""
    operations = chain.daemon.operations
    await add_account(operations, "shop-low", balance="20.00")
    await operations.provider.accounts.set_status("shop-low", False)
    first = await place(chain, "V-1")
    await delivered(chain, first)
    chain.receiver.answer_next(500, count=100)
    failing = await place(chain, "V-2")

    async def tried() -> bool:
        view = await order_detail(chain, failing)
        callback = view["callback"]
        told = callback is not None and callback["status"] == "delivered" == view["status"]
        return told and callback["attempts"] >= 1 and callback["pending"]

    await wait_until(tried)
    total = sum(Decimal(item["balance"]) for item in await operations.provider.accounts.list())
    await chain.client.login()
    page = await chain.client.get("/ui/")
    part = page.text[page.text.index('id="provider"') : page.text.index("Recent alerts")]
    assert re.search(r"<dd>2 \(1 disabled\)", part), part
    assert '<a href="/ui/provider/accounts/shop-low">shop-low</a>' in part
    assert f'<dd class="balance">{total} CNY</dd>' in part
    assert '<a href="/ui/provider/orders?status=delivered">delivered</a> 2' in part
    assert '<dd class="callbacks">1 pending, 1 failing, 0 given up</dd>' in part
    failing_page = await chain.client.get(f"/ui/provider/orders/{failing}")
    assert '<span class="badge warn">failing</span>' in failing_page.text
    assert "HTTP 500: busy" in failing_page.text


# --- bad input ----------------------------------------------------------------------------------------------

BAD_REQUESTS: dict[str, tuple[str, str, dict[str, str] | None, int, str]] = {
    "unknown account": ("GET", "/ui/provider/accounts/nobody", None, 404, "account_not_found"),
    "impossible account name": ("GET", "/ui/provider/accounts/..x", None, 404, "account_not_found"),
    "top-up of an unknown account": ("POST", "/ui/provider/accounts/nobody/topup",
                                     {"amount": "1", "note": "n"}, 404, "account_not_found"),
    "GET of an action": ("GET", "/ui/provider/accounts/shop-c/topup", None, 405, "method_not_allowed"),
    "ledger page 0": ("GET", "/ui/provider/accounts/shop-c?page=0", None, 400, "invalid_query"),
    "order id not a number": ("GET", "/ui/provider/orders/abc", None, 400, "invalid_id"),
    "order id zero": ("GET", "/ui/provider/orders/0", None, 404, "order_not_found"),
    "unknown order": ("GET", "/ui/provider/orders/999", None, 404, "order_not_found"),
    "replay of an unknown order": ("POST", "/ui/provider/orders/999/callback", {}, 404, "order_not_found"),
    "reveal of an unknown order": ("POST", "/ui/provider/orders/999/reveal", {}, 404, "order_not_found"),
    "unknown status filter": ("GET", "/ui/provider/orders?status=lost", None, 400, "invalid_query"),
    "unknown account filter": ("GET", "/ui/provider/orders?account=nobody", None, 404, "account_not_found"),
    "page_size too big": ("GET", "/ui/provider/orders?page_size=101", None, 400, "invalid_query"),
}  # fmt: skip


async def test_bad_input_gets_a_specific_error_page_and_changes_nothing(chain: Chain) -> None:
    """Each bad request answers its status with an HTML error page naming the problem; nothing changes."""
    await chain.client.login()
    before = await account(chain)
    for case, (method, path, fields, status, code) in BAD_REQUESTS.items():
        if method == "POST":
            await chain.client.get("/ui/provider/accounts")
        page = await (chain.client.get(path) if method == "GET" else chain.client.post(path, fields))
        assert (page.status, page.error_code) == (status, code), (case, page.text[-600:])
        assert_console_answer(page)
        assert "nothing was changed" in page.text
    assert await account(chain) == before


# --- pieces -------------------------------------------------------------------------------------------------


def test_order_page_tells_a_failing_and_a_given_up_callback_apart() -> None:
    """The callback part of an order's page says "failing" with the next try for a callback still being
    tried, "given up" for one given up, and "replay" on a replay's row of the delivery log."""
    environment = Templates().environment
    layout = {"page_link": lambda page: f"?page={page}", "csrf_token": "t", "signed_in": True,
              "login_required": True, "flash": None, "path": "/ui/", "version": "0",
              "provider_enabled": True, "nav": "provider", "subnav": "orders",
              "order_url": "/ui/provider/orders/7", "local_order_url": "/ui/orders/P1-ab",
              "account_url": "/ui/provider/accounts/shop-c"}  # fmt: skip
    order = {"id": 7, "order_no": "P1-ab", "account": "shop-c", "downstream_order_no": "D-7",
             "trace_id": None, "callback_url": "https://shop.example/hook", "status": "delivered",
             "upstream": "main", "product_id": 1, "sku_id": 2, "upstream_sku_id": 3, "title": {"en": "Card"},
             "quantity": 1, "unit_price": "9.90", "amount": "9.90", "refunded": "0.00", "currency": "CNY",
             "fulfillment": None, "created_at": "2026-11-23T10:00:00Z",
             "updated_at": "2026-11-23T10:00:00Z"}  # fmt: skip
    tries = [{"at": "2026-11-23T10:05:00Z", "status": "delivered", "http_status": None, "ok": False,
              "message": None, "replay": True, "outcome": "failed"}]  # fmt: skip
    states: dict[str, dict[str, Any]] = {
        "failing": {"pending": True, "attempts": 2, "next_attempt_at": "2026-11-23T10:06:00Z",
                    "delivered_at": None, "given_up_at": None},
        "given up": {"pending": False, "attempts": 9, "next_attempt_at": None, "delivered_at": None,
                     "given_up_at": "2026-11-24T10:00:00Z"},
    }  # fmt: skip
    for word, state in states.items():
        callback = {"status": "delivered", "first_attempt_at": "2026-11-23T10:00:00Z",
                    "last_error": "HTTP 503: down", **state}  # fmt: skip
        detail = ProviderOrderDetail(dict(order), None, callback, tries, revealed=False)
        page = environment.get_template("provider_order.html").render(
            detail=detail, order=detail.order, **layout
        )
        assert f'<span class="badge {"warn" if word == "failing" else "bad"}">{word}</span>' in page
        assert '<dd class="error-text">HTTP 503: down</dd>' in page
        assert '<span class="badge">replay</span>' in page
        assert '<span class="none">no answer</span>' in page
        assert "No local order" in page
