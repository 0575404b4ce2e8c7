"""The signed API (seed 000 parts 4, 5 and 7) as two sites serve it: the sandbox upstream, and procurd as a
provider (a daemon with ``[provider]`` on, in front of a sandbox, seen through one of its accounts).

One set of tests runs against both sites, driven by procurd's own client (:class:`UpstreamClient`) and,
where the raw answer matters (HTTP status, envelope fields, headers), by the independent
:class:`SignedClient`. Each site is built once per module with the same catalogue (the sandbox's, plus a
product per role a test needs: ``plain``, ``scarce`` with one unit in stock, ``manual``, ``unpriced``,
``dormant`` and ``retired`` products that are inactive, ``mixed`` with an inactive SKU, ``touched`` updated
last) and four API users: ``main`` with a member level, ``other`` without one, ``poor`` with an empty
wallet, and ``disabled``.

Where the two sites legitimately differ, the :class:`Site` says so and the tests follow it:

- the provider sells only what ``[pricing]`` prices: the ``unpriced`` product is not offered at all;
- page sizes: the sandbox clamps to 50 as Dujiao-Next does, the provider to seed 000's 100;
- request bodies: the sandbox reads up to 10 MB as the real sites do, the provider 1 MB;
- a disabled key: the sandbox answers 403 ``invalid_api_key`` as Dujiao-Next does, the provider 401 (its
  account is known and shut out; INTERFACE "Provider");
- a product the upstream stopped listing leaves the provider's mirror with its SKUs (a full pass removes
  both), so only a product the mirror holds inactive with a live SKU answers ``product_unavailable`` to an
  order there: the sandbox lists active products only, so the test writes that state into the mirror;
- ``include_inactive=true``: the provider lists what it offered before and sells no longer, inactive, and
  says so (as Dujiao-Next since 2026 does); the sandbox speaks seed 000 here and ignores the flag;
- canceling an order that is canceled already: the sandbox refuses (409, only ``pending_payment`` orders
  cancel), the provider answers the canceled order again (a downstream retrying a lost answer);
- rate limits: the provider's counts verified requests per account and is raised out of the way here; the
  sandbox's is off.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Literal

import pytest
import pytest_asyncio
from pydantic import SecretStr
from sqlalchemy import select, update

from conftest import POSTGRES_URL, _admin_execute, _database_url
from procurd.config import UpstreamSettings
from procurd.daemon import Daemon
from procurd.db.schema import mirror_products, procurements, sync_runs
from procurd.protocol.dujiao.client import UpstreamClient
from procurd.protocol.dujiao.signing import sign
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.state import NewSku
from procurd.sandbox.testing import ApiResponse, SignedClient
from procurd.upstream import AuthError, BusinessError, ClockSkew, PaymentFailed
from procurd.upstream.models import CreateOrderRequest
from provider_support import add_account, provider_settings
from support import running_daemon, sql_execute, sql_rows, wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")

SiteKind = Literal["sandbox", "provider"]
KINDS: tuple[SiteKind, ...] = ("sandbox", "provider")
BALANCE = "100000.00"
GOLD = {"slug": "gold", "name": {"en-US": "Gold", "zh-CN": "黄金会员"}, "icon": "", "discount_percent": "5"}
SECRET_OF = {"main": "conf-main-secret-41d2", "other": "conf-other-secret-7be0",
             "poor": "conf-poor-secret-0c93", "disabled": "conf-disabled-secret-e5a8"}  # fmt: skip
PRIVATE_CALLBACKS = (
    "http://127.0.0.1:9/cb", "http://localhost/cb", "http://[::1]/cb", "http://10.0.0.7/cb",
    "http://192.168.1.20/cb", "http://169.254.169.254/latest", "http://0.0.0.0/cb",
)  # fmt: skip


# --- a module's own database ------------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def module_database_url(
    tmp_path_factory: pytest.TempPathFactory, postgres_template: str | None, sqlite_template: Path | None
) -> AsyncIterator[str]:
    """A fresh migrated database for the whole module (SQLite or PostgreSQL, as ``database_url``)."""
    if sqlite_template is not None:
        path = tmp_path_factory.mktemp("provider") / "procurd.db"
        shutil.copyfile(sqlite_template, path)
        yield f"sqlite+aiosqlite:///{path}"
        return
    assert POSTGRES_URL
    assert postgres_template
    name = f"procurd_test_{uuid.uuid4().hex[:12]}"
    await _admin_execute([f"CREATE DATABASE {name} TEMPLATE {postgres_template}"])
    try:
        yield _database_url(name)
    finally:
        await _admin_execute([f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"])


# --- the two sites ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    api_key: str
    api_secret: str = field(repr=False)


@dataclass
class Site:
    """One site of the signed API as its API users see it, and the sandbox that holds its goods (the site
    itself, or the upstream behind the provider)."""

    kind: SiteKind
    base_url: str
    users: dict[str, Credentials]
    products: dict[str, int]
    skus: dict[str, int]
    goods: Sandbox
    daemon: Daemon | None = None
    header_prefix: str = "Service"

    # What differs between the two sites (see the module's docstring).
    @property
    def page_size_max(self) -> int:
        return 50 if self.kind == "sandbox" else 100

    @property
    def max_body_bytes(self) -> int:
        return 10 * 1024 * 1024 if self.kind == "sandbox" else 1024 * 1024

    @property
    def disabled_key_status(self) -> int:
        return 403 if self.kind == "sandbox" else 401

    def signed(self, user: str = "main") -> SignedClient:
        who = self.users[user]
        return SignedClient(self.base_url, who.api_key, who.api_secret, self.header_prefix)

    def client(self, user: str = "main", **overrides: Any) -> UpstreamClient:
        who = self.users[user]
        values: dict[str, Any] = {
            "name": self.kind,
            "base_url": self.base_url,
            "api_key": who.api_key,
            "api_secret": SecretStr(who.api_secret),
            "header_prefix": self.header_prefix,
            "timeout_seconds": 5,
            "max_requests_per_second": 1000,
            **overrides,
        }
        return UpstreamClient(UpstreamSettings(**values))

    def goods_order(self, trace_id: str) -> int | None:
        """The id of the goods sandbox's order that carries ``trace_id`` (the provider's procurement)."""
        found = [o.order_id for o in self.goods.state.orders.values() if o.trace_id == trace_id]
        return found[0] if found else None

    async def bought(self, order_id: int, trace_id: str) -> int:
        """Wait until the order is placed where the goods are; that order's id there."""
        if self.kind == "sandbox":
            return order_id
        return await wait_until(lambda: self.goods_order(trace_id), timeout=10)

    async def idle(self) -> None:
        """Wait until the provider has placed every order it took (so that a fault planned for the next
        order where the goods are meets the order of the test that plans it)."""
        if self.daemon is None:
            return
        queued = select(procurements.c.id).where(procurements.c.state == "queued")
        database = self.daemon.runtime.database
        await wait_until(lambda: _none(sql_rows(database, queued)), timeout=10)

    async def procurement_state(self, order_no: str) -> dict[str, Any] | None:
        """The provider's procurement behind its order ``order_no`` (None on the sandbox)."""
        if self.daemon is None:
            return None
        view = await self.daemon.operations.views.order(order_no)
        return None if view is None else dict(view["procurements"][0])


