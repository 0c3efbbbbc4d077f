"""GRPO's step against TRL's ``GRPOTrainer`` on identical work, and rayft's rollout placements against each other:
rollout tokens/s, trainer tokens/s and step time.

Both arms run in this process, one after the other, on SmolLM2-135M-Instruct (rayft's offline copy) with a
LoRA adapter (r 16, alpha 32, every linear layer, no dropout), the same GSM8K training problems as raw-text
prompts (``Question: ...\\nAnswer:``, no chat template), the same group size, completion length, sampling
(temperature 1, top-p 1, no top-k), DAPO's loss with clip-higher, no KL term, one update per rollout, the math
reward (GSM8K's answer extraction against the reference), the same learning rate and steps, one prompt batch
per step. rayft runs its own loop in-process (``scaling.num_workers=0``: no Ray start-up to leave out);
TRL its trainer. The first step of each arm is a warm-up and is left out; step times come from rayft's
metrics.jsonl (``time/step``, ``time/rollout``) and from a TRL callback around each optimizer step.

Rollout tokens/s counts generated completion tokens over generation time; trainer tokens/s counts every
real token of the training rows (prompt and completion) over the rest of the step.

rayft runs three arms in the same run, each printed as ratios against the first: colocated rollouts (the
trainer samples), rollouts on one Ray generation actor in synchronous mode (``max_staleness: 0``: the
trainer waits for the rollout of each step), and asynchronous (``max_staleness: 1``: the actor samples step
n+1 while step n trains). For the actor arms ``time/rollout`` is the trainer's wait for the rollout and rollout
tokens/s is ``rl/rollout_tokens_per_s`` (generated tokens over the actor's own generating time). The actor
gets ``--actor-cpus`` CPUs (HF generate on that many threads); the trainer runs in this process. One more
colocated arm keeps LoRA's frozen layers in fp32 (``train.frozen_precision=fp32``; rayft's default multiplies
them in bf16 on a CPU with bf16 instructions, as TRL's arm does not). ``--arms`` picks rayft's arms by name
(``colocated``, ``colocated-fp32``, ``actors-sync``, ``actors-async``); the first is the ratios' base.

Shared prefixes (``train.rl.rollout.shared_prefix``): the arm ``colocated-unshared`` prefills every completion's
copy of its prompt, as rollouts did before. ``--shared-prefix`` runs instead a rollout-only comparison in this
process, with no training: rayft's sampler (the one colocated rollouts and HF actors use) on the same prompts of
``--prompt-tokens`` tokens each (GSM8K problems run together, a long few-shot prompt), ``--group`` completions of
each, ``--repeats`` times after a short warm-up of each, the arms alternating which goes first, one seed per
repeat shared by both arms (the same tokens are sampled: it says so, and each repeat's ratio is a paired one).
Rollout tokens/s: generated tokens over the sampling call's seconds.

    .venv/bin/python benchmarks/bench_rl.py [--steps 5] [--prompts 4] [--group 4] [--max-new-tokens 48] [--no-trl]
        [--arms colocated,colocated-fp32,colocated-unshared,actors-sync,actors-async]
    .venv/bin/python benchmarks/bench_rl.py --shared-prefix [--prompts 4] [--group 8] [--prompt-tokens 384]
        [--max-new-tokens 48] [--repeats 3] [--threads 2]

The same for the server: ``--server-prefix`` runs ``benchmarks/bench_serve_prefix.py`` (16 concurrent streams
sharing a long system prompt against a real ``rayft serve``, its prompt-prefix cache off and on, time to first
token and tokens/s as ratios); the arguments after ``--`` go to it.

    .venv/bin/python benchmarks/bench_rl.py --server-prefix [-- --streams 16 --system-tokens 700]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k" / "train.jsonl"
MODEL = "smollm2-135m-instruct"
LR = 1e-5


def problems(count: int) -> list[dict[str, str]]:
    """The first ``count`` GSM8K training problems."""
    return [json.loads(line) for line in GSM8K.read_text().splitlines()[:count]]


def prompt_of(question: str) -> str:
    """The raw-text prompt both arms sample from."""
    return f"Question: {question}\nAnswer:"


ARMS = {
    "rayft colocated": (),
    "rayft colocated fp32": ("train.frozen_precision=fp32",),
    "rayft colocated unshared": ("train.rl.rollout.shared_prefix=false",),
    "rayft actors sync": ("train.rl.rollout.placement=actors", "train.rl.rollout.num_actors=1"),
    "rayft actors async": ("train.rl.rollout.placement=actors", "train.rl.rollout.num_actors=1",
                           "train.rl.rollout.max_staleness=1"),
}  # fmt: skip


def arm_key(name: str) -> str:
    """An arm's name as ``--arms`` takes it: ``rayft actors sync`` is ``actors-sync``."""
    return name.removeprefix("rayft ").replace(" ", "-")


