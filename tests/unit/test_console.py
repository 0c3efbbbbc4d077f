"""The console: which records it shows, the progress line, and the note beside built-in evaluations."""

from __future__ import annotations

import logging

from rayft.console import ConsoleFilter, RayInfoFilter, progress_line
from rayft.data.builtin import builtin_eval_note


def _record(name: str, level: int, pathname: str = "x.py") -> logging.LogRecord:
    return logging.LogRecord(name, level, pathname, 1, "msg", None, None)


def test_console_shows_rayft_lines_and_others_warnings_only() -> None:
    quiet, verbose = ConsoleFilter(False), ConsoleFilter(True)
    assert quiet.filter(_record("rayft.train", logging.INFO))
    assert not quiet.filter(_record("ray.data", logging.INFO))
    assert quiet.filter(_record("ray.data", logging.WARNING))
    assert verbose.filter(_record("ray.data", logging.INFO))


def test_ray_info_filter_keys_on_where_the_record_was_logged() -> None:
    drop = RayInfoFilter("/site/ray")
    assert not drop.filter(_record("/site/ray/train/context.py", logging.INFO, "/site/ray/train/context.py"))
    assert drop.filter(_record("x", logging.WARNING, "/site/ray/train/context.py"))
    assert drop.filter(_record("rayft.train", logging.INFO, "/src/rayft/training/loop/metrics.py"))


def test_progress_line_has_rate_and_eta() -> None:
    assert progress_line("eval base", 40, 200, 20.0, "prompts") == (
        "eval base: 40/200 prompts (20%), 2.00 prompts/s, 0m20s elapsed, eta 1m20s"
    )
    assert progress_line("sdg", 0, 10, 0.0, "seeds").endswith("? seeds/s, 0m00s elapsed, eta ?")


def test_builtin_eval_note() -> None:
    note = builtin_eval_note(["builtin:arithmetic"], ["builtin:arithmetic"])
    assert note is not None and "not a GSM8K result" in note and "training data also came from" in note
    assert builtin_eval_note(["/data/gsm8k/test.jsonl"]) is None
