"""What a calculator is worth to SmolLM2-135M-Instruct on large-operand arithmetic, measured with rayft's CLI.

Five arms answer the same held-out problems, paired by `rayft compare` (McNemar's test with Tango's interval
of the difference, TOST at eval.equivalence_margin, flips):

- ``base``: SmolLM2-135M-Instruct, no tools;
- ``base_tools``: the same model, each problem an episode with the calculator (``eval.environment``);
- ``sft_plain``: LoRA SFT on the plain solutions (``sdg.tool_use=false``: GSM8K-style steps written out), no tools;
- ``sft_tools``: LoRA SFT on calculator traces (configs/agent.yaml's train stage), with the calculator;
- ``rl_tools``: the tools SFT model after multi-turn GRPO in the calculator environment (its rl stage),
  with the calculator.

The held-out problems are the symbolic generator's variations (operands ~1,000x larger) of the built-in
arithmetic set's **test** seeds, with a seed of their own. The training rows come from the train seeds and
are decontaminated (13-word n-grams, numbers kept) against the test split's first 80 problems, as
configs/agent.yaml does, and against the held-out file as well. Every stage is one ``rayft`` command run
after the other (``rayft run configs/agent.yaml --only STAGE``, ``rayft sdg``, ``rayft compare``), with
the budgets given on the command line; the commands, their wall times and ``compare.md`` are printed and
written to ``OUT/summary.json``. A stage whose output is already in OUT is not run again (``--fresh``
reruns all).

    nice -n 5 .venv/bin/python benchmarks/measure_tool_arms.py OUT [--seeds 120] [--variations 3]
        [--heldout 80] [--sft-steps 40] [--rl-steps 8] [--set KEY=VALUE ...]
        [--arms base,sft_tools,rl_tools --compare-dir compare-tools]   # some arms only, in a report of their own
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "agent.yaml"
MODEL = "smollm2-135m-instruct"
ENVIRONMENT = "{type: tools, tools: [calculator], max_turns: 6, max_tool_calls: 8, max_tokens: 1024, tool_timeout_s: 5}"
"""configs/agent.yaml's rl.environment, the calculator every tools arm is evaluated with."""
TEST_SEEDS_DECONTAMINATED = 80  # configs/agent.yaml's decontamination reads the test split's first 80 rows


def rayft_command(*args: str) -> list[str]:
    """The command line of ``rayft ARGS`` with this interpreter."""
    return [sys.executable, "-m", "rayft", *args]


def run_stage(name: str, command: list[str], done: Path, log: dict[str, Any]) -> None:
    """Run one stage's command unless ``done`` exists; record its wall time and the command."""
    shown = " ".join(command[2:]).replace(sys.executable, "python")
    if done.exists():
        print(f"[{name}] kept: {done}", flush=True)
        log.setdefault(name, {"command": shown, "wall_s": None, "kept": True})
        return
    print(f"[{name}] {shown}", flush=True)
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, check=False)
    seconds = time.perf_counter() - start
    log[name] = {"command": shown, "wall_s": round(seconds, 1)}
    print(f"[{name}] exit {result.returncode} after {seconds:.1f} s", flush=True)
    if result.returncode != 0 or not done.exists():
        raise SystemExit(f"stage {name} failed (exit {result.returncode}; expected {done})")


def _common(args: argparse.Namespace, out: Path, heldout: Path) -> list[str]:
    """Overrides every training command shares: where runs go, the budgets, and the decontamination."""
    decontaminate = (
        f"[{{path: builtin:arithmetic, split: test, max_rows: {TEST_SEEDS_DECONTAMINATED}}}, {{path: '{heldout}'}}]"
    )
    return [
        f"storage_path={out / 'runs'}",
        f"sdg.num_seeds={args.seeds}",
        f"sdg.variations={args.variations}",
        f"sdg.decontamination.datasets={decontaminate}",
        f"scaling.num_workers={args.workers}",
        f"train.max_steps={args.sft_steps}",
        f"rl.train.max_steps={args.rl_steps}",
        f"rl.train.save_steps={max(1, args.rl_steps // 2)}",
        f"rl.train.eval_steps={args.rl_steps}",
        *args.set,
    ]


def _stages(args: argparse.Namespace, out: Path) -> list[tuple[str, list[str], Path]]:
    """The commands in order, each with the file whose presence says it is done."""
    heldout_dir = out / "heldout"
    heldout = heldout_dir / "data.jsonl"
    runs = out / "runs"
    tools = [str(CONFIG), *_common(args, out, heldout)]
    plain_data = "[{path: 'stage:sdg', format: template, input_template: '{question}', output_template: '{answer}'}]"
    plain = [*tools, "name=agent-plain", "sdg.tool_use=false", f"data.datasets={plain_data}"]
    heldout_cmd = rayft_command(
        "sdg", str(CONFIG), "--output-dir", str(heldout_dir), "sdg.seeds.split=test",
        f"sdg.num_seeds={args.heldout + args.heldout // 4}", "sdg.variations=1", "sdg.tool_use=false",
        "sdg.decontamination.datasets=[]", f"sdg.seed={args.heldout_seed}",
    )  # fmt: skip
    return [
        ("heldout_sdg", heldout_cmd, heldout),
        ("tools_sdg", rayft_command("run", *tools, "--only", "sdg"), runs / "agent" / "sdg" / "data.jsonl"),
        ("tools_sft", rayft_command("run", *tools, "--only", "train"), runs / "agent" / "train" / "final"),
        ("tools_rl", rayft_command("run", *tools, "--only", "rl"), rl_model(args, runs)),
        ("plain_sdg", rayft_command("run", *plain, "--only", "sdg"), runs / "agent-plain" / "sdg" / "data.jsonl"),
        ("plain_sft", rayft_command("run", *plain, "--only", "train"), runs / "agent-plain" / "train" / "final"),
        (args.compare_dir, _compare(args, out, heldout), out / args.compare_dir / "compare.json"),
    ]


