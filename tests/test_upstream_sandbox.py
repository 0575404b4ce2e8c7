"""The upstream client against the sandbox upstream on 127.0.0.1: every endpoint and every failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any

import pytest
from pydantic import SecretStr

from procurd.config import UpstreamSettings
from procurd.protocol.dujiao.client import UpstreamClient
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.upstream import (
    AuthError,
    BusinessError,
    ClockSkew,
    PaymentFailed,
    PriorityRateLimiter,
    ProtocolError,
    RateLimited,
    ServerError,
    TransportError,
    UpstreamTimeout,
)
from procurd.upstream.models import CatalogPage, CreateOrderRequest, SeenPage, UpstreamOrder

DEADLINE_SECONDS = 5.0


@asynccontextmanager
async def started(config: SandboxConfig) -> AsyncIterator[tuple[Sandbox, str]]:
    async with Sandbox(config) as sandbox:
        yield sandbox, sandbox.base_url


@pytest.fixture
async def site() -> AsyncIterator[tuple[Sandbox, str]]:
    """A running sandbox with a small catalogue, and its base URL."""
    async with started(SandboxConfig(products=20, allow_private_callbacks=True)) as pair:
        yield pair


def settings_for(base_url: str, **overrides: Any) -> UpstreamSettings:
    values: dict[str, Any] = {
        "name": "main",
        "base_url": base_url,
        "api_key": "sandbox-key",
        "api_secret": SecretStr("sandbox-secret"),
        "header_prefix": "Service",
        "timeout_seconds": 5,
        "max_requests_per_second": 1000,
    }
    values.update(overrides)
    return UpstreamSettings(**values)


@pytest.fixture
async def client(site: tuple[Sandbox, str]) -> AsyncIterator[UpstreamClient]:
    """A correctly configured client of the sandbox."""
    async with UpstreamClient(settings_for(site[1])) as client:
        yield client


async def eventually(
    probe: Callable[[], Awaitable[UpstreamOrder]], done: Callable[[UpstreamOrder], bool]
) -> UpstreamOrder:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        order = await probe()
        if done(order):
            return order
        assert time.monotonic() < deadline, f"order still {order.status}"
        await asyncio.sleep(0.01)


async def test_ping_reports_site_balance_and_level(client: UpstreamClient) -> None:
    """Ping answers the site name, protocol 1.0, the exact balance, the currency and a member level."""
    result = await client.ping()
    assert result.site_name == "procurd sandbox"
    assert result.protocol_version == "1.0"
    assert result.balance == Decimal("1000.00")
    assert str(result.balance) == "1000.00"
    assert result.currency == "CNY"
    assert result.member_level is not None
    assert result.latency_ms >= 0


async def test_catalogue_endpoints(client: UpstreamClient) -> None:
    """Categories, a product page and a product detail parse, and the detail matches the listing."""
    categories = await client.categories()
    page = await client.products(page=1, page_size=5)
    detail = await client.product(page.items[0].id)
    assert categories
    assert {item.category_id for item in page.items} <= {category.id for category in categories}
    assert (page.page, page.page_size, page.total) == (1, 5, 20)
    assert len(page.items) == 5
    assert detail.to_json() == page.items[0].to_json()
    assert all(Decimal(sku.price_amount or "0") >= 0 for sku in detail.skus)


async def test_a_catalogue_page_seen_before_is_not_decoded(
    site: tuple[Sandbox, str], client: UpstreamClient
) -> None:
    """With ``seen`` digests a page carries its body's SHA-256; the same body again is answered as seen
    (not decoded), a changed one is decoded, and a failure is raised whatever was seen."""
    sandbox, _ = site
    first = await client.catalog_page(1, 5, seen=())
    assert isinstance(first, CatalogPage)
    assert len(first.body_digest) == 32
    assert len(first.items) == 5
    again = await client.catalog_page(1, 5, seen={first.body_digest})
    assert again == SeenPage(first.body_digest)
    unseen = await client.catalog_page(1, 5, seen={b"another digest"})
    assert isinstance(unseen, CatalogPage)
    assert (unseen.items, unseen.body_digest) == (first.items, first.body_digest)
    sandbox.state.set_sku_price(first.items[0]["skus"][0]["id"], "77.00")
    changed = await client.catalog_page(1, 5, seen={first.body_digest})
    assert isinstance(changed, CatalogPage)
    assert changed.body_digest != first.body_digest
    sandbox.faults.fail_next("products", status=500)
    with pytest.raises(ServerError):
        await client.catalog_page(1, 5, seen={changed.body_digest})
    plain = await client.catalog_page(1, 5)
    assert (plain.items, plain.body_digest) == (changed.items, b"")


async def test_page_size_clamp_is_followed(client: UpstreamClient) -> None:
    """Asking for 100 per page gets the site's 50; following the answered size walks every product once."""
    first = await client.products(page=1, page_size=100)
    assert first.page_size == 50
    seen = [product.id for product in first.items]
    page_number = 1
    while len(seen) < first.total:
        page_number += 1
        page = await client.products(page=page_number, page_size=first.page_size)
        assert page.items
        seen.extend(product.id for product in page.items)
    assert len(seen) == len(set(seen)) == first.total


