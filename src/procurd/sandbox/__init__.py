"""A faithful upstream site (seed 000) on loopback, for trying procurd and for tests.

``async with Sandbox(SandboxConfig(products=100)) as sandbox:`` serves the signed API at
``sandbox.api_url``; ``sandbox.state`` and ``sandbox.faults`` change what it answers.
"""

from procurd.sandbox.callbacks import CallbackAttempt
from procurd.sandbox.catalog import SKU, Category, Product
from procurd.sandbox.config import SandboxConfig
from procurd.sandbox.faults import FaultPlan
from procurd.sandbox.server import Sandbox
from procurd.sandbox.site import SandboxSite
from procurd.sandbox.state import ApiUser, Fulfillment, SandboxOrder, SandboxState, SandboxStateError

__all__ = [
    "SKU",
    "ApiUser",
    "CallbackAttempt",
    "Category",
    "FaultPlan",
    "Fulfillment",
    "Product",
    "Sandbox",
    "SandboxConfig",
    "SandboxOrder",
    "SandboxSite",
    "SandboxState",
    "SandboxStateError",
]