def rl_model(args: argparse.Namespace, runs: Path, name: str = "agent") -> Path:
    """The RL arm's model: run ``name``'s rl stage's final adapter, or the checkpoint named by --rl-checkpoint."""
    rl = runs / name / "rl"
    return rl / "checkpoints" / args.rl_checkpoint if args.rl_checkpoint else rl / "final"


def _compare(args: argparse.Namespace, out: Path, heldout: Path) -> list[str]:
    runs = out / "runs"
    models = {
        "base": MODEL,
        "base_tools": MODEL,
        "sft_plain": str(runs / "agent-plain" / "train"),
        "sft_tools": str(runs / "agent" / "train"),
        "rl_tools": str(rl_model(args, runs)),
    }
    unknown = sorted(set(args.arms) - set(models))
    if unknown or len(args.arms) < 2:
        raise SystemExit(f"--arms: name at least two of {sorted(models)} (got {args.arms})")
    without_tools = [arm for arm in ("base", "sft_plain") if arm in args.arms]
    return rayft_command(
        "compare", str(CONFIG), *(f"--model={label}={models[label]}" for label in args.arms),
        "--output", str(out / args.compare_dir), f"storage_path={runs}",
        f"eval.datasets=[{{path: '{heldout}'}}]", f"eval.max_samples={args.heldout}",
        "eval.prompt_template='{question}'",  # the training rows' user turn is the bare question
        f"eval.environment={ENVIRONMENT}",  # compare runs no pipeline: the rl stage's calculator, given here
        f"eval.without_tools=[{', '.join(without_tools)}]", f"eval.batch_size={args.eval_batch}",
        f"eval.num_workers={args.workers or 1}", *args.set,
    )  # fmt: skip


def _summary(out: Path, log: dict[str, Any], compare_dir: str) -> None:
    print("\nstage wall times (s):")
    for name, entry in log.items():
        wall = "kept" if entry.get("kept") else f"{entry['wall_s']:.1f}"
        print(f"  {name:12s} {wall:>8s}  {entry['command']}")
    report = out / compare_dir / "compare.md"
    if report.exists():
        print("\n" + report.read_text(encoding="utf-8"))
    for name, run in (("sdg (tools)", "agent/sdg"), ("sdg (plain)", "agent-plain/sdg")):
        summary = out / "runs" / run / "summary.json"
        if summary.exists():
            data = json.loads(summary.read_text(encoding="utf-8"))
            print(f"{name}: {data.get('accepted', data.get('rows_out', '?'))} rows accepted")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="Directory for every stage's output, the summary and the report.")
    parser.add_argument("--seeds", type=int, default=120, help="Train seeds of the training sdg (sdg.num_seeds).")
    parser.add_argument("--variations", type=int, default=3, help="Rows per train seed (sdg.variations).")
    parser.add_argument("--heldout", type=int, default=80, help="Held-out problems scored (eval.max_samples).")
    parser.add_argument("--heldout-seed", type=int, default=1, help="sdg.seed of the held-out problems' numbers.")
    parser.add_argument("--sft-steps", type=int, default=40, help="train.max_steps of both SFT arms.")
    parser.add_argument("--rl-steps", type=int, default=8, help="rl.train.max_steps of the RL arm.")
    parser.add_argument(
        "--rl-checkpoint",
        help="Score this checkpoint of the rl stage (e.g. step-000004, from a run stopped early) instead of final/.",
    )
    parser.add_argument("--workers", type=int, default=0, help="scaling.num_workers (0: train in-process).")
    parser.add_argument("--eval-batch", type=int, default=16, help="eval.batch_size.")
    parser.add_argument(
        "--arms", type=lambda text: [a.strip() for a in text.split(",") if a.strip()],
        default=["base", "base_tools", "sft_plain", "sft_tools", "rl_tools"],
        help="The arms compared, comma-separated (at least two; the first is the pairs' reference).",
    )  # fmt: skip
    parser.add_argument(
        "--compare-dir", default="compare", help="The compare report's directory under OUT (and its stage's name)."
    )
    parser.add_argument("--set", action="append", default=[], help="Another KEY=VALUE override for every command.")
    parser.add_argument("--fresh", action="store_true", help="Delete OUT first and rerun every stage.")
    args = parser.parse_args()
    out = args.out.resolve()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "summary.json"
    log: dict[str, Any] = json.loads(log_path.read_text(encoding="utf-8")) if log_path.exists() else {}
    try:
        for name, command, done in _stages(args, out):
            run_stage(name, command, done, log)
            log_path.write_text(json.dumps(log, indent=2), encoding="utf-8")
    finally:
        _summary(out, log, args.compare_dir)


if __name__ == "__main__":
    main()
