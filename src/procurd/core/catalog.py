"""The catalogue diff, free of I/O: upstream records against the mirror's snapshot.

An upstream Category, Product or SKU becomes a :class:`Record`: the values of its mirror row (every seed
field under its own name, anything else under ``extra``) and a digest of what the upstream sent. The
snapshot holds, per mirrored id, that digest, whether the row is marked removed, whether the current pass
saw it listed, and the tracked fields (prices, stock, activity). :func:`diff_listed` says which listed records
to insert, update or restore and :func:`diff_unlisted` which rows to mark removed; both also produce the
change-log entries (values as text).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
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
# Tracked fields holding labels that repeat on every row (kept once in memory, see existing_from_row).
_LABEL_POSITIONS: dict[Entity, tuple[int, ...]] = {
    entity: tuple(index for index, name in enumerate(fields) if name == "stock_status")
    for entity, fields in TRACKED_FIELDS.items()
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


_AMOUNTS: dict[Entity, tuple[str, ...]] = {
    entity: tuple(name for name in fields if name in AMOUNT_FIELDS) for entity, fields in ROW_FIELDS.items()
}
# Keys of an upstream payload that are not extras: the row fields, the key, and a product's SKU list.
_KNOWN_KEYS: dict[Entity, frozenset[str]] = {
    "category": frozenset((*ROW_FIELDS["category"], "id")),
    "product": frozenset((*ROW_FIELDS["product"], "id", "skus")),
    "sku": frozenset((*ROW_FIELDS["sku"], "id")),
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


class Existing(tuple[Any, ...]):
    """What the mirror holds for one id: digest, removal mark, tracked values, and whether this pass saw it.

    A sync keeps one per mirrored row in memory, so it is one flat tuple (digest as 16 bytes) rather than
    an object holding a string and another tuple; the ``listed`` mark replaces a separate set of the ids
    listed during the pass. Tracked values are kept as stored and compared as :func:`value_text`.
    """

    __slots__ = ()

    def __new__(
        cls, content_hash: str, removed: bool, tracked: Iterable[object], *, listed: bool = False
    ) -> Existing:
        return super().__new__(cls, (bytes.fromhex(content_hash), removed, listed, *tracked))

    @property
    def content_hash(self) -> str:
        return str(self[0].hex())

    @property
    def removed(self) -> bool:
        return bool(self[1])

    @property
    def listed(self) -> bool:
        """Whether the upstream listed this id during the current sync pass."""
        return bool(self[2])

    @property
    def tracked(self) -> tuple[object, ...]:
        return self[3:]

    def same_content(self, content_hash: str) -> bool:
        return bool(self[0] == bytes.fromhex(content_hash))

    def as_listed(self) -> Existing:
        return tuple.__new__(Existing, (self[0], self[1], True, *self[3:]))

    def __repr__(self) -> str:
        return (
            f"Existing({self.content_hash!r}, removed={self.removed}, tracked={self.tracked!r}, "
            f"listed={self.listed})"
        )


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

_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def value_text(value: object) -> str | None:
    """How a tracked value is written to the change log: booleans as ``true``/``false``, text unchanged."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def digest_text(text: str, *implied: object) -> str:
    """A 32-hex-digit digest of serialized upstream fields and values implied by where they were listed."""
    digest = hashlib.blake2b(text.encode(), digest_size=16)
    for value in implied:
        digest.update(f"\n{value}".encode())
    return digest.hexdigest()


def content_digest(payload: Mapping[str, Any], *implied: object) -> str:
    """:func:`digest_text` of a payload's canonical JSON (independent of key order)."""
    return digest_text(_CANONICAL_JSON.encode(payload), *implied)


def category_record(payload: Mapping[str, Any], content_hash: str | None = None) -> Record:
    """A Category as the upstream sent it (JSON-like mapping) as a mirror record.

    ``content_hash`` defaults to :func:`content_digest` of ``payload``; a caller that digests the upstream's
    fields another way passes its own, and must do so consistently from one sync to the next.
    """
    return _record("category", payload, content_hash or content_digest(payload))


def product_record(payload: Mapping[str, Any], content_hash: str | None = None) -> Record:
    """A Product's own mirror record (its ``skus`` are left to :func:`sku_record`)."""
    if content_hash is None:
        content_hash = content_digest({key: value for key, value in payload.items() if key != "skus"})
    return _record("product", payload, content_hash)


def sku_record(payload: Mapping[str, Any], product_id: int, content_hash: str | None = None) -> Record:
    """A SKU listed under product ``product_id`` as a mirror record (moving products changes the digest)."""
    return _record("sku", payload, content_hash or content_digest(payload, product_id), product_id)


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
        product = product_record(payload)
    except IncompleteRecord as exc:
        return ListedProduct(identity, category, None, [], sku_ids, (str(exc),))
    skus: list[Record] = []
    problems: list[str] = []
    for sku in sku_payloads:
        try:
            skus.append(sku_record(sku, identity))
        except IncompleteRecord as exc:
            problems.append(str(exc))
    return ListedProduct(identity, category, product, skus, sku_ids, tuple(problems))


