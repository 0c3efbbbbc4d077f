"""The SVG charts every report draws (rayft.charts): what each chart holds, and where values land."""

from __future__ import annotations

import math
import re
from xml.etree import ElementTree

from rayft import charts
from rayft.charts import Bar, Dot, Names, Series

_SVG = "{http://www.w3.org/2000/svg}"


def _parse(svg: str) -> ElementTree.Element:
    return ElementTree.fromstring(svg)  # well-formed XML, or this raises


def test_line_chart_draws_each_series_with_a_dot_per_point() -> None:
    svg = charts.line_chart(
        [Series("a", [(1, 1.0), (2, 0.5)], "#111111"), Series("b", [(2, 0.7)], "#222222")],
        Names("step", "Loss", "loss"),
        legend=True,
    )
    root = _parse(svg)
    assert len(root.findall(f"{_SVG}polyline")) == 2 and len(root.findall(f"{_SVG}circle")) == 3
    texts = [t.text for t in root.iter(f"{_SVG}text")]
    assert {"Loss", "step", "loss", "a", "b"} <= set(texts)  # title, axis names, legend


def test_line_chart_leaves_out_non_finite_points_and_is_empty_without_any() -> None:
    svg = charts.line_chart([Series("a", [(0, 1.0), (1, math.nan), (2, 2.0)], "#111111", key="t1")], Names("step"))
    line = _parse(svg).find(f"{_SVG}polyline")
    assert line is not None and line.get("data-trial") == "t1" and len(line.get("points", "").split()) == 2
    assert charts.line_chart([Series("empty", [], "#111111")], Names("step")) == ""
    assert charts.line_chart([Series("nan", [(1, math.nan)], "#111111")], Names("step")) == ""


def test_a_higher_value_is_drawn_higher() -> None:
    svg = charts.line_chart([Series("a", [(0, 1.0), (10, 3.0)], "#111111")], Names("step"))
    circles = _parse(svg).findall(f"{_SVG}circle")
    assert float(circles[1].get("cy", "0")) < float(circles[0].get("cy", "0"))  # SVG's y grows downwards
    assert float(circles[1].get("cx", "0")) > float(circles[0].get("cx", "0"))


def test_dot_chart_places_categories_in_order_and_numbers_on_a_log_axis() -> None:
    categorical = _parse(charts.dot_chart([Dot("b", 1.0, "#1", "b"), Dot("a", 2.0, "#1", "a")], Names("x")))
    xs = [float(c.get("cx", "0")) for c in categorical.iter(f"{_SVG}circle")]
    assert xs[0] < xs[1]  # first seen, first placed
    log = _parse(charts.dot_chart([Dot(1e-4, 1.0, "#1", ""), Dot(1e-3, 1.0, "#1", ""), Dot(1e-2, 1.0, "#1", "")],
                                  Names("lr"), log_x=True))  # fmt: skip
    a, b, c = (float(d.get("cx", "0")) for d in log.iter(f"{_SVG}circle"))
    assert math.isclose(b - a, c - b, rel_tol=1e-3)  # a decade is the same width anywhere
    assert charts.dot_chart([], Names("x")) == ""


def test_grouped_bars_are_as_tall_as_their_values_with_whiskers() -> None:
    bars = [Bar("acc", "base", 0.25, 0.2, 0.3, "#111111"), Bar("acc", "tuned", 0.5, 0.4, 0.6, "#222222")]
    root = _parse(charts.grouped_bar_chart(bars, label="metrics by model"))
    rects = [r for r in root.findall(f"{_SVG}rect") if r.find(f"{_SVG}title") is not None]
    heights = [float(r.get("height", "0")) for r in rects]
    assert math.isclose(heights[1], 2 * heights[0], rel_tol=1e-2)
    assert len(root.findall(f"{_SVG}line")) == 5 + 2 * 3  # the grid, and a whisker with two caps per bar
    assert charts.grouped_bar_chart([], label="x") == ""


def test_bar_rows_leave_out_non_finite_values_and_draw_intervals() -> None:
    bars = [Bar("acc", "base", 0.5, 0.4, 0.6, "#111111"), Bar("f1", "base", math.nan, None, None, "#222222")]
    svg = charts.bar_rows_chart(bars, label="metrics")
    root = _parse(svg)
    assert len(root.findall(f"{_SVG}rect")) == 1 and len(root.findall(f"{_SVG}line")) == 1
    assert "base · acc" in svg and "0.500" in svg
    assert charts.bar_rows_chart(bars[1:], label="metrics") == ""


def test_charts_fetch_nothing_and_escape_names() -> None:
    svg = charts.line_chart([Series("<b>", [(0, 1.0)], "#111111")], Names("<x>", "a & b"), legend=True)
    assert "<b>" not in svg and "&lt;b&gt;" in svg and "&amp;" in svg
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", svg)


def test_stacked_bars_split_each_row_into_its_parts_on_one_scale() -> None:
    svg = charts.stacked_bars_chart([("rank 0", [1.0, 3.0]), ("rank 1", [2.0, 0.0])], ["data", "compute"],
                                    label="steps", width=410)  # fmt: skip
    rects = _parse(svg).findall(f"{_SVG}rect")[2:]  # after the legend's two swatches
    widths = [float(r.get("width", "0")) for r in rects]
    assert widths == [82.5, 247.5, 165.0, 0.0]  # 330 px for the longest row (4 s)
    assert float(rects[1].get("x", "0")) == 70 + 82.5  # the second part starts where the first ends
    assert charts.stacked_bars_chart([], ["a"], label="none") == ""
