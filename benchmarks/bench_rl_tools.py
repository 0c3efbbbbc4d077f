"""Multi-turn GRPO with a calculator tool: rayft's episodes against TRL's ``GRPOTrainer`` with ``tools`` on
identical work, step time and reward side by side in one run.

Both arms run in this process, one after the other, on SmolLM2-135M-Instruct (rayft's offline copy) given
Qwen2.5's chat template (TRL's copy, ``trl/chat_templates/qwen2_5.jinja``): SmolLM2's own template renders
no tools, which TRL refuses, and Qwen2.5's renders the tool list in the system turn, calls as
``<tool_call>{...}</tool_call>`` and results as ``<tool_response>`` blocks, the format both rayft and TRL
parse. The same LoRA adapter (r 16, alpha 32, every linear layer, no dropout), the same prompts
(large-operand arithmetic word problems, made here from a seeded generator), the same calculator (rayft's,
exact big integers; TRL gets it as a Python function whose JSON schema is checked equal to rayft's),
group size, sampling (temperature 1, top-p 1, no top-k), DAPO's loss with clip-higher, no KL term, one
update per rollout, learning rate and steps. The reward is the math verifier on the episode's last
assistant turn (rayft's ``math`` reward; TRL's reward function calls the same function).

Turn limits: rayft's ``train.rl.environment.max_turns`` counts model turns, TRL's
``max_tool_calling_iterations`` counts tool rounds after the first turn, so ``--turns T`` gives rayft T and
TRL T - 1. Length limits differ in kind: rayft caps each model turn at ``--max-new-tokens`` and the episode
at ``--episode-tokens``; TRL caps the whole completion (model and tool tokens) at
``max_completion_length``, set here to ``--episode-tokens``. rayft runs its own loop in-process
(``scaling.num_workers=0``); the first step of each arm is a warm-up and is left out.

    .venv/bin/python benchmarks/bench_rl_tools.py [--steps 4] [--prompts 2] [--group 4] [--turns 3]
        [--max-new-tokens 64] [--episode-tokens 384]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m-instruct"
LR = 1e-5
TEMPLATES = (
    "A depot holds {a} crates of {b} bottles each, and {c} more bottles arrive. How many bottles are there now?",
    "A farm ships {a} boxes of {b} eggs each and keeps {c} eggs. How many eggs did it have?",
    "A printer prints {a} pages per hour for {b} hours, then {c} more pages. How many pages in all?",
)


def problems(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` word problems with 4- and 5-digit operands (a * b + c): a calculator matters for a 135M model."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        a, b, c = rng.randint(1000, 99999), rng.randint(100, 9999), rng.randint(1000, 99999)
        rows.append({"question": TEMPLATES[i % len(TEMPLATES)].format(a=a, b=b, c=c), "answer": str(a * b + c)})
    return rows


def qwen_templated_model(work: Path) -> Path:
    """SmolLM2's files (weights linked, not copied) with Qwen2.5's chat template as TRL ships it."""
    import trl

    from rayft.models.loading import ensure_builtin_model

    source = Path(ensure_builtin_model(MODEL))
    target = work / "smollm2-qwen-template"
    target.mkdir()
    for item in source.iterdir():
        if item.name in ("tokenizer_config.json", "chat_template.jinja"):
            continue
        (target / item.name).symlink_to(item.resolve())
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    shutil.copy(Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja", target / "chat_template.jinja")
    return target


def calculator(expression: str) -> str:
    """
    Evaluate an arithmetic expression exactly (big integers included) and return the result.

    Args:
        expression: An arithmetic expression, e.g. '(3 + 4) * 2**10'
    """
    from rayft.calculator import CalculatorError, calculate

    try:
        return calculate(expression)
    except CalculatorError as exc:  # rayft answers a refused expression with its error: the same text here
        return f"Error: {exc}"


def tool_schema() -> dict[str, Any]:
    """The calculator's schema as TRL renders it (transformers' ``get_json_schema``: its keys in its order, and a
    ``return`` entry); rayft's rows carry this one too, so both arms' prompts are the same text. Stops the
    benchmark if it describes another tool than rayft's calculator."""
    from transformers.utils import get_json_schema

    from rayft.environments.builtin import calculator_tool

    theirs = get_json_schema(calculator)
    ours, same = calculator_tool().schema, {k: v for k, v in theirs["function"].items() if k != "return"}
    if ours["function"] != same:
        sys.exit(f"the two arms would describe different tools:\nrayft {ours}\nTRL   {theirs}")
    return theirs


