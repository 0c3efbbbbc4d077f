"""The inline SVG charts of rayft's reports (compare.html, tune.html, the pipeline's report.html):
lines over steps, dots against a setting, and bars with their intervals. Each chart is one
self-contained ``<svg>`` string (nothing fetched, no script), drawn from plain values, so that the
reports share one look and one set of scales; :mod:`rayft.pages` gives them one page shell."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e")
"""The series colours, in order (a colour-blind-safe set)."""

Scale = Callable[[float], float]
Point = tuple[float, float]

# The plot area inside a chart of the default 520 x 300 pixels: room for the y labels on the
# left, the title on top and the x labels and axis name below.
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 30, 44


def color(index: int, palette: Sequence[str] = PALETTE) -> str:
    """The colour of the ``index``-th series (models, trials) in every chart of a report."""
    return palette[index % len(palette)]


def linear_scale(low: float, high: float, out_low: float, out_high: float) -> Scale:
    """Maps ``[low, high]`` onto ``[out_low, out_high]``; a single value lands in the middle."""
    if high <= low:
        low, high = low - 0.5, high + 0.5
    return lambda v: out_low + (v - low) / (high - low) * (out_high - out_low)


def log_scale(low: float, high: float, out_low: float, out_high: float) -> Scale:
    """Maps ``[low, high]`` (both > 0) onto ``[out_low, out_high]`` in decades."""
    inner = linear_scale(math.log10(low), math.log10(high), out_low, out_high)
    return lambda v: inner(math.log10(v))


def padded_range(values: Sequence[float]) -> tuple[float, float]:
    """The finite values' range with 5% room at each end (a flat series gets room too)."""
    finite = [v for v in values if math.isfinite(v)] or [0.0, 1.0]
    low, high = min(finite), max(finite)
    pad = (high - low) * 0.05 or abs(high) * 0.05 or 0.5
    return low - pad, high + pad


@dataclass(frozen=True)
class Series:
    """One line of a :func:`line_chart`: its (x, y) points, colour and width; ``key`` is set as the
    line's ``data-trial`` attribute so that a page or a test can find it."""

    name: str
    points: Sequence[Point]
    color: str
    width: float = 2.0
    key: str | None = None


@dataclass(frozen=True)
class Dot:
    """One point of a :func:`dot_chart`: ``x`` a number or a category, ``title`` its tooltip."""

    x: Any
    y: float
    color: str
    title: str


@dataclass(frozen=True)
class Bar:
    """One bar: its ``group`` (a metric) and ``label`` (a model), value and interval (may be None)."""

    group: str
    label: str
    value: float
    low: float | None
    high: float | None
    color: str


@dataclass(frozen=True)
class Names:
    """A chart's title (on top; may be empty) and its axis names."""

    x_label: str
    title: str = ""
    y_label: str = ""


