"""The sandbox's generated catalogue and the catalogue endpoints (ping, categories, products)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from procurd.sandbox import Sandbox, SandboxConfig, SandboxState
from procurd.sandbox.catalog import generate_catalogue, stock_status
from procurd.sandbox.testing import SignedClient

MONEY = re.compile(r"^\d+\.\d{2}$")


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig(products=120)) as sandbox:
        yield sandbox


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[SignedClient]:
    async with SignedClient(sandbox.base_url) as client:
        yield client


def test_same_seed_same_catalogue() -> None:
    """Two catalogues generated from one seed serialize to the same bytes; another seed differs."""
    first = generate_catalogue(seed=7, products=60, skus_per_product=3, manual_ratio=0.25)
    second = generate_catalogue(seed=7, products=60, skus_per_product=3, manual_ratio=0.25)
    other = generate_catalogue(seed=8, products=60, skus_per_product=3, manual_ratio=0.25)
    serialize = [p.detail_json() for p in first.products.values()]
    assert serialize == [p.detail_json() for p in second.products.values()]
    assert serialize != [p.detail_json() for p in other.products.values()]


def test_ten_thousand_products_with_three_skus() -> None:
    """A 10,000-product catalogue has 30,000 SKUs with dense ids and lists all 10,000 products."""
    state = SandboxState(SandboxConfig(products=10_000, skus_per_product=3))
    assert len(state.products) == 10_000
    assert len(state.skus) == 30_000
    assert sorted(state.skus) == list(range(1, 30_001))
    assert len(state.active_products()) == 10_000
    assert all(len(p.listing_json()) > 0 for p in state.active_products()[:50])


def test_manual_share_follows_ratio() -> None:
    """Exactly floor(products x manual_ratio) products are manual, and each has a form schema."""
    state = SandboxState(SandboxConfig(products=40, manual_ratio=0.25))
    manual = [p for p in state.products.values() if p.fulfillment_type == "manual"]
    assert len(manual) == 10
    assert all(p.manual_form_schema and p.manual_form_schema["fields"][0]["required"] for p in manual)
    auto = [p for p in state.products.values() if p.fulfillment_type == "auto"]
    assert all(p.manual_form_schema is None for p in auto)


def test_catalogue_has_every_stock_kind_and_some_discounts() -> None:
    """The mix has unlimited, plenty, low and zero stock, inactive SKUs, member discounts and extra fields."""
    state = SandboxState(SandboxConfig(products=200))
    statuses = {sku.stock_status for sku in state.skus.values()}
    assert statuses == {"unlimited", "in_stock", "low_stock", "out_of_stock"}
    assert any(not sku.is_active for sku in state.skus.values())
    assert any(sku.member_price is not None for sku in state.skus.values())
    assert any(sku.wholesale_prices for sku in state.skus.values())


@pytest.mark.parametrize(
    ("quantity", "status"),
    [(-1, "unlimited"), (0, "out_of_stock"), (1, "low_stock"), (20, "low_stock"), (21, "in_stock")],
)
def test_stock_status_rule(quantity: int, status: str) -> None:
    """stock_status follows seed 2.3 at each boundary."""
    assert stock_status(quantity) == status


def test_inactive_products_are_generated_on_top() -> None:
    """inactive_products adds inactive products after the active ones; listings show only the active."""
    state = SandboxState(SandboxConfig(products=10, inactive_products=3))
    assert len(state.products) == 13
    assert [p.id for p in state.active_products()] == list(range(1, 11))


def test_editing_a_dataclass_shows_in_the_serialized_product() -> None:
    """Assigning a SKU field directly drops the product's cached JSON."""
    state = SandboxState(SandboxConfig(products=5))
    product = state.active_products()[0]
    before = product.listing_json()
    product.skus[0].price_amount = "0.01"
    assert product.listing_json() != before
    assert b'"price_amount":"0.01"' in product.listing_json()