async def _none(rows: Awaitable[list[Any]]) -> bool:
    return not await rows


def populate(sandbox: Sandbox) -> tuple[dict[str, int], dict[str, int]]:
    """The products each test needs, added to the generated catalogue; their ids and a SKU id of each."""
    state = sandbox.state
    products = {
        "plain": state.add_product(price="9.90", title="Plain card"),
        "scarce": state.add_product(price="5.00", stock_quantity=1, title="Scarce card"),
        "manual": state.add_product(fulfillment_type="manual", price="3.00", title="Manual top-up"),
        "unpriced": state.add_product(price="7.00", title="Unpriced card"),
        "dormant": state.add_product(price="4.00", title="Dormant card"),
        "retired": state.add_product(price="6.00", title="Retired card"),
        "mixed": state.add_product(skus=[NewSku("8.00"), NewSku("9.00", is_active=False)], title="Mixed"),
        "touched": min(state.products),
    }
    skus = {name: state.product(identity).skus[0].id for name, identity in products.items()}
    skus["inactive"] = state.product(products["mixed"]).skus[1].id
    return products, skus


def catalogue(allow_private_callbacks: bool) -> SandboxConfig:
    return SandboxConfig(
        products=4,
        skus_per_product=2,
        manual_ratio=0.0,
        balance=Decimal(BALANCE),
        allow_private_callbacks=allow_private_callbacks,
        callback_retry_delays=(0.2, 0.5),
    )


@asynccontextmanager
async def sandbox_site() -> AsyncIterator[Site]:
    """The sandbox upstream itself; callbacks to private addresses refused, as on a real site."""
    async with Sandbox(catalogue(allow_private_callbacks=False)) as sandbox:
        products, skus = populate(sandbox)
        state = sandbox.state
        main = Credentials(sandbox.config.api_key, sandbox.config.api_secret)
        users = {"main": main}
        for name, balance, level in (
            ("other", BALANCE, False),
            ("poor", "0", False),
            ("disabled", BALANCE, True),
        ):
            state.add_api_key(f"conf-{name}-key", SECRET_OF[name], balance, member_level=level)
            users[name] = Credentials(f"conf-{name}-key", SECRET_OF[name])
        state.disable_api_key("conf-disabled-key")
        state.set_product_active(products["dormant"], False)
        state.set_product_active(products["retired"], False)
        state.set_product_title(products["touched"], "Touched last")
        yield Site("sandbox", sandbox.base_url, users, products, skus, sandbox)


async def settled(daemon: Daemon) -> None:
    """The daemon's start-up work done: its own catalogue pass, repricing and the offered catalogue."""
    database = daemon.runtime.database
    finished = select(sync_runs.c.id).where(sync_runs.c.status == "ok", sync_runs.c.finished_at.is_not(None))
    await wait_until(lambda: sql_rows(database, finished), timeout=20)
    await asyncio.gather(*daemon.operations.catalog.tasks.values())


@asynccontextmanager
async def provider_site(database_url: str) -> AsyncIterator[Site]:
    """procurd selling its mirror of a sandbox (every SKU at cost plus 10 % but ``unpriced``'s), with a
    ``gold`` level; callbacks to private addresses refused, its rate limit out of the way."""
    async with Sandbox(catalogue(allow_private_callbacks=True)) as top:
        products, skus = populate(top)
        settings = provider_settings(
            database_url,
            ("top", top),
            provider={"site_name": "procurd provider", "allow_private_callback_url": False,
                      "rate_limit_per_minute": 100_000, "levels": [GOLD]},
            pricing={"rules": [{"sku_ids": [skus["unpriced"]], "exclude": True}, {"markup_percent": "10"}]},
        )  # fmt: skip
        async with running_daemon(settings) as daemon:
            operations = daemon.operations
            await settled(daemon)
            users: dict[str, Credentials] = {}
            for name, balance, level in (("main", BALANCE, "gold"), ("other", BALANCE, None),
                                         ("poor", "0", None), ("disabled", BALANCE, None)):  # fmt: skip
                account = await add_account(operations, name, balance=balance, level=level)
                users[name] = Credentials(account.api_key, account.api_secret)
            await operations.provider.accounts.set_status("disabled", False)
            # The upstream stops listing `retired` and retitles `touched`; a full pass takes both in.
            top.state.set_product_active(products["retired"], False)
            top.state.set_product_title(products["touched"], "Touched last")
            report = await operations.catalog.sync("top", full=True)
            assert report.status == "ok", report.error
            # `dormant`: listed inactive with a live SKU (see the module's docstring).
            await sql_execute(
                daemon.runtime.database,
                update(mirror_products)
                .where(mirror_products.c.upstream == "top", mirror_products.c.id == products["dormant"])
                .values(is_active=False),
            )
            await operations.provider.refresh(["top"])
            site = Site("provider", f"http://127.0.0.1:{settings.server.public_port}", users, products, skus,
                        top, daemon, settings.provider.header_prefix)  # fmt: skip
            yield site


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=KINDS)
async def site(request: pytest.FixtureRequest, module_database_url: str) -> AsyncIterator[Site]:
    """The sandbox, then the provider: every test of this module runs against each."""
    builder = sandbox_site() if request.param == "sandbox" else provider_site(module_database_url)
    async with builder as built:
        yield built


