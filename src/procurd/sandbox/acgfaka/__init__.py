"""A faithful acg-faka shop (its shared-shop "对接" API) on loopback, for trying procurd and for tests.

``async with AcgFakaSandbox(ShopConfig(commodities=40, version="3.6.0")) as sandbox:`` serves
``/shared/...`` at ``sandbox.base_url`` with a generated catalogue; ``sandbox.shop`` holds the goods,
members and orders, ``sandbox.faults`` the knobs, and ``/_sandbox/`` is the control API.
"""

from procurd.sandbox.acgfaka.faults import ShopFaults
from procurd.sandbox.acgfaka.server import AcgFakaSandbox
from procurd.sandbox.acgfaka.shop import (
    DEFAULT_APP_ID,
    DEFAULT_APP_KEY,
    DEFAULT_VERSION,
    Card,
    Category,
    Commodity,
    Member,
    Order,
    Shop,
    ShopConfig,
)

__all__ = [
    "DEFAULT_APP_ID",
    "DEFAULT_APP_KEY",
    "DEFAULT_VERSION",
    "AcgFakaSandbox",
    "Card",
    "Category",
    "Commodity",
    "Member",
    "Order",
    "Shop",
    "ShopConfig",
    "ShopFaults",
]
