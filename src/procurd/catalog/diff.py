"""The catalogue diff, free of I/O: upstream records against the mirror's snapshot.

An upstream Category, Product or SKU becomes a :class:`Record`: the values of its mirror row (every seed
field under its own name, anything else under ``extra``) and a digest of what the upstream sent. The
snapshot holds, per mirrored id, that digest, whether the row is marked removed and the tracked fields
(prices, stock, activity) as text. :func:`diff_listed` says which listed records to insert, update or restore
and :func:`diff_unlisted` which rows to mark removed; both also produce the change-log entries.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Literal

Entity = Literal["category", "product", "sku"]
ChangeKind = Literal["added", "changed", "removed", "restored"]
ENTITIES: tuple[Entity, ...] = ("category", "product", "sku")

# Seed 000 part 2, field for field (``id`` is the key and kept apart).
CATEGORY_FIELDS = ("parent_id", "slug", "name", "icon", "sort_order")
PRODUCT_FIELDS = (
    "slug",
    "title",
    "description",
    "content",
    "seo_meta",
    "images",
    "tags",
    "price_amount",
    "original_price",
    "member_price",
    "fulfillment_type",
    "manual_form_schema",
    "is_active",
    "category_id",
    "created_at",
    "updated_at",
)
SKU_FIELDS = (
    "sku_code",
    "spec_values",
    "price_amount",
    "original_price",
    "member_price",
    "stock_status",
    "stock_quantity",
    "is_active",
)
AMOUNT_FIELDS = frozenset({"price_amount", "original_price", "member_price"})

# The mirror row's own columns per entity (besides upstream, id, extra and the bookkeeping columns).
# Categories have no activity flag in the seed: a listed category is active unless the upstream says not.
ROW_FIELDS: dict[Entity, tuple[str, ...]] = {
    "category": (*CATEGORY_FIELDS, "is_active"),
    "product": PRODUCT_FIELDS,
    "sku": ("product_id", *SKU_FIELDS),
}
# Fields whose every change goes to the change log.
TRACKED_FIELDS: dict[Entity, tuple[str, ...]] = {
    "category": ("is_active",),
    "product": ("price_amount", "original_price", "member_price", "is_active"),
    "sku": ("price_amount", "original_price", "member_price", "stock_status", "stock_quantity", "is_active"),
}
# Values for NOT NULL columns an upstream may leave out without the record being unusable.
_DEFAULTS: dict[Entity, dict[str, Any]] = {
    "category": {"parent_id": 0, "slug": "", "name": {}, "icon": "", "sort_order": 0, "is_active": True},
    "product": {"slug": "", "title": {}, "images": [], "tags": [], "is_active": True},
    "sku": {"sku_code": "", "is_active": True},
}
# Fields without which a record cannot be mirrored (nothing sensible stands in for a missing price).
REQUIRED_FIELDS: dict[Entity, tuple[str, ...]] = {
    "category": (),
    "product": ("price_amount", "fulfillment_type", "category_id"),
    "sku": ("price_amount", "stock_status", "stock_quantity"),
}


class IncompleteRecord(ValueError):
    """An upstream record lacks a field the mirror cannot do without."""

    def __init__(self, entity: Entity, identity: int, missing: Sequence[str]) -> None:
        self.entity = entity
        self.identity = identity
        self.missing = tuple(missing)
        super().__init__(f"{entity} {identity} lacks {', '.join(self.missing)}: not mirrored")


@dataclass(frozen=True, slots=True)
class Record:
    """One upstream entity as a mirror row: ``values`` holds every row field plus ``extra``."""

    entity: Entity
    id: int
    values: dict[str, Any]
    content_hash: str
    tracked: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class Existing:
    """What the mirror holds for one id: enough to decide whether and how a record changes it."""

    content_hash: str
    removed: bool
    tracked: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class Change:
    """One ``mirror_changes`` entry (values as text)."""

    entity: Entity
    entity_id: int
    kind: ChangeKind
    field: str | None = None
    old_value: str | None = None
    new_value: str | None = None


@dataclass(slots=True)
class Plan:
    """The writes one diff asks for, for one entity."""

    entity: Entity
    inserts: list[Record] = field(default_factory=list)
    updates: list[Record] = field(default_factory=list)
    restores: list[Record] = field(default_factory=list)
    removals: list[int] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """Mirror rows this plan writes."""
        return len(self.inserts) + len(self.updates) + len(self.restores) + len(self.removals)

    @property
    def added(self) -> int:
        """Entities that are (again) listed: new ones and restored ones."""
        return len(self.inserts) + len(self.restores)

    @property
    def changed(self) -> int:
        return len(self.updates)

    @property
    def removed(self) -> int:
        return len(self.removals)


Snapshot = dict[int, Existing]


def value_text(value: object) -> str | None:
    """How a tracked value is written to the change log: booleans as ``true``/``false``, text unchanged."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def content_digest(payload: Mapping[str, Any]) -> str:
    """A 32-hex-digit digest of an upstream payload, independent of key order."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def category_record(payload: Mapping[str, Any]) -> Record:
    """A Category as the upstream sent it (JSON-like mapping) as a mirror record."""
    return _record("category", payload, {})


@dataclass(frozen=True, slots=True)
class ListedProduct:
    """A listed Product: its record and its SKUs' records, plus every id listed, usable or not.

    ``record`` is ``None`` (and ``skus`` empty) when the product itself cannot be mirrored; ``problems``
    says what could not be mirrored. Listed ids count as listed either way, so nothing is marked removed
    because the upstream sent it incomplete.
    """

    id: int
    category_id: int | None
    record: Record | None
    skus: list[Record]
    sku_ids: tuple[int, ...]
    problems: tuple[str, ...]


def product_records(payload: Mapping[str, Any]) -> ListedProduct:
    """A Product as the upstream sent it (JSON-like mapping, SKUs under ``skus``) as mirror records."""
    identity = int(payload["id"])
    sku_payloads: Sequence[Mapping[str, Any]] = payload.get("skus") or ()
    sku_ids = tuple(int(sku["id"]) for sku in sku_payloads)
    category_id = payload.get("category_id")
    category = None if category_id is None else int(category_id)
    try:
        product = _record("product", {key: value for key, value in payload.items() if key != "skus"}, {})
    except IncompleteRecord as exc:
        return ListedProduct(identity, category, None, [], sku_ids, (str(exc),))
    skus: list[Record] = []
    problems: list[str] = []
    for sku in sku_payloads:
        try:
            skus.append(_record("sku", sku, {"product_id": identity}))
        except IncompleteRecord as exc:
            problems.append(str(exc))
    return ListedProduct(identity, category, product, skus, sku_ids, tuple(problems))


def _record(entity: Entity, payload: Mapping[str, Any], implied: Mapping[str, Any]) -> Record:
    identity = int(payload["id"])
    hashed = {**payload, **implied} if implied else payload
    values = dict(_DEFAULTS[entity])
    extra: dict[str, Any] = {}
    fields = ROW_FIELDS[entity]
    for key, value in hashed.items():
        if key == "id":
            continue
        if key in fields:
            if value is not None or key not in values:
                values[key] = _amount_text(value) if key in AMOUNT_FIELDS else value
        else:
            extra[key] = value
    for key in fields:
        values.setdefault(key, None)
    missing = [name for name in REQUIRED_FIELDS[entity] if values[name] is None]
    if missing:
        raise IncompleteRecord(entity, identity, missing)
    values["extra"] = extra or None
    tracked = tuple(_intern(value_text(values[name])) for name in TRACKED_FIELDS[entity])
    return Record(entity, identity, values, content_digest(hashed), tracked)


def _amount_text(value: object) -> str | None:
    # Amounts are decimal strings on the wire; a client may hand them over as Decimal, whose str() is exact.
    return None if value is None else str(value)


def _intern(text: str | None) -> str | None:
    # Tracked values repeat endlessly ("true", "in_stock", common prices): share one copy in the snapshot.
    return None if text is None else sys.intern(text)


def existing_from_row(content_hash: str, removed: bool, tracked: Sequence[object]) -> Existing:
    """A snapshot entry from a stored row's digest, removal mark and tracked columns (in TRACKED order)."""
    return Existing(content_hash, removed, tuple(_intern(value_text(value)) for value in tracked))


