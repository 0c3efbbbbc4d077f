"""Helpers shared by tests: running the training loop on prepared units, reading what it wrote."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rayft.config import RayftConfig, load_config
from rayft.data.prepared import PreparedData
from tests.support.faults import fault_callbacks

# 64 units, 2 workers x 4 per micro-batch: 8 steps per epoch, so 12 steps cross an epoch boundary; a
# checkpoint every 3 steps; LoRA dropout on, so that a resume must restore the RNG states too.
RESUME_RUN = ("train.max_steps=12", "train.save_steps=3", "train.eval_steps=null", "lora.dropout=0.1")


def tiny_config(model_dir: Path, storage: Path, *overrides: str) -> RayftConfig:
    """A config for the tiny model: 2 workers, small LoRA, frequent saves."""
    base = [
        f"model.name={model_dir}",
        f"storage_path={storage}",
        "name=run",
        "scaling.num_workers=2",
        "train.micro_batch_size=4",
        "train.learning_rate=3e-3",
        "train.save_steps=2",
        "train.eval_steps=2",
        "lora.r=4",
        "logging.tensorboard=false",
    ]
    # The faults a test set in its environment ride in the config: the shared Ray's workers do not see it.
    faults = fault_callbacks(os.environ)
    if faults and not any(o.startswith("train.callbacks") for o in overrides):
        base.append(f"train.callbacks={json.dumps(faults)}")
    return load_config(None, [*base, *overrides])


def train_on(cfg: RayftConfig, prepared: PreparedData, *, resume: bool = False) -> Path:
    """Claim the run and launch its workers (as the training driver does) on already prepared units;
    return the run directory."""
    from rayft.training.driver.run import default_launcher
    from rayft.training.driver.startup import build_worker_plan, claim_run_dir

    run_dir = claim_run_dir(cfg, resume=resume)
    default_launcher(cfg).launch(build_worker_plan(cfg, prepared, run_dir), prepared)
    return run_dir


def interleaved(prepared: PreparedData, root: Path, per_rank: int = 4) -> PreparedData:
    """The same units ordered so that one worker with two micro-batches a step trains, in every step,
    the micro-batches the two workers of ``prepared`` train (rank 0's, then rank 1's), ``per_rank``
    units each (unshuffled data: each rank reads its half in storage order)."""
    from dataclasses import replace

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayft.testing.units import write_split

    units = pa.concat_tables(pq.read_table(f) for f in prepared.train.files).to_pylist()
    half = len(units) // 2
    ordered = [
        u
        for step in range(0, half, per_rank)
        for u in (*units[step : step + per_rank], *units[half + step : half + step + per_rank])
    ]
    return replace(prepared, root=str(root), train=write_split(root / "train", ordered))


def crashed_copy(finished: Path, storage: Path, *, crashed_at: int) -> Path:
    """The state a run leaves when it dies before step ``crashed_at``, made from a finished run
    instead of training again: a copy of ``finished`` as ``storage/run`` without final/, without
    the checkpoints of ``crashed_at`` and later, and with the metrics of the steps before it.

    Exact for a deterministic run: the checkpoints it keeps are the ones the crashed run would have
    committed. The copy's config names ``storage`` (what the run's own config would say). Ray
    Train's own record of the checkpoints is left out (it would name the removed ones), so a resume
    finds its checkpoint by scanning the directory, as after a move to another machine; runs that
    really crash (``RAYFT_FAULT_RAISE``) resume through Ray's record."""
    import shutil

    from rayft.runs.checkpoints import scan_checkpoints

    run_dir = storage / "run"
    shutil.copytree(finished, run_dir, symlinks=True)
    shutil.rmtree(run_dir / "final")
    (run_dir / "checkpoints" / "checkpoint_manager_snapshot.json").unlink(missing_ok=True)
    for checkpoint in scan_checkpoints(run_dir / "checkpoints"):
        if checkpoint.step >= crashed_at:
            shutil.rmtree(run_dir / "checkpoints" / checkpoint.name)
    kept = [json.dumps(r) + "\n" for r in read_metrics(run_dir) if r["step"] < crashed_at]
    (run_dir / "metrics.jsonl").write_text("".join(kept))
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace(str(finished.parent), str(storage)))
    return run_dir


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of metrics.jsonl."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_losses(run_dir: Path) -> dict[int, float]:
    """Training loss by step."""
    return {r["step"]: r["train/loss"] for r in read_metrics(run_dir) if "train/loss" in r}


