"""Catalogue changes through the control API (SKUs, products, new and deleted products) and the knobs that
make GET /products answer an empty or shortened listing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.catalog import precise_iso_time
from procurd.sandbox.testing import ControlClient, ManualClock, SignedClient


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def sandbox(clock: ManualClock) -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig(), clock=clock) as sandbox:
        yield sandbox


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[SignedClient]:
    async with SignedClient(sandbox.base_url) as client:
        yield client


@pytest.fixture
async def control(sandbox: Sandbox) -> AsyncIterator[ControlClient]:
    async with ControlClient(sandbox.base_url) as control:
        yield control


async def detail(client: SignedClient, product_id: int) -> dict[str, Any]:
    product: dict[str, Any] = (await client.get(f"/products/{product_id}")).json()["product"]
    return product


async def test_sku_changes_show_and_stamp_the_product(
    sandbox: Sandbox, clock: ManualClock, client: SignedClient, control: ControlClient
) -> None:
    """POST /_sandbox/skus/{id} sets price (as two-place money), stock and active flag at once; the answer
    carries the SKU and its product's new updated_at."""
    sku = sandbox.state.first_sku()
    clock.advance(5)
    answer = await control.post(
        f"/skus/{sku.id}", {"price_amount": "1.5", "stock_quantity": 7, "is_active": False}
    )
    assert answer["product_updated_at"] == precise_iso_time(clock.now)
    assert (answer["sku"]["price_amount"], answer["sku"]["stock_status"]) == ("1.50", "low_stock")
    shown = {s["id"]: s for s in (await detail(client, sku.product_id))["skus"]}[sku.id]
    assert (shown["price_amount"], shown["stock_quantity"], shown["is_active"]) == ("1.50", 7, False)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"price_amount": 1.5}, "price_amount"),
        ({"price_amount": "cheap"}, "price_amount"),
        ({"price_amount": "-1.00"}, "price_amount"),
        ({"price_amount": "NaN"}, "price_amount"),
        ({"stock_quantity": -2}, "stock_quantity"),
        ({"stock_quantity": "3"}, "stock_quantity"),
        ({"is_active": "yes"}, "is_active"),
        ({"colour": "red"}, "colour"),
    ],
)
async def test_bad_sku_changes_are_400_and_change_nothing(
    sandbox: Sandbox, control: ControlClient, body: dict[str, Any], field: str
) -> None:
    """A bad or unknown SKU field answers 400 naming it, and no field of the request is applied."""
    sku = sandbox.state.first_sku()
    before = sku.to_dict()
    data = await control.post(f"/skus/{sku.id}", {"stock_quantity": 99, **body}, expect=400)
    assert (data["error_code"], data["field"]) == ("bad_request", field)
    assert field in data["error_message"]
    assert sku.to_dict() == before


async def test_unknown_sku_or_product_is_404(control: ControlClient) -> None:
    """Changing a SKU or product that does not exist answers 404 not_found."""
    assert (await control.post("/skus/999999", {"is_active": True}, expect=404))["error_code"] == "not_found"
    assert (await control.post("/products/999999", {}, expect=404))["error_code"] == "not_found"
    assert (await control.call("DELETE", "/products/999999", expect=404))["error_code"] == "not_found"


