"""Ray Jobs against a real `ray start --head` with its dashboard (token authentication on, as Ray's
default here): `rayft submit` trains the tiny model and exits with the job's status, no credential
value reaches the job, `rayft jobs stop` saves a checkpoint that `--resume` continues, `rayft jobs
stacks` shows every Ray Train worker of a held job in rayft's training loop (py-spy), `rayft run
--address` joins the head and leaves it up, and bad addresses fail within seconds in one line. The tests
share one head (its start costs more than most of them)."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.faults import FAULT_INJECTOR
from tests.support.ray_head import RayHead, ray_head
from tests.support.ray_state import train_workers
from tests.support.runs import read_metrics, train_losses
from tests.support.servers import free_port

pytestmark = pytest.mark.integration

RAYFT = str(Path(sys.executable).parent / "rayft")
SECRET = "hf_" + secrets.token_hex(16)
HELD_STEP = 3  # a run's steps before it are trained; before it, the run waits for `rayft jobs stop`
SECTION = re.compile(r"^=== (\S+) pid (\d+) on (\S+) \(node [0-9a-f]+\) ===$", re.MULTILINE)


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHead]:
    """One head for the module; its environment holds HF_TOKEN (as a cluster's nodes would), and holds
    a training job before HELD_STEP until it is stopped (a release file that is never created)."""
    hold = f"{HELD_STEP}:{tmp_path_factory.mktemp('hold') / 'never-released'}"
    with ray_head(num_cpus=2, env={"HF_TOKEN": SECRET, "RAYFT_FAULT_HOLD": hold}) as started:
        yield started


def _config(tmp_path: Path, model_dir: Path, name: str, *lines: str, workers: int = 1) -> Path:
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        f"name: {name}\nstorage_path: {tmp_path / 'runs'}\nmodel: {{name: {model_dir}}}\n"
        "data:\n  datasets: [{path: 'builtin:arithmetic', max_rows: 40}]\n  validation_fraction: 0.1\n"
        f"scaling: {{num_workers: {workers}}}\nlora: {{r: 4}}\nlogging: {{tensorboard: false}}\n"
        + "".join(f"{x}\n" for x in lines)
    )
    return config


def _rayft(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "RAY_ADDRESS": "", **env}
    return subprocess.run([RAYFT, *args], env=full, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def cold_start_s() -> float:
    """Seconds a fresh process takes here to import what a Ray command imports, before it does anything.

    A failure "within seconds" is measured past this: on a loaded machine the imports alone can take
    longer than the whole budget, and they are not what the check is about."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import ray, torch, rayft.cli.main"], check=True, timeout=300)
    return time.monotonic() - started


def _job_id(output: str) -> str:
    found = re.search(r"Submitted job (\S+)", output)
    assert found, output
    return found.group(1)