def resumed_after(run_dir: Path, interrupted_at: float, last_step: int) -> int:
    """The step a resumed run restarted from, read from metrics.jsonl, which keeps the records up to
    the restored step (written before the interruption, at ``time.time()`` ``interrupted_at``) and
    appends those of the steps after it, up to ``last_step``, each once.

    What the file holds is the evidence: the worker's "resumed from" log line reaches the driver
    through Ray's log relay, which may deliver it after the command has returned."""
    records = [r for r in read_metrics(run_dir) if "train/loss" in r]
    before = [r["step"] for r in records if r["time"] < interrupted_at]
    after = [r["step"] for r in records if r["time"] >= interrupted_at]
    assert before == list(range(1, len(before) + 1)), records
    assert after == list(range(len(before) + 1, last_step + 1)), records
    return len(before)


def adapter_tensors(directory: Path) -> dict[str, Any]:
    """The tensors of an adapter_model.safetensors."""
    from safetensors.torch import load_file

    return load_file(str(directory / "adapter_model.safetensors"))


def actor_classes() -> set[tuple[str, str]]:
    """(actor id, class name) of every actor the local Ray has created so far (from the GCS)."""
    import ray._private.state

    return {(actor_id, info["ActorClassName"]) for actor_id, info in ray._private.state.actors().items()}


def ray_processes(title: str, *, ours: bool = True) -> list[Any]:
    """The processes (psutil) whose command line holds ``title`` (a Ray actor's, ``ray::Class``).

    With ``ours``, only those that descend from this test process (through the Ray it started, or
    a driver it runs): never those of another Ray on the same machine, which may be another test
    process's running beside this one. A cluster from ``ray start`` is not this process's
    descendant: its callers pass ``ours=False`` and tell its processes apart another way."""
    import psutil

    def titled(process: Any) -> bool:
        try:
            return title in " ".join(process.cmdline())
        except psutil.Error:  # ended meanwhile
            return False

    candidates = psutil.Process().children(recursive=True) if ours else psutil.process_iter()
    return [p for p in candidates if titled(p)]


def train_workers(since: float, *, ours: bool = True) -> list[Any]:
    """The Ray Train worker processes (psutil) started at ``since`` (``time.time()``) or later; ``ours``
    as for :func:`ray_processes`."""
    import psutil

    since -= 1.0  # psutil dates a process from the boot time, which Linux gives in whole seconds

    def started(process: Any) -> bool:
        try:
            return bool(process.create_time() >= since)
        except psutil.Error:  # ended meanwhile
            return False

    return [p for p in ray_processes("ray::RayTrainWorker", ours=ours) if started(p)]


def end_orphaned_cleaners() -> list[int]:
    """SIGKILL the placement-group cleaners that a killed driver left on this process's Ray; returns
    their pids.

    For a run on a Ray that rayft did not start (a driver joining the tests' shared Ray by address),
    Ray Train starts a detached ``PlacementGroupCleaner`` that asks the State API every second whether
    the run's controller lives. The shared Ray has no dashboard, hence no State API: once the driver
    is killed its cleaner never gets an answer, and would poll and log a warning every second for the
    rest of the session. The driver's placement group ended with its job, so there is nothing to clean.
    """
    import psutil

    killed = []
    for process in ray_processes("ray::PlacementGroupCleaner"):
        with contextlib.suppress(psutil.Error):
            process.kill()
            killed.append(process.pid)
    return killed


