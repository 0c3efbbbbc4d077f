"""The built docs render in headless Chromium: every page's heading, no raw Markdown, a non-blank home page."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.docsite import build_site

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
PAGES = {
    "index.html": "rayft",
    "getting-started/index.html": "Getting started",
    "tutorial/ray-core/index.html": "Ray Core: tasks and actors",
    "reference/config/index.html": "Configuration reference",
    "reference/cli/index.html": "Command reference",
    "reliability/index.html": "Reliability",
    "guides/notebooks/index.html": "The pipeline in notebooks",
    "notebooks/01_synthetic_data/index.html": "1. Synthetic data",
    "notebooks/04_serving/index.html": "4. Serving and querying",
}
# Code holds Python comments (`# ...` lines) on purpose: only the prose must be rendered. A notebook
# page keeps each code cell twice, highlighted and as the hidden text its copy button copies.
CODE_BLOCKS = re.compile(r'<(script|style|pre)[^>]*>.*?</\1>|<div class="clipboard-copy-txt"[^>]*>.*?</div>', re.S)


def _chromium(tmp_path: Path, *args: str) -> str:
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", *args,
    ]  # fmt: skip
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout


@pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason="needs Debian's chromium: apt-get install -y chromium")
def test_pages_render_their_heading_without_raw_markdown(tmp_path: Path) -> None:
    from PIL import Image

    site = build_site(tmp_path / "site")
    for page, heading in PAGES.items():
        dom = _chromium(tmp_path, "--dump-dom", (site / page).as_uri())
        h1 = re.search(r"<h1[^>]*>(.*?)</h1>", dom, re.S)
        assert h1 is not None, page
        assert re.sub(r"<[^>]+>", "", h1.group(1)).strip().startswith(heading), page
        text = re.sub(r"<[^>]+>", " ", CODE_BLOCKS.sub("", dom))
        assert not re.search(r"^\s*#{1,3} \w|\]\([^)]*\.md\)|\|---\|", text, re.M), f"raw Markdown in {page}"
    png = tmp_path / "home.png"
    _chromium(tmp_path, f"--screenshot={png}", "--window-size=1200,900", (site / "index.html").as_uri())
    colors = Image.open(png).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is not None
    assert len(colors) > 50  # text, the header bar and the navigation, not a blank page