def run_rayft(work: Path, model_dir: Path, rows: list[dict[str, Any]], schema: dict[str, Any],
              args: argparse.Namespace) -> dict[str, float]:  # fmt: skip
    """rayft's multi-turn GRPO, in-process; per-step figures from its metrics.jsonl (the warm-up left out)."""
    import rayft
    from rayft.config import load_config

    data = work / "problems.jsonl"
    with data.open("w") as out:
        for r in rows:  # the reference answer is the assistant turn, which the prompt leaves out
            messages = [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]
            out.write(json.dumps({"messages": messages, "tools": [schema]}) + "\n")
    cfg = load_config(None, [
        f"model.name={model_dir}", f"storage_path={work}", "name=rayft-tools", "scaling.num_workers=0",
        f"data.datasets=[{{path: '{data}', format: messages}}]", "data.packing=false", "data.validation_fraction=0",
        "data.shuffle_buffer_size=1", "data.max_seq_length=1024", f"data.cache_dir={work / 'cache'}",
        "train.objective=grpo", f"train.max_steps={args.steps}", f"train.micro_batch_size={args.prompts}",
        f"train.learning_rate={LR}", "train.warmup_steps=0", "train.eval_steps=null", f"train.save_steps={args.steps}",
        "train.logging_steps=1", "lora.r=16", "lora.alpha=32", "lora.dropout=0", "lora.target_modules=all-linear",
        "logging.tensorboard=false", f"train.rl.group_size={args.group}",
        f"train.rl.max_new_tokens={args.max_new_tokens}", "train.rl.temperature=1.0", "train.rl.loss=dapo",
        "train.rl.epsilon_high=0.28",
        "train.rl.rewards=[{function: math}]",
        f"train.rl.environment={{type: tools, tools: [calculator], max_turns: {args.turns}, "
        f"max_tool_calls: {args.turns * 2}, max_tokens: {args.episode_tokens}, tool_timeout_s: 5}}",
    ])  # fmt: skip
    run = rayft.api.train(cfg)
    records = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r][1:]
    return {
        "step_s": statistics.median(r["time/step"] for r in steps),
        "rollout_s": statistics.median(r["time/rollout"] for r in steps),
        "tool_s": statistics.median(r["rl/episode/tool_s"] for r in steps),
        "tool_calls": statistics.mean(r["rl/episode/tool_calls"] for r in steps),
        "turns": statistics.mean(r["rl/episode/turns"] for r in steps),
        "reward": statistics.mean(r["rl/reward"] for r in steps),
    }