# --- helpers ----------------------------------------------------------------------------------------------


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def assert_failure(answer: ApiResponse, status: int, code: str) -> dict[str, Any]:
    """A failure envelope: the HTTP status, ``ok`` false, the error code and a message."""
    data = answer.json()
    assert (answer.status, data.get("ok"), data.get("error_code")) == (status, False, code), answer.body[:300]
    assert isinstance(data.get("error_message"), str), data
    assert data["error_message"], data
    assert answer.content_type == "application/json"
    return dict(data)


async def balance_of(site: Site, user: str = "main") -> Decimal:
    async with site.signed(user) as client:
        answer = await client.post("/ping")
    assert answer.status == 200, answer.body
    return Decimal(answer.json()["balance"])


async def sku_price(site: Site, role: str, user: str = "main") -> Decimal:
    """The price the user is shown for the role's SKU (``price_amount`` in the product's detail)."""
    async with site.signed(user) as client:
        answer = await client.get(f"/products/{site.products[role]}")
    assert answer.status == 200, answer.body
    sku = next(s for s in answer.json()["product"]["skus"] if s["id"] == site.skus[role])
    return Decimal(sku["price_amount"])


def instant(text: str) -> datetime:
    parsed = datetime.fromisoformat(text)
    assert parsed.tzinfo is not None, text
    return parsed


def rfc3339(moment: datetime) -> str:
    return moment.isoformat(timespec="microseconds")


def field_named(answer: ApiResponse, name: str) -> None:
    data = assert_failure(answer, 400, "bad_request")
    assert name in data["error_message"], (name, data)


# --- POST /ping -------------------------------------------------------------------------------------------


def assert_member_level(level: Any) -> None:
    """Seed 000 §2.6: ``id`` number, ``name`` multilingual object, ``slug`` and ``icon`` strings."""
    assert isinstance(level, dict), level
    assert isinstance(level["id"], int)
    assert not isinstance(level["id"], bool)
    assert isinstance(level["name"], dict)
    assert level["name"]
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in level["name"].items())
    assert isinstance(level["slug"], str)
    assert level["slug"]
    assert isinstance(level["icon"], str)


async def test_ping_fields(site: Site) -> None:
    """POST /ping answers ok, the site name, protocol 1.0, the user's id, its exact balance as a decimal
    string, the currency, and its member level in §2.6's shape (null for a user without one); procurd's
    client reads the same."""
    answers = {}
    for user in ("main", "other"):
        async with site.signed(user) as client:
            answer = await client.post("/ping")
        assert answer.status == 200
        data = answer.json()
        assert data["ok"] is True
        assert isinstance(data["site_name"], str)
        assert data["site_name"]
        assert data["protocol_version"] == "1.0"
        assert isinstance(data["user_id"], int)
        assert not isinstance(data["user_id"], bool)
        assert re.fullmatch(r"\d+\.\d{2}", data["balance"]), data["balance"]
        assert data["currency"] == "CNY"
        answers[user] = data
    assert_member_level(answers["main"]["member_level"])
    assert answers["other"]["member_level"] is None
    assert answers["main"]["user_id"] != answers["other"]["user_id"]
    async with site.client() as client:
        result = await client.ping()
    assert result.protocol_version == "1.0"
    assert result.user_id == answers["main"]["user_id"]
    assert result.currency == "CNY"
    assert result.member_level is not None
    assert result.member_level.slug == answers["main"]["member_level"]["slug"]


async def test_ping_with_a_body_is_signed_over_it(site: Site) -> None:
    """A ping that carries a body is checked against its digest like any request: signed over it, it
    answers; signed over no body, it is ``invalid_signature``."""
    async with site.signed() as client:
        good = await client.post("/ping", {"hello": "world"})
        stamp = int(time.time())
        who = site.users["main"]
        wrong = sign(who.api_secret, "POST", "/api/v1/upstream/ping", stamp, b"")
        bad = await client.post("/ping", {"hello": "world"}, timestamp=stamp, signature=wrong)
    assert good.status == 200
    assert good.json()["ok"] is True
    assert_failure(bad, 401, "invalid_signature")


# --- GET /categories and GET /products --------------------------------------------------------------------


async def all_products(site: Site, user: str = "main") -> list[dict[str, Any]]:
    async with site.signed(user) as client:
        return await client.list_all_products(page_size=site.page_size_max)


async def test_categories_have_two_levels_and_products_sit_on_leaves(site: Site) -> None:
    """GET /categories lists §2.1's fields; a category's parent is a top-level one; every listed product's
    category_id is a leaf listed there; procurd's client reads the same list."""
    async with site.signed() as client:
        answer = await client.get("/categories")
    assert answer.status == 200
    data = answer.json()
    assert data["ok"] is True
    categories = {c["id"]: c for c in data["categories"]}
    assert len(categories) == len(data["categories"]) > 0
    for category in categories.values():
        assert isinstance(category["parent_id"], int)
        assert isinstance(category["slug"], str)
        assert category["slug"]
        assert isinstance(category["name"], dict)
        assert isinstance(category["icon"], str)
        assert isinstance(category["sort_order"], int)
        if category["parent_id"] != 0:
            assert categories[category["parent_id"]]["parent_id"] == 0, category
    parents = {c["parent_id"] for c in categories.values()}
    products = await all_products(site)
    assert products
    for product in products:
        assert product["category_id"] in categories, product["id"]
        assert product["category_id"] not in parents, product["id"]
    async with site.client() as client:
        parsed = await client.categories()
    assert sorted(c.id for c in parsed) == sorted(categories)


