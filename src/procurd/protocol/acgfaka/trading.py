"""Buying from an acg-faka supplier: one trade per procurement, never twice. Being written."""

from __future__ import annotations

from procurd.config import UpstreamSettings
from procurd.protocol.acgfaka.client import AcgFakaClient
from procurd.protocol.acgfaka.ports import ChoiceBook
from procurd.upstream.models import CancelResult, CreateOrderRequest, OrderCreated, UpstreamOrder
from procurd.upstream.ratelimit import Priority


class AcgFakaTrading:
    def __init__(self, settings: UpstreamSettings, client: AcgFakaClient, choices: ChoiceBook) -> None:
        self.settings = settings
        self.client = client
        self.choices = choices

    async def create_order(
        self, request: CreateOrderRequest, *, priority: Priority = Priority.ORDER
    ) -> OrderCreated:
        raise NotImplementedError

    async def get_order(self, order_id: int, *, priority: Priority = Priority.POLL) -> UpstreamOrder:
        raise NotImplementedError

    async def cancel_order(self, order_id: int, *, priority: Priority = Priority.ORDER) -> CancelResult:
        raise NotImplementedError
