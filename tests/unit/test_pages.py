"""rayft.pages: compare.html, tune.html and the pipeline's report.html share one page shell and style."""

from __future__ import annotations

from rayft.evaluation.report import comparison_examples, render_html
from rayft.pages import BASE_CSS, html_page
from rayft.pipeline.report import render_report
from rayft.tuning.report_html import render_sweep_html
from tests.unit.test_eval_report import _examples, _runs, _summary
from tests.unit.test_pipeline_report import _inputs
from tests.unit.test_tune_results import BASE, sweep


def test_a_page_escapes_its_title_and_puts_the_report_rules_after_the_base_style() -> None:
    page = html_page("sweep <x>", ["<h1>x</h1>"], ".best{font-weight:600}")
    assert "<title>sweep &lt;x&gt;</title>" in page
    assert f"<style>{BASE_CSS}.best{{font-weight:600}}</style>" in page
    assert page.endswith("<h1>x</h1>\n</body></html>\n")


def test_every_report_is_built_on_the_one_shell() -> None:
    runs = _runs()
    pages = {
        "compare": render_html(_summary(runs), comparison_examples(runs, _examples())),
        "tune": render_sweep_html(sweep(), BASE.tune),
        "pipeline": render_report(_inputs()),
    }
    head = html_page("TITLE", []).split("<title>")[0]
    for name, page in pages.items():
        assert page.startswith(head), name
        assert f"<style>{BASE_CSS}" in page, name
        assert page.endswith("</body></html>\n"), name
