"""The catalogue diff, free of I/O: upstream records against the mirror's snapshot.

An upstream Category, Product or SKU, as decoded from the upstream's JSON, becomes a :class:`Record`: the
values of its mirror row (every seed field under its own name, anything else under ``extra``) and a digest
of what the upstream sent. A :class:`Snapshot` holds, per mirrored id, that digest, whether the row is marked
removed and whether the current pass saw it listed. :func:`diff_listed` says which listed records to insert,
update or restore and :func:`diff_unlisted` which rows to mark removed; :func:`log_changes` then writes the
change-log entries from the tracked values (prices, stock, activity) the mirror held before.

Also here: which kind of pass to run (:func:`choose_pass`), how to recognise an upstream that ignores
``updated_after`` (:func:`older_than_asked`), and when a pass would remove or take off sale too much
(:func:`removal_guard`, :func:`deactivated`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Final, Literal

import orjson

Entity = Literal["category", "product", "sku"]
ChangeKind = Literal["added", "changed", "removed", "restored"]
PassKind = Literal["full", "incremental"]
IncrementalMode = Literal["auto", "on", "off"]
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

# What a scalar column accepts; JSON columns take any JSON value. Lengths are the columns' own.
_INTEGER, _BOOLEAN, _TEXT, _AMOUNT, _JSON = range(5)
_INTEGER_FIELDS = frozenset({"parent_id", "sort_order", "category_id", "stock_quantity", "product_id"})
_TEXT_LIMITS = {
    "slug": 255,
    "icon": 1_000_000,
    "sku_code": 255,
    "fulfillment_type": 16,
    "stock_status": 16,
    "created_at": 64,
    "updated_at": 64,
}
_AMOUNT_MAX_CHARS = 40
_AMOUNT_TEXT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_BIGINT_MIN, _BIGINT_MAX = -(2**63), 2**63 - 1


def _kind(name: str) -> int:
    if name in _INTEGER_FIELDS:
        return _INTEGER
    if name == "is_active":
        return _BOOLEAN
    if name in AMOUNT_FIELDS:
        return _AMOUNT
    if name in _TEXT_LIMITS:
        return _TEXT
    return _JSON


_NO_DEFAULT: Final = object()
_COLUMNS: dict[Entity, tuple[tuple[str, int, int, object], ...]] = {
    entity: tuple(
        (name, _kind(name), _TEXT_LIMITS.get(name, 0), _DEFAULTS[entity].get(name, _NO_DEFAULT))
        for name in fields
        if name != "product_id"
    )
    for entity, fields in ROW_FIELDS.items()
}
# Keys of an upstream payload that are not extras: the row fields, the key, and a product's SKU list.
_KNOWN_KEYS: dict[Entity, frozenset[str]] = {
    "category": frozenset((*ROW_FIELDS["category"], "id")),
    "product": frozenset((*ROW_FIELDS["product"], "id", "skus")),
    "sku": frozenset((*ROW_FIELDS["sku"], "id")),
}


class IncompleteRecord(ValueError):
    """An upstream record lacks a field the mirror cannot do without, or sends one it cannot store."""

    def __init__(self, entity: Entity, identity: int, reason: str) -> None:
        self.entity = entity
        self.identity = identity
        self.reason = reason
        super().__init__(f"{entity} {identity} {reason}: not mirrored")


@dataclass(frozen=True, slots=True)
class Record:
    """One upstream entity as a mirror row: ``values`` holds every row field plus ``extra``."""

    entity: Entity
    id: int
    values: dict[str, Any]
    digest: bytes

    @property
    def content_hash(self) -> str:
        return self.digest.hex()

    @property
    def tracked(self) -> tuple[str | None, ...]:
        """The tracked fields as change-log text, in TRACKED_FIELDS order."""
        return tuple(value_text(self.values[name]) for name in TRACKED_FIELDS[self.entity])


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
        """Entities listed for the first time."""
        return len(self.inserts)

    @property
    def restored(self) -> int:
        """Entities marked removed earlier and listed again."""
        return len(self.restores)

    @property
    def changed(self) -> int:
        return len(self.updates)

    @property
    def removed(self) -> int:
        return len(self.removals)

    def known_ids(self) -> list[int]:
        """Ids whose previous tracked values the change log needs (every write but an insert)."""
        return [
            *(record.id for record in self.updates),
            *(record.id for record in self.restores),
            *self.removals,
        ]


_REMOVED: Final = 1
_LISTED: Final = 2
DIGEST_BYTES: Final = 16


class Snapshot:
    """What the mirror holds of one entity: per id, the digest of its row and whether it is marked removed,
    plus whether the current pass saw it listed.

    A sync keeps one entry per mirrored row in memory, so an entry is one 17-byte ``bytes`` (digest and a
    state byte) rather than an object; the change log's old values are read from the database only for the
    rows a pass rewrites.
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, bytes] = {}

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[int, str, object]]) -> Snapshot:
        """A snapshot of mirrored rows given as (id, hex digest, removed)."""
        snapshot = cls()
        snapshot._entries = {
            identity: bytes.fromhex(content_hash + ("01" if removed else "00"))
            for identity, content_hash, removed in rows
        }
        return snapshot

    def load(self, identity: int, digest: bytes, removed: bool) -> None:
        """Add a mirrored row (as the database holds it at the start of a pass)."""
        self._entries[identity] = digest + (b"\x01" if removed else b"\x00")

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, identity: object) -> bool:
        return identity in self._entries

    def ids(self) -> list[int]:
        return list(self._entries)

    def digest(self, identity: int) -> bytes | None:
        entry = self._entries.get(identity)
        return None if entry is None else entry[:DIGEST_BYTES]

    def removed(self, identity: int) -> bool:
        entry = self._entries.get(identity)
        return entry is not None and bool(entry[DIGEST_BYTES] & _REMOVED)

    def live(self, identity: int) -> bool:
        """Whether the mirror holds this id and does not mark it removed."""
        entry = self._entries.get(identity)
        return entry is not None and not entry[DIGEST_BYTES] & _REMOVED

    def listed(self, identity: int) -> bool:
        """Whether the upstream listed this id during the current pass."""
        entry = self._entries.get(identity)
        return entry is not None and bool(entry[DIGEST_BYTES] & _LISTED)

    def needs_write(self, identity: int, digest: bytes) -> bool:
        """Whether a listed entity with this digest is missing, removed, or different in the mirror."""
        entry = self._entries.get(identity)
        return entry is None or bool(entry[DIGEST_BYTES] & _REMOVED) or not entry.startswith(digest)

    def mark_listed(self, identity: int) -> bool:
        """Record that the upstream lists ``identity`` in this pass; False if it was already marked.

        Ids the mirror does not hold yet are not marked (they become listed entries once written).
        """
        entry = self._entries.get(identity)
        if entry is None:
            return True
        state = entry[DIGEST_BYTES]
        if state & _LISTED:
            return False
        self._entries[identity] = entry[:DIGEST_BYTES] + bytes((state | _LISTED,))
        return True

    def store(self, identity: int, digest: bytes) -> None:
        """The row was written from this pass's listing: live, listed, with this digest."""
        self._entries[identity] = digest + bytes((_LISTED,))

    def mark_removed(self, identity: int) -> None:
        entry = self._entries[identity]
        self._entries[identity] = entry[:DIGEST_BYTES] + bytes((entry[DIGEST_BYTES] | _REMOVED,))

    def live_count(self) -> int:
        """Rows not marked removed."""
        return sum(1 for entry in self._entries.values() if not entry[DIGEST_BYTES] & _REMOVED)

    def unlisted(self) -> list[int]:
        """Live rows the current pass did not see listed."""
        return [
            identity
            for identity, entry in self._entries.items()
            if not entry[DIGEST_BYTES] & (_REMOVED | _LISTED)
        ]


