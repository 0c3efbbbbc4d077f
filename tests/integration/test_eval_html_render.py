"""compare.html renders in headless Chromium (Debian's `chromium` package) to a non-blank page."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rayft.config.evaluation import EvalConfig
from rayft.config.model import ModelConfig
from rayft.evaluation.report import comparison_examples, model_summary, pair_tests, render_html
from rayft.evaluation.runner import Example, Examples, score_run
from rayft.evaluation.summary import CompareSummary
from rayft.evaluation.tasks import build_task
from rayft.generation.backend import Generation
from rayft.models.sources import ResolvedSource

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"


def _page() -> str:
    task = build_task(EvalConfig())
    refs = [f"Steps...\n#### {i}" for i in range(10)]
    examples = Examples([Example(f"ds:{i}", f"Question number {i}?", r, "") for i, r in enumerate(refs)], [])
    runs = []
    for label, right in (("base", 3), ("tuned", 8)):
        gens = [
            Generation(f"The answer is {i if i < right else -1}.\n#### {i if i < right else -1}") for i in range(10)
        ]
        source = ResolvedSource(label, "model", ModelConfig(name=f"org/{label}"))
        runs.append(score_run(label, source, examples, gens, task=task, ev=EvalConfig(), elapsed_s=1.0))
    summary = CompareSummary(
        task="gsm8k",
        num_examples=10,
        num_fewshot=0,
        confidence=0.95,
        significance=0.05,
        primary_metric="accuracy_flexible",
        models={r.label: model_summary(r) for r in runs},
        pairs=pair_tests(runs, 0.95, 0.05, 200, 0),
    )
    return render_html(summary, comparison_examples(runs, examples))


@pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason="needs Debian's chromium: apt-get install -y chromium")
def test_compare_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    from PIL import Image

    page = tmp_path / "compare.html"
    page.write_text(_page(), encoding="utf-8")
    png = tmp_path / "compare.png"
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}", "--window-size=1200,1600",
        page.as_uri(),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    assert png.is_file()
    image = Image.open(png).convert("RGB")
    assert image.size == (1200, 1600)
    colors = image.getcolors(maxcolors=1 << 20)
    assert colors is not None
    # A blank page has one colour; text, tables and the chart's bars give many, including the bar colours.
    assert len(colors) > 50
    assert any(rgb == (0x42, 0x69, 0xD0) for _, rgb in colors)  # the first model's bars in the SVG chart
