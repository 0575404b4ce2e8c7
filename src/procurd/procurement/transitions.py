"""The one state path: commands turned into decisions and written, many at once, in one transaction.

Intake, claims, submission answers, callbacks, polls and a person's actions all arrive here as commands
(:mod:`procurd.procurement.commands`). A batch of them runs inside one transaction
(:class:`procurd.db.batching.BatchWriter`):

1. everything the batch needs is looked up in a few statements: the numbers callbacks name, the due
   claims, the mirrored SKUs intake checks; then the orders concerned are locked and their items loaded;
2. each command is decided by :func:`procurd.core.machine.decide` against the records as the commands
   before it in the batch left them; a command that is refused (:class:`NotAllowed`, an intake error, a
   report about no known order) changes nothing and fails alone;
3. every change is written with one ``executemany`` per kind: procurements, numbers, audit entries, the
   orders' derived status and their storefront events (:mod:`procurd.core.events`), alerts
   (:mod:`procurd.core.alerts`) and findings. An ignored report identical to the last audit entry of its
   procurement adds to that entry's ``count`` instead of adding an entry. A claim that took fewer than it
   asked then reads when its upstream's next one falls due.

Nothing is taken on trust: a report naming an upstream order that procurd has not recorded for the
procurement is refused (:class:`~procurd.procurement.commands.ReportUnverified`) until the upstream confirms
it when asked (:mod:`procurd.procurement.confirmation` does that, then sends the report again marked
``verified``).

This module is synchronous: it runs on the database's writer (a thread on SQLite, a greenlet on
PostgreSQL) inside the transaction the writer opened, and names the stores it touches by a view of it
(:class:`BatchTx`). It opens no transaction: the writer does, because one transaction holds the commands of
many callers at once (group commit), which no one caller's operation could own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any, Protocol

from procurd.core import alerts
from procurd.core.alerts import Occurrence
from procurd.core.events import order_event
from procurd.core.intake import IntakeError, OrderRequest
from procurd.core.machine import decide, is_noop
from procurd.core.numbers import item_number
from procurd.core.orders import Order, OrderStatus, derive_status, event_for, order_view
from procurd.core.procurement import (
    Claim,
    ClaimAbandoned,
    Decision,
    Event,
    ExceptionOpened,
    GoodsAfterResolution,
    MirroredSku,
    NotAllowed,
    NumberAdded,
    NumberRetired,
    PollClaim,
    Procurement,
    Source,
)
from procurd.core.provider import Account, ProviderIntake, ProviderOrder, ProviderTerms
from procurd.core.reconcile import GOODS_RECORDED, goods_after_resolution
from procurd.core.records import Finding, NumberRow, Offer
from procurd.core.refusals import Refused
from procurd.core.rollup import Deltas, difference
from procurd.db.batching import Later
from procurd.db.offered_store import SkuSource
from procurd.db.procurement_store import AuditRow
from procurd.db.views import (
    WithAlerts,
    WithCharts,
    WithOffered,
    WithOffers,
    WithProcurements,
    WithProvider,
    WithReconcile,
)
from procurd.procurement.admission import admit_items, item_keys
from procurd.procurement.answers import finding_of
from procurd.procurement.audit import write_audit
from procurd.procurement.commands import (
    Change,
    ChangeAll,
    ClaimPolls,
    Claims,
    ClaimSubmissions,
    Command,
    Current,
    Intake,
    ProviderPlacement,
    ReleaseClaims,
    Report,
    ReportRejected,
    ReportUnverified,
    Rules,
)
from procurd.procurement.provider_orders import (
    ProviderBatch,
    intake_refusal,
    offered_sources,
    placement_intake,
)

ACCEPTED: OrderStatus = ("paid", False)  # an order as intake first records it
OFFERING_NOTHING = ProviderTerms("", frozenset())  # without [provider]: every offered SKU is unavailable


class BatchTx(
    WithProcurements, WithOffers, WithProvider, WithOffered, WithAlerts, WithCharts, WithReconcile, Protocol
):
    """The stores a batch touches: procurements, orders, numbers, audit and events; the offers intake
    names; provider orders and wallets, and the offered SKUs a provider order names; the alerts and
    findings it raises; the hourly rollup."""


# --- results ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Applied:
    """One event applied: the procurement before and after, and the decision."""

    before: Procurement
    decision: Decision
    source: Source

    @property
    def procurement(self) -> Procurement:
        return self.decision.procurement

    @property
    def changed(self) -> bool:
        return not is_noop(self.before, self.decision)

    @property
    def state_changed(self) -> bool:
        return self.before.state is not self.decision.procurement.state


@dataclass(frozen=True, slots=True)
class IntakeResult:
    created: bool
    order: dict[str, Any]  # the local order's view ({} for a provider order its wallet could not pay)
    admitted: tuple[Applied, ...] = ()
    provider: ProviderOrder | None = None  # a provider intake's order (new, or the one it repeats)
    wallet: Account | None = None  # a new provider order's account, its balance as the intake left it


@dataclass(frozen=True, slots=True)
class Claimed:
    """What a claim did: the procurements it claimed, and the ones it moved on instead (an exception over its
    limit, an offer's next source). A claim that took fewer than asked also says when the next procurement
    of its upstream can be claimed (``None``: nothing is waiting), read after its own writes."""

    applied: tuple[Applied, ...]
    next_due: datetime | None = None

    @property
    def procurements(self) -> list[Procurement]:
        """The procurements claimed (for submission, or for a poll)."""
        return [a.procurement for a in self.applied if a.decision.event in ("claimed", "poll_claimed")]

    @property
    def moved(self) -> list[Applied]:
        """The changes the claim made instead of a claim."""
        return [a for a in self.applied if a.decision.event not in ("claimed", "poll_claimed")]


Result = IntakeResult | Applied | list[Applied] | Claimed | Procurement | None


# --- one batch ----------------------------------------------------------------------------------------------

Key = tuple[str, int]  # (order_no, position): names a procurement before the database gives it an id


def _key(p: Procurement) -> Key:
    return p.order_no, p.position


@dataclass
class _Event:
    """A storefront event, its order view built once the new procurements have ids."""

    order_no: str
    name: str
    order: Order
    items: tuple[Procurement, ...]


@dataclass
class _Batch:
    tx: BatchTx
    rules: Rules
    now: datetime
    orders: dict[str, Order] = field(default_factory=dict)
    items: dict[str, list[Procurement]] = field(default_factory=dict)
    new_orders: dict[str, Order] = field(default_factory=dict)
    updated: dict[Key, Procurement] = field(default_factory=dict)
    inserted: dict[Key, Procurement] = field(default_factory=dict)
    originals: dict[Key, Procurement] = field(default_factory=dict)  # the updated ones as they were loaded
    order_changes: dict[str, Order] = field(default_factory=dict)
    numbers_added: list[tuple[str, str, Key, bool]] = field(default_factory=list)
    numbers_retired: list[tuple[str, str, int | None]] = field(default_factory=list)
    audit: list[tuple[Key, AuditRow, bool]] = field(default_factory=list)  # True: a repeat may merge
    late_goods: list[tuple[Key, Source, GoodsAfterResolution]] = field(default_factory=list)
    events: list[_Event] = field(default_factory=list)
    requests: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    exceptions_opened: list[tuple[Key, ExceptionOpened]] = field(default_factory=list)
    provider: ProviderBatch = field(default_factory=ProviderBatch)
    provider_ids: dict[str, int] = field(default_factory=dict)  # new provider orders' ids, once flushed
    offered: Mapping[int, SkuSource] = field(default_factory=dict)  # the offered SKUs placements name
    # What the commands name, as looked up first: numbers, the orders of changes named by id, SKUs, offers.
    numbers: Mapping[tuple[str, str], NumberRow] = field(default_factory=dict)
    order_nos: Mapping[int, str] = field(default_factory=dict)
    skus: Mapping[tuple[str, int], MirroredSku] = field(default_factory=dict)
    offers: Mapping[str, Offer] = field(default_factory=dict)


def apply_batch(
    tx: BatchTx, commands: Sequence[Command], rules: Rules
) -> list[Result | Later[Result] | Exception]:
    """Run ``commands`` in ``tx``; one result (or the exception of that command alone) per command, the ones
    that need nothing more of the database as :class:`Later` (built after the commit)."""
    batch = _Batch(tx, rules, rules.clock())
    store = tx.procurements

    # 1. Look up what the commands name, then lock their orders and load the items.
    intakes = [c for c in commands if isinstance(c, Intake)]
    batch.offers = tx.offers.many(
        item.offer for intake in intakes for item in intake.request.items if item.offer is not None
    )
    number_keys = [(c.upstream, c.number) for c in commands if isinstance(c, Report)]
    sku_keys: list[tuple[str, int]] = []
    for intake in intakes:
        skus_of, numbers_of = item_keys(intake.request, batch.offers)
        sku_keys += skus_of
        number_keys += numbers_of
    placements = [c for c in commands if isinstance(c, ProviderPlacement)]
    batch.offered = offered_sources(tx, [placement.sku_id for placement in placements])
    for placement in placements:
        source = batch.offered.get(placement.sku_id)
        if source is not None:
            sku_keys.append((source.upstream, source.upstream_id))
            number_keys.append((source.upstream, item_number(placement.order_no, 0)))
    batch.numbers = store.numbers(number_keys)
    batch.order_nos = store.order_nos_of(
        c.procurement_id for c in commands if isinstance(c, Change) and not c.order_no
    )
    claims: dict[int, dict[int, str]] = {}
    for index, command in enumerate(commands):
        if isinstance(command, ClaimSubmissions):
            claims[index] = store.claim_due(command.upstream, batch.now, command.limit)
        elif isinstance(command, ClaimPolls):
            claims[index] = store.claim_polls(command.upstream, batch.now, command.limit)
        elif isinstance(command, ReleaseClaims):
            claims[index] = store.claimed_by(command.instances)
    skus = store.mirrored_skus(sku_keys)
    wanted: set[str] = {intake.request.order_no for intake in intakes}
    wanted.update(placement.order_no for placement in placements)
    wanted.update(row.order_no for row in batch.numbers.values())
    wanted.update(batch.order_nos.values())
    wanted.update(c.order_no for c in commands if isinstance(c, Change | ChangeAll | Current) and c.order_no)
    for claimed in claims.values():
        wanted.update(claimed.values())
    batch.orders = store.lock_orders(wanted)
    batch.items = store.items_of(batch.orders)
    batch.provider = ProviderBatch.load(tx, batch.orders, placements)
    # A claim checks the cost (and an offer every source) against the mirror as it is now.
    claimed_keys = [
        key
        for index, claimed in claims.items()
        if isinstance(commands[index], ClaimSubmissions)
        for procurement_id, order_no in claimed.items()
        if (p := _find(batch, order_no, procurement_id)) is not None
        for key in _source_keys(p)
    ]
    if claimed_keys:
        skus = {**skus, **store.mirrored_skus(claimed_keys)}
    batch.skus = skus

    # 2. Decide each command against the records as the commands before it left them.
    pending: list[Callable[[dict[Key, int]], Result] | Exception] = []
    for index, command in enumerate(commands):
        try:
            pending.append(_run(batch, command, claims.get(index, {})))
        except (NotAllowed, IntakeError, ReportRejected, Refused) as refused:
            pending.append(refused)

    # 3. Write everything; the results but a claim's (its next due time is read) are built after the commit.
    ids = _flush(batch)
    return [
        item if isinstance(item, Exception)
        else _next_due(tx, command, item(ids)) if isinstance(command, Claims)
        else Later(partial(item, ids))
        for command, item in zip(commands, pending, strict=True)
    ]  # fmt: skip


def _next_due(tx: BatchTx, command: Claims, result: Result) -> Result:
    """A claim that took fewer than it asked for, with the time its upstream's next one falls due: what its
    submitter or poller waits for, read after the batch's writes (its own claims count from their expiry)."""
    if not isinstance(result, Claimed):
        return result
    if len(result.procurements) >= command.limit:
        return result
    store = tx.procurements
    if isinstance(command, ClaimSubmissions):
        return replace(result, next_due=store.next_submission_due(command.upstream))
    return replace(result, next_due=store.next_poll_due(command.upstream))


def _run(batch: _Batch, command: Command, claimed: Mapping[int, str]) -> Callable[[dict[Key, int]], Result]:
    match command:
        case Intake():
            return _intake(batch, command)
        case ProviderPlacement():
            return _place(batch, command)
        case Change():
            order_no = command.order_no or batch.order_nos.get(command.procurement_id)
            current = _find(batch, order_no, command.procurement_id)
            if current is None:
                return lambda ids: None
            applied = _apply(batch, [(current, command.event)], command.source)[0]
            return lambda ids: _with_id(applied, ids)
        case ChangeAll():
            steps = []
            for procurement_id, event in command.events:
                current = _find(batch, command.order_no, procurement_id)
                if current is None:
                    raise NotAllowed("procurement_not_found", f"no procurement {procurement_id}")
                steps.append((current, event))
            applied_all = _apply(batch, steps, command.source)
            return lambda ids: [_with_id(applied, ids) for applied in applied_all]
        case Report():
            return _report(batch, command)
        case ClaimSubmissions():
            owner, lease = command.owner, batch.rules.lease_seconds
            return _claim(batch, claimed, lambda p: Claim(owner, lease, _mirror_of(p, batch.skus)))
        case ClaimPolls():
            poll = PollClaim(batch.rules.lease_seconds, command.owner)
            return _claim(batch, claimed, lambda p: poll)
        case ReleaseClaims():
            released: list[Applied] = []
            for instance in command.instances:
                for procurement_id, order_no in claimed.items():
                    current = _find(batch, order_no, procurement_id)
                    if current is not None:
                        released += _apply(batch, [(current, ClaimAbandoned(instance))], Source.WORKER)
            changed = [applied for applied in released if applied.changed]
            return lambda ids: changed
        case Current():
            found = _find(batch, command.order_no, command.procurement_id)
            return lambda ids: found


def _find(batch: _Batch, order_no: str | None, procurement_id: int) -> Procurement | None:
    if order_no is None:
        return None
    return next((p for p in batch.items.get(order_no, ()) if p.id == procurement_id), None)


def _claim(
    batch: _Batch, claimed: Mapping[int, str], event_for_item: Callable[[Procurement], Event]
) -> Callable[[dict[Key, int]], Result]:
    """Claim each due procurement; the changed ones (claimed, or moved on by the claim: an exception over
    its limit, an offer's next source)."""
    changed: list[Applied] = []
    for procurement_id, order_no in claimed.items():
        current = _find(batch, order_no, procurement_id)
        if current is None:
            continue
        event = event_for_item(current)
        source = Source.WORKER if isinstance(event, Claim) else Source.POLL
        applied = _apply(batch, [(current, event)], source)[0]
        if applied.changed:
            changed.append(applied)
    return lambda ids: Claimed(tuple(changed))


def _source_keys(p: Procurement) -> list[tuple[str, int]]:
    return [(s.upstream, s.sku_id) for s in p.sources] or [(p.upstream, p.sku_id)]


def _mirror_of(
    p: Procurement, skus: Mapping[tuple[str, int], MirroredSku]
) -> dict[tuple[str, int], MirroredSku]:
    return {key: skus[key] for key in _source_keys(p) if key in skus}


def _report(batch: _Batch, command: Report) -> Callable[[dict[Key, int]], Result]:
    found = batch.numbers.get((command.upstream, command.number))
    current = None if found is None else _find(batch, found.order_no, found.procurement_id)
    if found is None or current is None:
        raise ReportRejected(f"no order {command.number!r} for upstream {command.upstream!r}")
    if command.upstream != current.upstream and command.number == current.downstream_order_no:
        # An offer left this upstream after it refused the order: it holds none under the number.
        raise ReportRejected(f"order {command.number!r} is bought from another upstream now")
    is_current = command.number == current.downstream_order_no
    expected = current.upstream_order_id if is_current else found.upstream_order_id
    if expected is not None and expected != command.report.order_id:
        raise ReportRejected(f"order {command.number!r} has another upstream order id")
    if expected is None and is_current and not command.report.verified:
        # Nothing recorded names this upstream order: the upstream has to confirm it first.
        raise ReportUnverified(
            f"upstream order {command.report.order_id} is not recorded for order {command.number!r}",
            current,
            batch.now,
        )
    event = replace(command.report, number=command.number)
    applied = _apply(batch, [(current, event)], command.source)[0]
    return lambda ids: applied


def _place(batch: _Batch, command: ProviderPlacement) -> Callable[[dict[Key, int]], Result]:
    """A downstream site's order: the one it repeats, or checked, priced, charged and taken in."""
    repeated = batch.provider.existing(command)
    if repeated is not None:
        return lambda ids: IntakeResult(False, {}, provider=_provider_with_id(batch, repeated))
    request, intake = placement_intake(
        command,
        batch.offered.get(command.sku_id),
        batch.skus,
        batch.provider.accounts.get(command.account_id),
        batch.rules.provider or OFFERING_NOTHING,
        batch.rules.pricing,
    )
    try:
        return _intake(batch, Intake(request, request.fingerprint(), intake))
    except IntakeError as refused:
        raise intake_refusal(refused) from None


def _intake(batch: _Batch, command: Intake) -> Callable[[dict[Key, int]], Result]:
    request = command.request
    order_no = request.order_no
    provider = command.provider
    existing = batch.orders.get(order_no) or batch.new_orders.get(order_no)
    if existing is not None:
        if existing.fingerprint != command.fingerprint:
            raise IntakeError("order_conflict", f"order {order_no} exists with a different body")
        items = tuple(batch.items.get(order_no, ()))
        return lambda ids: IntakeResult(False, order_view(existing, _with_ids(items, ids)))
    steps = _admissions(batch, request, provider)
    if provider is not None and not batch.provider.active(provider):
        raise IntakeError("account_disabled", "the provider account is disabled")
    if provider is not None and not batch.provider.can_pay(provider):
        refused = batch.provider.record(provider, batch.now, paid=False)
        return lambda ids: IntakeResult(
            True,
            {},
            provider=_provider_with_id(batch, refused),
            wallet=batch.provider.wallet(provider.account_id),
        )
    order = Order(
        order_no=order_no,
        trace_id=request.trace_id,
        fingerprint=command.fingerprint,
        status=ACCEPTED[0],
        exception=ACCEPTED[1],
        created_at=batch.now,
        updated_at=batch.now,
        provider=provider is not None,
    )
    batch.new_orders[order_no] = order
    batch.requests[order_no] = request.canonical()
    batch.orders[order_no] = order
    batch.items[order_no] = []
    charged = None if provider is None else batch.provider.record(provider, batch.now, paid=True)
    admitted = _apply(batch, steps, Source.INTAKE)
    return lambda ids: IntakeResult(
        True,
        order_view(batch.orders[order_no], _with_ids(tuple(batch.items[order_no]), ids)),
        tuple(_with_id(applied, ids) for applied in admitted),
        None if charged is None else _provider_with_id(batch, charged),
        None if provider is None else batch.provider.wallet(provider.account_id),
    )


def _provider_with_id(batch: _Batch, order: ProviderOrder) -> ProviderOrder:
    """A provider order as the batch left it, with its id once the batch wrote it."""
    current = batch.provider.orders.get(order.order_no, order)
    return current if current.id else replace(current, id=batch.provider_ids[current.order_no])


def _admissions(
    batch: _Batch, request: OrderRequest, provider: ProviderIntake | None = None
) -> list[tuple[None, Event]]:
    """Each item's first event, once every item is found buyable as asked (:class:`IntakeError` when one
    is not: nothing is written)."""

    def taken(upstream: str, number: str) -> bool:
        return (upstream, number) in batch.numbers or any(
            added[:2] == (upstream, number) for added in batch.numbers_added
        )

    admitted = admit_items(
        request, taken=taken, skus=batch.skus, offers=batch.offers, upstreams=batch.rules.upstreams,
        pricing=batch.rules.pricing,
        charged=None if provider is None else (provider.unit_price, provider.currency),
    )  # fmt: skip
    steps: list[tuple[None, Event]] = []
    for item in admitted:
        if item.refusal is not None:
            raise item.refusal
        assert item.admit is not None
        steps.append((None, item.admit))
    return steps


def _apply(batch: _Batch, steps: Sequence[tuple[Procurement | None, Event]], source: Source) -> list[Applied]:
    """Decide every step; write nothing into the batch unless all of them are allowed."""
    decided: list[tuple[Procurement | None, Decision]] = []
    for current, event in steps:
        decided.append((current, decide(current, event, batch.now, batch.rules.policy, batch.rules.rng)))
    results: list[Applied] = []
    touched: set[str] = set()
    for current, decision in decided:
        after = decision.procurement
        before = current or after
        results.append(Applied(before, decision, source))
        if current is not None and is_noop(current, decision):
            continue
        key = _key(after)
        touched.add(after.order_no)
        siblings = batch.items[after.order_no]
        if current is None:
            siblings.append(after)
            batch.inserted[key] = after
        else:
            siblings[siblings.index(current)] = after
            if key in batch.inserted:
                batch.inserted[key] = after
            else:
                batch.originals.setdefault(key, current)
                batch.updated[key] = after
        if decision.audited:
            old_state = None if current is None else current.state.value
            row = AuditRow(
                after.order_no, after.id or None, batch.now, source.value, decision.event, old_state,
                after.state.value, decision.detail,
            )  # fmt: skip
            # A report recorded without changing anything (a late status ...) may repeat the entry before it.
            batch.audit.append((key, row, after is current))
        for effect in decision.effects:
            if isinstance(effect, NumberAdded):
                batch.numbers_added.append((after.upstream, effect.number, key, effect.again))
            elif isinstance(effect, NumberRetired):
                batch.numbers_retired.append((before.upstream, effect.number, effect.upstream_order_id))
            elif isinstance(effect, GoodsAfterResolution):
                batch.late_goods.append((key, source, effect))
            else:
                batch.exceptions_opened.append((key, effect))
    for order_no in touched:
        _refresh_order(batch, order_no)
        if batch.orders[order_no].provider:
            # A change the downstream asked for itself (its cancel) is told in the answer to its request.
            tell = source is not Source.DOWNSTREAM
            batch.provider.follow(order_no, batch.items[order_no], batch.now, tell=tell)
    return results


def _refresh_order(batch: _Batch, order_no: str) -> None:
    """Derive the order's status from its items; on a change, store it and queue the storefront's event."""
    order = batch.orders[order_no]
    old: OrderStatus = (order.status, order.exception)
    new = derive_status(batch.items[order_no])
    if new == old:
        return
    changed = replace(order, status=new[0], exception=new[1], updated_at=batch.now)
    batch.orders[order_no] = changed
    if order_no in batch.new_orders:
        batch.new_orders[order_no] = changed
    else:
        batch.order_changes[order_no] = changed
    name = event_for(old, new)
    if name is not None and batch.rules.storefront_events:
        batch.events.append(_Event(order_no, name, changed, tuple(batch.items[order_no])))


def _flush(batch: _Batch) -> dict[Key, int]:
    """Write the batch; the ids of every procurement it touched, by key."""
    store = batch.tx.procurements
    store.insert_orders(
        [
            {
                "order_no": order.order_no,
                "trace_id": order.trace_id,
                "fingerprint": order.fingerprint,
                "request": batch.requests[order.order_no],
                "status": order.status,
                "exception": order.exception,
                "created_at": order.created_at,
                "updated_at": order.updated_at,
                "provider": order.provider,
            }
            for order in batch.new_orders.values()
        ]
    )
    batch.provider_ids = batch.provider.flush(batch.tx, batch.now)
    new = list(batch.inserted.values())
    ids = {_key(p): p.id for p in batch.updated.values()}
    ids.update(zip([_key(p) for p in new], store.insert_procurements(new), strict=True))
    store.update_procurements(list(batch.updated.values()))
    for again in (False, True):
        rows = [
            {
                "upstream": upstream,
                "downstream_order_no": number,
                "procurement_id": ids[key],
                "upstream_order_id": None,
                "created_at": batch.now,
            }
            for upstream, number, key, added_again in batch.numbers_added
            if added_again is again
        ]
        store.insert_numbers(rows, again=again)
    store.retire_numbers(batch.numbers_retired)
    audit = [(replace(row, procurement_id=ids[key]), repeat) for key, row, repeat in batch.audit]
    write_audit(store, audit, batch.now)
    store.update_orders(
        [
            (order.order_no, order.status, order.exception, order.updated_at)
            for order in batch.order_changes.values()
        ]
    )
    store.insert_events([_event_row(event, ids, batch.now) for event in batch.events])
    rules = batch.rules
    opened = [alerts.exception_opened(_item(batch, key), effect) for key, effect in batch.exceptions_opened]
    opened += _late_goods(batch, ids)
    batch.tx.alerts.occur(opened, batch.now, rules.alert_repeat_after, rules.alert_delivery)
    batch.tx.charts.add(_rollup(batch), rules.writer)
    return ids


def _rollup(batch: _Batch) -> Deltas:
    """What the batch's changes add to the hourly rollup (:mod:`procurd.core.rollup`), for the upstream and,
    for a downstream site's order, its account."""
    provider_orders = batch.provider.orders

    def accounts(p: Procurement) -> tuple[int, ...]:
        order = provider_orders.get(p.order_no) if provider_orders else None
        return (0,) if order is None else (0, order.account_id)

    changes: list[tuple[Procurement | None, Procurement, tuple[int, ...]]]
    changes = [(None, p, accounts(p)) for p in batch.inserted.values()]
    changes += [(batch.originals[key], p, accounts(p)) for key, p in batch.updated.items()]
    return difference(changes)


def _late_goods(batch: _Batch, ids: Mapping[Key, int]) -> list[Occurrence]:
    """Goods delivered for procurements a person had resolved: a finding each (in a run of the source that
    brought them), and a ``reconcile_mismatch`` alert for the person."""
    if not batch.late_goods:
        return []
    findings: list[Finding] = []
    occurrences: list[Occurrence] = []
    for key, _, effect in batch.late_goods:
        p = _item(batch, key)
        findings.append(finding_of(p, goods_after_resolution(p, effect.status), GOODS_RECORDED, batch.now))
        occurrences.append(alerts.goods_after_resolution(p))
    reconcile = batch.tx.reconcile
    for trigger in sorted({source.value for _, source, _ in batch.late_goods}):
        found = [f for f, (_, source, _) in zip(findings, batch.late_goods, strict=True) if source == trigger]
        run_id = reconcile.start(None, trigger, batch.now)
        reconcile.add_findings(run_id, found)
        reconcile.finish(
            run_id, status="ok", checked=len(found), repaired=0, errors=0, error=None, now=batch.now
        )
    return occurrences


def _item(batch: _Batch, key: Key) -> Procurement:
    """The procurement ``key`` names, as the batch left it."""
    order_no, position = key
    return next(item for item in batch.items[order_no] if item.position == position)


def _event_row(event: _Event, ids: Mapping[Key, int], now: datetime) -> dict[str, Any]:
    event_id = str(uuid.uuid4())
    return {
        "event_id": event_id,
        "order_no": event.order_no,
        "event": event.name,
        "payload": order_event(event.name, event_id, now, event.order, _with_ids(event.items, ids)),
        "created_at": now,
        "attempts": 0,
        "next_attempt_at": now,
    }


def _with_ids(items: Sequence[Procurement], ids: Mapping[Key, int]) -> list[Procurement]:
    return [p if p.id else replace(p, id=ids[_key(p)]) for p in items]


def _with_id(applied: Applied, ids: Mapping[Key, int]) -> Applied:
    if applied.procurement.id:
        return applied
    procurement = replace(applied.procurement, id=ids[_key(applied.procurement)])
    return replace(applied, before=procurement, decision=replace(applied.decision, procurement=procurement))