def _exact_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def digest_of(payload: Any, *implied: object) -> bytes:
    """A 16-byte digest of decoded upstream JSON (independent of key order) and of values implied by
    where it was listed (a SKU's product). Raises TypeError for values JSON cannot hold."""
    text = orjson.dumps(payload, default=_exact_default, option=orjson.OPT_SORT_KEYS)
    if implied:
        text += ("\n" + "\n".join(map(str, implied))).encode()
    return hashlib.blake2b(text, digest_size=DIGEST_BYTES).digest()


def product_digest(payload: Mapping[str, Any]) -> bytes:
    """The digest of a product as listed, its SKUs included: when it matches the mirror's, neither the
    product nor any of its SKUs needs a closer look."""
    return digest_of(payload)


def sku_digest(payload: Mapping[str, Any], product_id: int) -> bytes:
    """The digest of a SKU listed under product ``product_id`` (moving it to another product changes it)."""
    return digest_of(payload, product_id)


def value_text(value: object) -> str | None:
    """How a tracked value is written to the change log: booleans as ``true``/``false``, text unchanged."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def category_record(payload: Mapping[str, Any], digest: bytes | None = None) -> Record:
    """A Category as the upstream sent it (decoded JSON) as a mirror record."""
    return _record("category", payload, digest or digest_of(payload))


def product_record(payload: Mapping[str, Any], digest: bytes | None = None) -> Record:
    """A Product's own mirror record (its ``skus`` are left to :func:`sku_record`)."""
    return _record("product", payload, digest or product_digest(payload))