async def test_order_is_created_paid_and_delivered(site: tuple[Sandbox, str], client: UpstreamClient) -> None:
    """An order is created and paid, the query shows it delivered, and a paid order cannot be canceled."""
    sandbox, _ = site
    sku = sandbox.state.first_sku("auto")
    created = await client.create_order(
        CreateOrderRequest(sku_id=sku.id, quantity=2, downstream_order_no="T-1", trace_id="trace-1")
    )
    assert created.status == "paid"
    assert Decimal(created.amount or "0") == Decimal(sku.price_amount) * 2
    assert created.currency == "CNY"
    order = await eventually(lambda: client.get_order(created.order_id), lambda o: o.fulfillment is not None)
    assert order.order_no == created.order_no
    assert order.items[0].sku_id == sku.id
    assert order.fulfillment is not None
    assert order.fulfillment.payload
    assert order.fulfillment.payload not in repr(order)
    with pytest.raises(BusinessError) as caught:
        await client.cancel_order(created.order_id)
    assert (caught.value.code, caught.value.http_status) == ("cancel_not_allowed", 409)


async def test_pending_order_can_be_canceled(site: tuple[Sandbox, str], client: UpstreamClient) -> None:
    """An order still pending payment is canceled by the upstream."""
    sandbox, _ = site
    sandbox.faults.pending_payment_next()
    created = await client.create_order(
        CreateOrderRequest(sku_id=sandbox.state.first_sku("auto").id, quantity=1)
    )
    assert created.status == "pending_payment"
    result = await client.cancel_order(created.order_id)
    assert (result.order_id, result.status) == (created.order_id, "canceled")


async def test_repeat_with_same_number_returns_the_same_order(
    site: tuple[Sandbox, str], client: UpstreamClient
) -> None:
    """A repeated downstream_order_no returns the existing order and creates no second one."""
    sandbox, _ = site
    request = CreateOrderRequest(
        sku_id=sandbox.state.first_sku("auto").id, quantity=1, downstream_order_no="T-2"
    )
    first = await client.create_order(request)
    again = await client.create_order(request)
    assert (again.order_id, again.order_no) == (first.order_id, first.order_no)
    assert len(sandbox.orders_for("T-2")) == 1


async def test_dropped_answer_then_repeat_finds_the_order(
    site: tuple[Sandbox, str], client: UpstreamClient
) -> None:
    """When the answer to a created order is lost, the retry with the same number finds that order."""
    sandbox, _ = site
    sandbox.faults.drop_next("orders.create")
    request = CreateOrderRequest(
        sku_id=sandbox.state.first_sku("auto").id, quantity=1, downstream_order_no="T-3"
    )
    with pytest.raises(TransportError) as caught:
        await client.create_order(request)
    assert caught.value.retryable
    again = await client.create_order(request)
    assert [order.order_id for order in sandbox.orders_for("T-3")] == [again.order_id]


async def test_payment_failed_is_raised_and_the_number_stays_canceled(
    site: tuple[Sandbox, str], client: UpstreamClient
) -> None:
    """With an empty wallet the order is auto-canceled: PaymentFailed, and a repeat answers it canceled."""
    sandbox, _ = site
    sandbox.state.set_balance(Decimal("0"))
    request = CreateOrderRequest(
        sku_id=sandbox.state.first_sku("auto").id, quantity=1, downstream_order_no="T-4"
    )
    with pytest.raises(PaymentFailed) as caught:
        await client.create_order(request)
    assert caught.value.http_status == 200
    assert caught.value.status == "canceled"
    assert caught.value.order_id is not None
    order = await client.get_order(caught.value.order_id)
    assert order.status == "canceled"
    repeat = await client.create_order(request)
    assert (repeat.order_id, repeat.status) == (caught.value.order_id, "canceled")


