"""Cost of MLflow logging on the training loop: the same in-process run of the tiny model with and
without ``logging.mlflow`` (a real ``mlflow server`` on this machine), and the cost of one
``log()`` call on the training thread against a live and against a dead server.

Arms alternate none / mlflow after one warm-up of each; the step time of a run is the median gap
between the ``time`` stamps of consecutive steps in metrics.jsonl (steady state, logging every step).
The per-call cost is what the training thread pays per logged step (a queue put): measured over
2,000 calls of the six metrics of a step, with the sender thread sending to the live server, then
after the server is killed (the sender retrying in the background). Step times on a shared machine
move by several percent between runs, more than the 1% judged: the CPU the logging costs per step, in
rayft's process and in the server's, is measured too (:func:`logging_cpu_ms`), and does not move so.

    .venv/bin/python benchmarks/bench_tracking.py [--repeats 2] [--steps 60] [--model smollm2-135m-instruct]
        [--cpu-only STEP_MS]

``--model`` runs the arms on another model (the quickstart's built-in SmolLM2-135M-Instruct: its
step on a CPU is seconds long, so the 1% target is judged against a step users actually take).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
METRICS = {"train/loss": 1.0, "train/learning_rate": 1e-4, "train/grad_norm": 0.5, "train/tokens_per_s": 1e3,
           "train/epoch": 0.1, "train/padding_efficiency": 0.9}  # fmt: skip


def run_arm(root: Path, model: Path | str, name: str, steps: int, tracking_uri: str | None) -> float:
    """One `rayft train` run (in-process); its median step time in ms."""
    config = root / f"{name}.yaml"
    config.write_text(f"name: {name}\n")
    overrides = [str(config), f"storage_path={root / 'runs'}", f"model.name={model}", "scaling.num_workers=0",
                 f"train.max_steps={steps}", "train.save_steps=100000", "train.eval_steps=null", "lora.r=4",
                 "train.micro_batch_size=2", "data.datasets=[{path: 'builtin:arithmetic', max_rows: 400}]",
                 "data.validation_fraction=0.0", "data.max_seq_length=128", "logging.tensorboard=false",
                 "logging.console=false"]  # fmt: skip
    if tracking_uri:
        overrides.append(f"logging.mlflow={{tracking_uri: '{tracking_uri}', experiment: bench, artifacts: []}}")
    env = {**os.environ, "RAYFT_CACHE": str(root / "cache"), "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-m", "rayft", "train", *overrides], check=False, cwd=REPO, env=env,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{name}: rayft train failed: {done.stderr[-3000:]}")
    lines = (root / "runs" / name / "metrics.jsonl").read_text().splitlines()
    times = [json.loads(line)["time"] for line in lines if "train/loss" in line]
    return statistics.median(b - a for a, b in itertools.pairwise(times)) * 1000


def log_call_us(uri: str, run_id: str, root: Path, calls: int = 2000) -> float:
    """Microseconds per ``TrackerLogger.log`` call on this thread (the sender sends meanwhile)."""
    from rayft.tracking.mlflow_run import MlflowMetricSink
    from rayft.tracking.worker import TrackerLogger

    logger = TrackerLogger(MlflowMetricSink(uri, run_id), root)
    time.sleep(1.0)  # connected (or retrying)
    started = time.perf_counter()
    for step in range(calls):
        logger.log(step, METRICS)
        if step % 100 == 0:
            time.sleep(0.01)  # let the sender run, as a training step would
    elapsed = time.perf_counter() - started - (calls // 100) * 0.01
    logger.close()
    return elapsed / calls * 1e6


def logging_cpu_ms(
    server: Any, run_id: str, root: Path, *, step_s: float, interval_s: float, steps: int = 20
) -> tuple[float, float]:
    """CPU milliseconds per training step spent on MLflow logging at the real step cadence: in this
    process (the queue puts and the sender thread, the training thread otherwise sleeping) and in the
    server's process tree. CPU time, unlike step time, does not move with other load on the machine."""
    import psutil

    from rayft.tracking.mlflow_run import MlflowMetricSink
    from rayft.tracking.worker import TrackerLogger

    tree = [psutil.Process(server.process.pid), *psutil.Process(server.process.pid).children(recursive=True)]
    server_cpu = lambda: sum(sum(p.cpu_times()[:2]) for p in tree)  # noqa: E731
    logger = TrackerLogger(MlflowMetricSink(server.uri, run_id), root, min_interval_s=interval_s)
    time.sleep(2.0)  # connected
    own, served = time.process_time(), server_cpu()
    for step in range(steps):
        logger.log(10_000 + step, METRICS)
        time.sleep(step_s)
    logger.close()
    return (time.process_time() - own) / steps * 1000, (server_cpu() - served) / steps * 1000