def sku_record(payload: Mapping[str, Any], product_id: int, digest: bytes | None = None) -> Record:
    """A SKU listed under product ``product_id`` as a mirror record."""
    return _record("sku", payload, digest or sku_digest(payload, product_id), product_id)


def _amount_text(value: object) -> str | None:
    """An amount as exact decimal text, or None when it is not one."""
    if type(value) is str:
        text = value
    elif type(value) is int:
        text = str(value)
    elif isinstance(value, Decimal) and value.is_finite():
        text = format(value, "f")
    else:
        return None
    if len(text) > _AMOUNT_MAX_CHARS or _AMOUNT_TEXT.fullmatch(text) is None:
        return None
    return text


def _record(
    entity: Entity, payload: Mapping[str, Any], digest: bytes, product_id: int | None = None
) -> Record:
    identity = int(payload["id"])
    values: dict[str, Any] = {} if product_id is None else {"product_id": product_id}
    missing: list[str] = []
    for name, kind, limit, default in _COLUMNS[entity]:
        value = payload.get(name)
        if value is None:
            if default is not _NO_DEFAULT:
                value = default
            elif name in REQUIRED_FIELDS[entity]:
                missing.append(name)
        elif kind == _TEXT:
            if type(value) is not str or len(value) > limit:
                raise IncompleteRecord(entity, identity, f"has a {name} that is not text of up to {limit}")
        elif kind == _AMOUNT:
            amount = _amount_text(value)
            if amount is None:
                raise IncompleteRecord(entity, identity, f"has a {name} that is not a decimal amount")
            value = amount
        elif kind == _INTEGER:
            if type(value) is not int or not _BIGINT_MIN <= value <= _BIGINT_MAX:
                raise IncompleteRecord(entity, identity, f"has a {name} that is not an integer")
        elif kind == _BOOLEAN and type(value) is not bool:
            raise IncompleteRecord(entity, identity, f"has an {name} that is not true or false")
        values[name] = value
    if missing:
        raise IncompleteRecord(entity, identity, f"lacks {', '.join(missing)}")
    known = _KNOWN_KEYS[entity]
    values["extra"] = {key: value for key, value in payload.items() if key not in known} or None
    return Record(entity, identity, values, digest)


def diff_listed(entity: Entity, records: Iterable[Record], snapshot: Snapshot) -> Plan:
    """Which listed records to insert, update or restore, given what the mirror holds."""
    plan = Plan(entity)
    for record in records:
        if record.id not in snapshot:
            plan.inserts.append(record)
        elif snapshot.removed(record.id):
            plan.restores.append(record)
        elif snapshot.needs_write(record.id, record.digest):
            plan.updates.append(record)
    return plan


