"""What a calculator is worth to SmolLM2-135M-Instruct on real GSM8K, measured with rayft's CLI.

The arms answer the same held-out GSM8K problems (never trained on), paired by ``rayft compare`` (McNemar's
test with Tango's interval of the difference, TOST at eval.equivalence_margin, flips):

- ``base``: SmolLM2-135M-Instruct, no tools;
- ``base_tools`` (with ``--base-tools``): the same model, each problem an episode with the calculator;
- ``sft_plain``: LoRA SFT on GSM8K's solutions with the annotations stripped, no tools;
- ``sft_tools``: LoRA SFT on the same problems as calculator traces (each ``<<expr=value>>`` annotation a
  call of rayft's calculator, its real answer, and the solution going on from it), with the calculator;
- ``rl_tools``: the tools SFT model after multi-turn GRPO in the calculator environment (the ``math``
  reward on the episode's final answer), with the calculator.

The data come from ``benchmarks/gsm8k_tool_traces.py`` (GSM8K's train file, ``../shared/datasets/gsm8k/``):
a seeded held-out slice, and the rest as training rows (both SFT arms take the first ``--train-rows`` of
the same shuffled problems). Both SFT arms train ``--sft-steps`` steps of the same token budget; a plain row
is about a third of a trace's tokens (no tool list, no calls), so packing fits about 4.75 plain problems into
a 1,024-token row against 1.5 traces (the smoke run's data preparation), and the plain arm sees about three
times as many problems. With ``--same-problems`` each arm instead trains one epoch over the
``--train-rows`` problems (``train.max_steps`` unset): the same problems, the plain arm in about a third of
the steps.

The training config is configs/agent.yaml with its sdg stage taken out and GSM8K's data, episode limits
(solutions make up to 9 calls) and sequence length put in, written to ``OUT/gsm8k-agent.yaml``; every stage
is one ``rayft`` command (``rayft run OUT/gsm8k-agent.yaml --only STAGE``, ``rayft compare``) with the
budgets on the command line. The commands, their wall times and ``compare.md`` are printed and written to
``OUT/summary.json``. A stage whose output is already in OUT is not run again (``--fresh`` reruns all).

    nice -n 5 .venv/bin/python benchmarks/measure_gsm8k_tool_arms.py OUT [--heldout 100] [--train-rows 800]
        [--rl-rows 200] [--sft-steps 40 | --same-problems] [--rl-steps 8] [--base-tools] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from gsm8k_tool_traces import default_source
from measure_tool_arms import rayft_command, rl_model, run_stage

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "configs" / "agent.yaml"
CONVERTER = REPO / "benchmarks" / "gsm8k_tool_traces.py"
MODEL = "smollm2-135m-instruct"
HELDOUT_SLICE = 100  # problems held out by the converter; --heldout scores the first of them
# GSM8K's solutions make up to 9 calculator calls (one model turn each, then the answer); a trace is 554
# SmolLM2 tokens on average (p95 792, max 1134) with the tools' system text, a plain solution 93 (max 342).
ENVIRONMENT = {"type": "tools", "tools": ["calculator"], "max_turns": 10, "max_tool_calls": 10,
               "max_tokens": 1536, "tool_timeout_s": 5}  # fmt: skip
MAX_SEQ_LENGTH = 1024
MAX_NEW_TOKENS = 256  # per model turn: a whole plain solution fits (p95 176 tokens)


def write_config(out: Path, data: Path) -> Path:
    """configs/agent.yaml without its sdg stage, on GSM8K's converted rows; the path written."""
    config = yaml.safe_load(AGENT.read_text(encoding="utf-8"))
    config.pop("sdg")
    config["name"] = "gsm8k-tools"
    config["data"]["datasets"] = [{"path": str(data / "train_tools.jsonl"), "format": "messages"}]
    config["data"]["max_seq_length"] = MAX_SEQ_LENGTH
    config["rl"]["max_new_tokens"] = MAX_NEW_TOKENS
    config["rl"]["environment"] = copy.deepcopy(ENVIRONMENT)
    config["rl"]["data"] = {"datasets": [{"path": str(data / "rl_prompts.jsonl"), "format": "messages"}]}
    config["eval"]["datasets"] = [{"path": str(data / "heldout.jsonl")}]
    config["eval"]["environment"] = copy.deepcopy(ENVIRONMENT)
    config["eval"]["generation"] = {"max_new_tokens": MAX_NEW_TOKENS}
    config["eval"]["prompt_template"] = "{question}"  # the training rows' user turn is the bare question
    path = out / "gsm8k-agent.yaml"
    header = "# Written by benchmarks/measure_gsm8k_tool_arms.py from configs/agent.yaml (sdg taken out).\n"
    path.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _common(args: argparse.Namespace, out: Path) -> list[str]:
    """Overrides every training command shares: where runs go, the budgets."""
    return [
        f"storage_path={out / 'runs'}",
        f"scaling.num_workers={args.workers}",
        "train.max_steps=null" if args.same_problems else f"train.max_steps={args.sft_steps}",
        f"rl.train.max_steps={args.rl_steps}",
        f"rl.train.save_steps={max(1, args.rl_steps // 2)}",
        f"rl.train.eval_steps={args.rl_steps}",
        *args.set,
    ]


