"""Upstream-first cancel of a whole order (seed 000 part 1, rule 3).

Items never sent are canceled locally; items with a live upstream order only once the upstream confirmed the
cancel. Nothing is canceled locally unless every item can be; items the upstream did cancel are canceled
here too, whatever happens to the rest.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from procurd.core.machine import cancel_refusal, needs_upstream_cancel
from procurd.core.procurement import Cancel, Event, NotAllowed, Procurement, Source, State
from procurd.procurement.service import ProcurementService

UpstreamCancel = Callable[[str, int], Awaitable[Any]]
"""Cancels upstream order ``order_id`` of upstream ``name``; raises on refusal or failure."""


@dataclass(frozen=True)
class CancelItem:
    procurement_id: int
    downstream_order_no: str
    reason: str


class CancelDenied(Exception):
    """The order cannot be canceled (upstream-first); ``items`` says why, item by item."""

    def __init__(self, items: list[CancelItem]) -> None:
        super().__init__("; ".join(f"{item.downstream_order_no}: {item.reason}" for item in items))
        self.items = items


async def cancel_order(
    service: ProcurementService,
    order_no: str,
    items: Sequence[Procurement],
    cancel_upstream: UpstreamCancel,
    source: Source = Source.ADMIN,
) -> None:
    """Cancel ``order_no``, whose procurements are ``items`` (as read just before), upstream-first; returns
    once it is canceled, else raises :class:`CancelDenied`. ``source``: who asks (a person, or a downstream
    site canceling its order at the provider)."""
    upstream_first = [p for p in items if needs_upstream_cancel(p)]
    refusals = [
        CancelItem(p.id, p.downstream_order_no, reason)
        for p in items
        if p not in upstream_first
        and p.state is not State.CANCELED
        and (reason := cancel_refusal(p)) is not None
    ]
    if refusals:
        raise CancelDenied(refusals)
    confirmed: list[int] = []
    for p in upstream_first:
        assert p.upstream_order_id is not None
        try:
            await cancel_upstream(p.upstream, p.upstream_order_id)
        except Exception as exc:  # noqa: BLE001 - any refusal or failure denies the cancel
            code = getattr(exc, "code", type(exc).__name__)
            denied = [CancelItem(p.id, p.downstream_order_no, f"upstream refused: {code}")]
            denied += [CancelItem(pid, _number(items, pid), "canceled upstream") for pid in confirmed]
            await _record_upstream_cancels(service, order_no, confirmed, source)
            raise CancelDenied(denied) from None
        confirmed.append(p.id)
    events: list[tuple[int, Event]] = [(pid, Cancel(upstream_confirmed=True)) for pid in confirmed]
    events += [(p.id, Cancel(upstream_confirmed=False)) for p in items if p not in upstream_first]
    try:
        await service.apply_all(order_no, events, source)
    except NotAllowed as exc:
        # The state moved between the check and the write (a submitter claimed an item meanwhile).
        await _record_upstream_cancels(service, order_no, confirmed, source)
        raise CancelDenied([CancelItem(0, order_no, exc.message)]) from None


async def _record_upstream_cancels(
    service: ProcurementService, order_no: str, procurement_ids: list[int], source: Source
) -> None:
    for procurement_id in procurement_ids:
        await service.apply(procurement_id, Cancel(upstream_confirmed=True), source, order_no=order_no)


def _number(items: Sequence[Procurement], procurement_id: int) -> str:
    return next(p.downstream_order_no for p in items if p.id == procurement_id)
