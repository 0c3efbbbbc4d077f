"""report.html renders in headless Chromium (Debian's `chromium` package): charts and tables are drawn."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.pipeline.report import render_report
from tests.support.pages import CHROMIUM, screenshot
from tests.unit.test_pipeline_report import _inputs

pytestmark = pytest.mark.integration


@pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason="needs Debian's chromium: apt-get install -y chromium")
def test_report_renders_with_its_charts(tmp_path: Path) -> None:
    from PIL import Image

    page = tmp_path / "report.html"
    page.write_text(render_report(_inputs()), encoding="utf-8")
    png = tmp_path / "report.png"
    screenshot(page, png)
    image = Image.open(png).convert("RGB")
    colors = {rgb for _, rgb in image.getcolors(maxcolors=1 << 20) or []}
    assert len(colors) > 50, "a blank page has one colour"
    assert (0x25, 0x63, 0xEB) in colors, "the training-loss line (first series colour) is drawn"
    assert (0xDC, 0x26, 0x26) in colors, "the second series / bar colour is drawn"