def _stages(args: argparse.Namespace, out: Path, config: Path) -> list[tuple[str, list[str], Path]]:
    """The commands in order, each with the file whose presence says it is done."""
    data, runs = out / "data", out / "runs"
    tools = [str(config), *_common(args, out), f"data.datasets={_rows(data / 'train_tools.jsonl', args.train_rows)}",
             f"rl.data.datasets={_rows(data / 'rl_prompts.jsonl', args.rl_rows)}"]  # fmt: skip
    plain_data = _rows(data / "train_plain.jsonl", args.train_rows)
    plain = [str(config), *_common(args, out), "name=gsm8k-plain", f"data.datasets={plain_data}"]
    return [
        ("tools_sft", rayft_command("run", *tools, "--only", "train"), runs / "gsm8k-tools" / "train" / "final"),
        ("tools_rl", rayft_command("run", *tools, "--only", "rl"), rl_model(args, runs, "gsm8k-tools")),
        ("plain_sft", rayft_command("run", *plain, "--only", "train"), runs / "gsm8k-plain" / "train" / "final"),
        ("compare", _compare(args, out, config), out / "compare" / "compare.json"),
    ]


def _rows(path: Path, count: int) -> str:
    """A datasets override: the first ``count`` rows of a converted file (in the converter's shuffled order)."""
    return f"[{{path: '{path}', format: messages, max_rows: {count}}}]"


def _convert(args: argparse.Namespace, data: Path) -> list[str]:
    return [sys.executable, str(CONVERTER), str(data), "--source", str(args.source), "--heldout",
            str(HELDOUT_SLICE), "--seed", str(args.heldout_seed), "--max-seq-length", str(MAX_SEQ_LENGTH)]  # fmt: skip


def _compare(args: argparse.Namespace, out: Path, config: Path) -> list[str]:
    runs = out / "runs"
    models = {
        "base": MODEL,
        **({"base_tools": MODEL} if args.base_tools else {}),
        "sft_plain": str(runs / "gsm8k-plain" / "train"),
        "sft_tools": str(runs / "gsm8k-tools" / "train"),
        "rl_tools": str(rl_model(args, runs, "gsm8k-tools")),
    }
    return rayft_command(
        "compare", str(config), *(f"--model={label}={source}" for label, source in models.items()),
        "--output", str(out / "compare"), f"storage_path={runs}", f"eval.max_samples={args.heldout}",
        "eval.without_tools=[base, sft_plain]", f"eval.batch_size={args.eval_batch}",
        f"eval.num_workers={args.workers or 1}", *args.set,
    )  # fmt: skip


def _summary(out: Path, log: dict[str, Any]) -> None:
    print("\nstage wall times (s):")
    for name, entry in log.items():
        if name == "data":
            continue
        wall = "kept" if entry.get("kept") else f"{entry['wall_s']:.1f}"
        print(f"  {name:10s} {wall:>8s}  {entry['command']}")
    report = out / "compare" / "compare.md"
    if report.exists():
        print("\n" + report.read_text(encoding="utf-8"))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="Directory for the data, every stage's output and the report.")
    parser.add_argument("--source", type=Path, default=default_source(), help="GSM8K's train rows (question, answer).")
    parser.add_argument("--heldout", type=int, default=100, help=f"Held-out problems scored (<= {HELDOUT_SLICE}).")
    parser.add_argument("--heldout-seed", type=int, default=0, help="Seed of the shuffle that holds problems out.")
    parser.add_argument("--train-rows", type=int, default=800, help="Training problems each SFT arm reads.")
    parser.add_argument("--rl-rows", type=int, default=200, help="Prompts the RL stage reads.")
    parser.add_argument("--sft-steps", type=int, default=40, help="train.max_steps of both SFT arms.")
    parser.add_argument(
        "--same-problems", action="store_true", help="SFT: one epoch over --train-rows per arm, not --sft-steps."
    )
    parser.add_argument("--rl-steps", type=int, default=8, help="rl.train.max_steps of the RL arm.")
    parser.add_argument("--rl-checkpoint", help="Score this checkpoint of the rl stage (e.g. step-000004).")
    parser.add_argument("--base-tools", action="store_true", help="Also score the base model with the calculator.")
    parser.add_argument("--workers", type=int, default=0, help="scaling.num_workers (0: train in-process).")
    parser.add_argument("--eval-batch", type=int, default=16, help="eval.batch_size.")
    parser.add_argument("--set", action="append", default=[], help="Another KEY=VALUE override for every command.")
    parser.add_argument("--fresh", action="store_true", help="Delete OUT first and rerun every stage.")
    return parser


def main() -> None:
    args = _parser().parse_args()
    if not 0 < args.heldout <= HELDOUT_SLICE:
        raise SystemExit(f"--heldout {args.heldout}: score 1 to {HELDOUT_SLICE} of the held-out problems")
    out = args.out.resolve()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "summary.json"
    log: dict[str, Any] = json.loads(log_path.read_text(encoding="utf-8")) if log_path.exists() else {}
    try:
        run_stage("convert", _convert(args, out / "data"), out / "data" / "summary.json", log)
        log["data"] = json.loads((out / "data" / "summary.json").read_text(encoding="utf-8"))
        config = write_config(out, out / "data")
        for name, command, done in _stages(args, out, config):
            run_stage(name, command, done, log)
            log_path.write_text(json.dumps(log, indent=2), encoding="utf-8")
    finally:
        log_path.write_text(json.dumps(log, indent=2), encoding="utf-8")
        _summary(out, log)


if __name__ == "__main__":
    main()
