"""The web console in a real browser: Debian's Chromium (``/usr/bin/chromium``, installed by ``.ci/run``)
driven by Playwright, against procurd's admin listener in front of the sandbox upstream.

Nothing is downloaded: Playwright starts the system's Chromium with a fresh temporary profile. One browser
serves the whole module; each test gets its own browser context (cookies) and procurd. These tests run in the
SQLite pass only (the PostgreSQL pass covers the same pages in ``test_console.py``). Every page must load
without a console error, which is where Chromium reports anything the Content-Security-Policy blocked.

``PROCURD_CONSOLE_SCREENSHOTS=docs`` writes docs/console.md's screenshots (``docs/console-overview.png``,
``docs/console-order.png``); otherwise they go to the test's temporary directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web
from playwright.async_api import Browser, ConsoleMessage, Dialog, Page, ViewportSize, async_playwright, expect

from console_support import (
    ADMIN_TOKEN,
    INSTANCE_STATES,
    STOPPED_LONG_AGO,
    delivered_order,
    order,
    record_instances,
    sandbox_control,
)
from procurd.http.testing import Stack, procurd_stack, serve
from procurd.operations.pings import ping_upstream
from test_console_provider import Chain, delivered, place, provider_chain

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
LAPTOP: ViewportSize = {"width": 1280, "height": 860}
PHONE: ViewportSize = {"width": 390, "height": 844}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        bool(os.environ.get("PROCURD_TEST_POSTGRES_URL")), reason="browser tests run in the SQLite pass only"
    ),
    # CI installs Chromium; there a missing browser fails the launch instead of skipping.
    pytest.mark.skipif(
        not CHROMIUM.exists() and not os.environ.get("CI"),
        reason="no /usr/bin/chromium (apt-get install chromium)",
    ),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    """Debian's Chromium, headless, with a temporary profile, for every test of this module."""
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


@dataclass
class Console:
    """procurd with a token in front of the sandbox, and a browser tab on its admin listener."""

    stack: Stack
    page: Page
    sku: int
    product: int
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return self.stack.admin_url + path

    async def sign_in(self) -> None:
        await sign_in(self.page, self.stack.admin_url)


async def sign_in(page: Page, admin_url: str) -> None:
    """Open the console, which asks to sign in, and sign in with the admin token."""
    await page.goto(admin_url + "/ui/")
    await expect(page).to_have_url(re.compile(r"/ui/login$"))
    await page.get_by_label("Admin token").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()


@asynccontextmanager
async def browser_tab(browser: Browser, errors: list[str], dialogs: list[str]) -> AsyncIterator[Page]:
    """A tab in a fresh browser context (laptop size, UTC); console errors and dialogs (dismissed) are
    kept in ``errors`` and ``dialogs``."""
    context = await browser.new_context(viewport=LAPTOP, locale="en-US", timezone_id="UTC")
    context.set_default_timeout(10_000)
    page = await context.new_page()

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    async def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("console", on_console)
    page.on("dialog", on_dialog)
    try:
        yield page
    finally:
        await context.close()


@pytest_asyncio.fixture(loop_scope="module")
async def console(browser: Browser, database_url: str) -> AsyncIterator[Console]:
    """A fresh procurd (both upstreams mirrored, a 9.90 product, prices held on a cost rise above 10 %) and
    a fresh browser context."""
    pricing = {"hold_on_cost_increase_percent": "10", "rules": [{"markup_percent": "0"}]}
    async with procurd_stack(database_url, admin_token=ADMIN_TOKEN, pricing=pricing) as stack:
        product = stack.sandbox.state.add_product(price="9.90")
        await stack.sync("main")
        await stack.sync("second")
        errors: list[str] = []
        dialogs: list[str] = []
        async with browser_tab(browser, errors, dialogs) as page:
            sku = stack.sandbox.state.product(product).skus[0].id
            yield Console(stack, page, sku, product, errors, dialogs)


