"""Build the mkdocs site and read its internal links (shared by the docs-site tests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[2]
HREF = re.compile(r"""(?:href|src)="([^"]+)\"""")


def build_site(out: Path) -> Path:
    """`mkdocs build --strict` into OUT; any warning (a broken link, a missing page) fails the build."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env["NO_MKDOCS_2_WARNING"] = "1"
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def broken_links(site: Path) -> list[str]:
    """Internal href/src targets of every built page that name no built file."""
    broken = []
    for page in site.rglob("*.html"):
        if page.name == "404.html":  # served at any depth, so its links are root-relative: not files here
            continue
        for target in HREF.findall(page.read_text(encoding="utf-8")):
            parts = urlsplit(target)
            if parts.scheme or parts.netloc or not parts.path:
                continue
            path = (page.parent / unquote(parts.path)).resolve()
            if path.is_dir():
                path = path / "index.html"
            if not path.is_file():
                broken.append(f"{page.relative_to(site)} -> {target}")
    return broken