def _stored_job(head: RayHead, job: str) -> str:
    """The job as the head stores and serves it (entrypoint, runtime_env, metadata), raw JSON."""
    import urllib.request

    token = Path(head.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    request = urllib.request.Request(f"{head.jobs_url}/api/jobs/{job}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return str(reply.read().decode())


def test_submit_stop_and_resume_a_run_with_no_credential_value_in_the_job(
    head: RayHead, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Submit (not followed), stop mid-run through the SIGTERM path, resubmit with --resume and follow
    it to success: the run directory is complete and its losses continue from the saved step. The
    job waits before HELD_STEP until the stop request reaches it, then takes that step and saves it."""
    steps = 6
    config = _config(
        tmp_path, tiny_model_dir, "submitted",
        f"train: {{max_steps: {steps}, micro_batch_size: 4, save_steps: 1000, eval_steps: {steps}, "
        f"callbacks: ['{FAULT_INJECTOR}']}}",
    )  # fmt: skip
    workdir = tmp_path / "project"
    workdir.mkdir()
    env = {**head.env, "HF_TOKEN": SECRET}
    submit = (
        "submit",
        str(config),
        "--address",
        str(head.jobs_url),
        "--working-dir",
        str(workdir),
        "--env",
        "HF_TOKEN",
    )
    started = _rayft(*submit, "--no-follow", env=env)
    assert started.returncode == 0, started.stderr[-3000:]
    job = _job_id(started.stdout)
    run_dir = tmp_path / "runs" / "submitted"
    deadline = time.monotonic() + 600  # a backstop against a job that never trains, not a time limit
    while not (run_dir / "metrics.jsonl").is_file() or len(train_losses(run_dir)) < HELD_STEP - 1:
        assert time.monotonic() < deadline, "the job never started training"
        time.sleep(0.5)
    stopped = _rayft("jobs", "stop", job, "--address", str(head.jobs_url), env=head.env)
    assert stopped.returncode == 0, stopped.stderr
    assert f"Job {job} STOPPED" in stopped.stdout and "--resume" in stopped.stdout
    saved = sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*"))
    assert saved == [HELD_STEP], saved  # saved on the stop, at the step it was held before
    first_logs = _rayft("jobs", "logs", job, "--address", str(head.jobs_url), env=head.env, timeout=60).stdout
    assert "stopped on SIGTERM after saving" in first_logs
    assert "Credentials found in the cluster's environment: HF_TOKEN" in first_logs
    losses_before = train_losses(run_dir)

    resumed = _rayft(*submit, "--resume", env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    second = _job_id(resumed.stdout)
    assert f"Job {second} SUCCEEDED" in resumed.stderr
    new_steps = [int(s) for s in re.findall(rf"step (\d+)/{steps}  loss", resumed.stdout)]
    assert new_steps and new_steps[0] == saved[0] + 1 and new_steps[-1] == steps
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, steps + 1))
    assert all(losses[s] == losses_before[s] for s in range(1, saved[0] + 1))
    assert any("eval/loss" in r for r in read_metrics(run_dir))
    assert (run_dir / "final" / "adapter_model.safetensors").is_file()
    listed = _rayft("jobs", "list", "--address", head.gcs, env=head.env, timeout=60).stdout
    assert re.search(rf"{job}\s+STOPPED\s+train\s+submitted", listed) and re.search(rf"{second}\s+SUCCEEDED", listed)

    # The credential's name travels, its value nowhere: not in the jobs' specs as the head stores them,
    # their logs, the uploaded configs, any of Ray's files, nor the run directory.
    status = _rayft("jobs", "status", second, "--address", str(head.jobs_url), env=head.env, timeout=60).stdout
    assert "--require-env HF_TOKEN" in status and "SUCCEEDED" in status
    specs = _stored_job(head, job) + _stored_job(head, second)
    assert "HF_TOKEN" in specs and "rayft_job_" in specs
    for text in (specs, started.stdout, resumed.stdout, resumed.stderr, first_logs, status):
        assert SECRET not in text
    assert len(list(head.temp_dir.rglob("rayft_job_*/config.yaml"))) == 2, "each job's config travels with it"
    for root in (head.temp_dir, run_dir):
        leaks = [p for p in root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
        assert not leaks, leaks


def _sections(output: str) -> dict[int, tuple[str, str]]:
    """What `rayft jobs stacks` printed, by process id: the kind of process and its stacks."""
    heads = list(SECTION.finditer(output))
    ends = [h.start() for h in heads[1:]] + [len(output)]
    return {int(h.group(2)): (h.group(1), output[h.end() : end]) for h, end in zip(heads, ends, strict=True)}


def _wait_for_step(run_dir: Path, step: int) -> None:
    deadline = time.monotonic() + 600  # a backstop against a job that never trains, not a time limit
    while not (run_dir / "metrics.jsonl").is_file() or step not in train_losses(run_dir):
        assert time.monotonic() < deadline, f"the job never reached step {step}"
        time.sleep(0.5)


def test_stacks_of_a_held_job_show_every_worker_in_the_training_loop(
    head: RayHead, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A run on 2 workers held before HELD_STEP until a file of its own exists (the hold in its config, in
    place of the head's): py-spy's dump of each of its workers shows it in the training loop, and the run
    then ends as if nothing had looked."""
    # The CLI runs from this environment's bin, not on the PATH: it finds py-spy there all the same.
    assert (Path(RAYFT).parent / "py-spy").is_file(), "py-spy comes with ray[default]"
    release = tmp_path / "released"
    injector = f"{{target: '{FAULT_INJECTOR}', options: {{hold: '{HELD_STEP}:{release}'}}}}"
    config = _config(
        tmp_path, tiny_model_dir, "held",
        f"train: {{max_steps: 4, micro_batch_size: 4, logging_steps: 1, save_steps: 1000, eval_steps: null, "
        f"callbacks: [{injector}]}}", workers=2,
    )  # fmt: skip
    workdir = tmp_path / "project"
    workdir.mkdir()
    since = time.time()
    address = ("--address", str(head.jobs_url))
    started = _rayft("submit", str(config), *address, "--working-dir", str(workdir), "--no-follow", env=head.env)
    assert started.returncode == 0, started.stderr[-3000:]
    job = _job_id(started.stdout)
    run_dir = tmp_path / "runs" / "held"
    _wait_for_step(run_dir, HELD_STEP - 1)

    try:
        dumped = _rayft("jobs", "stacks", job, *address, env=head.env, timeout=120)
    finally:
        release.touch()
    assert dumped.returncode == 0, dumped.stdout[-3000:] + dumped.stderr[-3000:]
    stacks = _sections(dumped.stdout)
    # This head's workers, not those of another Ray on the machine: they inherited its environment.
    workers = {w.pid for w in train_workers(since, ours=False) if w.environ().get("HF_TOKEN") == SECRET}
    assert len(workers) == 2 and workers <= stacks.keys(), (workers, dumped.stdout[-3000:])
    for pid in workers:
        kind, text = stacks[pid]
        assert kind == "RayTrainWorker" and "py-spy could not read" not in text, text
        # Held in the tests' fault callback, called from the worker loop.
        assert re.search(r"on_step_begin \(\S*tests/support/faults\.py:\d+\)", text), text
        assert re.search(r"\(\S*rayft/training/loop/worker\.py:\d+\)", text), text
    drivers = [text for kind, text in stacks.values() if kind == "DRIVER"]
    assert len(drivers) == 1 and "rayft/" in drivers[0], dumped.stdout[:3000]

    finished = _rayft("jobs", "logs", job, *address, "--follow", env=head.env, timeout=600)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert sorted(train_losses(run_dir)) == [1, 2, 3, 4]


def test_a_credential_missing_on_the_cluster_fails_the_job_at_once(head: RayHead, tmp_path: Path) -> None:
    config = _config(tmp_path, tmp_path, "absent")
    workdir = tmp_path / "project"
    workdir.mkdir()
    env = {**head.env, "RAYFT_ABSENT_API_KEY": "local-value-" + secrets.token_hex(8)}
    done = _rayft("submit", str(config), "--address", str(head.jobs_url), "--working-dir", str(workdir),
                  "--env", "RAYFT_ABSENT_API_KEY", env=env, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs RAYFT_ABSENT_API_KEY in the cluster's environment" in done.stdout
    assert env["RAYFT_ABSENT_API_KEY"] not in done.stdout + done.stderr


def test_run_joins_an_existing_cluster_with_address(head: RayHead, tmp_path: Path) -> None:
    """`rayft run --address` joins a running Ray head, names the fix when the head's token
    authentication refuses it, and leaves the cluster up."""
    config = tmp_path / "sdg-only.yaml"
    config.write_text(
        f"name: joined\nstorage_path: {tmp_path / 'runs'}\n"
        "sdg: {seeds: {path: 'builtin:arithmetic', max_rows: 4}, num_seeds: 4, variations: 1}\n"
    )
    refused = _rayft("run", str(config), "--address", head.gcs, env={**head.env, "RAY_AUTH_MODE": "disabled"})
    assert refused.returncode != 0
    assert "requires token authentication" in refused.stderr and "RAY_AUTH_MODE=token" in refused.stderr
    done = _rayft("run", str(config), "--address", head.gcs, env=head.env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"joining the Ray cluster at {head.gcs}" in done.stderr
    assert "Started a local Ray instance" not in done.stderr
    assert (tmp_path / "runs" / "joined" / "stages" / "sdg.json").is_file()
    assert head.gcs_answers(), "the joined cluster must be left running"


# Every command that uses Ray, CONFIG standing for the config file.
RAY_COMMANDS = [
    ["train", "CONFIG"], ["sdg", "CONFIG", "--test-mode"], ["data", "prepare", "CONFIG"], ["eval", "CONFIG"],
    ["compare", "CONFIG", "--model", "a=x", "--model", "b=y"], ["run", "CONFIG"],
]  # fmt: skip


def test_a_refused_token_is_one_line_within_seconds_on_every_command(
    head: RayHead, tmp_path: Path, cold_start_s: float
) -> None:
    config = str(_config(tmp_path, tmp_path, "refused"))
    no_token = {"RAY_AUTH_MODE": "disabled"}
    joins = [(command, head.gcs) for command in RAY_COMMANDS]
    jobs = [(["submit", "CONFIG"], str(head.jobs_url)), (["jobs", "list"], str(head.jobs_url))]
    for command, address in [*joins, *jobs]:
        args = [config if arg == "CONFIG" else arg for arg in command]
        started = time.monotonic()
        done = _rayft(*args, "--address", address, env=no_token, timeout=60)
        elapsed = time.monotonic() - started
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "requires token authentication" in done.stderr and "RAY_AUTH_MODE=token" in done.stderr, command
        assert "Traceback" not in done.stderr and "gcs_client" not in done.stderr, (command, done.stderr)
        assert elapsed - cold_start_s < 10, (command, elapsed, cold_start_s)
    assert not (tmp_path / "runs" / "refused").exists(), "a refused command writes nothing"


def test_an_unreachable_address_names_it_and_how_to_start_a_head(tmp_path: Path, cold_start_s: float) -> None:
    config = _config(tmp_path, tmp_path, "unreachable")
    for command, address in ((["train"], f"127.0.0.1:{free_port()}"), (["submit"], f"http://127.0.0.1:{free_port()}")):
        started = time.monotonic()
        done = _rayft(*command, str(config), "--address", address, env={}, timeout=60)
        assert time.monotonic() - started - cold_start_s < 10
        assert done.returncode == 2, done.stderr
        assert f"--address {address}" in done.stderr and "ray start --head" in done.stderr


def test_a_head_without_the_jobs_api_says_so_and_names_the_fix(tmp_path: Path, cold_start_s: float) -> None:
    config = _config(tmp_path, tmp_path, "nojobs")
    with ray_head(num_cpus=1, dashboard=False) as bare:
        started = time.monotonic()
        done = _rayft("submit", str(config), "--address", bare.gcs, env=bare.env, timeout=60)
        assert time.monotonic() - started - cold_start_s < 10
    assert done.returncode == 2, done.stderr
    assert (
        "serves no Jobs API" in done.stderr and "ray[default]" in done.stderr and "--include-dashboard" in done.stderr
    )