async def test_products_list_only_active_offered_products(site: Site) -> None:
    """GET /products lists active products only, each with its active SKUs priced as decimal strings;
    the provider leaves out what it does not price."""
    products = {p["id"]: p for p in await all_products(site)}
    listed = {role for role, identity in site.products.items() if identity in products}
    assert {"plain", "scarce", "manual", "mixed", "touched"} <= listed
    assert not listed & {"dormant", "retired"}
    assert ("unpriced" in listed) is (site.kind == "sandbox")
    for product in products.values():
        assert product["is_active"] is True
        assert product["fulfillment_type"] in ("auto", "manual")
        Decimal(product["price_amount"])
        for sku in product["skus"]:
            Decimal(sku["price_amount"])
            assert sku["stock_status"] in ("unlimited", "in_stock", "low_stock", "out_of_stock")
            assert isinstance(sku["stock_quantity"], int)
    scarce = products[site.products["scarce"]]["skus"][0]
    assert (scarce["stock_quantity"], scarce["stock_status"]) == (1, "low_stock")


async def test_include_inactive_lists_what_was_offered_before(site: Site) -> None:
    """Asked ``include_inactive=true``, as Dujiao-Next's own downstream asks: the provider also lists the
    products it offered before and sells no longer (``dormant``, ``retired``) with ``is_active: false``, and
    says ``includes_inactive: true`` (``unpriced``, never offered, stays out); the sandbox, speaking seed
    000, ignores the flag. Without it neither says anything of inactive products."""
    async with site.signed() as client:
        plain = (await client.get("/products", {"page_size": 100})).json()
        asked = (await client.get("/products", {"page_size": 100, "include_inactive": "true"})).json()
    assert "includes_inactive" not in plain
    shown = {p["id"]: p for p in asked["items"]}
    on_sale = {p["id"] for p in plain["items"]}
    if site.kind == "sandbox":
        assert "includes_inactive" not in asked
        assert set(shown) == on_sale
        return
    withdrawn = {site.products["dormant"], site.products["retired"]}
    assert asked["includes_inactive"] is True
    assert set(shown) == on_sale | withdrawn
    assert [shown[identity]["is_active"] for identity in sorted(withdrawn)] == [False, False]
    assert (asked["total"], site.products["unpriced"] in shown) == (plain["total"] + 2, False)


async def test_member_prices_for_a_user_with_a_level(site: Site) -> None:
    """For the user with a member level, a SKU that carries a member price shows ``price_amount`` =
    ``member_price`` at most ``original_price`` (§2.2); some do (on the provider, every offered SKU whose
    tier price stays above its cost: the plain product's)."""
    products = await all_products(site)
    discounted = 0
    for product in products:
        for sku in product["skus"]:
            if "member_price" in sku:
                discounted += 1
                assert sku["price_amount"] == sku["member_price"], sku
                assert Decimal(sku["member_price"]) <= Decimal(sku["original_price"]), sku
    assert discounted
    if site.kind == "provider":
        plain = next(p for p in products if p["id"] == site.products["plain"])
        assert "member_price" in plain["skus"][0]


async def test_provider_shows_no_member_price_without_a_level(site: Site) -> None:
    """The provider shows a user without a level its offered prices, without original_price or
    member_price (the sandbox's catalogue is the same for every key)."""
    if site.kind == "sandbox":
        pytest.skip("the sandbox shows one catalogue to every key")
    for product in await all_products(site, "other"):
        assert "member_price" not in product
        for sku in product["skus"]:
            assert "member_price" not in sku
            assert "original_price" not in sku