async def test_insufficient_balance_variant() -> None:
    """A site that refuses instead of auto-canceling answers 402 insufficient_balance."""
    async with started(SandboxConfig(products=5, balance_failure="insufficient_balance")) as (
        sandbox,
        base_url,
    ):
        sandbox.state.set_balance(Decimal("0"))
        async with UpstreamClient(settings_for(base_url)) as client:
            with pytest.raises(BusinessError) as caught:
                await client.create_order(
                    CreateOrderRequest(sku_id=sandbox.state.first_sku("auto").id, quantity=1)
                )
        assert (caught.value.code, caught.value.http_status) == ("insufficient_balance", 402)


async def test_business_errors(site: tuple[Sandbox, str], client: UpstreamClient) -> None:
    """Each refusal of seed part 7 arrives as a BusinessError with its code and HTTP status."""
    sandbox, _ = site
    auto = sandbox.state.first_sku("auto")
    manual = sandbox.state.first_sku("manual")

    async def refusal(call: Awaitable[object]) -> tuple[str, int | None]:
        with pytest.raises(BusinessError) as caught:
            await call
        assert not caught.value.retryable
        assert type(caught.value) is BusinessError
        return caught.value.code, caught.value.http_status

    assert await refusal(client.product(999_999)) == ("product_not_found", 404)
    assert await refusal(client.get_order(999_999)) == ("order_not_found", 404)
    assert await refusal(client.cancel_order(999_999)) == ("order_not_found", 404)
    assert await refusal(client.create_order(CreateOrderRequest(sku_id=999_999, quantity=1))) == (
        "sku_unavailable",
        400,
    )
    assert await refusal(client.create_order(CreateOrderRequest(sku_id=manual.id, quantity=1))) == (
        "bad_request",
        400,
    )
    sandbox.config.allow_private_callbacks = False
    private = CreateOrderRequest(sku_id=auto.id, quantity=1, callback_url="http://127.0.0.1:9/cb")
    assert await refusal(client.create_order(private)) == ("invalid_callback_url", 400)
    sandbox.state.set_sku_stock(auto.id, 1)
    assert await refusal(client.create_order(CreateOrderRequest(sku_id=auto.id, quantity=2))) == (
        "insufficient_stock",
        409,
    )
    sandbox.state.set_sku_active(auto.id, False)
    assert await refusal(client.create_order(CreateOrderRequest(sku_id=auto.id, quantity=1))) == (
        "sku_unavailable",
        400,
    )
    other = sandbox.state.first_sku("auto")
    sandbox.state.set_product_active(other.product_id, False)
    assert await refusal(client.product(other.product_id)) == ("product_unavailable", 404)
    assert await refusal(client.create_order(CreateOrderRequest(sku_id=other.id, quantity=1))) == (
        "product_unavailable",
        400,
    )


@pytest.mark.parametrize(
    "config",
    [SandboxConfig(products=5, inactive_product_detail="200"), SandboxConfig(products=5, dialect="2026")],
    ids=["knob", "2026"],
)
async def test_inactive_product_detail_returned_as_is(config: SandboxConfig) -> None:
    """A site that answers inactive products with 200 (Dujiao-Next since May 2026) gives a product with
    is_active false: it reads as inactive."""
    async with started(config) as (sandbox, base_url):
        product_id = sandbox.state.first_sku("auto").product_id
        sandbox.state.set_product_active(product_id, False)
        async with UpstreamClient(settings_for(base_url)) as client:
            product = await client.product(product_id)
        assert product.is_active is False