@dataclass
class ProviderConsole:
    """A provider daemon (account ``shop-c`` and its downstream, see ``test_console_provider``) and a
    browser tab on its admin listener."""

    chain: Chain
    page: Page
    errors: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return self.chain.client.base + path

    async def sign_in(self) -> None:
        await sign_in(self.page, self.chain.client.base)

    async def fits_a_phone(self, *paths: str) -> None:
        """Each page is no wider than a 390 px screen."""
        await self.page.set_viewport_size(PHONE)
        for path in paths:
            await self.page.goto(self.url(path))
            widths = await self.page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            assert widths[0] <= widths[1], (path, widths)
        await self.page.set_viewport_size(LAPTOP)


@pytest_asyncio.fixture(loop_scope="module")
async def provider_console(browser: Browser, database_url: str) -> AsyncIterator[ProviderConsole]:
    async with provider_chain(database_url) as chain:
        errors: list[str] = []
        async with browser_tab(browser, errors, []) as page:
            yield ProviderConsole(chain, page, errors)


def screenshot_path(tmp_path: Path, name: str) -> Path:
    directory = os.environ.get("PROCURD_CONSOLE_SCREENSHOTS")
    target = Path(directory) if directory else tmp_path
    target.mkdir(parents=True, exist_ok=True)
    return target / name


async def procurement_state(console: Console, procurement_id: int) -> str:
    found = await console.stack.operations.views.procurement(procurement_id)
    assert found is not None
    return str(found["state"])


async def test_sign_in_with_a_wrong_then_the_right_token_and_see_the_overview(
    console: Console, tmp_path: Path
) -> None:
    """A wrong token keeps the login page with a message; the right one shows the overview with each
    upstream's health, balance, queue and exceptions; on a phone nothing is wider than the screen; sign out
    leads back to the login page."""
    page = console.page
    await delivered_order(console.stack, "SHOT-1", console.sku)
    for name in ("main", "second"):
        await ping_upstream(console.stack.runtime, name)
    await order(console.stack, "SHOT-2", console.sku, max_unit_price="5.00")
    await order(console.stack, "SHOT-3", console.sku, "second")

    await page.goto(console.url("/ui/exceptions"))
    await expect(page).to_have_url(re.compile(r"/ui/login\?next=%2Fui%2Fexceptions$"))
    await page.get_by_label("Admin token").fill("not-the-token")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_have_text("That is not the admin token.")
    assert console.errors == [
        "Failed to load resource: the server responded with a status of 401 (Unauthorized)"
    ]
    console.errors.clear()
    await page.get_by_label("Admin token").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Exceptions")).to_be_visible()

    await page.get_by_role("link", name="Overview").click()
    main = page.locator("#upstream-main")
    await expect(main.locator(".badge.ok")).to_have_text("healthy")
    await expect(main.locator(".balance")).to_have_text("990.10 CNY")
    await expect(main.get_by_role("link", name="price_above_limit")).to_be_visible()
    await expect(page.locator("#upstream-second")).to_contain_text("queued 1")
    await page.screenshot(path=screenshot_path(tmp_path, "console-overview.png"), full_page=True)

    await page.set_viewport_size(PHONE)
    for path in ("/ui/", "/ui/exceptions", "/ui/orders/SHOT-1", "/ui/catalog"):
        await page.goto(console.url(path))
        widths = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert widths[0] <= widths[1], (path, widths)
    await page.set_viewport_size(LAPTOP)

    await page.get_by_role("button", name="Sign out", exact=True).click()
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await page.goto(console.url("/ui/orders"))
    await expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    assert console.errors == []


