"""One trial of a sweep: a complete rayft training run, driven from a Tune function trainable.

As Ray recommends for Train V2, the trial's function builds and fits a ``TorchTrainer`` (the same
one ``rayft train`` launches). Every report of the run (one per checkpoint; each carries a fresh
validation loss) reaches Tune with a small Tune checkpoint that points at the rayft checkpoint, so
that the scheduler decides on it, a restored sweep continues the trial from it, and Population
Based Training can hand it to another trial, which then continues from a copy of it with its own,
perturbed optimiser settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from rayft.config import RayftConfig
from rayft.errors import CheckpointError
from rayft.runs import layout
from rayft.runs.checkpoints import scan_checkpoints
from rayft.runs.manifest import read_manifest
from rayft.runs.store import RunStore
from rayft.runtime import mark_started_here
from rayft.training.driver.run import RayLauncher, RunStart, drive
from rayft.training.driver.startup import run_location
from rayft.training.loop.worker_plan import WorkerPlan
from rayft.tuning.reaper import remove_recorded_groups
from rayft.tuning.space import apply_params
from rayft.tuning.task_eval import CheckpointScorer, recorded_scores

if TYPE_CHECKING:
    from rayft.data.prepared import PreparedData

log = logging.getLogger("rayft.tune")

POINTER_FILE = "rayft_pointer.json"
"""The file of a Tune checkpoint: which rayft checkpoint it stands for."""
EXPLOITS_FILE = "exploits.jsonl"
"""In a trial's run directory: one line per checkpoint it took from another trial (PBT)."""

TrialStart = Literal["start", "resume", "adopt"]


@dataclass(frozen=True)
class TrialSetup:
    """What the sweep hands every trial: the base config and where the trials' runs go."""

    base: RayftConfig
    trials_root: str  # <storage_path>/<sweep name>/trials, a directory or a URI
    own_ray: bool  # the sweep's driver started this Ray (rayft's lean local runtime applies)
    parent_run_id: str | None = None  # the sweep's MLflow run, which trials' runs nest under


@dataclass(frozen=True)
class Pointer:
    """A Tune checkpoint's content: the rayft checkpoint ``run_dir/checkpoints/<name>`` of ``step``."""

    run_dir: str
    name: str
    step: int

    @property
    def path(self) -> Path:
        """The rayft checkpoint directory."""
        return Path(self.run_dir) / layout.CHECKPOINTS_DIR / self.name


def trial_config(setup: TrialSetup, params: Mapping[str, Any], trial_id: str) -> RayftConfig:
    """The trial's config: the sampled ``params`` set at their dotted paths, run as ``trial_id``
    under the sweep's trials/, saving a checkpoint at every evaluation (each is a report to Tune)."""
    cfg = apply_params(setup.base, dict(params))
    train = cfg.train
    if train.eval_steps is not None and train.eval_steps < train.save_steps:
        train = train.model_copy(update={"save_steps": train.eval_steps})
    return cfg.model_copy(update={"name": trial_id, "storage_path": setup.trials_root, "train": train})


def plan_trial_start(run_dir: Path, pointer: Pointer | None, finished: bool, exists: bool) -> TrialStart:
    """How the trial begins. Pure: ``adopt`` when Tune hands it another trial's checkpoint (PBT's
    exploit); ``resume`` when its own run exists (a restored sweep, a retried trial); else ``start``."""
    if pointer is not None and Path(pointer.run_dir).resolve() != run_dir.resolve():
        return "adopt"
    if exists or finished:
        return "resume"
    return "start"


def read_pointer(directory: Path) -> Pointer:
    """The pointer in a Tune checkpoint directory."""
    data = json.loads((directory / POINTER_FILE).read_text(encoding="utf-8"))
    return Pointer(str(data["run_dir"]), str(data["name"]), int(data["step"]))


def write_pointer(directory: Path, pointer: Pointer) -> None:
    """Write ``pointer`` into a Tune checkpoint directory."""
    (directory / POINTER_FILE).write_text(json.dumps(dataclasses.asdict(pointer)) + "\n", encoding="utf-8")


