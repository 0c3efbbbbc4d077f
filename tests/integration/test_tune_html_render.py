"""tune.html renders in headless Chromium (Debian's `chromium` package): one coloured series per trial."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.tuning.report_html import render_sweep_html, trial_color
from tests.support.pages import CHROMIUM, screenshot
from tests.unit.test_tune_results import BASE, sweep

pytestmark = pytest.mark.integration


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


@pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason="needs Debian's chromium: apt-get install -y chromium")
def test_sweep_page_draws_each_trial(tmp_path: Path) -> None:
    from PIL import Image

    result = sweep()  # four trials: three report the metric, one failed before reporting
    page = tmp_path / "tune.html"
    page.write_text(render_sweep_html(result, BASE.tune), encoding="utf-8")
    png = tmp_path / "tune.png"
    screenshot(page, png, size=(1200, 1400))
    image = Image.open(png).convert("RGB")
    colors = {rgb for _, rgb in image.getcolors(maxcolors=1 << 20) or []}
    assert len(colors) > 50, "a blank page has one colour"
    for index in range(len(result.trials)):  # three series and the failed trial's legend swatch
        assert _rgb(trial_color(index)) in colors, f"trial {result.trials[index].trial_id} is drawn"
    assert _rgb(trial_color(len(result.trials))) not in colors, "no series beyond the sweep's trials"