async def test_the_overview_tells_alive_stopped_and_down_and_folds_old_stops(console: Console) -> None:
    """The overview shows each instance alive, stopped or down in words and colours of their own (a clean
    restart is not red); the three stopped days ago are one closed line that opens on a click, without a
    script; on a phone the section is no wider than the screen."""
    page = console.page
    await record_instances(console.stack.runtime.database)
    await console.sign_in()
    section = page.locator("section", has=page.get_by_role("heading", name="Instances"))
    for name, state in INSTANCE_STATES.items():
        if name in STOPPED_LONG_AGO:
            await expect(section.get_by_text(name, exact=True)).to_be_hidden()
            continue
        row = section.locator("tr", has=page.get_by_text(name, exact=True))
        await expect(row.locator("td[data-label=State] .badge")).to_have_text(state)
    stopped = section.locator("tr", has=page.get_by_text("stopped:2", exact=True)).locator(".badge")
    down = section.locator("tr", has=page.get_by_text("down:3", exact=True)).locator(".badge")
    assert await stopped.evaluate("e => getComputedStyle(e).color") != await down.evaluate(
        "e => getComputedStyle(e).color"
    )
    folded = section.get_by_text("3 instances stopped cleanly more than a day ago")
    await folded.click()
    for name in STOPPED_LONG_AGO:
        row = section.locator("tr", has=page.get_by_text(name, exact=True))
        await expect(row.locator(".badge")).to_have_text("stopped")
    await page.set_viewport_size(PHONE)
    widths = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], widths
    await page.set_viewport_size(LAPTOP)
    assert console.errors == []


async def test_an_empty_queue_says_so_once_and_the_overview_tells_the_mirror_from_the_last_pass(
    console: Console,
) -> None:
    """With nothing open the exception queue says "No exceptions." once. After an incremental pass that
    listed one changed product, the overview shows the mirror's totals and, apart, what that pass listed."""
    page = console.page
    await console.sign_in()
    await page.goto(console.url("/ui/exceptions"))
    await expect(page.get_by_text("No exceptions.")).to_have_count(1)

    state = console.stack.sandbox.state
    sku = state.product(console.product).skus[0]
    state.set_sku_price(sku.id, "9.95")
    report = await console.stack.sync("main")
    assert (report.kind, report.products) == ("incremental", 1)
    mirrored = state.active_products()
    skus = sum(len(product.skus) for product in mirrored)
    listed = len(state.product(console.product).skus)
    await page.goto(console.url("/ui/"))
    main = page.locator("#upstream-main")
    await expect(main).to_contain_text(f"{len(mirrored)} products, {skus} SKUs")
    await expect(main).to_contain_text(
        f"this pass listed 1 product and {listed} SKU{'s' if listed > 1 else ''}"
    )
    assert console.errors == []


async def test_exception_from_a_drained_wallet_is_retried_from_the_page_after_a_refill(
    console: Console,
) -> None:
    """With the sandbox's wallet drained a purchase fails (payment_failed); after a refill, Retry on the
    exceptions page sends it again under a new number and it is delivered; the audit trail shows the
    operator's retry with its note."""
    page, stack = console.page, console.stack
    await sandbox_control(stack, "POST", "/wallet", {"balance": "0.00"})
    view = await order(stack, "W-1", console.sku)
    procurement_id = view["procurements"][0]["id"]
    assert await stack.submit_due()
    assert await procurement_state(console, procurement_id) == "exception"

    await console.sign_in()
    await page.get_by_role("link", name="Exceptions").click()
    await page.get_by_label("Reason").first.select_option("payment_failed")
    await page.get_by_role("button", name="Filter").click()
    row = page.locator(f"#exception-{procurement_id}")
    await expect(row).to_contain_text("payment_failed")

    await sandbox_control(stack, "POST", "/wallet", {"top_up": "100.00"})
    await row.get_by_placeholder("note (optional)").fill("wallet refilled")
    await row.get_by_role("button", name="Retry").click()
    await expect(page.get_by_role("status")).to_have_text(
        f"Procurement {procurement_id} is queued to be sent again."
    )
    await expect(page.locator(f"#exception-{procurement_id}")).to_have_count(0)

    assert await stack.submit_due()
    await stack.sandbox.wait_callbacks_idle()
    await page.goto(console.url("/ui/orders/W-1"))
    card = page.locator(f"#procurement-{procurement_id}")
    await expect(card.locator(".badge.state-delivered")).to_be_visible()
    await expect(card).to_contain_text("W-1-r2")
    retry = page.locator("table.audit tr", has_text="retry")
    await expect(retry).to_contain_text("admin")
    await expect(retry).to_contain_text('"note": "wallet refilled"')
    assert console.errors == []