def adopt_checkpoint(pointer: Pointer, run_dir: Path, params: Mapping[str, Any], name: str) -> Pointer:
    """Make another trial's checkpoint this trial's only one: its checkpoints are replaced by a copy
    of the source (weights, optimizer, data position) and its saved config by the source's (under
    this trial's run ``name``), so that the run continues from there with ``params`` (only
    optimiser settings may differ); a final/ it wrote meanwhile goes. Records the exploit in
    :data:`EXPLOITS_FILE`. Returns the checkpoint continued from."""
    source = pointer.path
    if not source.is_dir():  # the source trial has pruned it since it reported: take its newest
        complete = [c for c in scan_checkpoints(source.parent) if c.complete]
        if not complete:
            raise CheckpointError(
                f"PBT: the checkpoint {source} to copy is gone and {source.parent} holds no complete one; "
                "raise checkpoint.num_to_keep so that trials keep the checkpoints others may copy"
            )
        newest = max(complete, key=lambda c: c.step)
        log.warning("PBT: %s was pruned; copying the source trial's newest checkpoint %s", source, newest.name)
        pointer = Pointer(pointer.run_dir, newest.name, newest.step)
        source = pointer.path
    checkpoints = run_dir / layout.CHECKPOINTS_DIR
    shutil.rmtree(run_dir / layout.FINAL_DIR, ignore_errors=True)  # it ended before Tune exploited it
    shutil.rmtree(checkpoints, ignore_errors=True)
    checkpoints.mkdir(parents=True)
    shutil.copytree(source, checkpoints / pointer.name)
    saved = yaml.safe_load((Path(pointer.run_dir) / layout.CONFIG_FILE).read_text(encoding="utf-8"))
    saved["name"] = name
    (run_dir / layout.CONFIG_FILE).write_text(yaml.safe_dump(saved, sort_keys=False), encoding="utf-8")
    record = {"step": pointer.step, "source": str(source), "params": dict(params)}
    with (run_dir / EXPLOITS_FILE).open("a", encoding="utf-8") as out:
        out.write(json.dumps(record, default=str) + "\n")
    log.info("PBT: continuing from a copy of %s (step %d) with %s", source, pointer.step, dict(params))
    return pointer


Scorer = Callable[[str], dict[str, float]]
"""Scores a reported checkpoint (its path) with the evaluation task (:mod:`rayft.tuning.task_eval`)."""


def report_to_tune(item: Mapping[str, Any], run_dir: Path, scores: dict[str, float] | None = None) -> None:
    """Report one Train report to Tune: its metrics (with ``scores``, the evaluation task's scores
    of its checkpoint), and its checkpoint as a :class:`Pointer`."""
    from ray import tune

    metrics = {k: v for k, v in item["metrics"].items() if isinstance(v, (int, float))} | (scores or {})
    path = item.get("checkpoint")
    if path is None:
        tune.report(metrics)
        return
    name = Path(path).name
    step = layout.parse_step_dir_name(name)
    with tempfile.TemporaryDirectory(prefix="rayft-tune-") as directory:
        write_pointer(Path(directory), Pointer(str(run_dir), name, int(step if step is not None else 0)))
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))


def forward_reports_class() -> type:
    """A Ray Train callback (run by Train's controller) that puts every report on a Ray queue."""
    from ray.train.v2.api.callback import UserCallback

    class ForwardReports(UserCallback):
        """Puts rank 0's metrics and the checkpoint's path of every report on ``reports``."""

        def __init__(self, reports: Any) -> None:
            self._reports = reports

        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            self._reports.put({"metrics": dict(metrics[0]), "checkpoint": checkpoint.path if checkpoint else None})

    return ForwardReports


Report = tuple[Mapping[str, Any], dict[str, float]]
"""A Train report forwarded to Tune, with the evaluation task's scores of its checkpoint."""


def fit_forwarding(
    fit: Callable[[Any], None], run_dir: Path, score: Scorer | None = None, last_step: int | None = None
) -> Report | None:
    """Run ``fit(callback)`` in a thread while this one reports what the callback forwards to
    Tune (``tune.report`` must be called from the trial's own thread); re-raise its error.

    With ``score``, each report's checkpoint is scored here first (training goes on meanwhile); a
    report without a checkpoint carries the last scores, since the model it reports was not saved.
    The report of ``last_step`` (the run's last) is returned unsent, for the caller to send once
    the run is complete (results fetched, trackers finished): ASHA and HyperBand end a trial at its
    last report, which must not cut the end of the run short."""
    from ray.util.queue import Empty, Queue

    reports = Queue(actor_options={"num_cpus": 0})
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fit(forward_reports_class()(reports))
        except BaseException as exc:  # re-raised in the trial's thread below
            errors.append(exc)

    thread = threading.Thread(target=target, name="rayft-trial-fit", daemon=True)
    thread.start()
    scores: dict[str, float] = {}
    held: Report | None = None
    while True:
        alive = thread.is_alive()
        try:
            item = reports.get(timeout=0.5)
        except (Empty, queue.Empty):
            if not alive:
                break
            continue
        if score is not None and item.get("checkpoint") is not None:
            scores = score(str(item["checkpoint"]))
        if last_step is not None and float(item["metrics"].get("step", 0)) >= last_step:
            held = (item, scores)
            continue
        report_to_tune(item, run_dir, scores)
    thread.join()
    if errors:
        raise errors[0]
    return held


@dataclass
class TrialLauncher:
    """The trial's Ray Train workers, in Tune's Ray, every report forwarded to Tune as it comes
    except the last, which :meth:`send_last_report` sends once the driver has finished the run."""

    cfg: RayftConfig
    run_dir: Path
    scorer: Scorer | None = None
    uses_ray: bool = True
    last_report: Report | None = None

    def check(self) -> None:
        """Nothing to check: the sweep checked its cluster."""

    def runtime(self) -> AbstractContextManager[Any]:
        """Nothing to start: the trial runs in the sweep's Ray."""
        return contextlib.nullcontext()

    def launch(self, plan: WorkerPlan, prepared: PreparedData) -> None:
        """Fit the trial's ``TorchTrainer``, recording its placement groups (removed if Tune stops
        the trial) and forwarding its reports."""
        remove_recorded_groups(self.run_dir)  # of this trial's earlier run, which Tune stopped

        def fit(callback: Any) -> None:  # the launcher records the groups (see placement_group_recorder)
            RayLauncher(self.cfg.scaling, self.cfg.failure, self.cfg.checkpoint, callbacks=(callback,)).launch(
                plan, prepared
            )

        last_step = plan.schedule.total_steps
        self.last_report = fit_forwarding(fit, self.run_dir, self.scorer, last_step=last_step)

    def send_last_report(self) -> None:
        """Report the run's last report to Tune (nothing when there was none)."""
        if self.last_report is not None:
            item, scores = self.last_report
            report_to_tune(item, self.run_dir, scores)
            self.last_report = None