def _record(entity: Entity, payload: Mapping[str, Any], digest: str, product_id: int | None = None) -> Record:
    identity = int(payload["id"])
    values = {name: payload.get(name) for name in ROW_FIELDS[entity]}
    if product_id is not None:
        values["product_id"] = product_id
    for name, default in _DEFAULTS[entity].items():
        if values[name] is None:
            values[name] = default
    for name in _AMOUNTS[entity]:
        amount = values[name]
        if amount is not None and type(amount) is not str:
            # Amounts are decimal strings on the wire; a client may hand over a Decimal, whose str() is exact.
            values[name] = str(amount)
    known = _KNOWN_KEYS[entity]
    values["extra"] = {key: value for key, value in payload.items() if key not in known} or None
    missing = [name for name in REQUIRED_FIELDS[entity] if values[name] is None]
    if missing:
        raise IncompleteRecord(entity, identity, missing)
    tracked = tuple(value_text(values[name]) for name in TRACKED_FIELDS[entity])
    return Record(entity, identity, values, digest, tracked)


def existing_from_row(
    entity: Entity, content_hash: str, removed: bool, tracked: Sequence[object], *, listed: bool = False
) -> Existing:
    """A snapshot entry from a digest, removal mark and tracked values (in TRACKED_FIELDS order).

    Tracked values stay as given (compared as :func:`value_text`), except that labels such as stock
    statuses, which repeat on every row, share one copy.
    """
    values = list(tracked)
    for index in _LABEL_POSITIONS[entity]:
        label = values[index]
        if type(label) is str:
            values[index] = sys.intern(label)
    return Existing(content_hash, removed, values, listed=listed)


def needs_write(snapshot: Mapping[int, Existing], identity: int, content_hash: str) -> bool:
    """Whether a listed entity with this digest differs from, or is missing or removed in, the mirror."""
    previous = snapshot.get(identity)
    return previous is None or previous.removed or not previous.same_content(content_hash)


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
                    value_text(previous.tracked[active_index]),
                    record.tracked[active_index],
                )
            )
            plan.changes.extend(_tracked_changes(entity, record, previous, skip=active_index))
        elif not previous.same_content(record.content_hash):
            plan.updates.append(record)
            plan.changes.extend(_tracked_changes(entity, record, previous))
    return plan


def _tracked_changes(entity: Entity, record: Record, previous: Existing, skip: int = -1) -> list[Change]:
    names = TRACKED_FIELDS[entity]
    changes = []
    for index, (stored, new) in enumerate(zip(previous.tracked, record.tracked, strict=True)):
        old = value_text(stored)
        if index != skip and old != new:
            changes.append(Change(entity, record.id, "changed", names[index], old, new))
    return changes


def mark_listed(snapshot: Snapshot, identity: int) -> bool:
    """Record that the upstream lists ``identity`` in this pass; False if it was already marked.

    Ids the mirror does not hold yet are not marked (they become listed entries once written).
    """
    existing = snapshot.get(identity)
    if existing is None:
        return True
    if existing.listed:
        return False
    snapshot[identity] = existing.as_listed()
    return True


def diff_unlisted(entity: Entity, snapshot: Mapping[int, Existing]) -> Plan:
    """Rows the mirror shows as listed that this pass's complete listing did not mark as listed."""
    plan = Plan(entity)
    active_index = TRACKED_FIELDS[entity].index("is_active")
    for identity, existing in snapshot.items():
        if existing.removed or existing.listed:
            continue
        plan.removals.append(identity)
        plan.changes.append(
            Change(
                entity, identity, "removed", "is_active", value_text(existing.tracked[active_index]), "false"
            )
        )
    return plan


def apply_plan(snapshot: Snapshot, plan: Plan) -> None:
    """Bring ``snapshot`` up to date once ``plan`` has been written (written records count as listed)."""
    names = TRACKED_FIELDS[plan.entity]
    for record in (*plan.inserts, *plan.updates, *plan.restores):
        tracked = [record.values[name] for name in names]
        snapshot[record.id] = existing_from_row(plan.entity, record.content_hash, False, tracked, listed=True)
    if plan.removals:
        active_index = TRACKED_FIELDS[plan.entity].index("is_active")
        for identity in plan.removals:
            previous = snapshot[identity]
            tracked = list(previous.tracked)
            tracked[active_index] = "false"
            snapshot[identity] = Existing(previous.content_hash, True, tracked)


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