def run_rayft(
    work: Path, rows: list[dict[str, str]], args: argparse.Namespace, name: str = "rayft-grpo",
    extra: tuple[str, ...] = (),
) -> dict[str, float]:  # fmt: skip
    """rayft's GRPO, in-process; per-step figures from its metrics.jsonl (the warm-up step left out)."""
    import rayft
    from rayft.config import load_config

    data = work / "problems.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [
        f"model.name={MODEL}", f"storage_path={work}", f"name={name}", "scaling.num_workers=0",
        f"data.datasets=[{{path: '{data}', format: template, use_chat_template: false, "
        "input_template: 'Question: {question}\\nAnswer:', output_template: '{answer}'}]",
        "data.packing=false", "data.validation_fraction=0", "data.shuffle_buffer_size=1", "data.max_seq_length=512",
        f"data.cache_dir={work / 'cache'}", "train.objective=grpo", f"train.max_steps={args.steps}",
        f"train.micro_batch_size={args.prompts}", f"train.learning_rate={LR}", "train.warmup_steps=0",
        "train.eval_steps=null", f"train.save_steps={args.steps}", "train.logging_steps=1", "lora.r=16",
        "lora.alpha=32", "lora.dropout=0", "lora.target_modules=all-linear", "logging.tensorboard=false",
        f"train.rl.group_size={args.group}", f"train.rl.max_new_tokens={args.max_new_tokens}",
        "train.rl.temperature=1.0", "train.rl.loss=dapo", "train.rl.epsilon_high=0.28",
        f"train.rl.completions_per_forward={args.prompts * args.group}",
        f"train.rl.rollout.num_cpus_per_actor={args.actor_cpus}", *extra,
    ])  # fmt: skip
    run = rayft.api.train(cfg)
    records = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r][1:]
    figures = summarise(
        [r["time/step"] for r in steps],
        [r["time/rollout"] for r in steps],
        [r["rl/completion_length"] * args.prompts * args.group for r in steps],
        [r["train/tokens_per_s"] * (r["time/step"] - r["time/rollout"]) for r in steps],
        [r["rl/reward"] for r in steps],
    )
    # The generating time itself (on the trainer, or on the actor while the trainer may be training).
    figures["rollout_tokens_per_s"] = statistics.median(r["rl/rollout_tokens_per_s"] for r in steps)
    figures["staleness"] = statistics.mean(r["rl/staleness"] for r in steps)
    return figures


