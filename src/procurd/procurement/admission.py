"""What intake does with each item of an order, decided once for intake and for its preview.

:func:`admit_items` takes the request and what the database holds of it (the mirrored SKUs, the offers, the
numbers already registered) and says, per item, whether intake refuses it (and so the whole order: nothing
is written) or takes it in, with the :class:`~procurd.core.procurement.Admit` event the state machine then
decides (queued, or an exception at once such as ``price_above_limit``). ``POST /api/v1/orders`` writes what
it says (:mod:`procurd.procurement.transitions`); ``POST /api/v1/orders/preview`` only shows it
(:func:`preview`, over what :func:`preview_facts` read), so the two can never disagree.

An item the mirror knows to be out of stock, or short of the quantity, is refused ``insufficient_stock``
unless the request says ``allow_backorder``: a SKU whose stock is short, an offer none of whose sources can
be bought as asked because of stock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from procurd.core.intake import IntakeError, ItemRequest, OrderRequest, refusal_status
from procurd.core.machine import Policy, decide
from procurd.core.numbers import item_number
from procurd.core.pricing import PricingRule
from procurd.core.procurement import Admit, Decision, MirroredSku, SourceRef, State
from procurd.core.records import NumberRow, Offer
from procurd.core.sources import Skipped, default_limit, first_available, offer_limits, selling_terms
from procurd.db.views import WithOffers, WithProcurements

STOCK = "out_of_stock"  # the mirror's reason a source is passed over for its stock
INSUFFICIENT_STOCK = "insufficient_stock"  # intake's refusal, the upstream protocol's word for it


@dataclass(frozen=True, slots=True)
class ItemAdmission:
    """What intake does with one item: ``refusal`` (the order is refused) or ``admit`` (it is taken in)."""

    position: int
    item: ItemRequest
    number: str  # its downstream order number
    admit: Admit | None = None
    refusal: IntakeError | None = None
    skipped: tuple[Skipped, ...] = ()  # an offer's sources passed over at intake, and why


def item_sources(item: ItemRequest, offers: Mapping[str, Offer]) -> list[tuple[str, int]]:
    """The upstream SKUs an item may be bought as: its SKU, or its offer's sources."""
    if item.offer is not None:
        offer = offers.get(item.offer)
        return [] if offer is None else list(offer.sources)
    assert item.sku_id is not None
    return [(item.upstream or "", item.sku_id)]


def item_keys(
    request: OrderRequest, offers: Mapping[str, Offer]
) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
    """What intake looks up for ``request``: the upstream SKUs its items may be bought as, and the
    ``(upstream, number)`` pairs their downstream order numbers would take."""
    sku_keys: list[tuple[str, int]] = []
    number_keys: list[tuple[str, str]] = []
    for position, item in enumerate(request.items):
        keys = item_sources(item, offers)
        sku_keys += keys
        number = item_number(request.order_no, position)
        number_keys += [(upstream, number) for upstream, _ in keys]
    return sku_keys, number_keys


def admit_items(
    request: OrderRequest,
    *,
    taken: Callable[[str, str], bool],
    skus: Mapping[tuple[str, int], MirroredSku],
    offers: Mapping[str, Offer],
    upstreams: Sequence[str],
    pricing: Sequence[PricingRule],
    charged: tuple[str, str] | None = None,
) -> list[ItemAdmission]:
    """Each item of ``request`` as intake takes it (its upstreams already filled in). ``taken`` says whether a
    downstream order number is registered already with an upstream; ``charged`` is what a downstream site
    paid a unit, and its currency (a provider's order)."""
    found = []
    for position, item in enumerate(request.items):
        number = item_number(request.order_no, position)
        try:
            found.append(_admit_item(request, position, item, number, taken, skus, offers, upstreams,
                                     pricing, charged))  # fmt: skip
        except IntakeError as refusal:
            found.append(ItemAdmission(position, item, number, refusal=refusal))
    return found