def diff_unlisted(entity: Entity, snapshot: Snapshot) -> Plan:
    """Rows the mirror shows as live that this pass's complete listing did not mark as listed."""
    plan = Plan(entity)
    plan.removals.extend(snapshot.unlisted())
    return plan


def log_changes(
    plan: Plan, previous: Mapping[int, Sequence[object]], *, log_additions: bool = True
) -> list[Change]:
    """Fill ``plan.changes`` from the tracked values the mirror held before (TRACKED_FIELDS order, as
    stored) for the ids of :meth:`Plan.known_ids`; returns the changes.

    ``log_additions`` false leaves out the ``added`` entries (the first pass of an upstream: a storefront
    loads the tables themselves, not thousands of additions).
    """
    entity = plan.entity
    names = TRACKED_FIELDS[entity]
    active = names.index("is_active")
    changes = plan.changes
    if log_additions:
        changes.extend(Change(entity, record.id, "added") for record in plan.inserts)
    for record in plan.restores:
        old = _as_text(previous.get(record.id), len(names))
        new = record.tracked
        changes.append(Change(entity, record.id, "restored", "is_active", old[active], new[active]))
        changes.extend(_tracked_changes(entity, record.id, old, new, skip=active))
    for record in plan.updates:
        changes.extend(
            _tracked_changes(entity, record.id, _as_text(previous.get(record.id), len(names)), record.tracked)
        )
    for identity in plan.removals:
        old = _as_text(previous.get(identity), len(names))
        changes.append(Change(entity, identity, "removed", "is_active", old[active], "false"))
    return changes


def _as_text(values: Sequence[object] | None, count: int) -> tuple[str | None, ...]:
    if values is None:
        return (None,) * count
    return tuple(value_text(value) for value in values)


def _tracked_changes(
    entity: Entity, identity: int, old: Sequence[str | None], new: Sequence[str | None], skip: int = -1
) -> list[Change]:
    names = TRACKED_FIELDS[entity]
    return [
        Change(entity, identity, "changed", names[index], before, after)
        for index, (before, after) in enumerate(zip(old, new, strict=True))
        if index != skip and before != after
    ]


def apply_plan(snapshot: Snapshot, plan: Plan) -> None:
    """Bring ``snapshot`` up to date once ``plan`` has been written (written records count as listed)."""
    for records in (plan.inserts, plan.updates, plan.restores):
        for record in records:
            snapshot.store(record.id, record.digest)
    for identity in plan.removals:
        snapshot.mark_removed(identity)


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


# --- which pass, and when the upstream ignores updated_after --------------------------------------------

INCREMENTAL_OVERLAP: Final = timedelta(seconds=120)
"""How far an incremental pass reaches back before the start of the last complete pass: more than the
60 seconds of clock difference a signed request tolerates, plus products changed while that pass ran."""


@dataclass(frozen=True, slots=True)
class PassHistory:
    """What earlier passes of one upstream tell the next one (start times of passes that completed)."""

    last_complete_at: datetime | None = None
    last_full_at: datetime | None = None
    ignored_updated_after_at: datetime | None = None
    last_run_id: int | None = None
    """The newest run of the upstream, whatever its status (a pass that sees a newer one than it left knows
    that another pass ran in between)."""


@dataclass(frozen=True, slots=True)
class PassPlan:
    kind: PassKind
    updated_after: datetime | None
    reason: str


