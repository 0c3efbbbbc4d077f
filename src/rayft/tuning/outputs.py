"""Writing a sweep's files: ``tune.json``, ``best.yaml`` and ``tune.html`` (their content is made by
:mod:`rayft.tuning.results` and :mod:`rayft.tuning.report_html`)."""

from __future__ import annotations

from pathlib import Path

from rayft.config.schema import RayftConfig
from rayft.files import write_text_atomic
from rayft.tuning.report_html import render_sweep_html
from rayft.tuning.results import BEST_YAML, TUNE_HTML, TUNE_JSON, SweepResult, best_yaml, sweep_json


def write_sweep_outputs(sweep_dir: Path, result: SweepResult, base_cfg: RayftConfig) -> None:
    """Write tune.json, best.yaml (when a trial reported the metric) and tune.html into ``sweep_dir``."""
    write_text_atomic(sweep_dir / TUNE_JSON, sweep_json(result))
    text = best_yaml(result, base_cfg)
    if text is not None:
        write_text_atomic(sweep_dir / BEST_YAML, text)
    else:
        (sweep_dir / BEST_YAML).unlink(missing_ok=True)
    write_text_atomic(sweep_dir / TUNE_HTML, render_sweep_html(result, base_cfg.tune))