async def test_pagination_walks_every_product_once(site: Site) -> None:
    """Pages of 3 hold every listed product exactly once, in the order of one large page; ``total``,
    ``page`` and ``page_size`` are echoed; a page past the end is empty with the same total."""
    async with site.signed() as client:
        whole = (await client.get("/products", {"page": 1, "page_size": site.page_size_max})).json()
        seen: list[int] = []
        page = 1
        while True:
            data = (await client.get("/products", {"page": page, "page_size": 3})).json()
            assert (data["ok"], data["page"], data["page_size"], data["total"]) == (
                True, page, 3, whole["total"],
            )  # fmt: skip
            if not data["items"]:
                break
            assert len(data["items"]) <= 3
            seen += [p["id"] for p in data["items"]]
            page += 1
    assert seen == [p["id"] for p in whole["items"]]
    assert len(seen) == len(set(seen)) == whole["total"]
    assert page == -(-whole["total"] // 3) + 1
    async with site.signed() as client:  # what procurd's client asks: inactive products too (if served)
        asked = (
            await client.get("/products", {"page": 2, "page_size": 3, "include_inactive": "true"})
        ).json()
    async with site.client() as client:
        parsed = await client.products(page=2, page_size=3)
    assert [p.id for p in parsed.items] == [p["id"] for p in asked["items"]]
    assert (parsed.page, parsed.page_size, parsed.total) == (2, 3, asked["total"])


async def test_page_and_page_size_out_of_range_are_clamped(site: Site) -> None:
    """``page_size`` below 1 is the default 20, above the site's maximum that maximum (50 on the
    sandbox, 100 on the provider); ``page`` below 1 is 1; an empty value is the default; what is not an
    integer is ``bad_request`` naming the parameter."""
    cases: list[tuple[dict[str, str | int], int, int]] = [
        ({}, 1, 20),
        ({"page_size": 1}, 1, 1),
        ({"page_size": 0}, 1, 20),
        ({"page_size": -7}, 1, 20),
        ({"page_size": 101}, 1, site.page_size_max),
        ({"page_size": 100_000}, 1, site.page_size_max),
        ({"page_size": ""}, 1, 20),
        ({"page": 0}, 1, 20),
        ({"page": -3, "page_size": 2}, 1, 2),
        ({"page": ""}, 1, 20),
    ]
    async with site.signed() as client:
        for params, page, page_size in cases:
            data = (await client.get("/products", params)).json()
            assert (data["ok"], data["page"], data["page_size"]) == (True, page, page_size), params
            assert len(data["items"]) <= page_size
        for name in ("page", "page_size"):
            for value in ("abc", "1.5", "1e3", "0x10"):
                field_named(await client.get("/products", {name: value}), name)


async def test_category_filter(site: Site) -> None:
    """``category_id`` lists the products of that category only, with its total; a category without
    products lists none; a value that is not a non-negative integer is ``bad_request`` naming it."""
    products = await all_products(site)
    category = products[0]["category_id"]
    expected = [p["id"] for p in products if p["category_id"] == category]
    async with site.signed() as client:
        data = (await client.get("/products", {"category_id": category, "page_size": 100})).json()
        assert (data["total"], [p["id"] for p in data["items"]]) == (len(expected), expected)
        empty = (await client.get("/products", {"category_id": 987_654})).json()
        assert (empty["ok"], empty["total"], empty["items"]) == (True, 0, [])
        for value in ("abc", "-1", "1.0", " 1"):
            field_named(await client.get("/products", {"category_id": value}), "category_id")


async def test_updated_after_lists_products_updated_at_or_after_it(site: Site) -> None:
    """``updated_after`` (RFC 3339, any offset) lists exactly the products updated at or after it: the
    last-touched product alone at its own time, all of them from long ago, none a second after the last;
    a value without a time zone or not a timestamp is ``bad_request`` naming the parameter."""
    products = await all_products(site)
    times = {p["id"]: instant(p["updated_at"]) for p in products}
    last = max(times.values())
    assert times[site.products["touched"]] == last
    assert sorted(times.values())[-2] < last
    async with site.signed() as client:

        async def listed(since: datetime) -> list[int]:
            return [p["id"] for p in await client.list_all_products(50, updated_after=rfc3339(since))]

        assert await listed(last) == [p["id"] for p in products if times[p["id"]] >= last]
        assert await listed(last.astimezone(timezone(timedelta(hours=8)))) == [site.products["touched"]]
        assert await listed(last - timedelta(days=3650)) == [p["id"] for p in products]
        assert await listed(last + timedelta(seconds=1)) == []
        for value in ("yesterday", "2026-01-02T03:04:05", "2026-13-01T00:00:00Z", "1700000000"):
            field_named(await client.get("/products", {"updated_after": value}), "updated_after")
    async with site.client() as procurd_client:  # it asks in whole seconds, rounded down
        page = await procurd_client.catalog_page(1, 50, updated_after=last)
    second = last.replace(microsecond=0)
    on_sale = [p["id"] for p in page.items if p["is_active"]]  # it asks for inactive products too
    assert on_sale == [p["id"] for p in products if times[p["id"]] >= second]
    assert site.products["touched"] in [p["id"] for p in page.items]


async def test_product_detail_and_its_404s(site: Site) -> None:
    """GET /products/{id} answers the product as the listing shows it; an unknown id is 404
    ``product_not_found``, a product that is no longer listed 404 ``product_unavailable``, an id that is
    not a number ``bad_request``."""
    listed = {p["id"]: p for p in await all_products(site)}
    plain = site.products["plain"]
    async with site.signed() as client:
        answer = await client.get(f"/products/{plain}")
        assert answer.status == 200
        product = answer.json()["product"]
        assert product == listed[plain]
        assert_failure(await client.get("/products/987654"), 404, "product_not_found")
        for role in ("retired", "dormant"):
            assert_failure(await client.get(f"/products/{site.products[role]}"), 404, "product_unavailable")
        for raw in ("abc", "1.0", "-1", "99999999999999999999999"):
            assert_failure(await client.get(f"/products/{raw}"), 400, "bad_request")
    async with site.client() as client:
        parsed = await client.product(plain)
        assert parsed.id == plain
        assert [s.id for s in parsed.skus] == [s["id"] for s in product["skus"]]
        with pytest.raises(BusinessError) as caught:
            await client.product(987_654)
        assert (caught.value.code, caught.value.http_status) == ("product_not_found", 404)
        with pytest.raises(BusinessError) as caught:
            await client.product(site.products["retired"])
        assert (caught.value.code, caught.value.http_status) == ("product_unavailable", 404)


# --- POST /orders -----------------------------------------------------------------------------------------


async def test_an_order_is_paid_at_quantity_times_price(site: Site) -> None:
    """POST /orders answers ok, the order's id and number, ``paid``, amount = quantity x the price the user
    is shown, and the currency; the wallet is charged that amount exactly once."""
    price = await sku_price(site, "plain")
    before = await balance_of(site)
    async with site.signed() as client:
        answer = await client.create_order(site.skus["plain"], 3, downstream_order_no=unique("PAID"))
    assert answer.status == 200
    data = answer.json()
    assert data["ok"] is True
    assert isinstance(data["order_id"], int)
    assert isinstance(data["order_no"], str)
    assert data["order_no"]
    assert data["status"] == "paid"
    assert isinstance(data["amount"], str)
    assert Decimal(data["amount"]) == price * 3
    assert data["currency"] == "CNY"
    assert await balance_of(site) == before - price * 3


async def test_an_order_is_idempotent_per_user_and_downstream_number(site: Site) -> None:
    """The same user repeating a ``downstream_order_no`` gets the same order (no second charge); another
    user's order under the same number is its own."""
    number = unique("IDEM")
    before = await balance_of(site)
    async with site.client() as client:
        first = await client.create_order(CreateOrderRequest(sku_id=site.skus["plain"], quantity=1,
                                                             downstream_order_no=number))  # fmt: skip
        again = await client.create_order(CreateOrderRequest(sku_id=site.skus["plain"], quantity=1,
                                                             downstream_order_no=number))  # fmt: skip
    assert (again.order_id, again.order_no) == (first.order_id, first.order_no)
    assert first.status == "paid"
    assert await balance_of(site) == before - Decimal(first.amount or "0")
    async with site.signed() as client:
        raw = await client.create_order(site.skus["plain"], 2, downstream_order_no=number)
    assert (raw.status, raw.json()["ok"], raw.json()["order_id"]) == (200, True, first.order_id)
    async with site.signed("other") as client:
        theirs = await client.create_order(site.skus["plain"], 1, downstream_order_no=number)
    assert theirs.status == 200
    assert theirs.json()["order_id"] != first.order_id


async def test_payment_failed_is_http_200_and_the_number_stays_canceled(site: Site) -> None:
    """An empty wallet: HTTP 200 with ok false, ``payment_failed``, the canceled order's id, number and
    status; the order reads ``canceled``; a repeat of its number answers that canceled order again."""
    number = unique("PF")
    async with site.signed("poor") as client:
        answer = await client.create_order(site.skus["plain"], 1, downstream_order_no=number)
        data = assert_failure(answer, 200, "payment_failed")
        assert data["status"] == "canceled"
        assert isinstance(data["order_id"], int)
        assert isinstance(data["order_no"], str)
        shown = (await client.get(f"/orders/{data['order_id']}")).json()
        assert (shown["ok"], shown["status"], shown["order_no"]) == (True, "canceled", data["order_no"])
        repeat = await client.create_order(site.skus["plain"], 1, downstream_order_no=number)
    assert repeat.status == 200
    assert (repeat.json()["order_id"], repeat.json()["status"]) == (data["order_id"], "canceled")
    async with site.client("poor") as client:
        with pytest.raises(PaymentFailed) as caught:
            await client.create_order(CreateOrderRequest(sku_id=site.skus["plain"], quantity=1,
                                                         downstream_order_no=unique("PF")))  # fmt: skip
        assert (caught.value.http_status, caught.value.status) == (200, "canceled")
        assert caught.value.order_id is not None
        again = await client.create_order(CreateOrderRequest(sku_id=site.skus["plain"], quantity=1,
                                                             downstream_order_no=number))  # fmt: skip
    assert (again.order_id, again.status) == (data["order_id"], "canceled")
    assert await balance_of(site, "poor") == 0


async def test_unorderable_skus_are_refused_with_their_codes(site: Site) -> None:
    """An unknown or inactive SKU is 400 ``sku_unavailable``, a SKU of an inactive product 400
    ``product_unavailable``, more than the stock 409 ``insufficient_stock``; nothing is charged."""
    before = await balance_of(site)
    async with site.signed() as client:
        assert_failure(await client.create_order(987_654, 1), 400, "sku_unavailable")
        assert_failure(await client.create_order(site.skus["inactive"], 1), 400, "sku_unavailable")
        answer = await client.create_order(site.skus["dormant"], 1, downstream_order_no=unique("DORM"))
        assert_failure(answer, 400, "product_unavailable")
        answer = await client.create_order(site.skus["scarce"], 2, downstream_order_no=unique("SCARCE"))
        assert_failure(answer, 409, "insufficient_stock")
    async with site.client() as client:
        with pytest.raises(BusinessError) as caught:
            await client.create_order(CreateOrderRequest(sku_id=site.skus["scarce"], quantity=5))
        assert (caught.value.code, caught.value.http_status) == ("insufficient_stock", 409)
    assert await balance_of(site) == before


async def test_provider_sells_only_what_it_prices(site: Site) -> None:
    """A SKU that no pricing rule prices is not offered by the provider: its product is not listed and an
    order for it is ``sku_unavailable`` (the sandbox sells it)."""
    async with site.signed() as client:
        answer = await client.create_order(site.skus["unpriced"], 1, downstream_order_no=unique("UNP"))
    if site.kind == "sandbox":
        assert (answer.status, answer.json()["status"]) == (200, "paid")
    else:
        assert_failure(answer, 400, "sku_unavailable")


async def test_bad_bodies_are_bad_request_naming_the_field(site: Site) -> None:
    """Each malformed body is 400 ``bad_request`` whose message names the offending field; nothing is
    created or charged."""
    plain, manual = site.skus["plain"], site.skus["manual"]
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "sku_id"),
        ({"sku_id": str(plain), "quantity": 1}, "sku_id"),
        ({"sku_id": -1, "quantity": 1}, "sku_id"),
        ({"sku_id": 2**64, "quantity": 1}, "sku_id"),
        ({"sku_id": plain}, "quantity"),
        ({"sku_id": plain, "quantity": 0}, "quantity"),
        ({"sku_id": plain, "quantity": "1"}, "quantity"),
        ({"sku_id": plain, "quantity": True}, "quantity"),
        ({"sku_id": plain, "quantity": 1.5}, "quantity"),
        ({"sku_id": plain, "quantity": 1, "manual_form_data": ["x"]}, "manual_form_data"),
        ({"sku_id": plain, "quantity": 1, "downstream_order_no": 12}, "downstream_order_no"),
        ({"sku_id": plain, "quantity": 1, "trace_id": {"a": 1}}, "trace_id"),
        ({"sku_id": plain, "quantity": 1, "callback_url": 7}, "callback_url"),
        ({"sku_id": manual, "quantity": 1}, "manual_form_data"),
        ({"sku_id": manual, "quantity": 1, "manual_form_data": {"other": "x"}}, "manual_form_data"),
    ]
    before = await balance_of(site)
    async with site.signed() as client:
        for body, name in cases:
            field_named(await client.post("/orders", body), name)
        for raw in (b"", b"not json", b"[1, 2]", b'"text"', b"{", b'{"sku_id": 1,}', b"\xff\xfe"):
            assert_failure(await client.post("/orders", body=raw), 400, "bad_request")
    assert await balance_of(site) == before


