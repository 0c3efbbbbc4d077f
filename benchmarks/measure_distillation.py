"""On-policy distillation on the built-in text-to-SQL set, measured with rayft's CLI: does the student converge to
its teacher?

The teacher is a model that answers the set's questions with a query (``--teacher``: for example the merged
supervised start that ``benchmarks/measure_rl_budget.py`` writes to ``OUT/start-sft-merged``); the student
(``--student``, SmolLM2-135M-Instruct by default) shares its tokenizer. configs/sql-grpo.yaml's GRPO run with
its rewards taken out and ``train.rl.distillation`` set (mode ``replace``: the teacher's per-token
log-probabilities of the student's own samples are the whole signal), on ``--workers`` Ray Train workers:

1. ``distill``: ``--steps`` steps of ``--prompts`` prompts x ``--group`` samples per worker, validation every
   ``--eval-steps`` steps (one seeded sample of each validation prompt: ``eval/distill/reverse_kl``, the same
   draws at every checkpoint);
2. ``rayft compare`` of the student, the distilled student and the teacher on ``--heldout`` problems of the
   set's test split (execution accuracy; paired: McNemar's test, the interval of each difference, flips).

Printed and written to ``OUT/summary.json``: the sampled reverse KL per step (``rl/distill/reverse_kl``), the
validation reverse KL per evaluation, the teacher's seconds per step, then ``compare.md``. A stage whose output
is already in OUT is not run again (``--fresh`` reruns all).

    .venv/bin/python benchmarks/measure_distillation.py OUT --teacher DIR [--steps 30] [--heldout 200]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from measure_tool_arms import rayft_command, run_stage

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "sql-grpo.yaml"


def _distill(args: argparse.Namespace, out: Path, log: dict[str, Any]) -> Path:
    """The distillation run; its directory."""
    runs = out / "runs"
    teacher = {"teacher": str(args.teacher.resolve()), "mode": "replace"}
    run_stage("distill", rayft_command(
        "train", str(CONFIG), "name=distill", f"storage_path={runs}", f"model.name={args.student}",
        f"seed={args.seed}", "train.rl.rewards=[]", f"train.rl.distillation={json.dumps(teacher)}",
        f"train.rl.group_size={args.group}", f"train.micro_batch_size={args.prompts}",
        f"train.max_steps={args.steps}", f"train.eval_steps={args.eval_steps}", f"train.save_steps={args.eval_steps}",
        f"train.learning_rate={args.learning_rate}", f"scaling.num_workers={args.workers}",
    ), runs / "distill" / "final", log)  # fmt: skip
    return runs / "distill"


def _trajectory(run: Path) -> dict[str, Any]:
    """The reverse KL to the teacher along the run: sampled per step, and on the validation prompts."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line]
    sampled = {r["step"]: round(r["rl/distill/reverse_kl"], 4) for r in rows if "rl/distill/reverse_kl" in r}
    validation = {r["step"]: round(r["eval/distill/reverse_kl"], 4) for r in rows if "eval/distill/reverse_kl" in r}
    teacher_s = [r["rl/distill/teacher_s"] for r in rows if "rl/distill/teacher_s" in r]
    step_s = [r["time/step"] for r in rows if "rl/distill/reverse_kl" in r and "time/step" in r]
    return {
        "sampled_reverse_kl": sampled,
        "validation_reverse_kl": validation,
        "mean_teacher_s_per_step": round(sum(teacher_s) / max(len(teacher_s), 1), 2),
        "mean_step_s": round(sum(step_s) / max(len(step_s), 1), 2),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="Directory for the run and the report.")
    parser.add_argument("--teacher", type=Path, required=True, help="The teacher model's directory.")
    parser.add_argument("--student", default="smollm2-135m-instruct", help="The student model (name or directory).")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-steps", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers (each loads the teacher).")
    parser.add_argument("--prompts", type=int, default=4, help="Prompts per worker per step.")
    parser.add_argument("--group", type=int, default=4, help="Samples per prompt.")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--heldout", type=int, default=200, help="Test-split problems compared.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fresh", action="store_true", help="Run every stage again.")
    return parser


def main() -> None:
    args = _parser().parse_args()
    out = args.out.resolve()
    if args.fresh:
        shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    log: dict[str, Any] = {}
    run = _distill(args, out, log)
    compare = out / "compare"
    run_stage("compare", rayft_command(
        "compare", str(CONFIG), f"--model=student={args.student}", f"--model=distilled={run}",
        f"--model=teacher={args.teacher.resolve()}", "--output", str(compare), f"storage_path={out / 'runs'}",
        f"eval.max_samples={args.heldout}", f"eval.datasets.0.max_rows={args.heldout}",
    ), compare / "compare.md", log)  # fmt: skip
    trajectory = _trajectory(run)
    summary = {"args": {k: str(v) for k, v in vars(args).items()}, "stages": log, "trajectory": trajectory}
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(json.dumps(trajectory, indent=1))
    print("\n" + (compare / "compare.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