def diff_listed(entity: Entity, records: Iterable[Record], snapshot: Mapping[int, Existing]) -> Plan:
    """What to write for records the upstream lists now, given what the mirror holds."""
    plan = Plan(entity)
    names = TRACKED_FIELDS[entity]
    active_index = names.index("is_active")
    for record in records:
        previous = snapshot.get(record.id)
        if previous is None:
            plan.inserts.append(record)
            plan.changes.append(Change(entity, record.id, "added"))
        elif previous.removed:
            plan.restores.append(record)
            plan.changes.append(
                Change(
                    entity,
                    record.id,
                    "restored",
                    "is_active",
                    previous.tracked[active_index],
                    record.tracked[active_index],
                )
            )
            plan.changes.extend(_tracked_changes(entity, record, previous, skip=active_index))
        elif previous.content_hash != record.content_hash:
            plan.updates.append(record)
            plan.changes.extend(_tracked_changes(entity, record, previous))
    return plan


def _tracked_changes(entity: Entity, record: Record, previous: Existing, skip: int = -1) -> list[Change]:
    names = TRACKED_FIELDS[entity]
    return [
        Change(entity, record.id, "changed", names[index], old, new)
        for index, (old, new) in enumerate(zip(previous.tracked, record.tracked, strict=True))
        if index != skip and old != new
    ]