@pytest.mark.parametrize(
    ("overrides", "code", "status", "hint"),
    [
        ({"api_secret": SecretStr("wrong-secret")}, "invalid_signature", 401, "api_secret"),
        ({"api_key": "no-such-key"}, "invalid_api_key", 403, "api_key"),
        ({"header_prefix": "Dujiao-Next"}, "missing_auth_headers", 401, "header_prefix"),
    ],
)
async def test_configuration_mistakes_raise_auth_errors(
    site: tuple[Sandbox, str], overrides: dict[str, Any], code: str, status: int, hint: str
) -> None:
    """A wrong secret, key or header prefix raises a non-retryable AuthError whose hint names the setting."""
    async with UpstreamClient(settings_for(site[1], **overrides)) as client:
        with pytest.raises(AuthError) as caught:
            await client.ping()
    assert (caught.value.code, caught.value.http_status) == (code, status)
    assert not caught.value.retryable
    assert hint in caught.value.hint
    assert "wrong-secret" not in str(caught.value)


async def test_disabled_key_and_user(site: tuple[Sandbox, str], client: UpstreamClient) -> None:
    """A disabled key is invalid_api_key; a banned account is user_disabled, both 403."""
    sandbox, _ = site
    sandbox.state.disable_user("sandbox-key")
    with pytest.raises(AuthError) as caught:
        await client.ping()
    assert (caught.value.code, caught.value.http_status) == ("user_disabled", 403)
    assert "account" in caught.value.hint
    sandbox.state.enable_user("sandbox-key")
    sandbox.state.disable_api_key("sandbox-key")
    with pytest.raises(AuthError) as caught:
        await client.ping()
    assert (caught.value.code, caught.value.http_status) == ("invalid_api_key", 403)


async def test_upstream_clock_ahead_is_clock_skew() -> None:
    """An upstream whose clock runs 90 s ahead answers timestamp_expired: ClockSkew, hint about the clock."""
    async with started(SandboxConfig(products=5, clock_offset_seconds=90)) as (_, base_url):
        async with UpstreamClient(settings_for(base_url)) as client:
            with pytest.raises(ClockSkew) as caught:
                await client.ping()
        assert (caught.value.code, caught.value.http_status) == ("timestamp_expired", 401)
        assert "clock" in caught.value.hint


async def test_our_clock_behind_is_clock_skew_with_measured_offset(site: tuple[Sandbox, str]) -> None:
    """A local clock 90 s behind is reported with the offset measured from the upstream's Date header."""
    async with UpstreamClient(settings_for(site[1]), clock=lambda: time.time() - 90) as client:
        with pytest.raises(ClockSkew) as caught:
            await client.ping()
    offset = caught.value.clock_offset_seconds
    assert offset is not None
    assert -95 < offset < -85
    assert "behind" in caught.value.hint


async def test_rate_limit_envelope_raises_and_pauses_the_limiter() -> None:
    """Past the site's limit the 200 + 429 envelope raises RateLimited and pauses the shared limiter."""
    config = SandboxConfig(
        products=5,
        rate_limit=True,
        rate_limit_requests=3,
        rate_limit_window_seconds=60,
        rate_limit_block_seconds=30,
    )
    async with started(config) as (_, base_url):
        limiter = PriorityRateLimiter(1000)
        async with UpstreamClient(settings_for(base_url), limiter=limiter) as client:
            for _ in range(3):
                await client.ping()
            with pytest.raises(RateLimited) as caught:
                await client.ping()
        assert caught.value.http_status == 200
        assert caught.value.retry_after > 0
        assert limiter.paused_for > 0


async def test_injected_server_error_and_malformed_answer(
    site: tuple[Sandbox, str], client: UpstreamClient
) -> None:
    """A 500 raises a retryable ServerError; an HTML page with 200 raises a retryable ProtocolError."""
    sandbox, _ = site
    sandbox.faults.fail_next("orders.create", count=1, status=500)
    sandbox.faults.malformed_next("products", body=b"<html>", status=200, content_type="text/html")
    request = CreateOrderRequest(
        sku_id=sandbox.state.first_sku("auto").id, quantity=1, downstream_order_no="T-5"
    )
    with pytest.raises(ServerError):
        await client.create_order(request)
    with pytest.raises(ProtocolError):
        await client.products()
    created = await client.create_order(request)
    assert created.status == "paid"
    assert sandbox.request_counts["orders.create"] == 2


async def test_hanging_upstream_times_out(site: tuple[Sandbox, str]) -> None:
    """An upstream that never answers raises UpstreamTimeout after timeout_seconds."""
    sandbox, base_url = site
    sandbox.faults.hang_next("ping")
    async with UpstreamClient(settings_for(base_url, timeout_seconds=0.3)) as client:
        with pytest.raises(UpstreamTimeout):
            await client.ping()