async def test_private_callback_urls_are_refused(site: Site) -> None:
    """A ``callback_url`` on a private, loopback or link-local host, or not http(s), is 400
    ``invalid_callback_url`` when the site does not allow them; nothing is created."""
    before = await balance_of(site)
    async with site.signed() as client:
        for url in (*PRIVATE_CALLBACKS, "ftp://shop.example.com/cb", "not a url"):
            number = unique("CB")
            answer = await client.create_order(site.skus["plain"], 1, downstream_order_no=number,
                                               callback_url=url)  # fmt: skip
            assert_failure(answer, 400, "invalid_callback_url")
            again = await client.create_order(site.skus["plain"], 1, downstream_order_no=number,
                                              callback_url=url)  # fmt: skip
            assert_failure(again, 400, "invalid_callback_url")
    assert await balance_of(site) == before


async def test_oversized_bodies(site: Site) -> None:
    """A body over the site's limit (10 MB on the sandbox, 1 MB on the provider) is refused 413 before it
    is parsed; one at the limit is read and judged on its content."""
    padded = b'{"sku_id": 1, "quantity": 0}'
    async with site.signed() as client:
        at_limit = padded + b" " * (site.max_body_bytes - len(padded))
        field_named(await client.post("/orders", body=at_limit), "quantity")
        over = at_limit + b" "
        assert_failure(await client.post("/orders", body=over, timeout=60), 413, "request_too_large")


