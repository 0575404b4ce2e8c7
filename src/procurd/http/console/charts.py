"""Charts as SVG drawn on the server (pure: numbers in, markup out; no script, no inline style).

Each chart is an ``<svg role="img">`` with a ``<title>`` and a ``<desc>`` that say what it shows in words, a
``<title>`` on every bar or point (the browser shows it on hover and a screen reader reads it), and classes
that the console's stylesheet colours (the Content-Security-Policy allows no inline style). The drawing is
sized by its ``viewBox``, 360 units wide: the width of a phone, so its text is never smaller there than the
page's, and on a desktop the stylesheet caps how far it grows.

Amounts are drawn from ``Decimal``; a coordinate is a float, the text beside it is the exact amount.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from html import escape
from typing import Final

WIDTH: Final = 360
HEIGHT: Final = 176
LEFT: Final = 40  # room for the y axis' labels
RIGHT: Final = 8
TOP: Final = 10
BOTTOM: Final = 22  # room for the x axis' labels
PLOT_W: Final = WIDTH - LEFT - RIGHT
PLOT_H: Final = HEIGHT - TOP - BOTTOM
HOVER_AREAS: Final = 28  # at most this many areas of a line answer a hover
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


class Svg(str):
    """Markup that the templates insert as it is (Jinja2 honours ``__html__``); everything in it that came
    from outside was escaped when it was drawn."""

    __slots__ = ()

    def __html__(self) -> str:
        return str(self)


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a chart: its name in the legend and its class in the stylesheet (``c-<kind>``)."""

    label: str
    kind: str


@dataclass(frozen=True, slots=True)
class Point:
    """One bar (or one x position): its label for people, and a value per series (``None``: no value)."""

    label: str
    values: tuple[Decimal | int | None, ...]
    note: str = ""  # more words for the bar's tooltip