async def test_resolve_needs_a_note_in_the_page_and_records_it(console: Console) -> None:
    """Resolve without a note is stopped by the form itself (nothing sent); with a note the exception is
    closed and the order's audit trail shows the note as the operator's."""
    page = console.page
    view = await order(console.stack, "N-1", console.sku, max_unit_price="1.00")
    procurement_id = view["procurements"][0]["id"]
    await console.sign_in()
    await page.goto(console.url("/ui/exceptions"))
    row = page.locator(f"#exception-{procurement_id}")
    note = row.get_by_placeholder("why it is resolved")
    await row.get_by_role("button", name="Resolve").click()
    assert await note.evaluate("field => field.validity.valueMissing") is True
    assert await procurement_state(console, procurement_id) == "exception"

    await note.fill("buyer took a refund instead")
    await row.get_by_role("button", name="Resolve").click()
    await expect(page.get_by_role("status")).to_have_text(f"Procurement {procurement_id} is resolved.")
    assert await procurement_state(console, procurement_id) == "resolved"
    await page.goto(console.url("/ui/orders/N-1"))
    resolved = page.locator("table.audit tr", has_text="resolved")
    await expect(resolved).to_contain_text("admin")
    await expect(resolved).to_contain_text("buyer took a refund instead")
    assert console.errors == []


async def test_search_an_order_and_reveal_its_goods(console: Console, tmp_path: Path) -> None:
    """Searching by a downstream number opens the order; its delivered goods are not in the page until
    "Reveal delivered goods" is clicked, then they show."""
    page, stack = console.page, console.stack
    body = {"order_no": "V-7", "items": [
        {"upstream": "main", "sku_id": console.sku, "quantity": 2},
        {"upstream": "second", "sku_id": console.sku, "quantity": 1, "max_unit_price": "5.00"},
    ]}  # fmt: skip
    assert (await stack.admin("POST", "/api/v1/orders", body)).status == 202
    assert await stack.submit_due()
    await stack.sandbox.wait_callbacks_idle()
    view = await stack.order("V-7")
    delivered = view["procurements"][0]
    goods = delivered["fulfillment"]["payload"]
    assert delivered["state"] == "delivered"

    await console.sign_in()
    await page.get_by_role("link", name="Orders").click()
    await page.get_by_role("searchbox").fill("V-7-2")
    await page.get_by_role("searchbox").press("Enter")
    await expect(page.get_by_role("heading", name=re.compile("Order V-7"))).to_be_visible()
    await expect(page.locator(f"#procurement-{delivered['id']}")).to_contain_text("2 lines")
    assert goods.splitlines()[0] not in await page.content()
    await page.screenshot(path=screenshot_path(tmp_path, "console-order.png"), full_page=True)

    await (
        page.locator(f"#procurement-{delivered['id']}")
        .get_by_role("button", name="Reveal delivered goods")
        .click()
    )
    payload = page.locator(f"#procurement-{delivered['id']} pre.payload").first
    await expect(payload).to_have_text(goods)
    assert console.errors == []


