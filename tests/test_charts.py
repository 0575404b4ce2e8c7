"""The console's charts as drawn (``procurd.http.console.charts``, pure): well-formed SVG named for a screen
reader, text from outside escaped, no inline style, and geometry that stays inside the drawing."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from decimal import Decimal

from procurd.http.console.charts import (
    HEIGHT,
    WIDTH,
    Point,
    Projection,
    Series,
    Tick,
    bars_and_line,
    element_id,
    nice_ceiling,
    number,
    range_bars,
    stacked_bars,
    step_line,
)

SVG = "{http://www.w3.org/2000/svg}"
OUTCOMES = (Series("delivered", "delivered"), Series("exception", "exception"))


def parsed(svg: str) -> ET.Element:
    assert "style=" not in svg  # the Content-Security-Policy allows no inline style: classes colour it
    return ET.fromstring(svg)  # noqa: S314 (procurd's own drawing)


def named(root: ET.Element) -> tuple[str, str]:
    """The title and description an ``aria-labelledby`` names, as a screen reader reads them."""
    title_id, desc_id = root.attrib["aria-labelledby"].split()
    found = {element.attrib.get("id"): element.text or "" for element in root}
    return found[title_id], found[desc_id]


def test_stacked_bars_are_an_image_with_its_title_description_and_a_tooltip_per_bar() -> None:
    """Each point is a group with a tooltip and a rectangle per non-zero value, stacked from the axis up to
    a round top (10 for a total of 7); heights follow the values."""
    points = [Point("13:00 UTC", (5, 2)), Point("14:00 UTC", (0, 0)), Point("15:00 UTC", (1, None))]
    svg = stacked_bars("chart-main-hourly", "Per hour", "Seven in all", OUTCOMES, points, [Tick(0, "13:00")])
    root = parsed(svg)
    assert (root.attrib["role"], root.attrib["viewBox"]) == ("img", f"0 0 {WIDTH} {HEIGHT}")
    assert named(root) == ("Per hour", "Seven in all")
    groups = root.findall(f"{SVG}g")
    assert [g.findtext(f"{SVG}title") for g in groups] == [
        "13:00 UTC: delivered 5, exception 2",
        "14:00 UTC: delivered 0, exception 0",
        "15:00 UTC: delivered 1",
    ]
    first = list(groups[0].findall(f"{SVG}rect"))
    assert [rect.attrib["class"] for rect in first] == ["c-delivered", "c-exception"]
    heights = [float(rect.attrib["height"]) for rect in first]
    assert abs(heights[0] / heights[1] - 2.5) < 0.05
    assert [rect.attrib["class"] for rect in groups[1].findall(f"{SVG}rect")] == ["c-empty"]
    labels = [text.text for text in root.iter(f"{SVG}text")]
    assert labels[:3] == ["0", "5", "10"]  # the axis: 0, half the top, the top


def test_text_from_outside_is_escaped_and_ids_are_safe() -> None:
    """An upstream's name with markup in it stays text in the title and cannot break the element ids."""
    ident = element_id('<script>"main"</script>', "hourly")
    assert re.fullmatch(r"[A-Za-z0-9_-]+", ident)
    title = 'Pulse of <script>alert("x")</script> & co'
    svg = stacked_bars(ident, title, "d", OUTCOMES, [Point("<b>", (1, 1))], [])
    assert "<script>" not in svg
    root = parsed(svg)
    assert named(root)[0] == title
    assert root.find(f"{SVG}g/{SVG}title") is not None


def test_durations_are_drawn_on_a_logarithmic_axis() -> None:
    """p95 wide and light, p50 narrow and dark over it; a longer time is a taller bar; the axis is labelled
    in seconds, minutes, hours."""
    series = (Series("p50", "p50"), Series("p95", "p95"))
    points = [
        Point("a", (Decimal(1), Decimal(60))),
        Point("b", (Decimal(600), Decimal(3600))),
        Point("c", (None, None)),
    ]
    root = parsed(range_bars("x", "t", "d", series, points, []))
    a, b, c = root.findall(f"{SVG}g")
    a95, a50 = a.findall(f"{SVG}rect")
    assert (a95.attrib["class"], a50.attrib["class"]) == ("c-p95", "c-p50")
    assert float(a95.attrib["width"]) > float(a50.attrib["width"])
    assert float(b.findall(f"{SVG}rect")[1].attrib["height"]) > float(a50.attrib["height"])
    assert [rect.attrib["class"] for rect in c.findall(f"{SVG}rect")] == ["c-empty"]
    assert {"1 s", "1 min", "1 h"} <= {text.text for text in root.iter(f"{SVG}text")}


def test_a_balance_line_with_its_runway_cut_at_the_edge() -> None:
    """Equal hours make one step and one hover area; the runway's dashed line starts at now and, running past
    the chart, ends at its right edge, above zero; the alert's mark is drawn where it falls."""
    values = [Decimal(100)] * 3 + [Decimal(80)] * 3
    points = [Point(f"h{index}", (value,)) for index, value in enumerate(values)]
    projection = Projection(6.0, Decimal(80), 40.0, mark=8.0, mark_label="alert: 2 h")
    root = parsed(step_line("x", "t", "d", Series("balance", "balance"), points, [], 12, projection, 6.0))
    hovers = [rect for rect in root.iter(f"{SVG}rect") if rect.attrib["class"] == "c-hover"]
    assert [hover.findtext(f"{SVG}title") for hover in hovers] == [
        "h0 to h2: balance 100",
        "h3 to h5: balance 80",
    ]
    [line] = [line for line in root.iter(f"{SVG}line") if line.attrib["class"] == "c-projection"]
    assert float(line.attrib["x2"]) <= WIDTH
    [axis] = [line for line in root.iter(f"{SVG}line") if line.attrib["class"] == "c-axis"]
    assert float(line.attrib["y2"]) < float(axis.attrib["y1"])  # not yet at zero where the chart ends
    assert any(line.attrib["class"] == "c-mark" for line in root.iter(f"{SVG}line"))


def test_spend_bars_and_a_negative_margin() -> None:
    """A negative margin takes the axis below zero; days without a margin break the line."""
    points = [
        Point("1 Nov", (Decimal("100.00"), Decimal("-12.50"))),
        Point("2 Nov", (Decimal("80.00"), None)),
        Point("3 Nov", (Decimal("90.00"), Decimal("15.00"))),
    ]
    root = parsed(
        bars_and_line("x", "t", "d", Series("spend", "spend"), Series("margin", "margin"), points, [])
    )
    labels = [text.text for text in root.iter(f"{SVG}text")]
    assert labels[:3] == ["-20", "0", "100"]
    assert len(list(root.iter(f"{SVG}circle"))) == 2  # two margins, each alone between gaps


def test_round_tops_and_numbers_for_people() -> None:
    """Axis tops are 1, 2, 2.5 or 5 times a power of ten; numbers get thousands separators."""
    assert [nice_ceiling(Decimal(v)) for v in ("0", "7", "11", "230", "0.3")] == [
        Decimal(1), Decimal(10), Decimal(20), Decimal(250), Decimal("0.5")
    ]  # fmt: skip
    assert [number(v) for v in (1204, Decimal("12.50"), Decimal("1000000"), Decimal("0.25"))] == [
        "1,204", "12.5", "1,000,000", "0.25"
    ]  # fmt: skip