def live_placement_groups() -> dict[str, dict[str, Any]]:
    """The placement groups of this process's Ray that are not removed, by id (hex): their state,
    bundles and the job that made them (an id ends with its job's)."""
    import ray

    return {
        group: {"state": entry["state"], "bundles": list(entry["bundles"].values()), "job": group[-8:]}
        for group, entry in ray.util.placement_group_table().items()
        if entry["state"] != "REMOVED"
    }


def remove_placement_groups(groups: dict[str, Any], grace_s: float) -> dict[str, Any]:
    """Give Ray ``grace_s`` to remove ``groups`` (by id, as :func:`live_placement_groups` gives them),
    then remove those still there; returns those."""
    from rayft.tuning.reaper import remove_group

    left = {group: groups[group] for group in still_live(groups, grace_s)}
    for group in left:
        remove_group(group)
    still_live(left, 10)  # removal is asynchronous: the next test finds the CPUs free
    return left


def still_live(groups: Iterable[str], timeout_s: float) -> set[str]:
    """Those of ``groups`` (ids) that Ray has not removed within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    live = set(groups) & set(live_placement_groups())
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live &= set(live_placement_groups())
    return live


def kill_a_worker_at(
    run_dir: Path, step: int, killed: list[int], monkeypatch: Any, choose: Callable[[list[Any]], Any] = lambda w: w[-1]
) -> threading.Thread:
    """Hold the run that will train in ``run_dir`` before step ``step + 1`` (``RAYFT_FAULT_HOLD``)
    and, once metrics.jsonl shows ``step``, SIGKILL one of its Ray Train workers (``choose``), then
    let the run go on. The kill lands between ``step`` and ``step + 1`` however fast the machine
    is; ``killed`` gets the last step logged before it. Set up before the run starts."""
    release = run_dir.with_name(f"{run_dir.name}.released-{step}")
    monkeypatch.setenv("RAYFT_FAULT_HOLD", f"{step + 1}:{release}")
    since = time.time()

    def watch() -> None:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 900  # a backstop: a run that never gets there is let go, unkilled
        while not release.exists():
            try:
                done = [r["step"] for r in read_metrics(run_dir) if "train/loss" in r] if metrics.exists() else []
            except ValueError:  # a line being written
                done = []
            workers = train_workers(since) if done and max(done) >= step else []
            if workers:
                killed.append(max(done))
                os.kill(choose(workers).pid, signal.SIGKILL)
            if workers or time.monotonic() > deadline:
                release.touch()
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


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


# Canary values for the credential variables: tests set them and check that no output holds one.
CANARIES = {
    "HF_TOKEN": "hf_canaryHF0a1b2c3d4e5f",
    "WANDB_API_KEY": "canary-wandb-5f4e3d2c1b0a",
    "MLFLOW_TRACKING_TOKEN": "canary-mlflow-token-9z8y7x6w",
    "MLFLOW_TRACKING_PASSWORD": "canary-mlflow-9z8y7x6w",
    "AWS_ACCESS_KEY_ID": "AKIACANARY1234567890",
    "AWS_SECRET_ACCESS_KEY": "canary/aws+secret/0123456789abcdefABCDEF",
    "AWS_SESSION_TOKEN": "canary-aws-session-token-0123456789",
    # an endpoint's key, in a variable whose name says nothing of a credential (api_key_env names it)
    "LLM_ACCESS": "hf_CANARYSECRET123",
}


def files_containing(root: Path, needles: dict[str, str]) -> list[str]:
    """``path: NAME`` for every file under ``root`` (or ``root`` itself, a file) that contains a needle."""
    hits = []
    for path in [root] if root.is_file() else root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            hits += [f"{path}: {name}" for name, value in needles.items() if value.encode() in data]
    return hits