async def test_ping_answers_site_user_and_wallet(client: SignedClient) -> None:
    """POST /ping answers site name, protocol 1.0, user, balance as a string, currency and member level."""
    data = (await client.post("/ping")).json()
    assert data["ok"] is True
    assert data["site_name"] == "procurd sandbox"
    assert data["protocol_version"] == "1.0"
    assert data["user_id"] == 1
    assert data["balance"] == "1000.00"
    assert data["currency"] == "CNY"
    assert set(data["member_level"]) == {"id", "name", "slug", "icon"}


async def test_ping_member_level_can_be_null() -> None:
    """A user without a member level gets member_level null."""
    async with (
        Sandbox(SandboxConfig(member_level=False)) as sandbox,
        SignedClient(sandbox.base_url) as client,
    ):
        assert (await client.post("/ping")).json()["member_level"] is None


async def test_categories_are_two_levels_and_products_sit_on_leaves(client: SignedClient) -> None:
    """Categories have at most two levels and every listed product is on a leaf category."""
    categories = (await client.get("/categories")).json()["categories"]
    by_id = {c["id"]: c for c in categories}
    for category in categories:
        assert set(category) == {"id", "parent_id", "slug", "name", "icon", "sort_order"}
        if category["parent_id"]:
            assert by_id[category["parent_id"]]["parent_id"] == 0
    parents = {c["parent_id"] for c in categories}
    assert all(p["category_id"] not in parents for p in await client.list_all_products())


async def test_product_fields_follow_the_seed(client: SignedClient) -> None:
    """Listed products and SKUs carry the seed fields, two-place money and a consistent stock_status."""
    for product in await client.list_all_products():
        for key in ("id", "slug", "title", "description", "content", "seo_meta", "images", "tags"):
            assert key in product
        assert set(product["title"]) == {"zh-CN", "en-US"}
        assert MONEY.match(product["price_amount"])
        assert product["fulfillment_type"] in ("auto", "manual")
        assert product["is_active"] is True
        for sku in product["skus"]:
            assert MONEY.match(sku["price_amount"])
            assert sku["stock_status"] == stock_status(sku["stock_quantity"])
            if "member_price" in sku:
                assert sku["price_amount"] == sku["member_price"]
                assert Decimal(sku["original_price"]) >= Decimal(sku["member_price"])


async def test_page_size_is_clamped_to_50(client: SignedClient) -> None:
    """page_size=100 is answered with 50 items and page_size 50; the default page size is 20."""
    clamped = (await client.get("/products", {"page_size": 100})).json()
    assert (clamped["page_size"], len(clamped["items"]), clamped["total"]) == (50, 50, 120)
    default = (await client.get("/products")).json()
    assert (default["page"], default["page_size"], len(default["items"])) == (1, 20, 20)


async def test_pages_cover_every_product_once(client: SignedClient) -> None:
    """Walking the pages yields every active product exactly once; a page past the end is empty."""
    ids = [p["id"] for p in await client.list_all_products(7)]
    assert ids == list(range(1, 121))
    past = (await client.get("/products", {"page": 99, "page_size": 50})).json()
    assert past["items"] == []
    assert past["total"] == 120


async def test_bad_page_parameter_is_400(client: SignedClient) -> None:
    """A page that is not a number answers 400 bad_request."""
    assert (await client.get("/products", {"page": "two"})).error_code == "bad_request"


async def test_inactive_skus_are_left_out_of_listings(sandbox: Sandbox, client: SignedClient) -> None:
    """An inactive SKU is missing from the listing but shown with is_active false in the detail."""
    product = sandbox.state.active_products()[0]
    hidden = product.skus[-1]
    sandbox.state.set_sku_active(hidden.id, False)
    listed = next(p for p in await client.list_all_products() if p["id"] == product.id)
    assert hidden.id not in [s["id"] for s in listed["skus"]]
    detail = (await client.get(f"/products/{product.id}")).json()["product"]
    assert {s["id"]: s["is_active"] for s in detail["skus"]}[hidden.id] is False


async def test_product_detail_success_shape(client: SignedClient) -> None:
    """GET /products/:id answers ok and the product."""
    data = (await client.get("/products/3")).json()
    assert data["ok"] is True
    assert data["product"]["id"] == 3


async def test_missing_product_is_404_not_found(client: SignedClient) -> None:
    """An unknown product id answers 404 product_not_found."""
    response = await client.get("/products/999999")
    assert (response.status, response.error_code) == (404, "product_not_found")