def run_trl(work: Path, model_dir: Path, rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, float]:
    """TRL's ``GRPOTrainer`` with ``tools=[calculator]`` on the same work; step times from a callback."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rayft.evaluation.rewards import math_reward

    timing: dict[str, list[float]] = {"step": [], "rollout": [], "rewards": []}
    generating = [0.0]  # this step's generate time: TRL generates once per tool round

    def reward(completions: list[list[dict[str, Any]]], answer: list[str], **_: Any) -> list[float]:
        finals = [next((m.get("content") or "" for m in reversed(c) if m.get("role") == "assistant"), "")
                  for c in completions]  # fmt: skip
        values = [math_reward(text, a) for text, a in zip(finals, answer, strict=True)]
        timing["rewards"].append(sum(values) / len(values))
        return values

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.started, generating[0] = time.perf_counter(), 0.0

        def on_step_end(self, *_: Any, **__: Any) -> None:
            timing["step"].append(time.perf_counter() - self.started)
            timing["rollout"].append(generating[0])

    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]} for r in rows]
    )
    config = GRPOConfig(
        output_dir=str(work / "trl"), use_cpu=True, bf16=False, report_to=[], save_strategy="no", logging_steps=1,
        max_steps=args.steps, learning_rate=LR, lr_scheduler_type="cosine", warmup_steps=0,
        per_device_train_batch_size=args.prompts * args.group, num_generations=args.group,
        max_completion_length=args.episode_tokens, max_tool_calling_iterations=args.turns - 1, temperature=1.0,
        top_p=1.0, top_k=0, loss_type="dapo", beta=0.0, epsilon=0.2, epsilon_high=0.28, num_iterations=1,
        shuffle_dataset=False, seed=0, max_grad_norm=1.0, weight_decay=0.0, gradient_checkpointing=False,
    )  # fmt: skip
    peft = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward, args=config, train_dataset=dataset,
                          peft_config=peft, tools=[calculator], callbacks=[StepClock()])  # fmt: skip
    generate = trainer.model.generate

    def timed_generate(*a: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        out = generate(*a, **kw)
        generating[0] += time.perf_counter() - started
        return out

    trainer.model.generate = timed_generate
    torch.manual_seed(0)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "tools/call_frequency" in h][1:]
    keep = slice(1, None)
    return {
        "step_s": statistics.median(timing["step"][keep]),
        "rollout_s": statistics.median(timing["rollout"][keep]),
        "tool_s": float("nan"),
        "tool_calls": statistics.mean(h["tools/call_frequency"] for h in logged) if logged else float("nan"),
        "turns": float("nan"),
        "reward": statistics.mean(timing["rewards"][keep]) if timing["rewards"][keep] else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--group", type=int, default=4, help="episodes per prompt")
    parser.add_argument("--turns", type=int, default=3, help="model turns per episode (TRL: tool rounds + 1)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="rayft: tokens per model turn")
    parser.add_argument("--episode-tokens", type=int, default=384, help="rayft: episode tokens; TRL: completion")
    parser.add_argument("--no-trl", action="store_true", help="leave TRL's arm out")
    args = parser.parse_args()
    if args.turns < 2:
        parser.error("--turns must be at least 2: one tool round and the answer")
    schema = tool_schema()
    rows = problems(args.steps * args.prompts)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = qwen_templated_model(work)
        arms = {"rayft episodes": run_rayft(work, model_dir, rows, schema, args)}
        if not args.no_trl:
            arms["TRL GRPOTrainer tools"] = run_trl(work, model_dir, rows, args)
    print(f"multi-turn GRPO with a calculator, SmolLM2-135M LoRA r16 on CPU: {args.prompts} prompts x {args.group} "
          f"episodes of at most {args.turns} turns per step, {args.steps} steps (first left out), medians")  # fmt: skip
    print(f"{'arm':<24}{'step s':>9}{'generate s':>12}{'tools s':>9}{'calls/ep':>10}{'turns/ep':>10}{'reward':>9}")
    for name, f in arms.items():
        print(f"{name:<24}{f['step_s']:>9.2f}{f['rollout_s']:>12.2f}{f['tool_s']:>9.3f}{f['tool_calls']:>10.2f}"
              f"{f['turns']:>10.2f}{f['reward']:>9.3f}")  # fmt: skip
    if len(arms) == 2:
        ours, theirs = arms.values()
        print(f"ratio rayft/TRL: step time {ours['step_s'] / theirs['step_s']:.2f}x")
    print("command: " + " ".join([".venv/bin/python", "benchmarks/bench_rl_tools.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