def _admit_item(
    request: OrderRequest,
    position: int,
    item: ItemRequest,
    number: str,
    taken: Callable[[str, str], bool],
    skus: Mapping[tuple[str, int], MirroredSku],
    offers: Mapping[str, Offer],
    upstreams: Sequence[str],
    pricing: Sequence[PricingRule],
    charged: tuple[str, str] | None,
) -> ItemAdmission:
    keys = item_sources(item, offers)
    skipped: tuple[Skipped, ...] = ()
    if item.offer is not None:
        if not keys:
            raise IntakeError("offer_not_found", f"items.{position}.offer: no offer {item.offer!r}")
        keys = [key for key in keys if key[0] in upstreams]
        if not keys:
            raise IntakeError(
                "offer_not_found",
                f"items.{position}.offer: offer {item.offer!r} has no source on a configured upstream",
            )
        in_use, _ = first_available(
            [SourceRef(u, sku_id) for u, sku_id in keys], 0, skus, item.quantity, item.manual_form_data
        )
        sources = offer_limits(
            keys, skus, None if in_use is None else keys[in_use], item.max_unit_price, pricing
        )
        reference = None if in_use is None else keys[in_use]
        given = item.max_unit_price is not None
        chosen, passed = first_available(sources, 0, skus, item.quantity, item.manual_form_data, given)
        skipped = tuple(passed)
        if chosen is None and not request.allow_backorder and any(skip.reason == STOCK for skip in passed):
            short = "; ".join(f"{s.source.upstream} SKU {s.source.sku_id}: {s.message}" for s in passed)
            raise IntakeError(
                INSUFFICIENT_STOCK,
                f"items.{position}: no source of offer {item.offer!r} can be bought for its stock ({short})",
            )
    else:
        source = _sku_source(request, position, item, skus, upstreams, pricing)
        sources = (source,)
        reference = (source.upstream, source.sku_id)
    sell = None if reference is None else selling_terms(reference[0], skus.get(reference), pricing, charged)
    for upstream, _ in keys:
        if taken(upstream, number):
            raise IntakeError(
                "downstream_order_no_taken",
                "a downstream order number derived from this order_no is already used by another order",
            )
    admit = Admit(
        order_no=request.order_no,
        position=position,
        quantity=item.quantity,
        manual_form_data=item.manual_form_data,
        max_unit_price=item.max_unit_price,
        trace_id=request.trace_id,
        downstream_order_no=number,
        sources=sources,
        mirror={key: skus[key] for key in keys if key in skus},
        offer_code=item.offer,
        sell=sell,
    )
    return ItemAdmission(position, item, number, admit=admit, skipped=skipped)


def _sku_source(
    request: OrderRequest,
    position: int,
    item: ItemRequest,
    skus: Mapping[tuple[str, int], MirroredSku],
    upstreams: Sequence[str],
    pricing: Sequence[PricingRule],
) -> SourceRef:
    """The one source of a SKU item, refused at once when it cannot be bought as asked."""
    upstream = item.upstream
    if upstream is None:
        raise IntakeError(
            "upstream_required",
            f"items.{position}.upstream: required when several upstreams are configured",
        )
    if upstream not in upstreams:
        raise IntakeError("unknown_upstream", f"items.{position}.upstream: no upstream {upstream!r}")
    assert item.sku_id is not None
    sku = skus.get((upstream, item.sku_id))
    if sku is None:
        raise IntakeError(
            "sku_not_found",
            f"items.{position}: no such SKU in the mirrored catalogue (run a catalogue sync?)",
        )
    problem = sku.problem(item.manual_form_data)
    if problem is not None:
        raise IntakeError(problem[0], f"items.{position}: {problem[1]}")
    short = sku.stock_problem(item.quantity)
    if short is not None and not request.allow_backorder:
        raise IntakeError(
            INSUFFICIENT_STOCK,
            f'items.{position}: {short[1]} (the mirror\'s stock; send "allow_backorder": true to take it '
            "in anyway and let the upstream decide)",
        )
    limit = item.max_unit_price
    if limit is None:
        limit = default_limit(upstream, sku, pricing)
    return SourceRef(upstream, item.sku_id, limit)


# --- the preview ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreviewFacts:
    """What the database holds that an order's preview decides on: the offers its items name, the numbers
    they would take, the mirrored SKUs, and the fingerprint of an order already taken in under its number."""

    offers: Mapping[str, Offer]
    numbers: Mapping[tuple[str, str], NumberRow]
    skus: Mapping[tuple[str, int], MirroredSku]
    existing: str | None


class PreviewTx(WithOffers, WithProcurements, Protocol):
    """The stores an order's preview reads."""


def preview_facts(tx: PreviewTx, request: OrderRequest) -> PreviewFacts:
    """Read in ``tx`` what :func:`preview` decides on (``request``'s upstreams filled in)."""
    offers = tx.offers.many(item.offer for item in request.items if item.offer is not None)
    sku_keys, number_keys = item_keys(request, offers)
    store = tx.procurements
    found = store.order(request.order_no)
    existing = None if found is None else found[0].fingerprint
    return PreviewFacts(offers, store.numbers(number_keys), store.mirrored_skus(sku_keys), existing)


def preview(
    request: OrderRequest,
    facts: PreviewFacts,
    *,
    upstreams: Sequence[str],
    pricing: Sequence[PricingRule],
    policy: Policy,
    now: datetime,
) -> dict[str, Any]:
    """What intake would do with ``request`` now, decided by the same code (:func:`admit_items` and the state
    machine's admission), writing nothing: ``POST /api/v1/orders/preview``'s answer (:func:`preview_view`)."""

    def taken(upstream: str, number: str) -> bool:  # by another order: an order's own are its own
        row = facts.numbers.get((upstream, number))
        return row is not None and row.order_no != request.order_no

    skus = facts.skus
    admitted = admit_items(
        request, taken=taken, skus=skus, offers=facts.offers, upstreams=upstreams, pricing=pricing
    )
    decisions = [None if item.admit is None else decide(None, item.admit, now, policy) for item in admitted]
    return preview_view(request, admitted, decisions, skus, pricing, facts.existing)


