"""An acg-faka commodity's buyer inputs (``widget``) and the form schema a storefront checks before payment.

Each input is ``{cn, name, placeholder, type, regex, error, dict}``: a label, the form field its value is
posted as (top-level, beside the protocol's own fields), a type (text, password, number, select, checkbox,
radio, textarea; ``custom`` is a display-only container), and the seller's pattern with the text the
supplier refuses a non-matching value with. The supplier checks nothing else: a value (a missing one counts
as the empty string) must contain a match of the pattern, searched as PHP's ``preg_match('/<regex>/')``
does: unanchored unless the seller anchored it, no flags.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from procurd.protocol.acgfaka.signing import check_field_name

SCHEMA_LOCALE = "zh-CN"
# Field names the protocol itself posts (or PHP reads specially): an input named so cannot be told apart.
PROTOCOL_FIELDS = frozenset(
    {
        "app_id",
        "app_key",
        "sign",
        "shared_code",
        "sharedCode",
        "code",
        "num",
        "race",
        "sku",
        "card_id",
        "device",
        "contact",
        "password",
        "request_no",
        "coupon",
        "request",
        "tradeNo",
        "item_id",
        "pay_id",
        "page",
        "limit",
        "s",
    }
)
DISPLAY_ONLY = "custom"
_UNESCAPED_SLASH = re.compile(r"(?<!\\)(?:\\\\)*/")
MAX_INPUTS = 50


class WidgetError(ValueError):
    """Buyer inputs the API cannot fill in (the reason names the input)."""


@dataclass(frozen=True, slots=True)
class Widget:
    name: str
    label: str
    type: str
    placeholder: str
    pattern: str  # the seller's PCRE pattern ("" = any value)
    error: str  # what the supplier answers when a value does not match
    options: tuple[tuple[str, str], ...]  # (label, value) for select, checkbox and radio

    @property
    def required(self) -> bool:
        """Whether the supplier refuses an order without this input: its pattern finds no match in ""."""
        if not self.pattern:
            return False
        try:
            return re.search(self.pattern, "") is None
        except re.error:
            return True  # a PCRE construct Python lacks: ask the buyer rather than guess

    def schema(self) -> dict[str, Any]:
        field: dict[str, Any] = {
            "key": self.name,
            "type": self.type,
            "required": self.required,
            "label": {SCHEMA_LOCALE: self.label or self.name},
        }
        if self.placeholder:
            field["placeholder"] = {SCHEMA_LOCALE: self.placeholder}
        if self.pattern:
            field["pattern"] = self.pattern
            field["pattern_syntax"] = "pcre-search"
            field["pattern_error"] = {SCHEMA_LOCALE: self.error}
        if self.options:
            field["options"] = [
                {"label": {SCHEMA_LOCALE: label}, "value": value} for label, value in self.options
            ]
        return field


def _text(entry: Mapping[str, Any], key: str) -> str:
    value = entry.get(key)
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise WidgetError(f"an input's {key} is not text")
    return str(value)


def _options(text: str) -> tuple[tuple[str, str], ...]:
    """``label=value,label=value`` (a bare item is its own label and value)."""
    options = []
    for item in text.split(","):
        if not item:
            continue
        label, separator, value = item.partition("=")
        options.append((label, value if separator else label))
    return tuple(options)


def _decoded(raw: Any) -> list[Any]:
    """The inputs as a list, from the JSON text ``items`` sends or the array ``item`` sends."""
    if raw is None or raw == "" or raw == []:
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            raise WidgetError("the buyer inputs (widget) are not valid JSON") from None
        if raw is None:
            return []
    if isinstance(raw, Mapping):  # PHP writes an array keyed 0..n-1 as a list, any other as an object
        raw = list(raw.values())
    if not isinstance(raw, list):
        raise WidgetError("the buyer inputs (widget) are not a list")
    return raw


def read_widgets(raw: Any) -> tuple[Widget, ...]:
    """The buyer inputs of a commodity; :class:`WidgetError` when the API cannot fill them in."""
    entries = _decoded(raw)
    if len(entries) > MAX_INPUTS:
        raise WidgetError(f"{len(entries)} buyer inputs, more than {MAX_INPUTS}")
    widgets: list[Widget] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise WidgetError("a buyer input is not an object")
        kind = _text(entry, "type") or "text"
        pattern = _text(entry, "regex")
        if kind == DISPLAY_ONLY and not pattern:
            continue  # a container for text: nothing to post
        widget = Widget(
            name=_text(entry, "name"),
            label=_text(entry, "cn"),
            type=kind,
            placeholder=_text(entry, "placeholder"),
            pattern=pattern,
            error=_text(entry, "error"),
            options=_options(_text(entry, "dict")),
        )
        _check(widget)
        widgets.append(widget)
    names = [widget.name for widget in widgets]
    for name in names:
        if names.count(name) > 1:
            raise WidgetError(f"two buyer inputs are named {name!r}")
    return tuple(widgets)


def _check(widget: Widget) -> None:
    label = f"buyer input {widget.label or widget.name!r} ({widget.name!r})"
    problem = check_field_name(widget.name)
    if problem is not None:
        raise WidgetError(f"{label}: {problem}: the supplier would not find its value")
    if widget.name in PROTOCOL_FIELDS:
        raise WidgetError(f"{label}: the protocol posts a field of that name itself")
    if _UNESCAPED_SLASH.search(widget.pattern):
        raise WidgetError(f"{label}: its pattern holds an unescaped '/', so the supplier refuses every value")


def form_schema(widgets: tuple[Widget, ...]) -> dict[str, Any] | None:
    """The ``manual_form_schema`` of these inputs (``None`` when there are none)."""
    if not widgets:
        return None
    return {"fields": [widget.schema() for widget in widgets]}


def input_errors(widgets: tuple[Widget, ...]) -> frozenset[str]:
    """The texts the supplier refuses a non-matching input with (to tell them from other refusals)."""
    return frozenset(widget.error for widget in widgets if widget.pattern)