async def test_a_forged_post_from_another_page_is_refused(console: Console) -> None:
    """A page on another origin whose form posts to the console (the cookie goes along: same site) is
    refused for its Origin (it has no CSRF token either), and so is a POST sent with the session's cookies
    alone; the exception stays as it was."""
    page = console.page
    view = await order(console.stack, "F-1", console.sku, max_unit_price="1.00")
    procurement_id = view["procurements"][0]["id"]
    target = console.url(f"/ui/exceptions/{procurement_id}/resolve")
    await console.sign_in()

    async def forged_page(request: web.Request) -> web.Response:
        form = (f'<form method="post" action="{target}"><input type="hidden" name="note" value="forged">'
                '<button type="submit">Win a prize</button></form>')  # fmt: skip
        return web.Response(text=f"<!doctype html><title>prize</title>{form}", content_type="text/html")

    attacker = web.Application()
    attacker.router.add_get("/", forged_page)
    async with serve(attacker) as attacker_url:
        await page.goto(attacker_url + "/")
        await page.get_by_role("button", name="Win a prize").click()
        await expect(page.get_by_role("heading", name="Refused")).to_be_visible()
        await expect(page.locator(".message")).to_contain_text("posted from another site")

    answer = await page.context.request.post(target, form={"note": "forged"}, max_redirects=0)
    assert answer.status == 403
    assert await procurement_state(console, procurement_id) == "exception"


async def test_a_script_in_a_product_title_is_shown_as_text(console: Console) -> None:
    """A title with a script tag, quotes, CJK and emoji (changed through the sandbox's control API, then
    synced) shows as that text in the catalogue: no dialog opens and nothing is blocked or run."""
    page = console.page
    title = '<script>alert(1)</script> "引号" 商品 🎉'
    await sandbox_control(console.stack, "POST", f"/products/{console.product}", {"title": title})
    await console.stack.sync("main")
    await console.sign_in()
    await page.get_by_role("link", name="Catalogue").click()
    await page.get_by_role("searchbox").fill("script")
    await page.get_by_role("button", name="Search").click()
    cell = page.locator(f"#product-main-{console.product} td.title")
    await expect(cell).to_contain_text(title)
    assert await page.locator("td.title script").count() == 0
    assert console.dialogs == []
    assert console.errors == []


async def test_release_a_price_hold(console: Console) -> None:
    """A SKU whose cost rose past the hold threshold shows its hold in the catalogue; Release clears it and
    says so."""
    page = console.page
    await sandbox_control(console.stack, "POST", f"/skus/{console.sku}", {"price_amount": "19.90"})
    await console.stack.sync("main")
    await console.sign_in()
    await page.goto(console.url(f"/ui/catalog?q={console.sku}&upstream=main"))
    row = page.locator(f"#sku-main-{console.sku}")
    await expect(row).to_contain_text("held")
    await row.get_by_role("button", name="Release").click()
    await expect(page.get_by_role("status")).to_contain_text("released")
    await expect(page.locator(f"#sku-main-{console.sku}")).not_to_contain_text("held")


# --- the provider -------------------------------------------------------------------------------------------


