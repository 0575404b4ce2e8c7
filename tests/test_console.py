"""The admin web console over real sockets (no browser): sign-in and sessions, CSRF, security headers, every
page and action against the sandbox, escaping of upstream text, error pages for bad input.

The browser tests (``test_console_browser.py``) click through the same pages in Chromium.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from markupsafe import escape
from sqlalchemy import select

from console_support import (
    ADMIN_TOKEN,
    CSP,
    INSTANCE_STATES,
    STOPPED_LONG_AGO,
    ConsoleClient,
    Page,
    delivered_order,
    order,
    record_instances,
    sandbox_control,
)
from procurd.db.schema import audit_log
from procurd.db.stores import Tx
from procurd.http.console.data import Paged
from procurd.http.console.render import Templates, ago, duration, title_text
from procurd.http.console.session import SESSION_COOKIE, Session, SessionCodec
from procurd.http.testing import Stack, procurd_stack
from procurd.operations import offers
from procurd.operations.pings import ping_upstream
from procurd.operations.reconcile import reconcile
from procurd.operations.runtime import Runtime
from procurd.sandbox import Sandbox, SandboxConfig
from support import running_daemon, settings_for, sql_rows, wait_until
from test_hostile_callbacks import LogCapture


@dataclass
class Shop:
    """procurd with a token in front of the sandbox, a 9.90 auto product mirrored, a console client."""

    stack: Stack
    client: ConsoleClient
    sku: int
    product: int


@pytest.fixture
async def shop(database_url: str) -> AsyncIterator[Shop]:
    """Both upstreams mirrored (they share the sandbox's catalogue), nobody signed in yet."""
    async with procurd_stack(database_url, admin_token=ADMIN_TOKEN) as stack:
        product = stack.sandbox.state.add_product(price="9.90")
        await stack.sync("main")
        await stack.sync("second")
        client = ConsoleClient(stack.admin_url)
        try:
            yield Shop(stack, client, stack.sandbox.state.product(product).skus[0].id, product)
        finally:
            await client.close()


async def exception(shop: Shop, order_no: str, upstream: str = "main") -> int:
    """An order whose item is an exception ``price_above_limit`` at once; the procurement id."""
    view = await order(shop.stack, order_no, shop.sku, upstream, max_unit_price="1.00")
    [item] = view["procurements"]
    assert item["state"] == "exception"
    return int(item["id"])


async def state_of(shop: Shop, procurement_id: int) -> tuple[str, str | None]:
    found = await shop.stack.operations.views.procurement(procurement_id)
    assert found is not None
    return found["state"], found["resolution_note"]


async def audit_rows(shop: Shop) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in await sql_rows(shop.stack.runtime.database, select(audit_log))]


def assert_console_answer(page: Page) -> None:
    """An HTML answer with the console's security headers and never a traceback."""
    assert page.headers["Content-Security-Policy"] == CSP
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Referrer-Policy"] == "same-origin"
    assert page.status < 500, page.text[:500]
    assert "Traceback" not in page.text


# --- signing in -------------------------------------------------------------------------------------------


