"""Settings of one sandbox site."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

DEFAULT_API_KEY = "sandbox-key"
DEFAULT_API_SECRET = "sandbox-secret"  # noqa: S105 - the documented, public sandbox secret


@dataclass
class SandboxConfig:
    """How the sandbox upstream behaves. Fields may be changed while it runs; changes apply at once."""

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
    inactive_product_detail: Literal["404", "200"] = "404"
    balance_failure: Literal["payment_failed", "insufficient_balance"] = "payment_failed"
    clock_offset_seconds: float = 0
    member_level: bool = True  # the API user has a member level (ping answers it; else null)
    max_body_bytes: int = 10 * 1024 * 1024
    inactive_products: int = 0  # inactive products generated on top of ``products``
    honour_updated_after: bool = True  # GET /products?updated_after= lists only products updated since
