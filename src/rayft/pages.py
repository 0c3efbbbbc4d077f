"""The HTML page shell of rayft's reports (compare.html, tune.html, the pipeline's report.html):
one head, one base style; each report adds only its own rules and body."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

BASE_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;
padding:0 1rem}
h1{font-size:1.6rem}h2{font-size:1.25rem;margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.3rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.92rem}
th,td{border:1px solid #ccc;padding:.35rem .6rem;text-align:left;vertical-align:top}
th{background:#f3f4f6}
.ok{color:#0a7d32;font-weight:600}.bad{color:#b42318;font-weight:600}.meta{color:#555;font-size:.9rem}.muted{color:#6b7280}
.charts{display:flex;flex-wrap:wrap;gap:1rem}
pre{white-space:pre-wrap;font-size:.85rem}
"""


def html_page(title: str, body: Sequence[str], css: str = "") -> str:
    """A whole, self-contained page (readable offline): ``title`` (escaped here), the base style
    followed by ``css``, then the ``body`` parts (HTML, already escaped by the caller) one per line."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{BASE_CSS}{css}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