@dataclass(frozen=True, slots=True)
class Tick:
    at: int  # the index of the bar (or position) the label stands under
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """A drawn chart and its text equivalent: the key figures beside it and every value in a table."""

    key: str  # hourly | daily | delivery | balance | spend
    title: str
    svg: Svg
    legend: tuple[Series, ...]
    figures: tuple[str, ...]  # sentences with the key figures
    columns: tuple[str, ...] = ()  # the table of every value: its header ...
    rows: tuple[tuple[str, ...], ...] = field(default=())  # ... and its rows

    @property
    def table(self) -> Svg:
        """The table of every value as markup (each cell labelled with its column, for a phone's layout)."""
        labels = [escape(column) for column in self.columns]
        head = "".join(f'<th scope="col">{label}</th>' for label in labels)
        body = "".join(
            "<tr>"
            + "".join(
                f'<td data-label="{label}">{escape(cell)}</td>'
                for label, cell in zip(labels, row, strict=True)
            )
            + "</tr>"
            for row in self.rows
        )
        return Svg(
            f'<table class="list figures-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        )


def element_id(*parts: str) -> str:
    """An id for a chart's ``<title>`` and ``<desc>``, unique per upstream (or account) and chart."""
    return "-".join(_ID_UNSAFE.sub("_", part) or "_" for part in ("chart", *parts))


def nice_ceiling(value: Decimal | float) -> Decimal:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten at or above ``value`` (1 for nothing)."""
    number = Decimal(str(value)) if not isinstance(value, Decimal) else value
    if number <= 0:
        return Decimal(1)
    exponent = math.floor(math.log10(float(number)))
    for step in (Decimal(1), Decimal(2), Decimal("2.5"), Decimal(5), Decimal(10)):
        candidate = step.scaleb(exponent)
        if candidate >= number:
            return candidate.normalize() if candidate >= 1 else candidate
    return Decimal(10).scaleb(exponent)


def number(value: Decimal | int) -> str:
    """A count or amount for a label: ``1,204``, ``12.5``, ``0.25``."""
    if isinstance(value, int):
        return f"{value:,}"
    amount = value.normalize()
    if amount == amount.to_integral_value():
        return f"{int(amount):,}"
    return f"{amount:,f}"


def _f(value: float) -> str:
    return f"{value:.1f}"


def _rect(kind: str, x: float, y: float, width: float, height: float, inner: str = "") -> str:
    shape = f'<rect class="c-{kind}" x="{_f(x)}" y="{_f(y)}" width="{_f(width)}" height="{_f(height)}"'
    return f"{shape}>{inner}</rect>" if inner else f"{shape}/>"


def _line(kind: str, x1: float, y1: float, x2: float, y2: float) -> str:
    return f'<line class="c-{kind}" x1="{_f(x1)}" y1="{_f(y1)}" x2="{_f(x2)}" y2="{_f(y2)}"/>'


def _label(x: float, y: float, text: str, anchor: str = "end", extra: str = "") -> str:
    kind = f"c-label {extra}".strip()
    return f'<text class="{kind}" x="{_f(x)}" y="{_f(y)}" text-anchor="{anchor}">{escape(text)}</text>'


def _polyline(kind: str, points: Sequence[tuple[float, float]]) -> str:
    if len(points) == 1:
        x, y = points[0]
        return f'<circle class="c-{kind}-dot" cx="{_f(x)}" cy="{_f(y)}" r="2"/>'
    coordinates = " ".join(f"{_f(x)},{_f(y)}" for x, y in points)
    return f'<polyline class="c-{kind}" points="{coordinates}"/>'


def _open(title: str, desc: str, ident: str, kind: str) -> list[str]:
    return [
        f'<svg class="chart-svg chart-{kind}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="{ident}-t {ident}-d" xmlns="http://www.w3.org/2000/svg" focusable="false">',
        f'<title id="{ident}-t">{escape(title)}</title>',
        f'<desc id="{ident}-d">{escape(desc)}</desc>',
    ]


def _close(parts: list[str], ticks: Sequence[Tick], slots: int, zero: float) -> Svg:
    parts.append(_line("axis", LEFT, zero, WIDTH - RIGHT, zero))
    slot = PLOT_W / max(slots, 1)
    for tick in ticks:
        x = LEFT + slot * (tick.at + 0.5)
        anchor = "middle"
        if x - LEFT < 18:
            x, anchor = LEFT, "start"
        elif WIDTH - RIGHT - x < 18:
            x, anchor = WIDTH - RIGHT, "end"
        parts.append(_label(x, HEIGHT - 6, tick.label, anchor))
    parts.append("</svg>")
    return Svg("".join(parts))


def _y(value: Decimal | float, low: Decimal | float, high: Decimal | float) -> float:
    span = float(high) - float(low) or 1.0
    return TOP + PLOT_H * (1 - (float(value) - float(low)) / span)


def _y_axis(parts: list[str], low: Decimal, high: Decimal) -> None:
    """Grid lines with their labels: 0, half the top and the top, or the bottom, 0 and the top."""
    marks = [Decimal(0), high / 2, high] if low >= 0 else [low, Decimal(0), high]
    for value in marks:
        y = _y(value, low, high)
        parts += [_line("grid", LEFT, y, WIDTH - RIGHT, y), _label(LEFT - 4, y + 4, number(value))]


def _tooltip(point: Point, series: Sequence[Series], unit: str = "") -> str:
    values = ", ".join(
        f"{s.label} {number(v)}{unit}" for s, v in zip(series, point.values, strict=True) if v is not None
    )
    words = f"{point.label}: {values}" if values else f"{point.label}: nothing"
    return f"<title>{escape(words + ('; ' + point.note if point.note else ''))}</title>"


def stacked_bars(
    ident: str,
    title: str,
    desc: str,
    series: Sequence[Series],
    points: Sequence[Point],
    ticks: Sequence[Tick],
) -> Svg:
    """Bars of ``points``, each stacked from its series' values (the first series at the bottom)."""
    totals = [sum((v for v in p.values if v is not None), Decimal(0)) for p in points]
    high = nice_ceiling(max(totals, default=Decimal(0)))
    top_value = float(high)
    parts = _open(title, desc, ident, "bars")
    _y_axis(parts, Decimal(0), high)
    slot = PLOT_W / max(len(points), 1)
    width = max(slot * 0.78, 1.0)
    for index, point in enumerate(points):
        x = LEFT + slot * index + (slot - width) / 2
        parts.append("<g>" + _tooltip(point, series))
        base = 0.0
        for kind, value in zip((s.kind for s in series), point.values, strict=True):
            if value:
                top, bottom = (
                    TOP + PLOT_H * (1 - (base + float(value)) / top_value),
                    TOP + PLOT_H * (1 - base / top_value),
                )
                parts.append(_rect(kind, x, top, width, max(bottom - top, 0.5)))
                base += float(value)
        if not base:  # an empty slot still answers a hover
            parts.append(_rect("empty", x, TOP, width, PLOT_H))
        parts.append("</g>")
    return _close(parts, ticks, len(points), TOP + PLOT_H)


# Seconds on a logarithmic axis, with the labels people read durations in.
_DURATION_TICKS: Final = ((1, "1 s"), (10, "10 s"), (60, "1 min"), (600, "10 min"), (3600, "1 h"),
                          (21600, "6 h"), (86400, "1 d"), (604800, "7 d"))  # fmt: skip


_LOG_BOTTOM: Final = 0.4  # seconds at the axis: a delivery within 1 s still shows a bar


def _log_y(seconds: float, top: float) -> float:
    span = math.log10(top) - math.log10(_LOG_BOTTOM)
    return TOP + PLOT_H * (1 - (math.log10(max(seconds, _LOG_BOTTOM)) - math.log10(_LOG_BOTTOM)) / span)


def range_bars(
    ident: str,
    title: str,
    desc: str,
    series: Sequence[Series],
    points: Sequence[Point],
    ticks: Sequence[Tick],
    unit: str = " s",
) -> Svg:
    """Durations per slot on a logarithmic axis: the second series' value as a wide light bar (p95), the
    first's as a narrow dark one inside it (p50)."""
    longest = max((float(v) for p in points for v in p.values if v is not None), default=60.0)
    top = max(float(next((s for s, _ in _DURATION_TICKS if s >= longest * 1.5), 604800)), 60.0)
    parts = _open(title, desc, ident, "range")
    for seconds, label in _DURATION_TICKS:
        if seconds <= top:
            y = _log_y(seconds, top)
            parts += [_line("grid", LEFT, y, WIDTH - RIGHT, y), _label(LEFT - 4, y + 4, label)]
    slot = PLOT_W / max(len(points), 1)
    bottom = TOP + PLOT_H
    kinds = [s.kind for s in series]
    for index, point in enumerate(points):
        parts.append("<g>" + _tooltip(point, series, unit))
        drawn = False
        for position in reversed(range(len(kinds))):  # the widest (last) first, the narrow one over it
            value = point.values[position]
            if value is None:
                continue
            width = slot * (0.78 if position else 0.42)
            height = max(bottom - _log_y(float(value), top), 1.5)
            parts.append(
                _rect(
                    kinds[position], LEFT + slot * index + (slot - width) / 2, bottom - height, width, height
                )
            )
            drawn = True
        if not drawn:
            parts.append(_rect("empty", LEFT + slot * index, TOP, slot, PLOT_H))
        parts.append("</g>")
    return _close(parts, ticks, len(points), bottom)


@dataclass(frozen=True, slots=True)
class Projection:
    """A dashed line from the last value at ``start`` (a slot index, fractional) down to zero at ``end``
    (beyond the last slot: it is cut at the chart's edge); ``mark`` is a slot index for a vertical marker
    (the alert's horizon), with its label."""

    start: float
    value: Decimal
    end: float
    mark: float | None = None
    mark_label: str = ""


def step_line(
    ident: str,
    title: str,
    desc: str,
    series: Series,
    points: Sequence[Point],
    ticks: Sequence[Tick],
    slots: int,
    projection: Projection | None = None,
    now: float | None = None,
) -> Svg:
    """A value held from one point to the next (a balance), over ``slots`` positions of which ``points``
    fill the first ones, up to ``now`` (a fractional slot index); a projection may run on into the rest."""
    values = [v for p in points for v in p.values[:1] if v is not None]
    high = nice_ceiling(max([*values, projection.value if projection else Decimal(0)], default=Decimal(0)))
    lowest = min([Decimal(0), *values])
    low = -nice_ceiling(-lowest) if lowest < 0 else Decimal(0)
    parts = _open(title, desc, ident, "line")
    _y_axis(parts, low, high)
    slot = PLOT_W / max(slots, 1)
    right = WIDTH - RIGHT
    end = LEFT + slot * now if now is not None else right
    # Runs of the same value: one step of the line and one area that answers a hover, each.
    runs: list[tuple[int, int, Point]] = []  # first index, last index, the point that began the run
    for index, point in enumerate(points):
        if runs and runs[-1][1] == index - 1 and runs[-1][2].values[0] == point.values[0]:
            runs[-1] = (runs[-1][0], index, runs[-1][2])
        elif point.values[0] is not None:
            runs.append((index, index, point))
    path: list[tuple[float, float]] = []
    for number_of_run, (first, last, point) in enumerate(runs):
        y = _y(point.values[0] or 0, low, high)
        if path and runs[number_of_run - 1][1] != first - 1:  # a gap: the line stops
            parts.append(_polyline(series.kind, path))
            path = []
        path += [(LEFT + slot * first, y), (min(LEFT + slot * (last + 1), end), y)]
    if path:
        parts.append(_polyline(series.kind, path))
    if len(runs) > HOVER_AREAS:  # many changes: an area per block of slots, with its last value
        size = -(-len(points) // HOVER_AREAS)
        blocks = [(first, min(first + size, len(points)) - 1) for first in range(0, len(points), size)]
        runs = [(first, last, points[last]) for first, last in blocks if points[last].values[0] is not None]
    for first, last, point in runs:
        width = min(LEFT + slot * (last + 1), end) - (LEFT + slot * first)
        label = point.label if first == last else f"{points[first].label} to {points[last].label}"
        held = Point(label, point.values, point.note)
        parts.append(
            _rect("hover", LEFT + slot * first, TOP, max(width, 1), PLOT_H, _tooltip(held, (series,)))
        )
    if now is not None:
        parts.append(_line("now", end, TOP, end, TOP + PLOT_H))
    if projection is not None:
        x0, y0 = LEFT + slot * projection.start, _y(projection.value, low, high)
        x1, y1 = LEFT + slot * projection.end, _y(0, low, high)
        if x1 > right:  # cut where the chart ends
            x1, y1 = right, y0 + (y1 - y0) * (right - x0) / (x1 - x0)
        parts.append(_line("projection", x0, y0, x1, y1))
        if projection.mark is not None and LEFT + slot * projection.mark <= right:
            x = LEFT + slot * projection.mark
            parts += [_line("mark", x, TOP, x, TOP + PLOT_H), _label(x - 2, TOP + 10, projection.mark_label)]
    return _close(parts, ticks, slots, _y(0, low, high))


def bars_and_line(
    ident: str,
    title: str,
    desc: str,
    bars: Series,
    line: Series,
    points: Sequence[Point],
    ticks: Sequence[Tick],
) -> Svg:
    """A bar per point (its first value) and a line through the points' second values (gaps where there is
    none); the axis takes in negative values of the line."""
    firsts = [p.values[0] for p in points if p.values[0] is not None]
    seconds = [p.values[1] for p in points if p.values[1] is not None]
    high = nice_ceiling(max([*firsts, *seconds], default=Decimal(0)))
    lowest = min([Decimal(0), *seconds])
    low = -nice_ceiling(-lowest) if lowest < 0 else Decimal(0)
    parts = _open(title, desc, ident, "combo")
    _y_axis(parts, low, high)
    slot = PLOT_W / max(len(points), 1)
    width = max(slot * 0.7, 1.0)
    zero = _y(0, low, high)
    path: list[tuple[float, float]] = []
    lines: list[list[tuple[float, float]]] = []
    for index, point in enumerate(points):
        x = LEFT + slot * index + (slot - width) / 2
        parts.append("<g>" + _tooltip(point, (bars, line)))
        value = point.values[0]
        if value:
            y = _y(value, low, high)
            parts.append(_rect(bars.kind, x, min(y, zero), width, max(abs(zero - y), 0.5)))
        else:
            parts.append(_rect("empty", x, TOP, width, PLOT_H))
        parts.append("</g>")
        second = point.values[1]
        if second is None:
            if path:
                lines.append(path)
            path = []
        else:
            path.append((LEFT + slot * (index + 0.5), _y(second, low, high)))
    if path:
        lines.append(path)
    parts += [_polyline(line.kind, drawn) for drawn in lines]
    return _close(parts, ticks, len(points), zero)