async def test_without_a_session_every_page_leads_to_the_login_page(shop: Shop) -> None:
    """With a token set, pages answer 303 to the login page (keeping where to go back to), the login page
    answers 200 with a CSP, a POST without a session changes nothing; the JSON API still wants its bearer
    token and does not take a console cookie."""
    before = await audit_rows(shop)
    home = await shop.client.get("/ui/")
    deep = await shop.client.get("/ui/orders?q=A1")
    bare = await shop.client.get("/ui")
    login = await shop.client.get("/ui/login")
    retry = await shop.client.post("/ui/exceptions/1/retry", {"note": "x"})
    assert (home.status, home.location) == (303, "/ui/login")
    assert (deep.status, deep.location) == (303, "/ui/login?next=%2Fui%2Forders%3Fq%3DA1")
    assert (bare.status, bare.location) == (303, "/ui/")
    assert login.status == 200
    assert 'type="password"' in login.text
    assert (retry.status, retry.location) == (303, "/ui/login")
    for page in (home, deep, bare, login, retry):
        assert_console_answer(page)
    assert await audit_rows(shop) == before

    bearer = await shop.client.get("/ui/", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert (bearer.status, bearer.location) == (303, "/ui/login")
    await shop.client.login()
    async with shop.client.session.get(shop.stack.admin_url + "/api/v1/status") as api:
        assert api.status == 401
    assert (await shop.stack.admin("GET", "/api/v1/status")).status == 200


async def test_login_issues_a_new_hardened_session_cookie(shop: Shop) -> None:
    """Signing in answers 303 to the page asked for, with a new HttpOnly, SameSite=Strict, expiring cookie
    under /ui that holds no token; behind HTTPS (X-Forwarded-Proto) the cookie is Secure too."""
    await shop.client.get("/ui/login")
    anonymous = shop.client.cookie(SESSION_COOKIE)
    answer = await shop.client.post("/ui/login", {"token": ADMIN_TOKEN, "next": "/ui/orders?status=paid"})
    assert (answer.status, answer.location) == (303, "/ui/orders?status=paid")
    cookie = answer.headers["Set-Cookie"]
    assert cookie.startswith(SESSION_COOKIE + "=")
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/ui"):
        assert attribute in cookie, cookie
    max_age = re.search(r"Max-Age=(\d+)", cookie)
    assert max_age is not None
    assert 8 * 3600 - 5 <= int(max_age.group(1)) <= 8 * 3600
    assert "Secure" not in cookie
    assert ADMIN_TOKEN not in cookie
    assert shop.client.cookie(SESSION_COOKIE) not in (None, anonymous)
    assert (await shop.client.get("/ui/")).status == 200

    other = ConsoleClient(shop.stack.admin_url)
    try:
        https = {"X-Forwarded-Proto": "https"}
        await other.get("/ui/login", headers=https)
        secure = await other.post("/ui/login", {"token": ADMIN_TOKEN}, headers=https)
        assert "Secure" in secure.headers["Set-Cookie"]
    finally:
        await other.close()


async def test_a_wrong_token_a_forged_or_expired_cookie_do_not_sign_in(shop: Shop) -> None:
    """A wrong token answers 401 with the login page again; a cookie with a bad signature, one signed for
    another token, one past its expiry and a well-signed one of a session that never signed in all lead to
    the login page; the cookie of a signed-in session opens the console."""
    await shop.client.get("/ui/login")
    wrong = await shop.client.post("/ui/login", {"token": ADMIN_TOKEN + "x"})
    assert wrong.status == 401
    assert "That is not the admin token." in wrong.text
    assert (await shop.client.get("/ui/")).status == 303

    session = Session("forged", True, int(time.time()) + 3600)
    other_token = SessionCodec("another-token", 3600).encode(session)
    expired = SessionCodec(ADMIN_TOKEN, 3600).encode(Session("forged", True, int(time.time()) - 1))
    never_signed_in = SessionCodec(ADMIN_TOKEN, 3600).encode(session)
    await shop.client.login()
    genuine = shop.client.cookie(SESSION_COOKIE) or ""
    tampered = genuine[:-2] + ("AA" if not genuine.endswith("AA") else "BB")
    url = shop.stack.admin_url + "/ui/"
    async with aiohttp.ClientSession() as browser:
        for value in (other_token, expired, never_signed_in, tampered, "garbage", ""):
            async with browser.get(
                url, headers={"Cookie": f"{SESSION_COOKIE}={value}"}, allow_redirects=False
            ) as response:
                assert (response.status, response.headers.get("Location")) == (303, "/ui/login"), value
        async with browser.get(
            url, headers={"Cookie": f"{SESSION_COOKIE}={genuine}"}, allow_redirects=False
        ) as response:
            assert response.status == 200


async def test_logout_ends_the_session(shop: Shop) -> None:
    """Sign out (a form post) clears the cookie and leads to the login page; pages then ask to sign in."""
    await shop.client.login()
    answer = await shop.client.post("/ui/logout")
    assert (answer.status, answer.location) == (303, "/ui/login")
    assert re.search(rf"{SESSION_COOKIE}=\"?\"?;.*Max-Age=0", answer.headers["Set-Cookie"])
    assert (await shop.client.get("/ui/")).status == 303


async def test_the_open_console_without_a_token(database_url: str) -> None:
    """Without an admin token the console needs no sign-in (like the JSON API on loopback), shows no sign
    out, sends its login page back home, and still refuses a form post without its CSRF token."""
    async with procurd_stack(database_url) as stack:
        client = ConsoleClient(stack.admin_url)
        try:
            home = await client.get("/ui/")
            login = await client.get("/ui/login")
            forged = await client.post("/ui/sync", {"upstream": "main"}, csrf="")
            assert home.status == 200
            assert "Sign out" not in home.text
            assert (login.status, login.location) == (303, "/ui/")
            assert (forged.status, forged.error_code) == (403, "csrf_failed")
            assert_console_answer(home)
        finally:
            await client.close()


# --- CSRF and headers -------------------------------------------------------------------------------------


async def test_a_post_without_its_sessions_csrf_token_changes_nothing(shop: Shop) -> None:
    """A form post with no CSRF token, another session's token, a token from another site (Sec-Fetch-Site:
    cross-site) or a JSON body is refused with an error page, and nothing changes."""
    procurement_id = await exception(shop, "C1")
    await shop.client.login()
    other = ConsoleClient(shop.stack.admin_url)
    try:
        await other.login()
        foreign_token = other.last.csrf_token if other.last else ""
    finally:
        await other.close()
    before = await audit_rows(shop)
    path = f"/ui/exceptions/{procurement_id}/resolve"
    missing = await shop.client.post(path, {"note": "forged"}, csrf="")
    foreign = await shop.client.post(path, {"note": "forged"}, csrf=foreign_token)
    cross_site = await shop.client.post(path, {"note": "forged"}, headers={"Sec-Fetch-Site": "cross-site"})
    async with shop.client.session.post(
        shop.stack.admin_url + path, json={"note": "forged"}, allow_redirects=False
    ) as response:
        as_json = (response.status, await response.text())
    assert (missing.status, missing.error_code) == (403, "csrf_failed")
    assert (foreign.status, foreign.error_code) == (403, "csrf_failed")
    assert (cross_site.status, cross_site.error_code) == (403, "cross_site")
    assert as_json[0] == 415
    assert "security token" in missing.text
    for page in (missing, foreign, cross_site):
        assert_console_answer(page)
    assert await state_of(shop, procurement_id) == ("exception", None)
    assert await audit_rows(shop) == before


async def test_every_console_answer_carries_the_security_headers(shop: Shop) -> None:
    """Pages, error pages, redirects and static files all carry the CSP, nosniff and a same-origin referrer
    policy; pages are not cached, the stylesheet is."""
    await shop.client.login()
    pages = {
        path: await shop.client.get(path)
        for path in ("/ui/", "/ui/nope", "/ui/orders?page=0", "/ui", "/ui/static/console.css",
                     "/ui/static/missing.css", "/ui/static/../templates/base.html")
    }  # fmt: skip
    for path, page in pages.items():
        assert_console_answer(page)
        if not path.startswith("/ui/static/"):
            assert page.headers["Cache-Control"] == "no-store", path
    assert pages["/ui/static/console.css"].status == 200
    assert pages["/ui/static/console.css"].headers["Content-Type"].startswith("text/css")
    assert pages["/ui/static/missing.css"].status == 404
    assert pages["/ui/static/../templates/base.html"].status in (403, 404)
    assert "{%" not in pages["/ui/static/../templates/base.html"].text
    assert "<script" not in pages["/ui/"].text
    assert " style=" not in pages["/ui/"].text


# --- exceptions ---------------------------------------------------------------------------------------------


async def test_retry_and_resolve_go_through_the_api_path_into_the_audit_trail(shop: Shop) -> None:
    """Retry (with a note) queues the procurement again and resolve closes another with its note, both as
    source ``admin`` in the audit trail, each answered by a redirect back with a message."""
    retried = await exception(shop, "E1")
    resolved = await exception(shop, "E2")
    await shop.client.login()
    page = await shop.client.get("/ui/exceptions")
    assert f'id="exception-{retried}"' in page.text
    assert f'id="exception-{resolved}"' in page.text

    retry = await shop.client.post(
        f"/ui/exceptions/{retried}/retry", {"note": "limit raised by hand", "next": "/ui/exceptions?reason=x"}
    )
    assert (retry.status, retry.location) == (303, "/ui/exceptions?reason=x")
    shown = await shop.client.get(retry.location)
    assert shown.flash == ("ok", f"Procurement {retried} is queued to be sent again.")
    assert (await shop.client.get("/ui/exceptions")).flash is None

    resolve = await shop.client.post(f"/ui/exceptions/{resolved}/resolve", {"note": "refunded to the buyer"})
    assert (resolve.status, resolve.location) == (303, "/ui/exceptions")
    assert await state_of(shop, resolved) == ("resolved", "refunded to the buyer")
    assert (await state_of(shop, retried))[0] == "queued"

    trail = {entry["event"]: entry for entry in await shop.stack.operations.views.audit("E1")}
    assert (trail["retry"]["source"], trail["retry"]["detail"]["note"]) == (
        "admin",
        "limit raised by hand",
    )
    [last] = (await shop.stack.operations.views.audit("E2"))[-1:]
    assert (last["source"], last["event"], last["detail"]["note"]) == (
        "admin",
        "resolved",
        "refunded to the buyer",
    )


async def test_resolve_needs_a_note_and_a_second_action_is_refused(shop: Shop) -> None:
    """Resolving without a note is refused (400 note_required); resolving what is no longer an exception
    answers 409 with the state path's refusal; nothing changes either time."""
    procurement_id = await exception(shop, "E3")
    await shop.client.login()
    await shop.client.get("/ui/exceptions")
    before = await audit_rows(shop)
    empty = await shop.client.post(f"/ui/exceptions/{procurement_id}/resolve", {"note": "   "})
    assert (empty.status, empty.error_code) == (400, "note_required")
    assert await audit_rows(shop) == before
    assert (await shop.client.post(f"/ui/exceptions/{procurement_id}/resolve", {"note": "ok"})).status == 303
    after = await audit_rows(shop)
    again = await shop.client.post(f"/ui/exceptions/{procurement_id}/retry", {})
    assert again.status == 409
    assert "nothing was changed" in again.text
    assert await audit_rows(shop) == after


async def test_exception_list_filters_and_pages(shop: Shop) -> None:
    """The exception list filters by upstream and reason, shows reasons with their counts, and pages with
    page and page_size (previous and next links keep the filters)."""
    ids = [await exception(shop, f"F{n}") for n in range(3)]
    other = await exception(shop, "F9", upstream="second")
    await shop.client.login()
    first = await shop.client.get("/ui/exceptions?upstream=main&page_size=2")
    second = await shop.client.get("/ui/exceptions?upstream=main&page_size=2&page=2")
    by_reason = await shop.client.get("/ui/exceptions?reason=price_above_limit")
    none = await shop.client.get("/ui/exceptions?reason=payment_failed")
    shown = [f'id="exception-{pid}"' in first.text for pid in ids]
    assert shown == [True, True, False]
    assert f'id="exception-{ids[2]}"' in second.text
    assert f'id="exception-{other}"' not in second.text
    assert "1–2 of 3 exceptions · page 1 of 2" in first.text
    assert 'href="/ui/exceptions?upstream=main&amp;page_size=2&amp;page=2"' in first.text
    assert 'rel="prev" href="/ui/exceptions?upstream=main&amp;page_size=2&amp;page=1"' in second.text
    assert "price_above_limit (3)" in first.text
    assert all(f'id="exception-{pid}"' in by_reason.text for pid in [*ids, other])
    assert none.text.count("No exceptions.") == 1  # said once, above the (empty) list


async def test_bulk_retry_by_reason(shop: Shop) -> None:
    """Retrying every exception with a reason (within an upstream) queues them all again with the note and
    says how many; without a reason it is refused with 422 filter_required."""
    main_ids = [await exception(shop, f"B{n}") for n in range(2)]
    other = await exception(shop, "B9", upstream="second")
    await shop.client.login()
    await shop.client.get("/ui/exceptions?upstream=main")
    answer = await shop.client.post(
        "/ui/exceptions/retry",
        {"reason": "price_above_limit", "upstream": "main", "note": "prices checked", "limit": "100",
         "next": "/ui/exceptions?upstream=main"},
    )  # fmt: skip
    assert (answer.status, answer.location) == (303, "/ui/exceptions?upstream=main")
    assert (await shop.client.get(answer.location)).flash == ("ok", "2 exceptions sent again.")
    assert [(await state_of(shop, pid))[0] for pid in main_ids] == ["queued", "queued"]
    assert (await state_of(shop, other))[0] == "exception"
    refused = await shop.client.post("/ui/exceptions/retry", {"note": "all of them"})
    assert (refused.status, refused.error_code) == (422, "filter_required")


# --- orders -------------------------------------------------------------------------------------------------


async def test_order_search_by_every_kind_of_number(shop: Shop) -> None:
    """Searching finds an order by its number or the start of it, by a downstream number of an item, by the
    upstream order id and number; one match opens the order, several are listed, none says so."""
    delivered = await delivered_order(shop.stack, "S-100", shop.sku)
    two_items = {"order_no": "S-200", "items": [{"upstream": "main", "sku_id": shop.sku, "quantity": 1}] * 2}
    assert (await shop.stack.admin("POST", "/api/v1/orders", two_items)).status == 202
    item = delivered["procurements"][0]
    await shop.client.login()
    for query in ("S-100", "S-200-2", str(item["upstream_order_id"]), item["upstream_order_no"]):
        found = await shop.client.get(f"/ui/orders?q={query}")
        expected = "/ui/orders/S-200" if query == "S-200-2" else "/ui/orders/S-100"
        assert (found.status, found.location) == (303, expected), query
    listed = await shop.client.get("/ui/orders?q=S-")
    assert "1–2 of 2 orders" in listed.text
    assert listed.text.index("S-200") < listed.text.index("S-100")  # newest first
    assert "No orders." in (await shop.client.get("/ui/orders?q=nothing-like-it")).text
    assert "1–1 of 1 order " in (await shop.client.get("/ui/orders?status=delivered")).text
    paged = await shop.client.get("/ui/orders?page_size=1&page=2")
    assert "2–2 of 2 orders · page 2 of 2" in paged.text
    assert 'rel="prev"' in paged.text


async def test_delivered_goods_stay_hidden_until_revealed(shop: Shop) -> None:
    """The order page shows the fulfillment's shape but not its goods; "reveal" (a POST) shows them, for
    that procurement only; the goods never reach a log line or a URL."""
    logs = LogCapture()
    logs.start()
    try:
        view = await delivered_order(shop.stack, "R-1", shop.sku)
        await shop.client.login()
        goods = view["procurements"][0]["fulfillment"]["payload"]
        assert goods.startswith("SBX-")
        page = await shop.client.get("/ui/orders/R-1")
        assert goods not in page.text
        assert "1 line" in page.text
        assert "Reveal delivered goods" in page.text
        revealed = await shop.client.post(
            "/ui/orders/R-1/reveal", {"procurement_id": str(view["procurements"][0]["id"])}
        )
        assert revealed.status == 200
        assert goods in html.unescape(revealed.text)
        assert revealed.headers["Cache-Control"] == "no-store"
        assert "console.goods_revealed" in "".join(logs.new_lines())
        wrong = await shop.client.post("/ui/orders/R-1/reveal", {"procurement_id": "999"})
        assert (wrong.status, wrong.error_code) == (404, "procurement_not_found")
        assert all(goods not in line for line in logs.new_lines())
    finally:
        logs.stop()


async def test_order_page_shows_items_numbers_attempts_errors_and_audit(shop: Shop) -> None:
    """An order's page says what its status means in the order view's words (an item refused before
    anything was bought: ``paid``, with an exception), and lists each procurement with its state, numbers,
    attempts, error and reason, and the audit trail with its sources."""
    procurement_id = await exception(shop, "D-1")
    await shop.client.login()
    page = await shop.client.get("/ui/orders/D-1")
    text = html.unescape(page.text)
    assert "<strong>paid</strong>: accepted; nothing bought upstream yet; an item needs a person" in text
    assert f'id="procurement-{procurement_id}"' in page.text
    assert "price_above_limit" in text
    assert "mirrored unit price 9.90" in text
    assert re.search(r"Attempts</dt><dd>0</dd>", page.text)
    assert "<code>D-1</code>" in page.text
    assert re.search(r'data-label="Source">intake</td>\s*<td data-label="Event">price_above_limit', page.text)
    assert "Cancel order D-1" in page.text


async def test_a_long_audit_trail_is_paged(shop: Shop) -> None:
    """An audit trail longer than a page shows 50 entries per page with previous and next links; a bad
    audit page number is refused."""
    await sandbox_control(shop.stack, "POST", "/wallet", {"balance": "0.00"})  # every purchase fails
    procurement_id = (await order(shop.stack, "L-1", shop.sku))["procurements"][0]["id"]
    assert await shop.stack.submit_due()
    views = shop.stack.operations.views
    for _ in range(40):
        if len(await views.audit("L-1")) > 50:
            break
        assert (await shop.stack.admin("POST", f"/api/v1/exceptions/{procurement_id}/retry")).status == 200
        await shop.stack.submit_due()
    total = len(await views.audit("L-1"))
    assert total > 50
    await shop.client.login()
    first = await shop.client.get("/ui/orders/L-1")
    second = await shop.client.get("/ui/orders/L-1?audit_page=2")
    assert f"1–50 of {total} entries · page 1 of 2" in first.text
    assert 'rel="next" href="/ui/orders/L-1?audit_page=2#audit"' in first.text
    assert f"51–{total} of {total} entries · page 2 of 2" in second.text
    assert 'rel="prev" href="/ui/orders/L-1?audit_page=1#audit"' in second.text
    assert (await shop.client.get("/ui/orders/L-1?audit_page=0")).error_code == "invalid_query"


async def test_cancel_from_the_order_page(shop: Shop) -> None:
    """Cancel of a never-sent order is done and said; a paid order the upstream will not cancel answers 409
    with each item's reason, and nothing changes."""
    shop.stack.sandbox.faults.hold_delivery_next()
    await order(shop.stack, "K-2", shop.sku)
    assert await shop.stack.submit_due()
    await order(shop.stack, "K-1", shop.sku)
    await shop.client.login()
    await shop.client.get("/ui/orders/K-1")
    canceled = await shop.client.post("/ui/orders/K-1/cancel")
    assert (canceled.status, canceled.location) == (303, "/ui/orders/K-1")
    assert (await shop.client.get("/ui/orders/K-1")).flash == ("ok", "Order K-1 is canceled.")
    assert (await shop.stack.order("K-1"))["status"] == "canceled"
    trail = await shop.stack.operations.views.audit("K-1")
    assert (trail[-1]["source"], trail[-1]["new_state"]) == ("admin", "canceled")

    before = await shop.stack.order("K-2")
    denied = await shop.client.post("/ui/orders/K-2/cancel")
    assert (denied.status, denied.error_code) == (409, "cancel_not_allowed")
    assert "cancel_not_allowed" in denied.text
    assert "<strong>K-2</strong>" in denied.text
    assert await shop.stack.order("K-2") == before


# --- catalogue, sync runs, pages to come ------------------------------------------------------------------


async def test_upstream_text_is_shown_as_text(shop: Shop) -> None:
    """A product title with a script tag, quotes, CJK and emoji (set through the sandbox's control API, then
    synced) is escaped in the catalogue: no markup from upstream reaches the page."""
    title = '<script>alert(1)</script> "引号" 商品 🎉 <img src=x onerror=alert(2)>'
    await sandbox_control(shop.stack, "POST", f"/products/{shop.product}", {"title": title})
    await shop.stack.sync("main")
    await shop.client.login()
    page = await shop.client.get("/ui/catalog?q=script&upstream=main")
    assert "<script>alert(1)" not in page.text
    assert "<img src=x" not in page.text
    assert str(escape(title)) in page.text
    assert "商品 🎉" in page.text


async def test_catalogue_search_filters_and_pages(shop: Shop) -> None:
    """The catalogue finds products by title (any case), product id and SKU id, filters by upstream, shows
    cost, selling price (none without pricing rules), stock and active/removed, and pages."""
    await sandbox_control(shop.stack, "POST", f"/products/{shop.product}", {"title": "Moonlight Voucher"})
    await sandbox_control(shop.stack, "POST", f"/skus/{shop.sku}", {"stock_quantity": 7})
    await shop.stack.sync("main")
    await shop.client.login()
    by_title = await shop.client.get("/ui/catalog?q=MOONLIGHT&upstream=main")
    by_product = await shop.client.get(f"/ui/catalog?q={shop.product}&upstream=second")
    by_sku = await shop.client.get(f"/ui/catalog?q={shop.sku}&upstream=main")
    paged = await shop.client.get("/ui/catalog?page_size=1&page=2")
    assert "1–1 of 1 product " in by_title.text
    assert "Moonlight Voucher" in by_title.text
    assert f'id="product-second-{shop.product}"' in by_product.text
    assert f'id="sku-main-{shop.sku}"' in by_sku.text
    row = by_title.text[by_title.text.index(f'id="sku-main-{shop.sku}"') :]
    # No [pricing] rules: nothing is for sale at a price procurd set.
    cells = (
        r'data-label="Cost">9\.90</td>\s*<td data-label="Selling price"><span class="none">—</span></td>\s*'
    )
    assert re.search(cells + r'<td data-label="Stock">low_stock \(7\)', row), row[:400]
    assert "page 2 of " in paged.text
    assert 'rel="prev"' in paged.text
    assert "not available yet" not in by_title.text


async def test_sync_now_starts_a_pass_as_the_api_does(shop: Shop) -> None:
    """Sync runs are listed newest first with their counts; "sync now" starts a pass at once (the
    catalogue's own choice of pass, or a full one when ticked) and the new run shows when it is done."""
    await shop.client.login()
    page = await shop.client.get("/ui/sync?upstream=main")
    assert "1–1 of 1 run" in page.text
    assert "Start a pass now" in page.text
    answer = await shop.client.post("/ui/sync", {"upstream": "main", "full": "on", "next": "/ui/sync"})
    assert (answer.status, answer.location) == (303, "/ui/sync")
    flash = (await shop.client.get("/ui/sync")).flash
    assert flash == ("ok", "A full pass of main starts now; it shows here once it has begun.")
    await wait_until(lambda: finished_runs(shop.stack.runtime, 2))
    total, [latest, _] = await shop.stack.runtime.database.read(lambda tx: tx.console.sync_runs("main", 1, 2))
    assert (total, latest["status"], latest["kind"]) == (2, "ok", "full")


async def test_sync_now_in_a_running_daemon(database_url: str) -> None:
    """In ``procurd run`` the console's "sync now" runs a pass at once; a second one while it runs is refused
    with 409 sync_in_progress or starts after it, never two at once."""
    async with Sandbox(SandboxConfig(products=2)) as sandbox:
        settings = settings_for(database_url, ("main", sandbox), server={"admin_token": ADMIN_TOKEN},
                                catalog={"sync_interval_seconds": 3600})  # fmt: skip
        async with running_daemon(settings) as daemon:
            runtime = daemon.runtime
            await wait_until(lambda: finished_runs(runtime, 1))
            client = ConsoleClient(f"http://127.0.0.1:{daemon.admin_port}")
            try:
                await client.login()
                answer = await client.post("/ui/sync", {"upstream": "main", "next": "/ui/sync"})
                assert (answer.status, answer.location) == (303, "/ui/sync")
                assert (await client.get("/ui/sync")).flash == (
                    "ok",
                    "A catalogue pass of main starts now; it shows here once it has begun.",
                )
                await wait_until(lambda: finished_runs(runtime, 2))
            finally:
                await client.close()


async def finished_runs(runtime: Runtime, count: int) -> bool:
    """``count`` catalogue passes of ``main`` have run to their end."""

    def read(tx: Tx) -> tuple[int, list[dict[str, Any]]]:
        return tx.console.sync_runs("main", 1, count)

    total, rows = await runtime.database.read(read)
    return total >= count and all(row["status"] != "running" for row in rows)


async def test_offers_page_lists_offers_with_the_source_in_use(shop: Shop) -> None:
    """The offers page lists each offer with its sources in order and the one in use now."""
    await shop.client.login()
    empty = await shop.client.get("/ui/offers")
    assert "No offers." in empty.text
    assert 'href="/ui/offers" aria-current="page"' in empty.text
    runtime = shop.stack.runtime
    names = runtime.service.upstream_names
    await offers.put_offer(runtime.database, "GIFT", [("main", shop.sku), ("second", shop.sku)], names)
    page = await shop.client.get("/ui/offers")
    row = page.text[page.text.index("<code>GIFT</code>") :]
    assert re.search(r'<li class="in-use">main · SKU \d+</li>\s*<li>second · SKU \d+</li>', row), row[:800]
    assert re.search(r'data-label="In use">main · SKU \d+</td>', row)


async def test_alerts_page_and_overview_show_recorded_alerts(shop: Shop) -> None:
    """An exception raises an alert: the alerts page lists it with its kind, subject, message and count,
    and the overview shows it among the recent alerts."""
    await exception(shop, "AL-1")
    await shop.client.login()
    page = await shop.client.get("/ui/alerts")
    assert page.status == 200
    assert "1–1 of 1 alert" in page.text
    assert '<td data-label="Kind"><code>exception_opened</code></td>' in page.text
    assert "price_above_limit" in page.text
    overview = await shop.client.get("/ui/")
    assert re.search(r"<strong>exception_opened</strong> AL-1", overview.text), overview.text


async def test_overview_shows_instances_and_the_low_balance_threshold(database_url: str) -> None:
    """In ``procurd run`` the overview lists the instance with its heartbeat as alive, and each upstream's
    low-balance threshold."""
    async with Sandbox(SandboxConfig(products=1)) as sandbox:
        settings = settings_for(
            database_url, ("main", sandbox), server={"admin_token": ADMIN_TOKEN},
            upstream={"low_balance_threshold": "50.00"},
        )  # fmt: skip
        async with running_daemon(settings) as daemon:
            client = ConsoleClient(f"http://127.0.0.1:{daemon.admin_port}")
            try:
                await client.login()
                page = await client.get("/ui/")
                assert f"<code>{daemon.runtime.instance}</code>" in page.text
                assert '<span class="badge ok">alive</span>' in page.text
                assert re.search(r"Low-balance threshold</dt>\s*<dd>50.00</dd>", page.text), page.text
            finally:
                await client.close()


async def test_overview_tells_alive_stopped_and_down_apart_and_folds_old_stops(shop: Shop) -> None:
    """Each instance is alive, stopped (a clean shutdown) or down (gone without one), in the overview as in
    GET /api/v1/status; instances stopped cleanly more than a day ago are folded into one line that opens
    (no script: a <details>), the others are listed with their state."""
    await record_instances(shop.stack.runtime.database)
    report = await shop.stack.admin("GET", "/api/v1/status")
    assert {i["id"]: i["state"] for i in report.body["instances"]} == INSTANCE_STATES
    assert {i["id"]: i["alive"] for i in report.body["instances"]} == {
        name: state == "alive" for name, state in INSTANCE_STATES.items()
    }
    await shop.client.login()
    page = await shop.client.get("/ui/")
    section = page.text[page.text.index("<h2>Instances</h2>") :]
    listed, _, folded = section.partition('<details class="stopped-earlier">')
    rows = dict(re.findall(r'<code>([a-z]+:\d)</code>.*?<td data-label="State"><span class="badge[ a-z]*">'
                           r"([a-z]+)</span>", listed, re.S))  # fmt: skip
    assert rows == {name: state for name, state in INSTANCE_STATES.items() if name not in STOPPED_LONG_AGO}
    assert "<summary>3 instances stopped cleanly more than a day ago</summary>" in folded
    assert re.findall(r"<code>([a-z]+:\d)</code>", folded) == list(STOPPED_LONG_AGO)
    assert '<span class="badge stopped">stopped</span>' in listed
    assert '<span class="badge bad">down</span>' in listed
    assert "<script" not in page.text


async def test_reconcile_page_lists_findings(shop: Shop) -> None:
    """A delivered order the upstream refunds afterwards (no callback, like real sites) is found by a
    reconciliation pass: the page shows the order, what differs, both values and the repair."""
    view = await delivered_order(shop.stack, "RC-1", shop.sku)
    upstream_order_id = view["procurements"][0]["upstream_order_id"]
    await sandbox_control(shop.stack, "POST", f"/orders/{upstream_order_id}/refund", {})
    runtime = shop.stack.runtime
    report = await reconcile(
        runtime.service, runtime.clients, runtime.alerts, window_seconds=3600, repair=True, trigger="manual"
    )
    assert report.mismatches == 1
    await shop.client.login()
    page = await shop.client.get("/ui/reconcile")
    assert page.status == 200
    assert "1–1 of 1 finding" in page.text
    row = page.text[page.text.index('href="/ui/orders/RC-1"') :]
    assert re.search(r'<code>status</code></td>\s*<td data-label="Here">delivered</td>\s*'
                     r'<td data-label="Upstream says">refunded</td>', row), row[:600]  # fmt: skip
    assert '<span class="badge ok">repaired</span>' in row


async def test_release_a_price_hold_from_the_catalogue(database_url: str) -> None:
    """A SKU whose cost rose past the hold threshold shows its hold; Release prices it from the rules at
    once and says so; a SKU without a hold answers 404 hold_not_found."""
    pricing = {"hold_on_cost_increase_percent": "10", "rules": [{"markup_percent": "0"}]}
    async with procurd_stack(database_url, admin_token=ADMIN_TOKEN, pricing=pricing) as stack:
        product = stack.sandbox.state.add_product(price="9.90")
        sku = stack.sandbox.state.product(product).skus[0].id
        await stack.sync("main")
        await sandbox_control(stack, "POST", f"/skus/{sku}", {"price_amount": "19.90"})
        await stack.sync("main")
        client = ConsoleClient(stack.admin_url)
        try:
            await client.login()
            page = await client.get(f"/ui/catalog?q={sku}&upstream=main")
            row = page.text[page.text.index(f'id="sku-main-{sku}"') :]
            assert re.search(r'Selling price">9\.90 CNY</td>', row), row[:600]
            assert "(cost 19.90)" in row
            path = f"/ui/catalog/holds/main/{sku}/release"
            answer = await client.post(path, {"next": f"/ui/catalog?q={sku}"})
            assert answer.status == 303
            flash = (await client.get(f"/ui/catalog?q={sku}")).flash
            assert flash == ("ok", f"The hold on main SKU {sku} is released; it now sells at 19.90 CNY.")
            again = await client.post(path, {})
            assert (again.status, again.error_code) == (404, "hold_not_found")
        finally:
            await client.close()


async def test_overview_shows_each_upstream(shop: Shop) -> None:
    """The overview shows per upstream its health, the protocol it speaks, balance after a ping, queue by
    state, oldest queued, exceptions by reason (linked to the filtered list) and the last sync with its
    counts."""
    await exception(shop, "O-1")
    await order(shop.stack, "O-2", shop.sku)
    await ping_upstream(shop.stack.runtime, "main")
    await shop.client.login()
    page = await shop.client.get("/ui/")
    main = page.text[page.text.index('id="upstream-main"') : page.text.index('id="upstream-second"')]
    second = page.text[page.text.index('id="upstream-second"') :]
    assert '<span class="badge ok">healthy</span>' in main
    assert '<span class="badge bad">unhealthy</span>' in second  # never pinged
    assert '<dd class="balance">1000.00 CNY</dd>' in main
    assert '<p class="meta protocol">Dujiao-Next · procurd sandbox' in main
    assert re.search(r'state-queued">queued</span> 1</li>', main)
    assert re.search(r'state-exception">exception</span> 1</li>', main)
    assert re.search(r"Oldest queued</dt>\s*<dd>\d+ seconds?</dd>", main)
    assert 'href="/ui/exceptions?upstream=main&amp;reason=price_above_limit">price_above_limit</a> 1' in main
    assert "5 products, 9 SKUs" in main


# --- bad input ----------------------------------------------------------------------------------------------

BAD_REQUESTS: dict[str, tuple[str, str, dict[str, str] | None, int, str]] = {
    "page 0": ("GET", "/ui/orders?page=0", None, 400, "invalid_query"),
    "page_size too big": ("GET", "/ui/exceptions?page_size=101", None, 400, "invalid_query"),
    "page not a number": ("GET", "/ui/catalog?page=two", None, 400, "invalid_query"),
    "unknown upstream filter": ("GET", "/ui/exceptions?upstream=nope", None, 400, "unknown_upstream"),
    "unknown order status": ("GET", "/ui/orders?status=lost", None, 400, "invalid_query"),
    "NUL in a search": ("GET", "/ui/orders?q=a%00b", None, 400, "invalid_query"),
    "search too long": ("GET", "/ui/orders?q=" + "x" * 101, None, 400, "invalid_query"),
    "impossible order number": ("GET", "/ui/orders/has%20space", None, 404, "order_not_found"),
    "unknown order": ("GET", "/ui/orders/NOPE", None, 404, "order_not_found"),
    "unknown page": ("GET", "/ui/nothing/here", None, 404, "not_found"),
    "GET of an action": ("GET", "/ui/exceptions/1/retry", None, 405, "method_not_allowed"),
    "id not a number": ("POST", "/ui/exceptions/abc/retry", {}, 400, "invalid_id"),
    "id zero": ("POST", "/ui/exceptions/0/resolve", {"note": "n"}, 404, "procurement_not_found"),
    "unknown procurement": ("POST", "/ui/exceptions/999/retry", {}, 404, "procurement_not_found"),
    "note too long": ("POST", "/ui/exceptions/1/retry", {"note": "n" * 4001}, 400, "invalid_request"),
    "NUL in a note": ("POST", "/ui/exceptions/1/retry", {"note": "a\x00b"}, 400, "invalid_request"),
    "bulk limit 0": ("POST", "/ui/exceptions/retry", {"reason": "price_above_limit", "limit": "0"}, 400,
                     "invalid_request"),
    "limit a word": ("POST", "/ui/exceptions/retry", {"reason": "price_above_limit", "limit": "a"}, 400,
                     "invalid_request"),
    "bulk of unknown upstream": ("POST", "/ui/exceptions/retry", {"upstream": "x"}, 400, "unknown_upstream"),
    "reveal without id": ("POST", "/ui/orders/A1/reveal", {}, 400, "invalid_id"),
    "cancel unknown order": ("POST", "/ui/orders/NOPE/cancel", {}, 404, "order_not_found"),
    "sync unknown upstream": ("POST", "/ui/sync", {"upstream": "nope"}, 400, "unknown_upstream"),
    "hold of unknown upstream": ("POST", "/ui/catalog/holds/nope/1/release", {}, 404, "unknown_upstream"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_REQUESTS), ids=list(BAD_REQUESTS))
async def test_bad_input_gets_a_specific_error_page_and_changes_nothing(shop: Shop, case: str) -> None:
    """Each bad request answers its status with an HTML error page naming the problem; nothing changes."""
    method, path, fields, status, code = BAD_REQUESTS[case]
    await exception(shop, "A1")
    await shop.client.login()
    before = await audit_rows(shop)
    page = await (shop.client.get(path) if method == "GET" else shop.client.post(path, fields))
    assert (page.status, page.error_code) == (status, code), page.text[-800:]
    assert_console_answer(page)
    assert "nothing was changed" in page.text
    assert await audit_rows(shop) == before


# --- pieces -------------------------------------------------------------------------------------------------


def test_relative_times_and_durations_read_right() -> None:
    """Times read "just now", "1 minute ago", "5 minutes ago", "1 hour ago", "in 2 days"; durations use
    their two largest units with plurals right."""
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    cases = {
        now - timedelta(seconds=20): "just now",
        now - timedelta(seconds=61): "1 minute ago",
        now - timedelta(minutes=5, seconds=59): "5 minutes ago",
        now - timedelta(hours=1, minutes=59): "1 hour ago",
        now - timedelta(days=3): "3 days ago",
        now + timedelta(days=2, hours=1): "in 2 days",
    }
    for moment, text in cases.items():
        assert ago(moment, now) == text
    assert ago("2026-11-23T11:58:00Z", now) == "2 minutes ago"
    assert ago(None, now) == ago("not a time", now) == ""
    assert [duration(s) for s in (0, 1, 59, 60, 61, 3600, 3661, 90061)] == [
        "0 seconds", "1 second", "59 seconds", "1 minute", "1 minute 1 second", "1 hour", "1 hour 1 minute",
        "1 day 1 hour",
    ]  # fmt: skip


def test_titles_show_every_language_once() -> None:
    """A multilingual title shows English first, then the other texts that differ; plain text stays."""
    assert title_text({"zh-CN": "商品", "en-US": "Goods"}) == "Goods / 商品"
    assert title_text({"zh-CN": "Same", "en-US": "Same"}) == "Same"
    assert title_text("plain") == "plain"
    assert title_text(None) == ""


def test_session_codec_binds_csrf_tokens_to_sessions() -> None:
    """A CSRF token is good only for its session; codecs of different tokens do not read each other."""
    codec = SessionCodec("token-a", 60)
    first, second = codec.issue(authenticated=True), codec.issue(authenticated=True)
    assert codec.csrf_valid(first, codec.csrf_token(first))
    assert not codec.csrf_valid(first, codec.csrf_token(second))
    assert not codec.csrf_valid(first, "")
    assert codec.decode(codec.encode(first)) == first
    assert SessionCodec("token-b", 60).decode(codec.encode(first)) is None


def test_list_templates_of_features_to_come_render_rows() -> None:
    """The alerts, offers and reconciliation templates render a list when their data function returns one
    (what plugging the feature in will hand them)."""
    environment = Templates().environment
    layout = {"page_link": lambda page: f"?page={page}", "csrf_token": "t", "signed_in": True,
              "login_required": True, "flash": None, "path": "/ui/", "version": "0"}  # fmt: skip
    samples: dict[str, dict[str, Any]] = {
        "alerts.html": {"kind": "low_balance", "subject": "main", "message": "<b>9.00</b> left", "count": 2,
                        "first_at": "2026-11-23T10:00:00Z", "last_at": "2026-11-23T11:00:00Z"},
        "offers.html": {"code": "GIFT-50", "sources": [{"upstream": "main", "sku_id": 1},
                        {"upstream": "second", "sku_id": 2}], "in_use": {"upstream": "second", "sku_id": 2},
                        "sell_price": "59.00"},
        "reconcile.html": {"found_at": "2026-11-23T10:00:00Z", "upstream": "main", "order_no": "A1",
                           "kind": "status", "local": "submitted", "remote": "delivered", "repaired": True},
    }  # fmt: skip
    for name, row in samples.items():
        page = environment.get_template(name).render(found=Paged([row], 3, 1, 1), nav=name[:-5], **layout)
        assert "1–1 of 3" in page
        assert 'rel="next"' in page
    assert "&lt;b&gt;9.00&lt;/b&gt; left" in environment.get_template("alerts.html").render(
        found=Paged([samples["alerts.html"]], 1, 1, 20), nav="alerts", **layout
    )
