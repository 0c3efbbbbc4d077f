"""The training driver, with fakes of its seams (the launcher, the trackers, the store): the order of
its steps, what a failure leaves, and that each of its callers (`rayft train`, a Tune trial, rank 0
under torchrun, the pipeline's train stage) goes through it, so that for each the trackers start and
finish, the store is persisted and the results are fetched."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rayft.config import RayftConfig, load_config
from rayft.data.prepared import PreparedData
from rayft.errors import RunStateError, TrainingError
from rayft.runs import layout
from rayft.runs.location import RunLocation
from rayft.runs.manifest import write_manifest
from rayft.runs.store import RunStore, open_store
from rayft.tracking.state import write_ids
from rayft.training.driver import run as driver
from rayft.training.driver.run import DriverSeams, RunStart, TrainResult, drive
from rayft.training.driver.startup import run_location
from rayft.training.loop.worker_plan import WorkerPlan


@dataclass
class Events:
    """What the fakes saw, in order."""

    seen: list[tuple[Any, ...]] = field(default_factory=list)

    def names(self) -> list[str]:
        return [e[0] for e in self.seen]


@dataclass
class FakeLauncher:
    """Stands for the workers: writes final/ as rank 0 would, or fails."""

    events: Events
    fail: bool = False
    uses_ray: bool = False

    def check(self) -> None:
        self.events.seen.append(("check",))

    def runtime(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def launch(self, plan: WorkerPlan, prepared: PreparedData) -> None:
        self.events.seen.append(("launch", dict(plan.tracker_ids), plan.retuned))
        if self.fail:
            raise TrainingError("training failed on rank 0")
        final = Path(plan.run_dir) / layout.FINAL_DIR
        final.mkdir(parents=True)
        write_manifest(final, plan.schedule.total_steps, {"train/loss": 1.5, "eval/loss": 1.25})


@dataclass
class FakeTrackers:
    events: Events

    def finish(self, *, succeeded: bool, artifacts: dict[str, Path] | None = None) -> None:
        self.events.seen.append(("trackers.finish", succeeded, sorted(artifacts or {})))


class RecordingStore:
    """A real store of the run that records what the driver asks it to make durable or fetch."""

    def __init__(self, inner: RunStore, events: Events) -> None:
        self._inner = inner
        self._events = events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def persist(self, rel: str) -> None:
        self._events.seen.append(("store.persist", rel))
        self._inner.persist(rel)

    def fetch_results(self) -> None:
        self._events.seen.append(("store.fetch_results",))
        self._inner.fetch_results()


def fake_seams(events: Events) -> DriverSeams:
    def start_trackers(cfg: RayftConfig, run_dir: Path, lineage: dict[str, Any], parent: str | None) -> Any:
        events.seen.append(("trackers.start", parent))
        write_ids(run_dir, "mlflow", {"run_id": "run-1"})
        return FakeTrackers(events)

    def store(location: RunLocation) -> Any:
        events.seen.append(("store.open", location.local_dir))
        return RecordingStore(open_store(location), events)

    return DriverSeams(open_store=store, start_trackers=start_trackers)


def config(model_dir: Path, storage: Path, *overrides: str) -> RayftConfig:
    return load_config(None, [
        f"model.name={model_dir}", f"storage_path={storage}", "name=run", "scaling.num_workers=0",
        "data.datasets=[{path: 'builtin:arithmetic', max_rows: 24}]", "data.validation_fraction=0.2",
        "train.micro_batch_size=2", "train.max_steps=3", "lora.r=4", *overrides,
    ])  # fmt: skip


IN_ORDER = [
    "check", "store.open", "store.persist", "trackers.start", "store.persist", "launch", "store.fetch_results",
    "trackers.finish",
]  # fmt: skip


def test_the_driver_claims_prepares_tracks_launches_fetches_and_finishes_in_order(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    events = Events()
    cfg = config(tiny_model_dir, tmp_path)
    result = drive(cfg, FakeLauncher(events), run_location(cfg), parent_run_id="sweep-1", seams=fake_seams(events))

    assert events.names() == IN_ORDER
    assert events.seen[2] == ("store.persist", layout.DATA_DIR) and events.seen[4][1] == layout.TRACKING_FILE
    assert ("trackers.start", "sweep-1") in events.seen
    assert ("launch", {"mlflow": {"run_id": "run-1"}}, False) in events.seen  # the workers log into the runs
    assert events.seen[-1] == ("trackers.finish", True, ["config", "final"])
    assert result.steps == 3 and result.eval_loss == 1.25 and result.storage_uri is None
    assert result.run_dir == tmp_path / "run" and (result.run_dir / layout.CONFIG_FILE).is_file()
    assert (result.run_dir / layout.DATA_DIR).is_dir()  # the data report of the run


def test_a_failed_launch_ends_the_trackers_failed_and_fetches_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    events = Events()
    cfg = config(tiny_model_dir, tmp_path)
    with pytest.raises(TrainingError, match="training failed on rank 0"):
        drive(cfg, FakeLauncher(events, fail=True), run_location(cfg), seams=fake_seams(events))
    assert events.seen[-1] == ("trackers.finish", False, [])
    assert "store.fetch_results" not in events.names()


def test_a_start_decided_under_the_lock_may_train_nothing_or_retune(tiny_model_dir: Path, tmp_path: Path) -> None:
    events = Events()
    cfg = config(tiny_model_dir, tmp_path)
    nothing = drive(cfg, FakeLauncher(events), run_location(cfg), start=lambda store: None, seams=fake_seams(events))
    assert nothing is None and events.names() == ["check", "store.open"]
    assert not (tmp_path / "run" / layout.CONFIG_FILE).exists()  # nothing claimed

    first = drive(cfg, FakeLauncher(events), run_location(cfg), seams=fake_seams(events))
    assert first.steps == 3
    with pytest.raises(RunStateError, match="already finished"):  # the claim still refuses a finished run
        drive(cfg, FakeLauncher(events), run_location(cfg), start=RunStart(resume=True), seams=fake_seams(events))


Caller = Callable[[RayftConfig, Path], Any]


@contextlib.contextmanager
def driven_with_fakes(monkeypatch: pytest.MonkeyPatch, module: Any) -> Iterator[tuple[Events, list[Any]]]:
    """Every call of ``module.drive`` runs the real driver with the fake launcher and seams, and
    records the caller's own launcher and arguments."""
    events, calls = Events(), []
    real = driver.drive

    def spy(cfg: RayftConfig, launcher: Any, location: RunLocation, **kwargs: Any) -> TrainResult | None:
        calls.append((launcher, kwargs))
        return real(cfg, FakeLauncher(events), location, **{**kwargs, "seams": fake_seams(events)})

    monkeypatch.setattr(module, "drive", spy)
    yield events, calls


