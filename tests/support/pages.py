"""Screenshots of the HTML pages rayft writes, in headless Chromium (offline)."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = "/usr/bin/chromium"


def screenshot(page: Path, png: Path, size: tuple[int, int] = (1200, 1600)) -> None:
    """Render a local HTML page in headless Chromium (offline flags) to a PNG."""
    import subprocess

    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={png.parent / 'chromium-profile'}", f"--screenshot={png}",
        f"--window-size={size[0]},{size[1]}", page.as_uri(),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
