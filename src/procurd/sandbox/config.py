"""Settings of one sandbox site."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

Dialect = Literal["seed", "2026"]
DIALECTS: tuple[Dialect, ...] = ("seed", "2026")
DEFAULT_API_KEY = "sandbox-key"
DEFAULT_API_SECRET = "sandbox-secret"  # noqa: S105 - the documented, public sandbox secret


@dataclass
class SandboxConfig:
    """How the sandbox upstream behaves. Fields may be changed while it runs; changes apply at once.

    ``dialect`` is what the site speaks: ``seed`` (seed 000 as written, the default) or ``2026`` (Dujiao-Next
    since mid-2026): over its limit HTTP 429 with the same envelope instead of HTTP 200; ``GET
    /products?include_inactive=true`` lists inactive products too and every listing answers
    ``includes_inactive``; ``page_size`` 50 by default, anything outside 1 to ``page_size_max`` read as
    ``page_size_max``; an inactive product's detail answered 200 with ``is_active: false`` (a removed one
    404 ``product_not_found``); a product's purchase limits refused HTTP 500 ``internal_error``; an order
    charged the cheaper of the price and the SKU's wholesale tier for its quantity, its items carrying
    ``original_unit_price`` and ``original_total_price``.
    """

    api_key: str = DEFAULT_API_KEY
    api_secret: str = field(default=DEFAULT_API_SECRET, repr=False)
    header_prefix: str = "Service"
    site_name: str = "procurd sandbox"
    currency: str = "CNY"
    balance: Decimal = Decimal("1000.00")
    products: int = 40
    skus_per_product: int = 3
    seed: int = 1
    manual_ratio: float = 0.25
    page_size_max: int = 50
    allow_private_callbacks: bool = False
    auto_deliver: bool = True
    rate_limit: bool = False
    rate_limit_requests: int = 60
    rate_limit_window_seconds: float = 60
    rate_limit_block_seconds: float = 30
    callback_retry_delays: tuple[float, ...] = (30, 60, 120, 300)
    callback_timeout_seconds: float = 15
    inactive_product_detail: Literal["404", "200"] | None = None  # None: the dialect's (seed 404, 2026 200)
    balance_failure: Literal["payment_failed", "insufficient_balance"] = "payment_failed"
    clock_offset_seconds: float = 0
    member_level: bool = True  # the API user has a member level (ping answers it; else null)
    max_body_bytes: int = 10 * 1024 * 1024
    inactive_products: int = 0  # inactive products generated on top of ``products``
    honour_updated_after: bool = True  # False: GET /products ignores updated_after, like an older site
    dialect: Dialect = "seed"

    @property
    def speaks_2026(self) -> bool:
        return self.dialect == "2026"

    @property
    def inactive_detail(self) -> Literal["404", "200"]:
        """What ``GET /products/:id`` answers for an inactive product: 404 ``product_unavailable`` or 200."""
        if self.inactive_product_detail is not None:
            return self.inactive_product_detail
        return "200" if self.speaks_2026 else "404"

    @property
    def rate_limit_status(self) -> int:
        """The HTTP status of the answer over the limit (its body is the storefront envelope either way)."""
        return 429 if self.speaks_2026 else 200