def assert_driven(events: Events, parent: str | None = None) -> None:
    """The run went through the whole driver: trackers started and finished, store persisted, results fetched."""
    names = events.names()
    assert ("trackers.start", parent) in events.seen
    assert ("store.persist", layout.DATA_DIR) in events.seen and ("store.persist", layout.TRACKING_FILE) in events.seen
    assert names.index("launch") < names.index("store.fetch_results") < names.index("trackers.finish")
    assert events.seen[-1] == ("trackers.finish", True, ["config", "final"])


def test_rayft_train_drives_its_run_with_the_in_process_or_ray_launcher(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft.recipes import train

    with driven_with_fakes(monkeypatch, train) as (events, calls):
        result = train.run(config(tiny_model_dir, tmp_path))
        assert isinstance(calls[0][0], driver.LocalLauncher)
        train.run(config(tiny_model_dir, tmp_path, "scaling.num_workers=2", "name=other"))
        assert isinstance(calls[1][0], driver.RayLauncher) and calls[1][0].scaling.num_workers == 2
    assert result.steps == 3 and "command" not in calls[0][1]  # the default lock name, `rayft train`
    assert_driven(events)


def test_a_tune_trial_drives_its_run_nested_under_the_sweep(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft.tuning import trial

    cfg = config(tiny_model_dir, tmp_path, "scaling.num_workers=1")
    with driven_with_fakes(monkeypatch, trial) as (events, calls):
        trial.train_trial(cfg, {}, None, parent_run_id="sweep-run")
    launcher, kwargs = calls[0]
    assert isinstance(launcher, trial.TrialLauncher) and kwargs["command"] == "rayft tune"
    assert_driven(events, parent="sweep-run")
    assert ("launch", {"mlflow": {"run_id": "run-1"}}, False) in events.seen  # a fresh trial: not retuned


def test_rank_0_under_torchrun_drives_the_run(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft.training.driver import torchrun
    from tests.support.servers import free_port

    env = {
        "WORLD_SIZE": "1",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with driven_with_fakes(monkeypatch, torchrun) as (events, calls):
        result = torchrun.train(config(tiny_model_dir, tmp_path, "scaling.num_workers=1"))
    assert result is not None and result.steps == 3
    launcher, kwargs = calls[0]
    assert isinstance(launcher, torchrun.TorchrunLauncher) and kwargs["command"] == "rayft train (torchrun)"
    assert_driven(events)


def test_the_pipeline_train_stage_drives_its_run(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft.pipeline import training
    from rayft.pipeline.stages import StageContext, TrainStage

    ctx = StageContext(config(tiny_model_dir, tmp_path), RunLocation(tmp_path / "pipeline"), {})
    with driven_with_fakes(monkeypatch, training) as (events, calls):
        output = TrainStage().run(ctx, fresh=False)
    assert isinstance(calls[0][0], driver.LocalLauncher)
    assert output.summary["steps"] == 3 and output.files["final"] == tmp_path / "pipeline" / "train" / "final"
    assert_driven(events)
