"""A sweep's results: one record per trial, the best trial, and the files a sweep leaves behind.

``<sweep dir>/tune.json`` holds every trial (its values, metric history, status and run directory),
``best.yaml`` the best trial's full config (run it with ``rayft train best.yaml`` or ``rayft run
best.yaml``), ``tune.html`` the charts. Files are written to a temporary name and renamed into place.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Literal

import yaml

from rayft.config.schema import RayftConfig
from rayft.errors import RunStateError
from rayft.security import redact
from rayft.tuning.space import apply_params

TrialStatus = Literal["TERMINATED", "STOPPED_EARLY", "ERROR", "RUNNING", "PENDING", "PAUSED"]

TUNE_JSON = "tune.json"
BEST_YAML = "best.yaml"
TUNE_HTML = "tune.html"


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """One trial of a sweep.

    Attributes:
        trial_id: Ray Tune's trial id.
        params: The sampled values, keyed by dotted config path.
        metric: The last reported value of the sweep's metric (what ranks trials, as in Ray Tune), or
            None when the trial reported none.
        best_metric: The best value it reported.
        steps: Optimizer steps it trained.
        status: TERMINATED (ran to the end), STOPPED_EARLY (by the scheduler), ERROR, RUNNING, PENDING
            or PAUSED.
        stop_reason: Why it stopped, in words ('' while it runs).
        run_dir: Its run directory.
        history: (step, metric) at every report.
    """

    trial_id: str
    params: dict[str, Any]
    metric: float | None
    best_metric: float | None
    steps: int
    status: TrialStatus
    stop_reason: str
    run_dir: str
    history: list[tuple[int, float]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """Every trial of a sweep and which one is best by ``metric`` in ``mode``."""

    name: str
    metric: str
    mode: Literal["min", "max"]
    trials: list[TrialRecord]
    best_trial_id: str | None

    @property
    def best(self) -> TrialRecord | None:
        """The best trial's record, if any trial reported the metric."""
        return next((t for t in self.trials if t.trial_id == self.best_trial_id), None)

    def ranked(self) -> list[TrialRecord]:
        """Trials best first; those without a metric last, in their original order."""
        sign = 1.0 if self.mode == "min" else -1.0
        return sorted(self.trials, key=lambda t: (t.metric is None, sign * (t.metric or 0.0)))


def pick_best(trials: list[TrialRecord], mode: Literal["min", "max"]) -> str | None:
    """The id of the trial whose last metric is best (NaN and missing metrics never win)."""
    sign = 1.0 if mode == "min" else -1.0
    scored = [(sign * t.metric, t.trial_id) for t in trials if t.metric is not None and not math.isnan(t.metric)]
    return min(scored)[1] if scored else None


def best_config(result: SweepResult, base_cfg: RayftConfig) -> RayftConfig | None:
    """The best trial's full config: the base config with its values, no tune section, its own name."""
    best = result.best
    if best is None:
        return None
    cfg = apply_params(base_cfg, best.params)
    raw = cfg.model_dump(mode="json", exclude={"tune"})
    raw["name"] = f"{result.name}-best"
    return RayftConfig.model_validate(raw)


def best_yaml(result: SweepResult, base_cfg: RayftConfig) -> str | None:
    """best.yaml's text: a header that says where it comes from, then every field spelled out."""
    cfg = best_config(result, base_cfg)
    best = result.best
    if cfg is None or best is None:
        return None
    raw = cfg.model_dump(mode="json", exclude={"tune"})
    head = (
        f"# rayft train best.yaml  (or: rayft run best.yaml)\n"
        f"# The best trial {best.trial_id} of sweep {result.name}: {result.metric} = {best.metric:.6g} "
        f"({result.mode}), trained in {best.run_dir}\n"
        f"# with {', '.join(f'{k}={v!r}' for k, v in best.params.items())}.\n"
    )
    return head + redact(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))


def sweep_json(result: SweepResult) -> str:
    """tune.json's text."""
    data = dataclasses.asdict(result)
    return json.dumps(data, indent=2, default=str, allow_nan=True) + "\n"


def load_sweep_result(path: Path) -> SweepResult:
    """Read tune.json back (``path`` is the file or the sweep directory).

    Raises:
        RunStateError: the file is missing or not a sweep result.
    """
    file = path / TUNE_JSON if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        trials = [_trial(t) for t in data["trials"]]
        return SweepResult(data["name"], data["metric"], data["mode"], trials, data["best_trial_id"])
    except FileNotFoundError:
        raise RunStateError(f"{file} does not exist; run `rayft tune CONFIG` first to make a sweep") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise RunStateError(f"{file} is not a sweep result ({exc!r}); remove it and rerun `rayft tune`") from None


def _trial(data: dict[str, Any]) -> TrialRecord:
    history = [(int(step), float(value)) for step, value in data.pop("history", [])]
    return TrialRecord(**data, history=history)


def render_table(result: SweepResult) -> str:
    """The console table: trial, each hyper-parameter, metric, steps, status, why stopped; best first,
    marked with '*'."""
    paths = list(dict.fromkeys(p for t in result.trials for p in t.params))
    head = ("", "trial", *paths, result.metric, "steps", "status", "why stopped")
    rows = [head]
    for trial in result.ranked():
        mark = "*" if trial.trial_id == result.best_trial_id else ""
        values = [_cell(trial.params.get(p, "")) for p in paths]
        metric = "-" if trial.metric is None else _cell(trial.metric)
        rows.append((mark, trial.trial_id, *values, metric, str(trial.steps), trial.status, trial.stop_reason))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
