"""The shop's pulse in a real browser (Debian's Chromium through Playwright, as ``test_console_browser.py``),
on a laptop (1280 px) and on a phone (390 px): every chart is drawn and named for a screen reader, nothing
scrolls sideways, and the console logs no error (which is where Chromium reports anything the
Content-Security-Policy blocked: the charts use no script and no inline style).

``PROCURD_CONSOLE_SCREENSHOTS=docs`` writes docs/console.md's screenshots (``docs/console-pulse.png``,
``docs/console-pulse-phone.png``, ``docs/console-account-pulse.png``); otherwise they go to the test's
temporary directory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest_asyncio
from playwright.async_api import Browser, Page, ViewportSize, expect

from console_support import ADMIN_TOKEN
from procurd.db.stores import Tx
from procurd.http.testing import Stack, procurd_stack
from procurd.operations.pings import ping_upstream
from pulse_support import PRICE, plan_history, seed_history
from test_console_browser import LAPTOP, PHONE, browser, browser_tab, pytestmark, screenshot_path, sign_in
from test_console_provider import delivered, place, provider_chain

__all__ = ["browser", "pytestmark"]  # the module's browser, and its marks: Chromium, SQLite only

CHART_TITLES = (
    "Procurements per hour, last 24 h",
    "Procurements per day, last 30 days",
    "Time from intake to delivery, last 24 h",
    "Balance, last 7 days, and the runway",
    "Spend and margin per day, last 30 days",
)


@pytest_asyncio.fixture(loop_scope="module")
async def shop(database_url: str) -> AsyncIterator[Stack]:
    """procurd with a token, one upstream (a 9.90 SKU sold at 11.88), 30 days of history written through the
    state path, the wallet's balance every six hours of the last week, and a ping now."""
    pricing = {"rules": [{"markup_percent": "20"}]}
    async with procurd_stack(
        database_url, admin_token=ADMIN_TOKEN, upstreams=("main",), pricing=pricing
    ) as stack:
        product = stack.sandbox.state.add_product(price=PRICE)
        await stack.sync("main")
        sku = stack.sandbox.state.product(product).skus[0].id
        now = datetime.now(UTC)
        await seed_history(
            stack.runtime.database, stack.settings, sku, plan_history(now, orders=480, recent=1 / 24)
        )

        def balances(tx: Tx) -> None:
            for ago in range(168, 0, -6):
                tx.charts.record_balance(
                    "main", f"{1800 - (168 - ago) * 4.5:.2f}", "CNY", now - timedelta(hours=ago)
                )

        await stack.runtime.database.write(balances)
        stack.sandbox.state.set_balance("1000.00")
        await ping_upstream(stack.runtime, "main")
        yield stack


async def charts_fit(page: Page, url: str, viewport: ViewportSize, errors: list[str]) -> None:
    """At ``viewport``: the page shows every chart, each an image named by its title, inside the screen's
    width, and the console logged no error."""
    await page.set_viewport_size(viewport)
    await page.goto(url)
    for title in CHART_TITLES:
        image = page.get_by_role("img", name=title)
        await expect(image).to_be_visible()
        box = await image.bounding_box()
        assert box is not None
        assert box["x"] >= 0
        assert box["x"] + box["width"] <= viewport["width"], (title, box)
    widths = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], (url, viewport, widths)
    assert errors == []


async def test_the_overview_draws_the_pulse_on_a_laptop_and_on_a_phone(
    browser: Browser, shop: Stack, tmp_path: Path
) -> None:
    """Signed in, the overview shows the five charts of the upstream with the figures beside them, on a
    laptop and on a phone, without sideways scrolling or a console error; a chart's table of every value
    opens on demand."""
    errors: list[str] = []
    async with browser_tab(browser, errors, []) as page:
        await sign_in(page, shop.admin_url)
        await charts_fit(page, shop.admin_url + "/ui/", LAPTOP, errors)
        pulse = page.locator("#pulse-1")
        await expect(pulse.get_by_role("heading", name="The pulse of main")).to_be_visible()
        await expect(pulse.locator("li", has_text="taken in over the last 24 h")).to_be_visible()
        await expect(pulse.locator("li", has_text="Runway:")).to_be_visible()
        await pulse.screenshot(path=screenshot_path(tmp_path, "console-pulse.png"))
        hourly = pulse.locator("figure[data-chart=hourly]")
        await hourly.get_by_text("Every figure of this chart").click()
        await expect(hourly.get_by_role("columnheader", name="Still open")).to_be_visible()
        await charts_fit(page, shop.admin_url + "/ui/", PHONE, errors)
        await page.locator("#pulse-1").screenshot(path=screenshot_path(tmp_path, "console-pulse-phone.png"))
        await page.goto(shop.admin_url + "/ui/?charts=off")
        await expect(page.get_by_text("Charts are off for this page")).to_be_visible()
        assert errors == []


async def test_a_downstream_accounts_page_draws_its_pulse(
    browser: Browser, database_url: str, tmp_path: Path
) -> None:
    """With the provider role, a downstream account's page shows the same five charts of its orders and
    wallet, on a laptop and on a phone, without sideways scrolling or a console error."""
    async with provider_chain(database_url) as chain:
        for number in ("B1", "B2", "B3"):
            await delivered(chain, await place(chain, number))
        errors: list[str] = []
        async with browser_tab(browser, errors, []) as page:
            await sign_in(page, chain.client.base)
            url = chain.client.base + "/ui/provider/accounts/shop-c"
            await charts_fit(page, url, LAPTOP, errors)
            await expect(page.get_by_role("heading", name="The pulse of shop-c")).to_be_visible()
            await page.locator("#pulse").screenshot(
                path=screenshot_path(tmp_path, "console-account-pulse.png")
            )
            await charts_fit(page, url, PHONE, errors)