# --- GET /orders/{id} and POST /orders/{id}/cancel --------------------------------------------------------


async def test_order_query_shows_items_and_fulfillment_only_once_delivered(site: Site) -> None:
    """GET /orders/{id} shows the order's items (§2.4); ``fulfillment`` is absent while the order is paid
    and undelivered, and present with §2.5's fields once it is delivered; a paid order is not cancelable
    (409 ``cancel_not_allowed``), nor a delivered one."""
    trace = unique("trace")
    price = await sku_price(site, "plain")
    await site.idle()
    site.goods.faults.hold_delivery_next()
    async with site.signed() as client:
        created = (await client.create_order(site.skus["plain"], 2, downstream_order_no=unique("HOLD"),
                                             trace_id=trace)).json()  # fmt: skip
        order_id = created["order_id"]
        goods_id = await site.bought(order_id, trace)
        held = (await client.get(f"/orders/{order_id}")).json()
        assert (held["ok"], held["order_id"], held["order_no"]) == (True, order_id, created["order_no"])
        assert (held["status"], held["amount"], held["currency"]) == ("paid", created["amount"], "CNY")
        assert "fulfillment" not in held
        assert held["items"] == [held["items"][0]]
        item = held["items"][0]
        assert (item["product_id"], item["sku_id"], item["quantity"]) == (
            site.products["plain"], site.skus["plain"], 2,
        )  # fmt: skip
        assert Decimal(item["unit_price"]) == price
        assert Decimal(item["total_price"]) == price * 2 == Decimal(created["amount"])
        assert item["fulfillment_type"] == "auto"
        assert isinstance(item["title"], dict)
        assert item["title"]
        assert_failure(await client.post(f"/orders/{order_id}/cancel"), 409, "cancel_not_allowed")
        await site.goods.deliver(goods_id)

        async def delivered() -> dict[str, Any] | None:
            data: dict[str, Any] = (await client.get(f"/orders/{order_id}")).json()
            return data if data["status"] == "delivered" else None

        shown = await wait_until(delivered, timeout=15)
        fulfillment = shown["fulfillment"]
        assert fulfillment["type"] == "auto"
        assert fulfillment["status"] == "delivered"
        assert isinstance(fulfillment["payload"], str)
        assert fulfillment["payload"]
        assert fulfillment["delivery_data"] is None or isinstance(fulfillment["delivery_data"], dict)
        instant(fulfillment["delivered_at"].replace("Z", "+00:00"))
        assert_failure(await client.post(f"/orders/{order_id}/cancel"), 409, "cancel_not_allowed")
    async with site.client() as procurd_client:
        parsed = await procurd_client.get_order(order_id)
        assert parsed.fulfillment is not None
        assert parsed.fulfillment.payload == fulfillment["payload"]
        with pytest.raises(BusinessError) as caught:
            await procurd_client.cancel_order(order_id)
        assert (caught.value.code, caught.value.http_status) == ("cancel_not_allowed", 409)


async def test_a_cancelable_order_is_canceled_and_paid_back(site: Site) -> None:
    """An order the upstream still holds unpaid (``pending_payment`` where the goods are) is canceled: 200
    with ok, its id, number and ``canceled``; it then reads canceled and the wallet holds what it held
    before the order. Canceling it again: the sandbox refuses (409), the provider answers it again."""
    trace = unique("trace")
    before = await balance_of(site)
    await site.idle()
    site.goods.faults.pending_payment_next()
    async with site.signed() as client:
        created = (await client.create_order(site.skus["plain"], 1, downstream_order_no=unique("CXL"),
                                             trace_id=trace)).json()  # fmt: skip
        order_id = created["order_id"]
        await site.bought(order_id, trace)
        if site.kind == "provider":

            async def submitted() -> bool:
                procurement = await site.procurement_state(created["order_no"])
                return procurement is not None and procurement["upstream_status"] == "pending_payment"

            await wait_until(submitted, timeout=10)
        answer = await client.post(f"/orders/{order_id}/cancel")
        assert answer.status == 200, answer.body
        data = answer.json()
        assert data == {
            "ok": True,
            "order_id": order_id,
            "order_no": created["order_no"],
            "status": "canceled",
        }
        assert (await client.get(f"/orders/{order_id}")).json()["status"] == "canceled"
        again = await client.post(f"/orders/{order_id}/cancel")
    if site.kind == "sandbox":
        assert_failure(again, 409, "cancel_not_allowed")
    else:
        assert (again.status, again.json()["status"]) == (200, "canceled")
    assert await balance_of(site) == before


async def test_unknown_and_foreign_orders_are_not_found(site: Site) -> None:
    """An order id nobody has, and another user's order, are 404 ``order_not_found`` to GET and cancel;
    a path id that is not a number is ``bad_request``."""
    async with site.signed() as client:
        mine = (await client.create_order(site.skus["plain"], 1, downstream_order_no=unique("MINE"))).json()
        assert (await client.get(f"/orders/{mine['order_id']}")).status == 200
    async with site.signed("other") as client:
        for order_id in (mine["order_id"], 987_654):
            assert_failure(await client.get(f"/orders/{order_id}"), 404, "order_not_found")
            assert_failure(await client.post(f"/orders/{order_id}/cancel"), 404, "order_not_found")
        for raw in ("abc", "1.5", "-2", "18446744073709551616"):
            assert_failure(await client.get(f"/orders/{raw}"), 400, "bad_request")
            assert_failure(await client.post(f"/orders/{raw}/cancel"), 400, "bad_request")
    async with site.client("other") as client:
        with pytest.raises(BusinessError) as caught:
            await client.get_order(mine["order_id"])
        assert (caught.value.code, caught.value.http_status) == ("order_not_found", 404)
        with pytest.raises(BusinessError) as caught:
            await client.cancel_order(mine["order_id"])
        assert (caught.value.code, caught.value.http_status) == ("order_not_found", 404)