def run_trl(work: Path, rows: list[dict[str, str]], args: argparse.Namespace, model_dir: str) -> dict[str, float]:
    """TRL's ``GRPOTrainer`` on the same work; step and generation times from callbacks and timers."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rayft.evaluation.rewards import math_reward

    timing: dict[str, list[float]] = {"step": [], "rollout": [], "generated": [], "rewards": []}

    def reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
        values = [math_reward(c, a) for c, a in zip(completions, answer, strict=True)]
        timing["rewards"].append(sum(values) / len(values))
        return values

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            timing["step"].append(time.perf_counter() - self.started)

    dataset = Dataset.from_list([{"prompt": prompt_of(r["question"]), "answer": r["answer"]} for r in rows])
    config = GRPOConfig(
        output_dir=str(work / "trl"), use_cpu=True, bf16=False, report_to=[], save_strategy="no", logging_steps=1,
        max_steps=args.steps, learning_rate=LR, lr_scheduler_type="cosine", warmup_steps=0,
        per_device_train_batch_size=args.prompts * args.group, num_generations=args.group,
        max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, loss_type="dapo", beta=0.0,
        epsilon=0.2, epsilon_high=0.28, num_iterations=1, shuffle_dataset=False, seed=0, max_grad_norm=1.0,
        weight_decay=0.0, gradient_checkpointing=False,  # rayft's default: train.gradient_checkpointing=false
    )  # fmt: skip
    peft = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=config, train_dataset=dataset,
                          peft_config=peft, callbacks=[StepClock()])  # fmt: skip
    generate = trainer.model.generate

    def timed_generate(*a: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        out = generate(*a, **kw)
        timing["rollout"].append(time.perf_counter() - started)
        prompt = kw.get("input_ids", a[0] if a else None)
        width = 0 if prompt is None else prompt.shape[1]
        pad = trainer.processing_class.pad_token_id
        timing["generated"].append(float((out[:, width:] != pad).sum()))
        return out

    trainer.model.generate = timed_generate
    torch.manual_seed(0)
    trainer.train()
    keep = slice(1, None)
    trained = [float("nan")] * len(timing["step"][keep])  # TRL logs no real-token count per step
    return summarise(timing["step"][keep], timing["rollout"][keep], timing["generated"][keep], trained,
                     timing["rewards"][keep])  # fmt: skip


def summarise(steps: list[float], rollouts: list[float], generated: list[float], trained: list[float],
              rewards: list[float]) -> dict[str, float]:  # fmt: skip
    """Medians of the per-step figures."""
    return {
        "step_s": statistics.median(steps),
        "rollout_s": statistics.median(rollouts),
        "train_s": statistics.median(s - r for s, r in zip(steps, rollouts, strict=True)),
        "rollout_tokens_per_s": statistics.median(g / r for g, r in zip(generated, rollouts, strict=True)),
        "trainer_tokens_per_s": statistics.median(
            t / (s - r) for t, s, r in zip(trained, steps, rollouts, strict=True)
        ),
        "reward": statistics.mean(rewards) if rewards else float("nan"),
    }


def long_prompts(tokenizer: Any, count: int, length: int) -> list[list[int]]:
    """``count`` prompts of exactly ``length`` tokens: GSM8K problems and answers run together (prompt ``i``
    starts at problem ``i``), cut to their last ``length`` tokens."""
    rows = problems(count + 64)
    out = []
    for i in range(count):
        text = "".join(f"{prompt_of(r['question'])} {r['answer']}\n\n" for r in rows[i:])
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < length:
            raise SystemExit(f"--prompt-tokens {length}: the problems give only {len(ids)} tokens")
        out.append(ids[-length:])
    return out


def shared_prefix_rollouts(args: argparse.Namespace, model_dir: str) -> None:
    """Rollout tokens/s of rayft's sampler with and without shared prefixes, on the same prompts and seeds."""
    import torch

    from rayft.config.model import ModelConfig
    from rayft.config.rl import RlConfig
    from rayft.models.loading import load_causal_lm, load_tokenizer
    from rayft.training.methods.rl.sampling import Sampler

    torch.set_num_threads(args.threads)
    config = ModelConfig(name=model_dir)
    model, tokenizer = load_causal_lm(config, "cpu"), load_tokenizer(config)
    prompts = long_prompts(tokenizer, args.prompts, args.prompt_tokens)
    arms = {
        name: Sampler(RlConfig(group_size=args.group, max_new_tokens=args.max_new_tokens, temperature=1.0,
                               rollout={"shared_prefix": shared}), tokenizer, "sdpa")
        for name, shared in (("unshared", False), ("shared", True))
    }  # fmt: skip
    for arm in arms.values():  # warm-up: a short call of each arm
        arm.sample(model, [p[:32] for p in prompts], args.group, seed=0)
    rates: dict[str, list[float]] = {name: [] for name in arms}
    same = True
    for repeat in range(args.repeats):  # the arms alternate which goes first (a load that drifts hits both)
        order = list(arms) if repeat % 2 == 0 else list(arms)[::-1]
        sampled = {name: arms[name].sample(model, prompts, args.group, seed=repeat + 1) for name in order}
        same = same and sampled["shared"].token_ids == sampled["unshared"].token_ids
        for name, done in sampled.items():
            rates[name].append(done.generated_tokens / done.seconds)
    print(f"Rollouts, SmolLM2-135M-Instruct fp32 on CPU ({args.threads} threads): {args.prompts} prompts of "
          f"{args.prompt_tokens} tokens x {args.group} completions of at most {args.max_new_tokens} tokens, "
          f"{args.repeats} repeats after a warm-up, median (min-max) rollout tokens/s")  # fmt: skip
    for name, values in rates.items():
        print(f"{name:<10}{statistics.median(values):>9.1f}  ({min(values):.1f}-{max(values):.1f})")
    # The same seed samples the same tokens in both arms: each repeat's ratio is a paired one.
    paired = [s / u for s, u in zip(rates["shared"], rates["unshared"], strict=True)]
    print(f"ratio shared / unshared: median {statistics.median(paired):.2f}x (per repeat "
          f"{', '.join(f'{r:.2f}' for r in paired)}); the same tokens sampled: {'yes' if same else 'NO'}")  # fmt: skip
    print("command: " + " ".join([".venv/bin/python", "benchmarks/bench_rl.py", *sys.argv[1:]]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--actor-cpus", type=float, default=1.0, help="CPUs of the generation actor")
    parser.add_argument("--no-trl", action="store_true", help="leave TRL's arm out")
    parser.add_argument("--arms", default=",".join(arm_key(name) for name in ARMS), help="rayft's arms, by name")
    parser.add_argument("--shared-prefix", action="store_true", help="only the rollouts, shared prefixes or not")
    parser.add_argument("--prompt-tokens", type=int, default=384, help="--shared-prefix: tokens of each prompt")
    parser.add_argument("--repeats", type=int, default=3, help="--shared-prefix: measured rounds")
    parser.add_argument("--threads", type=int, default=2, help="--shared-prefix: torch threads")
    parser.add_argument("--server-prefix", action="store_true", help="rayft serve's prompt-prefix cache, off and on "
                        "(benchmarks/bench_serve_prefix.py; the arguments after -- go to it)")  # fmt: skip
    if "--server-prefix" in sys.argv:
        from bench_serve_prefix import main as server_prefix

        rest = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []
        server_prefix(rest)
        return
    args = parser.parse_args()
    if args.shared_prefix:
        from rayft.models.loading import ensure_builtin_model

        shared_prefix_rollouts(args, str(ensure_builtin_model(MODEL)))
        return
    chosen = {arm_key(name): name for name in ARMS}
    unknown = [key for key in args.arms.split(",") if key not in chosen]
    if unknown:
        parser.error(f"--arms: unknown {', '.join(unknown)}; choose among {', '.join(chosen)}")
    from rayft.models.loading import ensure_builtin_model

    model_dir = str(ensure_builtin_model(MODEL))
    rows = problems(args.steps * args.prompts)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        arms = {name: run_rayft(work, rows, args, name.replace(" ", "-"), ARMS[name])
                for name in (chosen[key] for key in args.arms.split(","))}  # fmt: skip
        theirs = None if args.no_trl else run_trl(work, rows, args, model_dir)
    print(f"GRPO step, SmolLM2-135M LoRA r16 on CPU: {args.prompts} prompts x {args.group} completions of at most "
          f"{args.max_new_tokens} tokens per step, {args.steps} steps (first left out), medians")  # fmt: skip
    print(f"{'arm':<22}{'step s':>9}{'rollout s':>11}{'train s':>9}{'rollout tok/s':>15}{'train tok/s':>13}"
          f"{'stale':>7}{'reward':>9}")  # fmt: skip
    for name, figures in [*arms.items(), *([("TRL GRPOTrainer", theirs)] if theirs else [])]:
        print(f"{name:<22}{figures['step_s']:>9.2f}{figures['rollout_s']:>11.2f}{figures['train_s']:>9.2f}"
              f"{figures['rollout_tokens_per_s']:>15.1f}{figures['trainer_tokens_per_s']:>13.1f}"
              f"{figures.get('staleness', float('nan')):>7.2f}{figures['reward']:>9.3f}")  # fmt: skip
    first, base = next(iter(arms.items()))
    for name, figures in list(arms.items())[1:]:
        print(f"ratios {name} / {first}: step time {figures['step_s'] / base['step_s']:.2f}x, rollout tokens/s "
              f"{figures['rollout_tokens_per_s'] / base['rollout_tokens_per_s']:.2f}x, trainer tokens/s "
              f"{figures['trainer_tokens_per_s'] / base['trainer_tokens_per_s']:.2f}x")  # fmt: skip
    if theirs is not None:
        print(f"ratios {first}/TRL: step time {base['step_s'] / theirs['step_s']:.2f}x, rollout tokens/s "
              f"{base['rollout_tokens_per_s'] / theirs['rollout_tokens_per_s']:.2f}x, training time "
              f"{base['train_s'] / theirs['train_s']:.2f}x")  # fmt: skip
    print("command: " + " ".join([".venv/bin/python", "benchmarks/bench_rl.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