def diff_unlisted(entity: Entity, snapshot: Mapping[int, Existing], listed: Set[int]) -> Plan:
    """Rows the mirror shows as listed whose ids the upstream's complete listing no longer has."""
    plan = Plan(entity)
    active_index = TRACKED_FIELDS[entity].index("is_active")
    for identity, existing in snapshot.items():
        if existing.removed or identity in listed:
            continue
        plan.removals.append(identity)
        plan.changes.append(
            Change(entity, identity, "removed", "is_active", existing.tracked[active_index], "false")
        )
    return plan


def apply_plan(snapshot: Snapshot, plan: Plan) -> None:
    """Bring ``snapshot`` up to date once ``plan`` has been written."""
    for record in (*plan.inserts, *plan.updates, *plan.restores):
        snapshot[record.id] = Existing(record.content_hash, False, record.tracked)
    if plan.removals:
        active_index = TRACKED_FIELDS[plan.entity].index("is_active")
        for identity in plan.removals:
            previous = snapshot[identity]
            tracked = list(previous.tracked)
            tracked[active_index] = "false"
            snapshot[identity] = Existing(previous.content_hash, True, tuple(tracked))


@dataclass(frozen=True, slots=True)
class CategoryRules:
    """Seed 000's category rules (two levels at most; products only on leaf categories) for one listing."""

    parents: Mapping[int, int]
    slugs: Mapping[int, str]
    with_children: frozenset[int]

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> CategoryRules:
        categories = list(records)
        parents = {record.id: int(record.values["parent_id"] or 0) for record in categories}
        slugs = {record.id: str(record.values.get("slug") or "") for record in categories}
        with_children = frozenset(parent for parent in parents.values() if parent != 0)
        return cls(parents, slugs, with_children)

    def category_violations(self) -> list[str]:
        """Categories that break the two-level rule or hang under a category that is not listed."""
        problems = []
        for identity, parent in sorted(self.parents.items()):
            if parent == 0:
                continue
            label = f"category {identity} ({self.slugs[identity]})"
            grandparent = self.parents.get(parent)
            if grandparent is None:
                problems.append(f"{label} has parent {parent}, which is not listed")
            elif grandparent != 0:
                problems.append(
                    f"{label} is more than two levels deep: its parent {parent} is itself a sub-category"
                )
        return problems

    def product_violation(self, product_id: int, category_id: int) -> str | None:
        """Why a product may not sit on ``category_id``, or ``None`` when it may."""
        if category_id not in self.parents:
            return f"product {product_id} is on unknown category {category_id}"
        if category_id in self.with_children:
            return (
                f"product {product_id} is on category {category_id} ({self.slugs[category_id]}), "
                "which is not a leaf"
            )
        return None