async def test_an_operator_tops_up_an_account_and_a_debit_too_large_is_refused_on_the_page(
    provider_console: ProviderConsole, tmp_path: Path
) -> None:
    """From the Provider entry an operator opens an account, tops its wallet up with a note (said, and the
    ledger's newest row), cannot send a debit without a note (the form stops it), and a debit beyond the
    balance is refused on the account's page with the reason, the balance unchanged. Every provider page
    fits a phone's screen."""
    chain, page = provider_console.chain, provider_console.page
    order_id = await place(chain, "B-1")
    await delivered(chain, order_id)
    balance = (await chain.daemon.operations.provider.accounts.get("shop-c")).balance_cents
    after = balance + 2500

    await provider_console.sign_in()
    await page.get_by_role("navigation", name="Console").get_by_role("link", name="Provider").click()
    await expect(page.get_by_role("heading", name="Provider accounts")).to_be_visible()
    await page.get_by_role("link", name="shop-c").click()
    await expect(page.get_by_role("heading", name=re.compile("Account shop-c"))).to_be_visible()
    topup = page.locator("form#topup")
    await topup.get_by_label(re.compile("Amount")).fill("25.00")
    await topup.get_by_label("Note").fill("bank transfer 7781")
    await topup.get_by_role("button", name="Top up").click()
    await expect(page.get_by_role("status")).to_have_text(
        f"Topped up 25.00 CNY: shop-c now holds {after // 100}.{after % 100:02d} CNY."
    )
    await expect(page.locator("dd.balance")).to_have_text(f"{after // 100}.{after % 100:02d} CNY")
    newest = page.locator("table.ledger tbody tr").first
    await expect(newest).to_contain_text("topup")
    await expect(newest).to_contain_text("bank transfer 7781")
    await page.screenshot(path=screenshot_path(tmp_path, "console-provider-account.png"), full_page=True)

    debit = page.locator("form#debit")
    await debit.get_by_label(re.compile("Amount")).fill("1.00")
    await debit.get_by_role("button", name="Debit").click()
    note = debit.get_by_label("Note")
    assert await note.evaluate("field => field.validity.valueMissing") is True
    await note.fill("more than it holds")
    await debit.get_by_label(re.compile("Amount")).fill("99999.00")
    await debit.get_by_role("button", name="Debit").click()
    await expect(page.get_by_role("alert")).to_contain_text("99999.00 cannot be taken. Nothing was changed.")
    await expect(page.locator("dd.balance")).to_have_text(f"{after // 100}.{after % 100:02d} CNY")
    assert (await chain.daemon.operations.provider.accounts.get("shop-c")).balance_cents == after
    assert provider_console.errors == [
        "Failed to load resource: the server responded with a status of 409 (Conflict)"
    ]
    provider_console.errors.clear()

    await provider_console.fits_a_phone(
        "/ui/", "/ui/provider/accounts", "/ui/provider/accounts/shop-c", "/ui/provider/orders",
        f"/ui/provider/orders/{order_id}",
    )  # fmt: skip
    assert provider_console.errors == []


async def test_an_operator_replays_a_callback_from_the_order_page(
    provider_console: ProviderConsole, tmp_path: Path
) -> None:
    """From the orders received an operator opens an order: its goods show only after "Reveal delivered
    goods"; "Replay callback" tells the downstream its status again (signed), says it took it, and the
    delivery log shows the replay; the local order behind it is one click away."""
    chain, page = provider_console.chain, provider_console.page
    order_id = await place(chain, "C-1")
    view = await delivered(chain, order_id)
    [push] = await chain.receiver.wait_for(1)
    goods = push.json()["fulfillment"]["payload"]

    await provider_console.sign_in()
    await page.get_by_role("navigation", name="Console").get_by_role("link", name="Provider").click()
    await page.get_by_role("link", name="Orders received").click()
    await page.get_by_role("link", name=f"#{order_id}").click()
    await expect(page.get_by_role("heading", name=re.compile(f"Provider order #{order_id}"))).to_be_visible()
    assert goods not in await page.content()
    await page.screenshot(path=screenshot_path(tmp_path, "console-provider-order.png"), full_page=True)
    await page.get_by_role("button", name="Reveal delivered goods").click()
    await expect(page.locator("pre.payload").first).to_have_text(goods)

    await page.get_by_role("button", name="Replay callback").click()
    await expect(page.get_by_role("status")).to_have_text(
        "The downstream was told delivered again and took it (HTTP 200: received)."
    )
    assert goods not in await page.content()
    rows = page.locator("table.callback-log tbody tr")
    await expect(rows).to_have_count(2)
    await expect(rows.first).to_contain_text("replay")
    await expect(rows.first).to_contain_text("ok")
    pushes = await chain.receiver.wait_for(2)
    assert [(p.json()["status"], p.signature_valid) for p in pushes] == [("delivered", True)] * 2

    await page.get_by_role("link", name=view["order_no"]).click()
    await expect(page.get_by_role("heading", name=re.compile(f"Order {view['order_no']}"))).to_be_visible()
    assert provider_console.errors == []
