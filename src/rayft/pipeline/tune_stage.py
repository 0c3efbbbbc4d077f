"""The ``tune`` stage of ``rayft run`` and its hand-off to ``train``.

The sweep runs in ``tune/`` of the pipeline (its trials in ``tune/trials/<id>/``, resumed when the
pipeline is rerun after an interruption). The train stage then trains the best trial's config, or
reuses the best trial's finished model when that is the same training
(:func:`rayft.tuning.handoff.plan_handoff`); eval and export follow on what it produced.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from rayft._version import __version__
from rayft.config import RayftConfig, dump_config
from rayft.config.loader import read_yaml
from rayft.errors import TrainingError
from rayft.files import replace_dir, staging_dir
from rayft.pipeline.inputs import local_files, model_identity, train_data_config
from rayft.pipeline.stage import StageContext, StageOutput
from rayft.recipes import tune as tune_recipe
from rayft.runs import layout
from rayft.runs.manifest import read_manifest
from rayft.runs.store import move_aside
from rayft.tuning.handoff import TrainHandoff, plan_handoff
from rayft.tuning.results import BEST_YAML, TUNE_HTML, TUNE_JSON, SweepResult, load_sweep_result
from rayft.tuning.space import apply_params

log = logging.getLogger("rayft.run")

SWEEP_DIR = "tune"
"""The sweep's directory in the pipeline's directory (also the sweep's name there)."""


def tune_stage_config(ctx: StageContext) -> RayftConfig:
    """The sweep's config: the pipeline's, on the train stage's data, swept into ``<run dir>/tune``."""
    cfg = ctx.cfg
    assert cfg.tune is not None
    data = train_data_config(cfg, ctx.run_dir, ctx.records)
    tune = cfg.tune.model_copy(update={"name": SWEEP_DIR})
    return cfg.model_copy(update={"storage_path": str(ctx.run_dir), "data": data, "tune": tune})


def tuned_config(ctx: StageContext) -> RayftConfig:
    """The pipeline's config with the best trial's values when a sweep ran (what train trains)."""
    record = ctx.records.get("tune")
    if record is None:
        return ctx.cfg
    return apply_params(ctx.cfg, record.summary.get("best_params") or {})


class TuneStage:
    """A hyper-parameter sweep into ``tune/``: tune.json, best.yaml, tune.html and every trial's run."""

    name = "tune"

    def inputs(self, ctx: StageContext) -> dict[str, Any]:
        """What training covers (model, adapter, data, optimisation, workers, seed) and the tune section."""
        data = json.loads(train_data_config(ctx.cfg, ctx.run_dir, ctx.records).model_dump_json())
        assert ctx.cfg.tune is not None
        return {
            "model": model_identity(ctx.cfg),
            "lora": json.loads(ctx.cfg.lora.model_dump_json()),
            "data": data,
            "files": local_files(data),
            "train": json.loads(ctx.cfg.train.model_dump_json()),
            "scaling": {"num_workers": ctx.cfg.scaling.num_workers},
            "seed": ctx.cfg.seed,
            "tune": json.loads(ctx.cfg.tune.model_dump_json()),
            "rayft": __version__,
        }

    def run(self, ctx: StageContext, *, fresh: bool) -> StageOutput:
        """Run the sweep (an interrupted one continues); a finished sweep with other inputs is moved aside."""
        out = ctx.run_dir / SWEEP_DIR
        if fresh:
            move_aside(out)
        done = tune_recipe.run(tune_stage_config(ctx))
        log.info("stage tune: %d trial(s), %d at once\n%s", len(done.result.trials), done.concurrent, done.table)
        files = {"dir": out, "json": out / TUNE_JSON, "html": out / TUNE_HTML}
        if (out / BEST_YAML).is_file():
            files["best_yaml"] = out / BEST_YAML
        return StageOutput(files, sweep_summary(done.result))


def sweep_summary(result: SweepResult) -> dict[str, Any]:
    """What the tune stage's record keeps: the best trial, its values and metric, trials per status."""
    best = result.best
    if best is None:
        raise TrainingError(
            f"stage tune: no trial of sweep {result.name} reported {result.metric}; see tune/tune.json for each "
            "trial's status, and check that the metric is one the run reports (eval/loss needs validation data)"
        )
    statuses: dict[str, int] = {}
    for trial in result.trials:
        statuses[trial.status] = statuses.get(trial.status, 0) + 1
    return {
        "trials": len(result.trials),
        "statuses": statuses,
        "metric": result.metric,
        "best_trial": best.trial_id,
        "best_metric": best.metric,
        "best_params": best.params,
        "best_run_dir": best.run_dir,
    }


def plan_train_handoff(ctx: StageContext, wanted: dict[str, Any]) -> tuple[TrainHandoff, Path] | None:
    """What the train stage does with the sweep's best trial (None when the pipeline has no sweep)."""
    record = ctx.records.get("tune")
    if record is None or ctx.cfg.tune is None:
        return None
    result = load_sweep_result(record.output(ctx.run_dir, "json"))
    best = result.best
    assert best is not None  # a finished tune stage has a best trial (sweep_summary)
    trial_dir = Path(best.run_dir)
    saved = trial_dir / layout.CONFIG_FILE
    handoff = plan_handoff(
        best,
        scheduler=ctx.cfg.tune.scheduler,
        trial_config=read_yaml(saved) if saved.is_file() else None,
        wanted=wanted,
        trial_finished=read_manifest(trial_dir / layout.FINAL_DIR) is not None,
    )
    return handoff, trial_dir


def adopt_trial_run(trial_dir: Path, out: Path, train_cfg: RayftConfig) -> None:
    """Make the best trial's finished run the train stage's run: its final model, metrics and logs
    (hard links where the filesystem allows, else copies; checkpoints are left in the sweep), with the
    train stage's config saved so that a rerun keeps it."""
    staging = staging_dir(out, "adopt")
    shutil.copytree(
        trial_dir, staging, copy_function=_link_or_copy, ignore=shutil.ignore_patterns(layout.CHECKPOINTS_DIR),
        dirs_exist_ok=True,
    )  # fmt: skip
    (staging / layout.CONFIG_FILE).unlink(missing_ok=True)  # a hard link to the trial's: not written through
    (staging / layout.CONFIG_FILE).write_text(dump_config(train_cfg), encoding="utf-8")
    move_aside(out)
    replace_dir(staging, out)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
