"""Fault knobs of the sandbox acg-faka shop: each applies to the next ``count`` matching requests.

Before the work: ``crash_next`` (the shop's HTML page, nothing done), ``refuse_next`` (a refusal with the
given text, nothing done), ``redirect_next`` (HTTP 302 to the given location, as a web server in front of
the shop may answer). During a trade: ``price_changed_next`` (the check inside the transaction finds the
goods changed: 商品信息已经更新...), ``sold_out_race_next`` (another buyer takes the cards while this order is
paid: the order is paid and answers the sold-out notice). After a trade committed: ``lost_answer_next`` (the
connection is closed without an answer), ``hang_after_next`` (no answer until the client gives up),
``error_after_commit_next`` (a refusal text, or the HTML page with ``html``, although the order is paid).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ENDPOINTS = (
    "connect",
    "items",
    "item",
    "inventory",
    "inventoryState",
    "stock",
    "valuation",
    "trade",
    "query",
    "draftCard",
    "draft",
)
ANY_ENDPOINT = "*"
BEFORE_KINDS = ("crash", "refuse", "redirect")
AFTER_KINDS = ("lost_answer", "hang_after", "error_after_commit")
TRADE_KINDS = ("price_changed", "sold_out_race")
CONNECTION_FAILED = "连接失败, 疑似被对方防火墙拦截"


@dataclass
class Fault:
    kind: str
    endpoint: str
    remaining: int
    message: str = ""
    html: bool = False

    def describe(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "knob": f"{self.kind}_next",
            "endpoint": self.endpoint,
            "remaining": self.remaining,
        }
        if self.message:
            data["msg"] = self.message
        if self.html:
            data["html"] = True
        return data


@dataclass
class ShopFaults:
    faults: list[Fault] = field(default_factory=list)

    def _add(self, fault: Fault) -> None:
        if fault.endpoint != ANY_ENDPOINT and fault.endpoint not in ENDPOINTS:
            known = ", ".join((*ENDPOINTS, ANY_ENDPOINT))
            raise ValueError(f"unknown endpoint {fault.endpoint!r}; use one of {known}")
        if fault.remaining < 1:
            raise ValueError("count must be at least 1")
        self.faults.append(fault)

    def crash_next(self, endpoint: str = "trade", count: int = 1) -> None:
        """Answer the shop's HTML page without doing anything (a PHP error, rolled back)."""
        self._add(Fault("crash", endpoint, count))

    def refuse_next(self, msg: str, endpoint: str = "trade", count: int = 1) -> None:
        """Answer ``{"code": 0, "msg": msg}`` without doing anything."""
        self._add(Fault("refuse", endpoint, count, message=msg))

    def redirect_next(self, location: str, endpoint: str = ANY_ENDPOINT, count: int = 1) -> None:
        """Answer HTTP 302 to ``location`` without doing anything (a web server in front of the shop)."""
        self._add(Fault("redirect", endpoint, count, message=location))

    def price_changed_next(self, count: int = 1) -> None:
        """The next trades find the goods changed inside their transaction (3.5.5 on)."""
        self._add(Fault("price_changed", "trade", count))

    def sold_out_race_next(self, count: int = 1) -> None:
        """The next trades lose their cards to another buyer while they are paid."""
        self._add(Fault("sold_out_race", "trade", count))

    def lost_answer_next(self, count: int = 1) -> None:
        """The next trades commit, then the connection is closed without an answer."""
        self._add(Fault("lost_answer", "trade", count))

    def hang_after_next(self, count: int = 1) -> None:
        """The next trades commit, then no answer comes until the client gives up."""
        self._add(Fault("hang_after", "trade", count))

    def error_after_commit_next(
        self, msg: str = CONNECTION_FAILED, html: bool = False, count: int = 1
    ) -> None:
        """The next trades commit, then answer the refusal ``msg`` (or the HTML page with ``html``), as when
        the shop's stock lookup after the sale fails."""
        self._add(Fault("error_after_commit", "trade", count, message=msg, html=html))

    def clear(self) -> None:
        self.faults.clear()

    def take(self, endpoint: str, kinds: tuple[str, ...]) -> Fault | None:
        """The first live knob of one of ``kinds`` for ``endpoint``, with one use taken off it."""
        for fault in self.faults:
            if fault.kind in kinds and fault.endpoint in (ANY_ENDPOINT, endpoint):
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self.faults.remove(fault)
                return fault
        return None

    def describe(self) -> list[dict[str, Any]]:
        return [fault.describe() for fault in self.faults]
