"""What ``rayft profile RUN`` shows: every rank's mean step breakdown over the run, the verdict
and its fix, and the traces written; as text for the console and as an HTML section for the run's
report (and ``profile/profile.html``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from rayft.charts import stacked_bars_chart
from rayft.errors import RunStateError
from rayft.files import write_text_atomic
from rayft.pages import html_page
from rayft.runs import layout
from rayft.training.profiling.breakdown import PHASES
from rayft.training.profiling.diagnosis import Finding, diagnose, merge_windows

COLUMNS = (*PHASES, "step")
_CSS = "td.num{text-align:right;font-variant-numeric:tabular-nums}.verdict{font-size:1.1rem}"


@dataclass(frozen=True)
class RunProfile:
    """The profile of one run: per-rank breakdowns, findings (largest first) and trace files."""

    name: str
    ranks: list[dict[str, Any]]
    findings: list[Finding]
    traces: list[str]


def read_profile(run_dir: Path, margin: float = 0.2) -> RunProfile | None:
    """The profile of the run in ``run_dir``; None when it logged no step breakdown."""
    path = run_dir / layout.STEP_TIMES_FILE
    if not path.is_file():
        return None
    windows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ranks = merge_windows(windows)
    traces = sorted(p.relative_to(run_dir).as_posix() for p in (run_dir / layout.PROFILE_DIR).glob("trace-rank-*"))
    return RunProfile(run_dir.name, ranks, diagnose(ranks, margin), traces)


def load_profile(run_dir: Path, margin: float = 0.2) -> RunProfile:
    """:func:`read_profile`, or a clear error naming what is missing and how to get it."""
    if not run_dir.is_dir():
        raise RunStateError(f"run directory {run_dir} does not exist; pass the run's directory (storage_path/name)")
    profile = read_profile(run_dir, margin)
    if profile is None:
        raise RunStateError(
            f"{run_dir / layout.STEP_TIMES_FILE} does not exist: the run logged no step breakdown; train it with "
            "train.profile.step_timing host (the default) and at least one logged step"
        )
    return profile


def profile_text(profile: RunProfile) -> str:
    """The console summary: a table of milliseconds per step by rank, then the verdict and fix."""
    header = f"{'rank':<5} {'node':<16} " + " ".join(f"{c:>10}" for c in COLUMNS)
    lines = [f"Step breakdown of {profile.name} (ms per step, mean over the run)", header]
    for row in profile.ranks:
        cells = " ".join(f"{1000 * float(row.get(f'time/{c}', 0.0)):>10.1f}" for c in COLUMNS)
        lines.append(f"{row['rank']:<5} {str(row.get('node', '?'))[:16]:<16} {cells}")
    lines.append("")
    for index, finding in enumerate(profile.findings):
        lines.append(f"{'Verdict' if index == 0 else 'Also'}: {finding.verdict} ({finding.detail})")
        lines.append(f"  Fix: {finding.fix}")
    lines.extend(f"Trace: {trace}" for trace in profile.traces)
    return "\n".join(lines)


def profile_section(profile: RunProfile) -> str:
    """The profile as an HTML section (for the run's report.html and profile.html)."""
    head = "".join(f"<th>{escape(c)} (ms)</th>" for c in COLUMNS)
    rows = "".join(
        f"<tr><td>{row['rank']}</td><td>{escape(str(row.get('node', '?')))}</td>"
        + "".join(f'<td class="num">{1000 * float(row.get(f"time/{c}", 0.0)):.1f}</td>' for c in COLUMNS)
        + "</tr>"
        for row in profile.ranks
    )
    findings = "".join(
        f'<li><span class="{"bad" if f.verdict != "compute-bound" else "ok"}">{escape(f.verdict)}</span>: '
        f"{escape(f.detail)}.<br>Fix: {escape(f.fix)}</li>"
        for f in profile.findings
    )
    traces = "".join(f"<li><code>{escape(t)}</code></li>" for t in profile.traces)
    return (
        f'<h2>Where the time goes</h2>\n<ul class="verdict">{findings}</ul>\n{_bars(profile.ranks)}\n'
        f"<table><tr><th>rank</th><th>node</th>{head}</tr>{rows}</table>\n"
        + (f'<p class="meta">Traces (open in Perfetto or chrome://tracing):</p><ul>{traces}</ul>' if traces else "")
    )


def _bars(ranks: list[dict[str, Any]]) -> str:
    """One bar per rank, its step split into the phases, on a common time scale."""
    rows = [(f"rank {r['rank']}", [float(r.get(f"time/{phase}", 0.0)) for phase in PHASES]) for r in ranks]
    return stacked_bars_chart(rows, PHASES, label="step breakdown")


def write_profile_page(run_dir: Path, profile: RunProfile) -> Path:
    """Write ``profile/profile.html`` (the section on rayft's page shell) and return its path."""
    path = run_dir / layout.PROFILE_PAGE
    write_text_atomic(path, html_page(f"rayft profile {profile.name}", [profile_section(profile)], _CSS))
    return path


def section_css() -> str:
    """The rules the section needs beyond the page shell's."""
    return _CSS