def choose_pass(
    history: PassHistory,
    now: datetime,
    *,
    mode: IncrementalMode,
    full_interval: timedelta,
    force_full: bool = False,
) -> PassPlan:
    """Full or incremental, and from when: a full pass when asked, when incremental sync is off, when no
    full pass completed within ``full_interval``, or (``auto``) when the upstream was seen ignoring
    ``updated_after`` within that interval; otherwise the products updated since the last complete pass
    began, less :data:`INCREMENTAL_OVERLAP`."""
    if force_full:
        return PassPlan("full", None, "a full pass was asked for")
    if mode == "off":
        return PassPlan("full", None, "incremental sync is off")
    if history.last_full_at is None or history.last_complete_at is None:
        return PassPlan("full", None, "no full pass has completed yet")
    if now - history.last_full_at >= full_interval:
        return PassPlan("full", None, "the last full pass is older than full_sync_interval_seconds")
    ignored = history.ignored_updated_after_at
    if mode == "auto" and ignored is not None and now - ignored < full_interval:
        return PassPlan("full", None, "the upstream ignored updated_after recently")
    since = history.last_complete_at - INCREMENTAL_OVERLAP
    return PassPlan("incremental", since, "between full passes")


def rfc3339(moment: datetime) -> str:
    """``2026-11-23T15:27:29Z``: UTC, whole seconds (rounded down, so nothing at the boundary is missed)."""
    return moment.astimezone(UTC).replace(microsecond=0, tzinfo=None).isoformat() + "Z"


def _parse_time(text: object) -> datetime | None:
    if type(text) is not str:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def older_than_asked(items: Iterable[Mapping[str, Any]], updated_after: datetime) -> int | None:
    """The id of a listed product last updated before ``updated_after`` (proof that the upstream did not
    filter), or None. Products without a readable ``updated_at`` with its offset prove nothing."""
    floor = updated_after.replace(microsecond=0)
    for item in items:
        moment = _parse_time(item.get("updated_at"))
        if moment is not None and moment < floor:
            return int(item["id"])
    return None


def total_suggests_full_listing(total: int, live_products: int, page_size: int) -> bool:
    """An incremental answer as long as the whole catalogue (more than one page of it) looks unfiltered."""
    return live_products > page_size and total >= live_products


@dataclass(frozen=True, slots=True)
class RemovalGuard:
    blocked: bool
    reason: str | None


def removal_guard(
    *,
    products_removed: int,
    live_products: int,
    total_listed: int | None,
    max_fraction: float,
    allowed: bool,
    products_deactivated: int = 0,
) -> RemovalGuard:
    """Whether a complete pass may apply its removals and deactivations (products listed inactive that the
    mirror holds on sale): not when together they would take more than ``max_fraction`` of the live products
    off sale, or any when the upstream lists none (``total_listed`` 0: a full pass's listing; ``None`` for an
    incremental pass, whose listing holds only what changed), unless ``allowed``."""
    affected = products_removed + products_deactivated
    if affected == 0 or live_products == 0:
        return RemovalGuard(False, None)
    share = affected / live_products
    if total_listed == 0:
        why = f"the upstream lists no products but the mirror has {live_products} live"
    elif share > max_fraction:
        if products_deactivated == 0:
            what = f"remove {products_removed}"
        elif products_removed == 0:
            what = f"take {products_deactivated}"
        else:
            what = f"remove {products_removed} and take {products_deactivated} more"
        off_sale = "" if products_deactivated == 0 else " off sale"
        why = (
            f"it would {what} of {live_products} live products{off_sale} ({share:.0%}, more than "
            f"max_removed_fraction {max_fraction:g})"
        )
    else:
        return RemovalGuard(False, None)
    if allowed:
        return RemovalGuard(False, f"{why}; applied because mass removal was allowed")
    return RemovalGuard(
        True,
        f"{why}: nothing was removed or taken off sale; after checking the upstream, run "
        "`procurd catalog sync --full --allow-mass-removal`",
    )


def deactivated(previous: Mapping[int, Sequence[object]]) -> list[int]:
    """The products a pass lists inactive that the mirror holds active: ``previous`` maps each product to its
    tracked values as stored (TRACKED_FIELDS order); a product the mirror does not hold is none of them."""
    active = TRACKED_FIELDS["product"].index("is_active")
    return sorted(identity for identity, values in previous.items() if values[active] in (True, 1))
