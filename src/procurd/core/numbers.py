"""Downstream order numbers: derived deterministically from the local order number (pure)."""

from __future__ import annotations

import re

MAX_ID = 2**63 - 1  # the largest id the database (BIGINT) and the upstreams hold
ORDER_NO_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


def item_number(order_no: str, position: int) -> str:
    """The downstream order number of the item at ``position`` (0-based) of ``order_no``.

    The first item uses the order number itself (a one-item order is known upstream by the storefront's own
    number); item ``n`` (0-based) uses ``ORDER-{n+1}``.
    """
    return order_no if position == 0 else f"{order_no}-{position + 1}"


def retry_number(first_number: str, numbers_used: int) -> str:
    """The number for the next try once the upstream canceled the order under the current one.

    ``numbers_used`` counts the numbers the procurement already had: the second number is ``X-r2``, the
    third ``X-r3``, and so on, all derived from the first.
    """
    return f"{first_number}-r{numbers_used + 1}"