def run_trial(params: dict[str, Any], setup: TrialSetup) -> None:
    """The Tune function trainable: train this trial's config, reporting every checkpoint to Tune."""
    from ray import tune

    mark_started_here(setup.own_ray)
    trial_id = tune.get_context().get_trial_id()
    cfg = trial_config(setup, params, trial_id)
    train_trial(cfg, params, tune.get_checkpoint(), parent_run_id=setup.parent_run_id)


def train_trial(
    cfg: RayftConfig, params: Mapping[str, Any], checkpoint: Any, *, parent_run_id: str | None = None
) -> None:
    """Train the trial's run with the training driver: under the run's lock, decide how it starts
    (:func:`plan_trial_start`), then claim, prepare (data shared through the cache while the params
    leave it alone), launch its ``TorchTrainer`` and fetch its results; its tracker run nests under
    ``parent_run_id`` (the sweep's)."""
    location = run_location(cfg)
    pointer = None
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            pointer = read_pointer(Path(directory))
    launcher = TrialLauncher(cfg, location.local_dir, CheckpointScorer.for_trial(cfg, location))

    def decide(store: RunStore) -> RunStart | None:
        return decide_trial_start(store, cfg.name, params, pointer, launcher.scorer)

    drive(cfg, launcher, location, start=decide, command="rayft tune", parent_run_id=parent_run_id)
    launcher.send_last_report()


def decide_trial_start(
    store: RunStore, name: str, params: Mapping[str, Any], pointer: Pointer | None, scorer: Scorer | None
) -> RunStart | None:
    """Under the run's lock: how the trial's run starts. A resumed trial first reports to Tune the
    checkpoints it has not seen; an adopting one takes the other trial's checkpoint; a trial whose
    run had already finished reports its end and trains nothing (None)."""
    run_dir = store.local_dir
    state = store.state()
    start = plan_trial_start(run_dir, pointer, state.finished, state.exists)
    where = f" from {pointer.path} (step {pointer.step})" if pointer is not None else ""
    log.info("tune: trial %s: %s%s", name, start, where)
    caught_up = catch_up(run_dir, pointer, scorer) if start == "resume" else 0
    if state.finished and start == "resume":
        if not caught_up and pointer is None:
            report_final(store)
        return None
    if start == "adopt" and pointer is not None:
        adopt_checkpoint(pointer, run_dir, params, name)
    return RunStart(resume=start != "start", retune=start == "adopt")


def unreported_checkpoints(run_dir: Path, pointer: Pointer | None) -> list[Pointer]:
    """The complete checkpoints of the trial's run newer than the one Tune handed back (all of them
    without one), oldest first: saved after the last report Tune recorded, before Tune paused the
    trial or the sweep's driver stopped."""
    after = pointer.step if pointer is not None else -1
    found = scan_checkpoints(run_dir / layout.CHECKPOINTS_DIR)
    return [Pointer(str(run_dir), c.name, c.step) for c in found if c.complete and c.step > after]


def catch_up(run_dir: Path, pointer: Pointer | None, score: Scorer | None) -> int:
    """Report to Tune, with their metrics and as checkpoints, the checkpoints it has not seen, so
    that its count of reports (the schedulers' time) and its history match the run, which goes on
    from the newest; returns how many. A checkpoint's evaluation-task scores are the recorded
    ones, else it is scored now."""
    missed = unreported_checkpoints(run_dir, pointer)
    for checkpoint in missed:
        manifest = read_manifest(checkpoint.path)
        metrics = dict(manifest.metrics) if manifest is not None else {}
        scores = recorded_scores(run_dir, checkpoint.step) if score is not None else {}
        if score is not None and not scores:
            scores = score(str(checkpoint.path))
        log.info("tune: reporting %s, saved after the last report of this trial", checkpoint.path)
        report_to_tune({"metrics": {"step": float(checkpoint.step), **metrics}, "checkpoint": str(checkpoint.path)},
                       run_dir, scores)  # fmt: skip
    return len(missed)


def report_final(store: RunStore) -> None:
    """A trial whose run had already finished (its driver was stopped just after): report its end,
    from the final/ manifest wherever the run lives."""
    from ray import tune

    manifest = store.final_manifest()
    if manifest is not None:
        scores = recorded_scores(store.local_dir, manifest.step)
        tune.report({"step": float(manifest.step), **manifest.metrics, **scores})