async def test_product_title_category_and_active_flag(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """POST /_sandbox/products/{id} sets the title (one text, or one per locale), the category and the
    active flag; the signed API shows each at once."""
    await control.post("/products/3", {"title": "Plain name", "category_id": 2})
    shown = await detail(client, 3)
    assert shown["title"] == {"zh-CN": "Plain name", "en-US": "Plain name"}
    assert shown["category_id"] == 2
    answer = await control.post("/products/3", {"title": {"zh-CN": "新名字", "en-US": "New name"}})
    assert answer["product"]["title"] == {"zh-CN": "新名字", "en-US": "New name"}
    await control.post("/products/3", {"is_active": False})
    assert (await client.get("/products/3")).error_code == "product_unavailable"
    assert 3 not in [p["id"] for p in await client.list_all_products()]
    bad = await control.post("/products/3", {"title": ""}, expect=400)
    assert bad["field"] == "title"


async def test_added_product_is_listed_orderable_and_recent(
    sandbox: Sandbox, clock: ManualClock, client: SignedClient, control: ControlClient
) -> None:
    """POST /_sandbox/products adds a product with the SKUs given; it is listed, stamped with the site's
    clock (so an incremental listing finds it) and its active SKUs can be ordered."""
    clock.advance(2)
    answer = await control.post(
        "/products",
        {
            "title": "Fresh card",
            "category_id": 3,
            "skus": [
                {"price_amount": "5.00"},
                {"price_amount": "12.5", "stock_quantity": 4},
                {"price_amount": "99.00", "is_active": False},
            ],
        },
    )
    product = answer["product"]
    assert product["id"] == 41
    assert product["updated_at"] == precise_iso_time(clock.now)
    assert [(s["price_amount"], s["stock_quantity"], s["is_active"]) for s in product["skus"]] == [
        ("5.00", -1, True),
        ("12.50", 4, True),
        ("99.00", -1, False),
    ]
    recent = await client.list_all_products(updated_after=product["updated_at"])
    assert [(p["id"], len(p["skus"])) for p in recent] == [(41, 2)]
    order = (await client.create_order(product["skus"][1]["id"], 2)).json()
    assert (order["ok"], order["amount"]) == (True, "25.00")


async def test_added_product_defaults(control: ControlClient) -> None:
    """Without fields a product gets a generated title, a leaf category and one 9.90 SKU of unlimited stock;
    a manual one gets a form schema."""
    product = (await control.post("/products", {"fulfillment_type": "manual"}))["product"]
    assert product["title"]["en-US"] == f"Sandbox product {product['id']}"
    assert product["manual_form_schema"]["fields"][0]["key"] == "account"
    assert [(s["price_amount"], s["stock_quantity"]) for s in product["skus"]] == [("9.90", -1)]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"skus": []}, "skus"),
        ({"skus": "two"}, "skus"),
        ({"skus": [{"price_amount": "1.00"}, {"stock_quantity": 1}]}, "skus[1].price_amount"),
        ({"skus": [{"price_amount": "1.00", "stock_quantity": -5}]}, "skus[0].stock_quantity"),
        ({"skus": [{"price_amount": 1}]}, "skus[0].price_amount"),
        ({"skus": ["1.00"]}, "skus[0]"),
        ({"fulfillment_type": "robot"}, "fulfillment_type"),
        ({"title": 5}, "title"),
        ({"sku_count": 3}, "sku_count"),
    ],
)
async def test_bad_new_product_is_400(
    sandbox: Sandbox, control: ControlClient, body: dict[str, Any], field: str
) -> None:
    """A new product with a bad field answers 400 naming it (a SKU's field with its position) and adds
    nothing."""
    data = await control.post("/products", body, expect=400)
    assert (data["error_code"], data["field"]) == ("bad_request", field)
    assert len(sandbox.state.products) == 40


async def test_deleted_product_is_gone_until_restored(
    sandbox: Sandbox, clock: ManualClock, client: SignedClient, control: ControlClient
) -> None:
    """DELETE /_sandbox/products/{id} removes the product from the site (unlisted, product_not_found, its
    SKUs unavailable); POST with removed false brings it back, stamped with the site's clock."""
    sku = sandbox.state.first_sku()
    answer = await control.call("DELETE", f"/products/{sku.product_id}")
    assert answer["removed"] is True
    assert (await client.get(f"/products/{sku.product_id}")).error_code == "product_not_found"
    assert (await client.create_order(sku.id, 1)).error_code == "sku_unavailable"
    assert (await client.get("/products")).json()["total"] == 39
    clock.advance(3)
    restored = await control.post(f"/products/{sku.product_id}", {"removed": False})
    assert (restored["removed"], restored["product"]["updated_at"]) == (False, precise_iso_time(clock.now))
    assert (await client.get("/products")).json()["total"] == 40


async def test_empty_listing_for_the_next_requests(
    sandbox: Sandbox, client: SignedClient, control: ControlClient
) -> None:
    """The empty_listing_next knob answers GET /products with no items and total 0 for the next `count`
    requests (incremental ones included), then the whole listing again; product details are unaffected."""
    await control.post("/faults", {"knob": "empty_listing_next", "count": 2})
    assert (await client.get("/products/1")).status == 200
    first = (await client.get("/products", {"page_size": 50})).json()
    second = (await client.get("/products", {"updated_after": "2000-01-01T00:00:00Z"})).json()
    assert [(page["ok"], page["items"], page["total"]) for page in (first, second)] == [(True, [], 0)] * 2
    assert (await client.get("/products")).json()["total"] == 40


@pytest.mark.parametrize(
    ("knob", "listed"),
    [({"fraction": 0.1}, 4), ({"fraction": 0.25}, 10), ({"products": 7}, 7), ({"products": 100}, 40)],
)
async def test_list_only_part_of_the_catalogue(
    client: SignedClient, control: ControlClient, knob: dict[str, Any], listed: int
) -> None:
    """The list_only knob makes GET /products list only the first products (by id), a number or a share
    rounded down, with total counting only those, until the faults are cleared."""
    state = await control.post("/faults", {"knob": "list_only", **knob})
    assert state["faults"]["list_only"] == knob
    assert [p["id"] for p in await client.list_all_products(7)] == list(range(1, listed + 1))
    assert (await client.get("/products")).json()["total"] == listed
    assert (await client.get("/products/40")).status == 200
    await control.post("/faults/clear")
    assert (await client.get("/products")).json()["total"] == 40


@pytest.mark.parametrize(
    "knob",
    [{}, {"products": 3, "fraction": 0.5}, {"fraction": 1.5}, {"products": -1}, {"fraction": "half"}],
)
async def test_bad_list_only_is_400(control: ControlClient, knob: dict[str, Any]) -> None:
    """list_only needs exactly one of products (at least 0) or fraction (0 to 1)."""
    data = await control.post("/faults", {"knob": "list_only", **knob}, expect=400)
    assert data["error_code"] == "bad_request"
