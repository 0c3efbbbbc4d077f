"""Plain GRPO against GRPO with dynamic sampling at the same wall-clock budget, measured with rayft's CLI.

A config's comparison of a supervised start and GRPO from it, with the RL arms stopped by the clock instead of
by a step count. ``--task sql``: configs/sql-grpo.yaml (the built-in text-to-SQL set, the execution reward);
``--task gsm8k``: configs/gsm8k-grpo.yaml on real GSM8K (``../shared/datasets/gsm8k/train.jsonl`` split as
its header does: the first 1,000 problems for SFT, the next 600 as GRPO prompts, the last ``--heldout``
held out; the math reward and a format reward).

1. ``sft``: the config's supervised start (``--sft-steps`` LoRA steps, its header's other settings), merged
   by ``rayft export``. SQL: 10 steps (the header's) is a weak start that answers about 7 in 10 training
   questions, 200 a strong one that answers all;
2. the RL arms from that model, **run at the same time** (so that each sees the same machine, and the same
   load from anything else running on it), each on one Ray Train worker at one torch thread, with a
   checkpoint after every step and no validation (the held-out comparison below is the measure).
   ``--budget-min`` minutes after its launch each arm gets SIGTERM; its model is the last checkpoint
   committed by then (launch plus budget, however long the signal then takes to arrive):
   - ``plain``: the config's GRPO (DAPO loss);
   - ``dynamic``: the same with ``train.rl.dynamic_sampling`` (groups whose rewards are all alike dropped,
     more prompts sampled, at most ``--max-rounds`` extra rounds a step);
   - ``curriculum`` (GSM8K only: SQL rows have no annotated solution to vary): dynamic sampling and
     ``train.rl.curriculum`` (a harder variant of each prompt every completion solved, an easier one of each
     that none did, served in later steps; decontaminated against the held-out problems);
3. ``rayft compare`` of the start and the arms on ``--heldout`` held-out problems (the set's test split for
   SQL; paired: McNemar's test, the interval of each difference, flips).

Printed and written to ``OUT/summary.json``: per arm the steps finished within the budget, the share of steps
with a gradient (some group's rewards differed among the groups trained), the completions sampled, the mean
sampled reward, reward per hour (the sum of every sampled completion's reward over the budget), and dynamic
sampling's record (groups drawn, dropped, trained; extra rollouts), then ``compare.md``. A stage whose
output is already in OUT is not run again (``--fresh`` reruns all).

    .venv/bin/python benchmarks/measure_rl_budget.py OUT [--task sql|gsm8k] [--sft-steps 10] [--budget-min 25]
        [--heldout 200]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from measure_tool_arms import rayft_command, run_stage

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {"sql": REPO / "configs" / "sql-grpo.yaml", "gsm8k": REPO / "configs" / "gsm8k-grpo.yaml"}
GROUP_SIZE = 8  # train.rl.group_size of both configs
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k" / "train.jsonl"
GSM8K_SFT, GSM8K_RL = (0, 1000), (1000, 1600)  # configs/gsm8k-grpo.yaml's header: lines 1-1000, 1001-1600
STOP_GRACE_S = 180  # SIGTERM saves the step in progress; past this the arm is killed (its checkpoints are kept)


@functools.cache  # every stage and arm asks for the paths; the file is read and split once per run
def _split_gsm8k(out: Path, heldout: int) -> dict[str, Path]:
    """GSM8K's train file in three files that share no problem (the config header's split); their paths."""
    lines = GSM8K.read_text(encoding="utf-8").splitlines(keepends=True)
    parts = {"sft": lines[slice(*GSM8K_SFT)], "rl": lines[slice(*GSM8K_RL)], "heldout": lines[-heldout:]}
    paths = {}
    for name, rows in parts.items():
        paths[name] = out / "data" / f"{name}.jsonl"
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        paths[name].write_text("".join(rows), encoding="utf-8")
    return paths


def _data(args: argparse.Namespace, out: Path, stage: str) -> list[str]:
    """The overrides that point a stage (sft, rl, compare) of the task at its data."""
    if args.task == "sql":
        return ["data.datasets.0.max_rows=2000"] if stage == "sft" else []
    paths = _split_gsm8k(out, args.heldout)
    if stage == "compare":
        return [f"eval.datasets.0.path={paths['heldout']}"]
    return [f"data.datasets.0.path={paths[stage]}"]


def _sft(args: argparse.Namespace, out: Path, log: dict[str, Any]) -> Path:
    """The supervised start (the config header's commands), merged; the merged model's path."""
    runs = out / "runs"
    run_stage("sft", rayft_command(
        "train", str(args.config), "name=start-sft", f"storage_path={runs}", "train.objective=sft",
        "data.packing=true", *_data(args, out, "sft"), f"train.max_steps={args.sft_steps}",
        "train.learning_rate=2e-3", f"train.save_steps={args.sft_steps}", "train.eval_steps=null", f"seed={args.seed}",
    ), runs / "start-sft" / "final", log)  # fmt: skip
    merged = out / "start-sft-merged"
    run_stage("merge", rayft_command(
        "export", str(runs / "start-sft"), str(merged), "--merge", "--checkpoint", "final",
    ), merged / "config.json", log)  # fmt: skip
    return merged


def _arm_command(args: argparse.Namespace, out: Path, merged: Path, arm: str) -> list[str]:
    command = rayft_command(
        "train", str(args.config), f"name=arm-{arm}", *_data(args, out, "rl"), f"storage_path={out / 'runs'}",
        f"model.name={merged}", f"seed={args.seed}", "scaling.num_workers=1", f"train.micro_batch_size={args.prompts}",
        "train.max_steps=100000", "train.save_steps=1", "train.eval_steps=null", "checkpoint.num_to_keep=null",
        "checkpoint.async_upload=false", "data.validation_fraction=0",  # a checkpoint's validation: none to run
    )  # fmt: skip
    if arm in ("dynamic", "curriculum"):
        command.append(f"train.rl.dynamic_sampling={{max_rounds: {args.max_rounds}}}")
    if arm == "curriculum":  # the variants are checked against the held-out problems, as sdg's are
        heldout = _data(args, out, "compare")[0].split("=", 1)[1]
        command.append(f"train.rl.curriculum={{decontamination: {{datasets: [{{path: '{heldout}'}}]}}}}")
    return command


def _run_arms(args: argparse.Namespace, out: Path, merged: Path, log: dict[str, Any]) -> None:
    """Launch every arm at once; SIGTERM each ``--budget-min`` after its launch; record the deadlines."""
    pending = [arm for arm in args.arms if not (out / f"arm-{arm}.json").exists()]
    if not pending:
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    processes: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
    for arm in pending:
        shutil.rmtree(out / "runs" / f"arm-{arm}", ignore_errors=True)
        command = _arm_command(args, out, merged, arm)
        print(f"[{arm}] {' '.join(command[2:])}", flush=True)
        logfile = (out / f"arm-{arm}.log").open("wb")
        started = time.time()
        processes[arm] = (subprocess.Popen(command, cwd=REPO, env=env, stdout=logfile, stderr=subprocess.STDOUT),
                          started)  # fmt: skip
        log[arm] = {"command": " ".join(command[2:]).replace(sys.executable, "python"), "started": started}
    budget = args.budget_min * 60.0
    for arm, (process, started) in processes.items():
        remaining = started + budget - time.time()
        try:
            process.wait(timeout=max(remaining, 0.0))
            raise SystemExit(f"arm {arm} ended before its budget (exit {process.returncode}); see {out}/arm-{arm}.log")
        except subprocess.TimeoutExpired:
            pass
        # The deadline is the launch plus the budget, whenever the signal goes (an arm waits while the one
        # before it saves and exits): checkpoints committed after it are not the arm's model.
        signalled = time.time()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        record = {"deadline": started + budget, "budget_s": budget, "signalled_s": signalled - started,
                  "exit": process.returncode}  # fmt: skip
        (out / f"arm-{arm}.json").write_text(json.dumps(record), encoding="utf-8")
        print(f"[{arm}] stopped {signalled - started:.0f} s after launch (exit {process.returncode})", flush=True)


def _checkpoint_before(run: Path, deadline: float) -> tuple[Path, int]:
    """The run's last checkpoint committed before ``deadline``, and its step."""
    kept = []
    for marker in (run / "checkpoints").glob("step-*/rayft_checkpoint.json"):
        if marker.stat().st_mtime <= deadline:
            kept.append((int(marker.parent.name.split("-")[1]), marker.parent))
    if not kept:
        raise SystemExit(f"{run}: no checkpoint committed within the budget; raise --budget-min")
    step, path = max(kept)
    return path, step


def _figures(run: Path, last_step: int, budget_s: float, first_round: int) -> dict[str, Any]:
    """What the arm's steps up to ``last_step`` sampled and trained, from its metrics.jsonl; ``first_round``:
    the completions a step samples before any extra round (prompts x group size)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line]
    steps = {row["step"]: row for row in rows if "rl/reward" in row and row["step"] <= last_step}
    sampled = {step: first_round + row.get("rl/extra_rollouts", 0.0) for step, row in steps.items()}
    completions = sum(sampled.values())
    reward_sum = sum(row["rl/reward"] * sampled[step] for step, row in steps.items())
    with_gradient = sum(1 for row in steps.values() if _had_gradient(row))
    figures: dict[str, Any] = {
        "steps": len(steps),
        "steps_with_gradient": with_gradient,
        "share_with_gradient": round(with_gradient / max(len(steps), 1), 3),
        "completions": int(completions),
        "mean_reward": round(reward_sum / max(completions, 1.0), 4),
        "reward_per_hour": round(reward_sum * 3600.0 / budget_s, 1),
        "mean_step_s": round(sum(row.get("time/step", 0.0) for row in steps.values()) / max(len(steps), 1), 1),
    }
    for key in ("groups_drawn", "groups_dropped", "groups_trained", "extra_rollouts", "short_steps"):
        if any(f"rl/{key}" in row for row in steps.values()):
            figures[key] = int(sum(row.get(f"rl/{key}", 0.0) for row in steps.values()))
    curriculum = sorted({key for row in steps.values() for key in row if key.startswith("rl/curriculum/")})
    for key in curriculum:  # what the curriculum made, served, and could not vary, summed over the steps
        figures[key.removeprefix("rl/")] = round(sum(row.get(key, 0.0) for row in steps.values()), 1)
    return figures


def _had_gradient(row: dict[str, Any]) -> bool:
    """A step trained some group whose rewards differed (dynamic sampling: it kept one; plain: not all alike)."""
    if "rl/groups_trained" in row:
        return row["rl/groups_trained"] > 0
    return row["rl/zero_std_groups"] < 1.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="Directory for every stage's output and the report.")
    parser.add_argument("--task", choices=sorted(CONFIGS), default="sql", help="Which config's comparison.")
    parser.add_argument("--sft-steps", type=int, default=10, help="Supervised steps of the start (10: weak).")
    parser.add_argument("--budget-min", type=float, default=25.0, help="Wall-clock minutes of each RL arm.")
    parser.add_argument("--prompts", type=int, default=None,
                        help="Prompts per step, 8 completions each (default: the config's 2 workers' worth: "
                             "4 for sql, 2 for gsm8k's longer answers).")  # fmt: skip
    parser.add_argument("--max-rounds", type=int, default=4, help="Dynamic sampling's most extra rounds a step.")
    parser.add_argument("--heldout", type=int, default=200, help="Test-split problems compared.")
    parser.add_argument("--arms", default="plain,dynamic",
                        help="Comma-separated RL arms (plain, dynamic, curriculum), run at the same time.")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fresh", action="store_true", help="Run every stage again.")
    return parser


def main() -> None:
    args = _parser().parse_args()
    args.arms = [arm for arm in args.arms.split(",") if arm]
    args.config = CONFIGS[args.task]
    if args.prompts is None:
        args.prompts = {"sql": 4, "gsm8k": 2}[args.task]
    unknown = sorted(set(args.arms) - {"plain", "dynamic", "curriculum"})
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; name plain, dynamic or curriculum")
    if args.task == "sql" and "curriculum" in args.arms:
        raise SystemExit("--arms curriculum: the SQL rows have no annotated solution to vary; use --task gsm8k")
    out = args.out.resolve()
    if args.fresh:
        shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    log: dict[str, Any] = {}
    merged = _sft(args, out, log)
    _run_arms(args, out, merged, log)
    models = [f"--model=sft={merged}"]
    arms: dict[str, Any] = {}
    for arm in args.arms:
        record = json.loads((out / f"arm-{arm}.json").read_text(encoding="utf-8"))
        run = out / "runs" / f"arm-{arm}"
        checkpoint, step = _checkpoint_before(run, record["deadline"])
        arms[arm] = {"checkpoint": str(checkpoint), "budget_s": round(record["budget_s"], 1),
                     **_figures(run, step, record["budget_s"], args.prompts * GROUP_SIZE)}  # fmt: skip
        models.append(f"--model={arm}={checkpoint}")
    compare = out / "compare"
    run_stage("compare", rayft_command(
        "compare", str(args.config), *models, *_data(args, out, "compare"), "--output", str(compare),
        f"storage_path={out / 'runs'}", f"eval.max_samples={args.heldout}", f"eval.datasets.0.max_rows={args.heldout}",
    ), compare / "compare.md", log)  # fmt: skip
    summary = {"args": {k: str(v) for k, v in vars(args).items()}, "stages": log, "arms": arms}
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    for arm, figures in arms.items():
        print(f"{arm}: {json.dumps(figures)}")
    print("\n" + (compare / "compare.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