def print_step_times(args: argparse.Namespace, results: dict[str, list[float]]) -> None:
    """Print the step-time arms."""
    none_ms, mlflow_ms = statistics.median(results["none"]), statistics.median(results["mlflow"])
    pairs = [m / n for n, m in zip(results["none"], results["mlflow"], strict=True)]
    print(
        f"{args.model} model, in-process, {args.steps} steps, logging every step, {args.repeats} runs per arm (median)"
    )
    print(f"  step time  none {none_ms:.2f} ms   mlflow {mlflow_ms:.2f} ms   ratio {mlflow_ms / none_ms:.3f}")
    print(
        f"  runs       none {[round(x, 2) for x in results['none']]}  mlflow {[round(x, 2) for x in results['mlflow']]}"
    )
    print(f"  ratio of each none/mlflow pair run back to back {[round(x, 3) for x in pairs]} "
          f"(median {statistics.median(pairs):.3f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--model", default="tiny", help="tiny (random-init, default) or a model name or path")
    parser.add_argument("--cpu-only", type=float, metavar="STEP_MS",
                        help="skip the step-time arms; measure the logging CPU at this step time")  # fmt: skip
    args = parser.parse_args()
    sys.path[:0] = [str(REPO / "src"), str(REPO)]  # the repository root: the test support's MLflow server
    from mlflow.tracking import MlflowClient

    from rayft.config.tracking import MlflowConfig
    from rayft.testing import build_tiny_model
    from tests.support.servers import mlflow_server

    interval_s = MlflowConfig.model_fields["send_interval_s"].default
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        root = Path(tmp)
        model = build_tiny_model(root / "model") if args.model == "tiny" else args.model
        with mlflow_server(root / "mlflow") as server:
            results: dict[str, list[float]] = {"none": [], "mlflow": []}
            for i in range(0 if args.cpu_only else args.repeats + 1):  # the first pair warms caches up and is dropped
                for arm in ("none", "mlflow"):
                    ms = run_arm(root, model, f"{arm}-{i}", args.steps, server.uri if arm == "mlflow" else None)
                    if i > 0:
                        results[arm].append(ms)
            client = MlflowClient(tracking_uri=server.uri)
            run_id = client.create_run(client.create_experiment("bench-calls")).info.run_id
            live_us = log_call_us(server.uri, run_id, root)
            none_ms = args.cpu_only or statistics.median(results["none"])
            cpu = {
                s: logging_cpu_ms(server, run_id, root, step_s=none_ms / 1000, interval_s=s) for s in (1.0, interval_s)
            }
            server.kill()
            dead_us = log_call_us(server.uri, run_id, root)
    if not args.cpu_only:
        print_step_times(args, results)
    for interval, (client_cpu, server_cpu) in cpu.items():
        print(f"  CPU per {none_ms:.0f} ms step spent on logging, a request every {interval:g} s: rayft's process "
              f"{client_cpu:.2f} ms ({client_cpu / none_ms * 100:.3f}% of a step), the MLflow server "
              f"{server_cpu:.2f} ms ({server_cpu / none_ms * 100:.3f}%; another machine's in a cluster)")  # fmt: skip
    print(f"  log() on the training thread: live server {live_us:.1f} us/step ({live_us / 10 / none_ms:.3f}% of a "
          f"step), dead server {dead_us:.1f} us/step ({dead_us / 10 / none_ms:.3f}% of a step)")  # fmt: skip


if __name__ == "__main__":
    main()
