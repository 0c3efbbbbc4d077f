"""Padded against padding-free (``train.padding_free: true``) DPO and GRPO training steps on uneven lengths (CPU).

One micro-batch per step through the methods' own code (:class:`PreferenceTraining` and :class:`RlTraining`:
collation, the reference forward with the LoRA adapter off, the policy forward, the loss and its backward;
GRPO's completions are given, so sampling is left out). The model is a random-init SmolLM2-135M shape cut to
``--layers`` layers, with a LoRA adapter on q/v, on the training attention of a CPU (per-example SDPA). Token
ids are random; lengths are uneven: prompts of 40-160 tokens, responses and completions of 20-300, drawn from
a fixed seed. The arms alternate round by round; each prints its best round's real tokens per second (padding
excluded), the positions it computed, and the packed/padded ratio.

    flock /tmp/rayft-heavy.lock .venv/bin/python benchmarks/bench_packed_steps.py [--threads 2] [--layers 6]
        [--pairs 8] [--prompts 2] [--group 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def lora_model(layers: int) -> Any:
    """The SmolLM2-135M shape with ``layers`` layers, random weights, a LoRA adapter on q/v whose B is
    random (so the reference, the adapter off, differs from the policy), on per-example SDPA."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rayft.testing.architectures import architecture_config
    from rayft.training.modeling.attention import PER_EXAMPLE_SDPA, register

    register()
    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_config(architecture_config("smollm2-135m", num_hidden_layers=layers),
                                           attn_implementation="sdpa")  # fmt: skip
    net.set_attn_implementation(PER_EXAMPLE_SDPA)
    model = get_peft_model(net, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.01)
    return model


def plan(padding_free: bool) -> Any:
    """The parts of a worker's plan the methods read."""
    from rayft.training.modeling.attention import PER_EXAMPLE_SDPA

    return SimpleNamespace(model=SimpleNamespace(attn_implementation=PER_EXAMPLE_SDPA),
                           train=SimpleNamespace(padding_free=padding_free, method="lora"))  # fmt: skip


def ids(rng: random.Random, low: int, high: int) -> list[int]:
    """Random token ids, between ``low`` and ``high`` of them."""
    return [rng.randrange(100, 40000) for _ in range(rng.randint(low, high))]


def dpo_step(model: Any, count: int, seed: int) -> Callable[[bool], tuple[int, int]]:
    """A DPO step over ``count`` pairs; the step returns (real tokens, computed positions)."""
    from rayft.config.preference import PreferenceConfig
    from rayft.training.methods.preference.method import PreferenceTraining
    from rayft.training.modeling.precision import Precision

    rng = random.Random(seed)
    units = []
    for index in range(count):
        prompt, chosen, rejected = ids(rng, 40, 160), ids(rng, 20, 300), ids(rng, 20, 300)
        units.append({"chosen_input_ids": prompt + chosen, "chosen_labels": [-100] * len(prompt) + chosen,
                      "rejected_input_ids": prompt + rejected, "rejected_labels": [-100] * len(prompt) + rejected,
                      "sample_ids": [index]})  # fmt: skip

    def step(padding_free: bool) -> tuple[int, int]:
        lm = SimpleNamespace(plan=plan(padding_free), tokenizer=SimpleNamespace(pad_token_id=0), model_type="llama")
        training = PreferenceTraining(lm, "dpo", PreferenceConfig())  # type: ignore[arg-type]
        batch = training.collate(units)
        model.zero_grad()
        training.loss_sum(model, batch, Precision(None, use_grad_scaler=False)).backward()
        return batch.num_tokens, batch.num_computed_tokens

    return step


def grpo_step(model: Any, prompts: int, group: int, seed: int) -> Callable[[bool], tuple[int, int]]:
    """A GRPO update on ``prompts`` x ``group`` given completions (KL to the adapter-off base)."""
    from rayft.config.rl import RlConfig
    from rayft.training.methods.rl.method import RlTraining
    from rayft.training.methods.rl.sampling import Completions, PromptBatch
    from rayft.training.modeling.precision import Precision

    rng = random.Random(seed)
    batch = PromptBatch([ids(rng, 40, 160) for _ in range(prompts)], [""] * prompts, list(range(prompts)))
    completions = [[*ids(rng, 20, 300), 2] for _ in range(prompts * group)]
    sampled = Completions(completions, [""] * len(completions), sum(map(len, completions)), 0.0)
    rewards = [rng.random() for _ in completions]
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=2)  # what the sampler reads of it
    settings = RlConfig(rewards=[{"function": "exact_match"}], group_size=group, kl_coef=0.04,
                        completions_per_forward=prompts * group)  # fmt: skip

    def step(padding_free: bool) -> tuple[int, int]:
        lm = SimpleNamespace(plan=plan(padding_free), tokenizer=tokenizer, seq2seq=False, model_type="llama")
        training = RlTraining.build(lm, settings, seed=0)  # type: ignore[arg-type]
        model.zero_grad()
        (rollout,) = training.to_rollout(model, batch, sampled, rewards, Precision(None, use_grad_scaler=False))
        training.loss_sum(model, rollout, Precision(None, use_grad_scaler=False)).backward()
        return rollout.num_tokens, rollout.num_computed_tokens

    return step


def measure(name: str, step: Callable[[bool], tuple[int, int]], rounds: int) -> None:
    """Both arms alternating for ``rounds`` (after a warm-up of each); the best round's tokens/s and the ratio."""
    arms = (False, True)
    counts = {arm: step(arm) for arm in arms}  # warm-up
    best = dict.fromkeys(arms, float("inf"))
    for _ in range(rounds):
        for arm in arms:
            started = time.perf_counter()
            step(arm)
            best[arm] = min(best[arm], time.perf_counter() - started)
    speed = {arm: counts[arm][0] / best[arm] for arm in arms}
    for arm in arms:
        label = "padding-free" if arm else "padded"
        print(f"{name:>5} {label:>13} {counts[arm][0]:>7} {counts[arm][1]:>9} {best[arm]:>8.2f} {speed[arm]:>9.0f}")
    print(f"{name:>5} packed/padded tokens/s: {speed[True] / speed[False]:.2f}x")


def main() -> None:
    """A DPO and a GRPO step, padded and padding-free."""
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=8, help="DPO pairs per micro-batch")
    parser.add_argument("--prompts", type=int, default=2, help="GRPO prompts per micro-batch")
    parser.add_argument("--group", type=int, default=8, help="GRPO completions per prompt")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = lora_model(args.layers)
    print(f"torch {torch.__version__}, {args.threads} threads, SmolLM2-135M shape x {args.layers} layers, LoRA r=8, "
          f"load {Path('/proc/loadavg').read_text().split()[:3]}")  # fmt: skip
    print(f"{'step':>5} {'arm':>13} {'tokens':>7} {'positions':>9} {'best s':>8} {'tokens/s':>9}")
    measure("dpo", dpo_step(model, args.pairs, seed=1), args.rounds)
    measure("grpo", grpo_step(model, args.prompts, args.group, seed=2), args.rounds)


if __name__ == "__main__":
    main()