async def test_inactive_product_is_404_unavailable_and_unlisted(
    sandbox: Sandbox, client: SignedClient
) -> None:
    """An inactive product leaves the listing and its detail answers 404 product_unavailable."""
    sandbox.state.set_product_active(5, False)
    response = await client.get("/products/5")
    assert (response.status, response.error_code) == (404, "product_unavailable")
    assert 5 not in [p["id"] for p in await client.list_all_products()]
    assert (await client.get("/products")).json()["total"] == 119


async def test_inactive_product_detail_can_answer_200(sandbox: Sandbox, client: SignedClient) -> None:
    """With inactive_product_detail '200' an inactive product's detail is 200 with is_active false."""
    sandbox.config.inactive_product_detail = "200"
    sandbox.state.set_product_active(5, False)
    response = await client.get("/products/5")
    assert response.status == 200
    assert response.json()["product"]["is_active"] is False


async def test_removed_product_is_gone_until_restored(sandbox: Sandbox, client: SignedClient) -> None:
    """A removed product is unlisted and not found; restoring brings it back."""
    sandbox.state.remove_product(9)
    assert (await client.get("/products/9")).error_code == "product_not_found"
    assert 9 not in [p["id"] for p in await client.list_all_products()]
    sandbox.state.restore_product(9)
    assert (await client.get("/products/9")).status == 200


async def test_price_change_shows_at_once(sandbox: Sandbox, client: SignedClient) -> None:
    """set_sku_price changes what the next listing and detail answer."""
    sku = sandbox.state.first_sku()
    sandbox.state.set_sku_price(sku.id, "12.34")
    detail = (await client.get(f"/products/{sku.product_id}")).json()["product"]
    assert {s["id"]: s["price_amount"] for s in detail["skus"]}[sku.id] == "12.34"


async def test_added_category_and_product_show_up(sandbox: Sandbox, client: SignedClient) -> None:
    """Categories and products added by a test (even a third level) are served as they are."""
    leaf = sandbox.state.leaf_categories()[0]
    third = sandbox.state.add_category(leaf.id, "third-level")
    product_id = sandbox.state.add_product(third, title="Odd one", price="5.00", skus=2)
    categories = (await client.get("/categories")).json()["categories"]
    assert {"id": third, "parent_id": leaf.id}.items() <= next(
        c for c in categories if c["id"] == third
    ).items()
    detail = (await client.get(f"/products/{product_id}")).json()["product"]
    assert detail["category_id"] == third
    assert [s["price_amount"] for s in detail["skus"]] == ["5.00", "10.00"]


async def test_listing_carries_extra_fields(client: SignedClient) -> None:
    """Products carry fields beyond the seed (sales_count), so clients prove they tolerate additions."""
    product = (await client.get("/products")).json()["items"][0]
    assert "sales_count" in product


async def test_updated_after_lists_only_products_changed_since(
    sandbox: Sandbox, client: SignedClient
) -> None:
    """updated_after (RFC 3339, offset required) lists the active products updated at or after it; a
    change or a restore bumps a product's updated_at."""
    since = datetime.fromtimestamp(sandbox.state.now() - 1, UTC).isoformat(timespec="seconds")
    sandbox.state.set_sku_price(sandbox.state.product(3).skus[0].id, "77.00")
    sandbox.state.remove_product(5)
    sandbox.state.restore_product(5)
    data = (await client.get("/products", {"updated_after": since})).json()
    assert [item["id"] for item in data["items"]] == [3, 5]
    assert data["total"] == 2
    assert (await client.get("/products", {"updated_after": "2020-01-01"})).status == 400
    assert (await client.get("/products", {"updated_after": "soon"})).status == 400


async def test_updated_after_can_be_ignored_like_some_sites_do(
    sandbox: Sandbox, client: SignedClient
) -> None:
    """With honour_updated_after off the parameter changes nothing: the whole listing comes back."""
    sandbox.config.honour_updated_after = False
    data = (await client.get("/products", {"updated_after": "2099-01-01T00:00:00Z"})).json()
    assert data["total"] == len(sandbox.state.active_products())