# --- authentication, routing and the Date header ----------------------------------------------------------


def _stamp(offset: int) -> int:
    return int(time.time()) + offset


AUTH_CASES: tuple[tuple[str, int, str, dict[str, Any]], ...] = (
    ("no key", 401, "missing_auth_headers", {"omit_headers": ["Service-Api-Key"]}),
    ("no timestamp", 401, "missing_auth_headers", {"omit_headers": ["Service-Timestamp"]}),
    ("no signature", 401, "missing_auth_headers", {"omit_headers": ["Service-Signature"]}),
    ("blank signature", 401, "missing_auth_headers", {"signature": " "}),
    ("timestamp not a number", 401, "invalid_timestamp", {"timestamp": "yesterday"}),
    ("timestamp in milliseconds", 401, "invalid_timestamp", {"timestamp": str(int(time.time() * 1000))}),
    ("wrong secret", 401, "invalid_signature", {"api_secret": "not-the-secret"}),
    ("signed another path", 401, "invalid_signature", {"sign_path": "/api/v1/upstream/categories"}),
    ("garbage signature", 401, "invalid_signature", {"signature": "0" * 64}),
    ("unknown key", 403, "invalid_api_key", {"api_key": "nobody-has-this-key"}),
)


async def test_authentication_failures(site: Site) -> None:
    """Every authentication failure answers its seed 000 code with its status: missing headers,
    unreadable timestamp, a timestamp more than 60 s off either way, a bad signature (401), an unknown
    key (403); a timestamp within the tolerance is accepted. A disabled key is ``invalid_api_key``: 403 on
    the sandbox, 401 on the provider."""
    async with site.signed() as client:
        for name, status, code, overrides in AUTH_CASES:
            answer = await client.post("/ping", **overrides)
            assert (answer.status, answer.error_code) == (status, code), name
            assert_failure(answer, status, code)
        for offset in (-3600, -61, 61, 3600):
            answer = await client.post("/ping", timestamp=_stamp(offset))
            assert_failure(answer, 401, "timestamp_expired")
        for offset in (-50, 50):
            assert (await client.post("/ping", timestamp=_stamp(offset))).status == 200, offset
        answer = await client.get("/products", api_key=site.users["disabled"].api_key,
                                  api_secret=site.users["disabled"].api_secret)  # fmt: skip
        assert_failure(answer, site.disabled_key_status, "invalid_api_key")
    async with site.signed("disabled") as client:
        assert_failure(await client.post("/ping"), site.disabled_key_status, "invalid_api_key")


@pytest.mark.parametrize(
    ("overrides", "code", "status"),
    [
        ({"api_secret": SecretStr("wrong-secret")}, "invalid_signature", 401),
        ({"api_key": "no-such-key"}, "invalid_api_key", 403),
        ({"header_prefix": "Other"}, "missing_auth_headers", 401),
    ],
)
async def test_procurds_client_reads_authentication_failures(
    site: Site, overrides: dict[str, Any], code: str, status: int
) -> None:
    """procurd's client raises a non-retryable AuthError with the site's code and status for a wrong
    secret, key or header prefix, and for a disabled key."""
    async with site.client(**overrides) as client:
        with pytest.raises(AuthError) as caught:
            await client.ping()
    assert (caught.value.code, caught.value.http_status) == (code, status)
    assert not caught.value.retryable
    async with site.client("disabled") as client:
        with pytest.raises(AuthError) as caught:
            await client.ping()
    assert (caught.value.code, caught.value.http_status) == ("invalid_api_key", site.disabled_key_status)


async def test_procurds_client_sees_a_clock_off_by_more_than_a_minute(site: Site) -> None:
    """A client whose clock runs 90 s behind gets ``timestamp_expired``: ClockSkew, with the offset
    measured from the site's Date header."""
    async with UpstreamClient(site.client().settings, clock=lambda: time.time() - 90) as client:
        with pytest.raises(ClockSkew) as caught:
            await client.ping()
    assert (caught.value.code, caught.value.http_status) == ("timestamp_expired", 401)
    offset = caught.value.clock_offset_seconds
    assert offset is not None
    assert -100 < offset < -80


async def test_unknown_paths_and_methods(site: Site) -> None:
    """A path the API does not have is 404 ``not_found``; a known path with another method is 405
    ``method_not_allowed``; both in the API's envelope."""
    async with site.signed() as client:
        assert_failure(await client.get("/nothing-here"), 404, "not_found")
        assert_failure(await client.get("/orders/1/cancel/more"), 404, "not_found")
        assert_failure(await client.request("DELETE", "/orders"), 405, "method_not_allowed")
        assert_failure(await client.get("/ping"), 405, "method_not_allowed")
        assert_failure(await client.post("/products"), 405, "method_not_allowed")


async def test_every_answer_carries_the_sites_date(site: Site) -> None:
    """Success, authentication failure, business failure and routing failure answers all carry a
    ``Date`` header in HTTP date form, within a minute of this machine's clock."""
    async with site.signed() as client:
        answers = [
            await client.post("/ping"),
            await client.get("/categories"),
            await client.get("/products/987654"),
            await client.post("/ping", signature="0" * 64),
            await client.post("/ping", omit_headers=["Service-Api-Key"]),
            await client.get("/nothing-here"),
        ]
    for answer in answers:
        date = parsedate_to_datetime(answer.headers["Date"])
        assert date.tzinfo is not None
        assert abs((date - datetime.now(UTC)).total_seconds()) < 60, answer.headers["Date"]