def preview_view(
    request: OrderRequest,
    admitted: Sequence[ItemAdmission],
    decisions: Sequence[Decision | None],
    skus: Mapping[tuple[str, int], MirroredSku],
    pricing: Sequence[PricingRule],
    existing: str | None,
) -> dict[str, Any]:
    """``POST /api/v1/orders/preview``'s answer: what ``POST /api/v1/orders`` would answer now for the same
    body, and per item the source, the price, the stock, the hold, the limit with the loss guard, the offer's
    sources, and whether it would be bought or why not. ``existing``: the fingerprint of an order already
    taken in under the number (a repeat answers that order, another body is refused)."""
    refusal = next((item.refusal for item in admitted if item.refusal is not None), None)
    repeat = existing is not None and existing == request.fingerprint()
    if existing is not None and not repeat:
        refusal = IntakeError("order_conflict", f"order {request.order_no} exists with a different body")
    answer: dict[str, Any] = {"status": 200 if repeat else 202, "error_code": None, "error_message": None}
    if refusal is not None and not repeat:
        answer = {"status": refusal_status(refusal.code), "error_code": refusal.code,
                  "error_message": refusal.message}  # fmt: skip
    return {
        "order_no": request.order_no,
        "accepted": answer["error_code"] is None,
        "repeat": repeat,
        "allow_backorder": request.allow_backorder,
        "answer": answer,
        "items": [
            _item_view(item, decision, skus, pricing)
            for item, decision in zip(admitted, decisions, strict=True)
        ],
    }


def _item_view(
    admitted: ItemAdmission,
    decision: Decision | None,
    skus: Mapping[tuple[str, int], MirroredSku],
    pricing: Sequence[PricingRule],
) -> dict[str, Any]:
    item = admitted.item
    view: dict[str, Any] = {
        "position": admitted.position,
        "downstream_order_no": admitted.number,
        "offer": item.offer,
        "quantity": item.quantity,
        "max_unit_price": item.max_unit_price,
    }
    bought = None if decision is None else decision.procurement
    upstream: str | None
    sku_id: int | None
    if bought is not None:  # taken in: the source it buys from, under the limit intake fixed
        upstream, sku_id = bought.upstream, bought.sku_id
    elif item.offer is None:
        upstream, sku_id = item.upstream, item.sku_id
    else:
        upstream, sku_id = None, None
    sku = None if upstream is None or sku_id is None else skus.get((upstream, sku_id))
    loss_guard = None if sku is None or upstream is None else default_limit(upstream, sku, pricing)
    view.update(upstream=upstream, sku_id=sku_id, **_sku_facts(sku))
    view.update(
        unit_limit=bought.unit_limit if bought is not None else item.max_unit_price or loss_guard,
        loss_guard=loss_guard,
    )
    if admitted.refusal is not None:
        view.update(accepted=False, outcome="refused", reason=admitted.refusal.code,
                    message=admitted.refusal.message)  # fmt: skip
    elif bought is not None and bought.state is State.EXCEPTION:
        view.update(accepted=False, outcome="exception", reason=bought.exception_reason,
                    message=bought.last_error_message)  # fmt: skip
    else:
        view.update(accepted=True, outcome="queued", reason=None, message=None)
    if item.offer is not None:
        sources = bought.sources if bought is not None else ()
        skipped = {(s.source.upstream, s.source.sku_id): s for s in admitted.skipped}
        view["sources"] = [
            {
                "upstream": source.upstream,
                "sku_id": source.sku_id,
                "unit_limit": source.limit,
                **_sku_facts(skus.get((source.upstream, source.sku_id))),
                "available": (source.upstream, source.sku_id) not in skipped,
                "reason": _skip_reason(skipped.get((source.upstream, source.sku_id))),
                "in_use": bought is not None
                and bought.state is not State.EXCEPTION
                and (source.upstream, source.sku_id) == (bought.upstream, bought.sku_id),
            }
            for source in sources
        ]
    return view


def _skip_reason(skip: Skipped | None) -> str | None:
    return None if skip is None else skip.reason


def _sku_facts(sku: MirroredSku | None) -> dict[str, Any]:
    """What the mirror knows of a SKU: its cost, selling price, stock and hold (``None`` when it has none)."""
    if sku is None:
        return {
            "unit_price": None,
            "sell_price": None,
            "sell_currency": None,
            "stock": None,
            "price_held": None,
        }
    return {
        "unit_price": sku.price_amount,
        "sell_price": sku.sell_price,
        "sell_currency": sku.sell_currency,
        "stock": {"status": sku.stock_status, "quantity": sku.stock_quantity},
        "price_held": sku.price_held,
    }