def svg_open(width: int, height: int, label: str) -> str:
    """An ``<svg>`` opening tag with its accessible name; the chart ends with ``</svg>``."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(label)}">'
    )


def _frame(
    size: tuple[int, int], y: Scale, y_range: tuple[float, float], x_ticks: Sequence[tuple[float, str]], names: Names
) -> list[str]:
    """The opening tag, the y grid with its labels, the x tick labels (already placed), and the
    title, x axis and y axis names."""
    width, height = size
    parts = [svg_open(width, height, names.title or names.x_label)]
    if names.title:
        parts.append(
            f'<text x="{width / 2:.1f}" y="18" font-size="14" font-weight="600" text-anchor="middle">'
            f"{escape(names.title)}</text>"
        )
    for i in range(5):
        value = y_range[0] + (y_range[1] - y_range[0]) * i / 4
        yy = y(value)
        parts.append(f'<line x1="{_LEFT}" x2="{width - _RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{_LEFT - 6}" y="{yy + 4:.1f}" font-size="11" text-anchor="end">{value:.4g}</text>')
    for xx, text in x_ticks:
        parts.append(
            f'<text x="{xx:.1f}" y="{height - _BOTTOM + 16}" font-size="11" text-anchor="middle">{escape(text)}</text>'
        )
    parts.append(
        f'<text x="{(_LEFT + width - _RIGHT) / 2:.1f}" y="{height - 8}" font-size="12" text-anchor="middle">'
        f"{escape(names.x_label)}</text>"
    )
    if names.y_label:
        parts.append(
            f'<text x="14" y="{height / 2:.1f}" font-size="12" text-anchor="middle" '
            f'transform="rotate(-90 14 {height / 2:.1f})">{escape(names.y_label)}</text>'
        )
    return parts


def line_chart(
    series: Sequence[Series], names: Names, *, legend: bool = False, width: int = 520, height: int = 300
) -> str:
    """Lines over steps (x from 0 to the last step), a dot on every point; "" when no point is finite.

    ``legend`` draws the series' names inside the chart (a report with many series, a sweep's
    trials, lays its legend out in HTML with :func:`legend_html` instead).
    """
    shown = [(s, [(x, y) for x, y in sorted(s.points) if math.isfinite(y)]) for s in series]
    points = [p for _, pts in shown for p in pts]
    if not points:
        return ""
    max_step = max(x for x, _ in points)
    x = linear_scale(0, max_step, _LEFT, width - _RIGHT)
    y_range = padded_range([v for _, v in points])
    y = linear_scale(y_range[0], y_range[1], height - _BOTTOM, _TOP)
    ticks = [(x(step), f"{step:g}") for step in dict.fromkeys(round(max_step * i / 4) for i in range(5))]
    parts = _frame((width, height), y, y_range, ticks, names)
    for index, (line, pts) in enumerate(shown):
        if not pts:
            continue
        key = f' class="series" data-trial="{escape(line.key)}"' if line.key is not None else ""
        coords = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in pts)
        parts.append(
            f'<polyline{key} points="{coords}" fill="none" stroke="{line.color}" stroke-width="{line.width:g}">'
            f"<title>{escape(line.name)}</title></polyline>"
        )
        parts += [f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="2.5" fill="{line.color}"/>' for a, b in pts]
        if legend:
            top = _TOP + 6 + 16 * index
            parts.append(
                f'<rect x="{width - _RIGHT - 150}" y="{top}" width="10" height="10" fill="{line.color}"/>'
                f'<text x="{width - _RIGHT - 135}" y="{top + 9}" font-size="11">{escape(line.name)}</text>'
            )
    parts.append("</svg>")
    return "\n".join(parts)


def legend_html(items: Sequence[tuple[str, str]]) -> str:
    """A legend of (name, colour) swatches as a line of HTML under a chart."""
    spans = [
        f'<span style="margin-right:1rem"><span style="display:inline-block;width:12px;height:12px;'
        f'background:{colour}"></span> {escape(name)}</span>'
        for name, colour in items
    ]
    return f'<p class="meta">{"".join(spans)}</p>'


def dot_chart(dots: Sequence[Dot], names: Names, *, log_x: bool = False, width: int = 520, height: int = 300) -> str:
    """Values against a setting: numbers on a linear (or, with ``log_x``, a log) axis, anything
    else as categories in the order first seen; "" when there is no dot."""
    if not dots:
        return ""
    y_range = padded_range([d.y for d in dots])
    y = linear_scale(y_range[0], y_range[1], height - _BOTTOM, _TOP)
    x, ticks = _x_axis([d.x for d in dots], log_x, width)
    parts = _frame((width, height), y, y_range, ticks, names)
    for dot in dots:
        if math.isfinite(dot.y):
            parts.append(
                f'<circle class="point" cx="{x(dot.x):.1f}" cy="{y(dot.y):.1f}" r="5" fill="{dot.color}">'
                f"<title>{escape(dot.title)}</title></circle>"
            )
    parts.append("</svg>")
    return "\n".join(parts)


def _x_axis(values: Sequence[Any], log: bool, width: int) -> tuple[Callable[[Any], float], list[tuple[float, str]]]:
    """The x position of a value, and the tick labels: categories, or five ticks over the range."""
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if not numeric:
        categories = list(dict.fromkeys(repr(v) for v in values))
        place = linear_scale(-0.5, len(categories) - 0.5, _LEFT, width - _RIGHT)
        return (lambda v: place(categories.index(repr(v)))), [(place(i), c) for i, c in enumerate(categories)]
    low, high = float(min(values)), float(max(values))
    if log and low > 0:
        if high <= low:
            low, high = low / 2, high * 2
        scale = log_scale(low, high, _LEFT + 10, width - _RIGHT - 10)
        ticks = [low * (high / low) ** (i / 4) for i in range(5)]
    else:
        scale = linear_scale(low, high, _LEFT + 10, width - _RIGHT - 10)
        ticks = [low + (high - low) * i / 4 for i in range(5)] if high > low else [low]
    return (lambda v: scale(float(v))), [(scale(t), f"{t:.3g}") for t in ticks]


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _whisker(low: float | None, high: float | None) -> tuple[float, float] | None:
    return (low, high) if low is not None and high is not None and _finite(low) and _finite(high) else None


def grouped_bar_chart(bars: Sequence[Bar], *, label: str, width: int = 900, height: int = 330) -> str:
    """Vertical bars, one group per metric and one bar per model in it, each with its value and
    interval whisker; the models' legend below. "" when there is no bar."""
    if not bars:
        return ""
    groups = list(dict.fromkeys(b.group for b in bars))
    labels = list(dict.fromkeys(b.label for b in bars))
    # The axis reaches the tallest bar or whisker (a bar without an interval, a count, may pass 1).
    tops = [b.high if b.high is not None else b.value for b in bars]
    scale = max([1.0, *(t for t in tops if _finite(t))])
    left, bottom, top = 60, 60, 30
    plot_h = height - bottom - top
    y = linear_scale(0.0, scale, top + plot_h, top)
    group_w = (width - left - 20) / len(groups)
    bar_w = min(60.0, group_w * 0.8 / len(labels))
    parts = [svg_open(width, height, label)]
    for tick in range(5):
        value = scale * tick / 4
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{left - 6}" y="{y(value) + 4:.1f}" font-size="11" text-anchor="end">{value:.2f}</text>')
    for bar in bars:
        gi, mi = groups.index(bar.group), labels.index(bar.label)
        x = left + gi * group_w + (group_w - bar_w * len(labels)) / 2 + mi * bar_w
        parts.append(
            f'<rect x="{x:.1f}" y="{y(bar.value):.1f}" width="{bar_w - 4:.1f}" height="{y(0.0) - y(bar.value):.1f}" '
            f'fill="{bar.color}"><title>{escape(bar.label)} {escape(bar.group)}: {bar.value:.3f}</title></rect>'
        )
        cx, label_y = x + (bar_w - 4) / 2, y(bar.value) - 4
        whisker = _whisker(bar.low, bar.high)
        if whisker is not None:
            lo, hi = y(whisker[0]), y(whisker[1])
            parts.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{lo:.1f}" y2="{hi:.1f}" stroke="#222"/>')
            for yy in (lo, hi):
                parts.append(f'<line x1="{cx - 5:.1f}" x2="{cx + 5:.1f}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#222"/>')
            label_y = min(label_y, hi - 4)  # above the bar and its whisker
        parts.append(f'<text x="{cx:.1f}" y="{label_y:.1f}" font-size="11" text-anchor="middle">{bar.value:.2f}</text>')
    for gi, group in enumerate(groups):
        parts.append(
            f'<text x="{left + gi * group_w + group_w / 2:.1f}" y="{height - bottom + 18}" font-size="12" '
            f'text-anchor="middle">{escape(group)}</text>'
        )
    colours = {b.label: b.color for b in bars}
    for mi, name in enumerate(labels):
        x = left + mi * 160
        parts.append(f'<rect x="{x}" y="{height - 22}" width="12" height="12" fill="{colours[name]}"/>')
        parts.append(f'<text x="{x + 18}" y="{height - 12}" font-size="12">{escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def bar_rows_chart(bars: Sequence[Bar], *, label: str, width: int = 620) -> str:
    """Horizontal bars, one row per (model, metric) named ``label · group``, each with its value
    and interval line; bars whose value is not finite are left out. "" when none is left."""
    shown = [b for b in bars if _finite(b.value)]
    if not shown:
        return ""
    row, left = 26, 230
    top_value = max(*(b.value for b in shown), *(b.high for b in shown if b.high is not None and _finite(b.high)), 1e-9)
    x = linear_scale(0.0, top_value, left, width - 60)
    parts = [svg_open(width, row * len(shown) + 20, label)]
    for i, bar in enumerate(shown):
        y = 10 + i * row
        parts.append(
            f'<text x="{left - 8}" y="{y + 15}" text-anchor="end" font-size="12">'
            f"{escape(bar.label)} · {escape(bar.group)}</text>"
            f'<rect x="{left}" y="{y + 3}" width="{max(x(bar.value) - left, 1):.1f}" height="16" fill="{bar.color}"/>'
        )
        label_x = x(bar.value) + 6
        whisker = _whisker(bar.low, bar.high)
        if whisker is not None:
            x1, x2 = x(whisker[0]), x(whisker[1])
            parts.append(
                f'<line x1="{x1:.1f}" y1="{y + 11}" x2="{x2:.1f}" y2="{y + 11}" stroke="#111" stroke-width="2"/>'
            )
            label_x = max(label_x, x2 + 6)
        parts.append(f'<text x="{label_x:.1f}" y="{y + 15}" font-size="12">{bar.value:.3f}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def stacked_bars_chart(
    rows: Sequence[tuple[str, Sequence[float]]], parts: Sequence[str], *, label: str, width: int = 720
) -> str:
    """Horizontal bars on one scale, one per row (``(name, values)``), each split into ``parts``
    (one colour each, with a legend above), e.g. a rank's step split into its phases. "" when no row."""
    if not rows:
        return ""
    row, left = 28, 70
    longest = max((sum(max(v, 0.0) for v in values) for _, values in rows), default=0.0) or 1.0
    x = linear_scale(0.0, longest, 0.0, width - left - 10)
    out = [svg_open(width, 30 + len(rows) * row, label)]
    out += [f'<rect x="{left + i * 95}" y="0" width="10" height="10" fill="{color(i)}"/>'
            f'<text x="{left + 14 + i * 95}" y="10" font-size="11">{escape(name)}</text>'
            for i, name in enumerate(parts)]  # fmt: skip
    for index, (name, values) in enumerate(rows):
        y, start = 24 + index * row, float(left)
        out.append(f'<text x="0" y="{y + 15}" font-size="12">{escape(name)}</text>')
        for part, value in enumerate(values):
            w = x(max(value, 0.0))
            out.append(f'<rect x="{start:.1f}" y="{y}" width="{w:.1f}" height="22" fill="{color(part)}"/>')
            start += w
    out.append("</svg>")
    return "\n".join(out)
