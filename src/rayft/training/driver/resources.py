"""What a GRPO run asks for, checked against what the model and the cluster have before anything starts,
with the estimate in the error. Pure decisions, no I/O: the driver hands in the model's config and the
cluster's nodes (:func:`rayft.training.driver.startup.check_rollout_resources` gathers them).

- the longest sequence a rollout makes (a prompt of up to ``data.max_seq_length`` tokens and
  ``train.rl.max_new_tokens`` more) against the model's context;
- the generation actors (``train.rl.rollout``) with the training workers against the cluster's CPUs and
  GPUs, instead of waiting out ``start_timeout_s`` for actors that can never be placed;
- the memory a step's rollout holds on a worker (the KV cache of every completion sampled at once, and
  the logits of a training forward pass) against a node's memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rayft.config.data import DataConfig
from rayft.config.rl import RolloutConfig
from rayft.config.train import TrainConfig
from rayft.errors import ConfigError, ResourceError
from rayft.training.loop.plan import missing_resources

_FLOAT32_BYTES = 4  # an upper bound: the KV cache in the model's dtype (float32 on CPUs), logits in float32


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a causal LM that a rollout's memory grows with."""

    layers: int
    kv_heads: int
    head_dim: int
    vocab: int


def model_shape(config: Mapping[str, object]) -> ModelShape | None:
    """The shape of a model from its config dict (None when the config does not say)."""
    layers, heads, hidden, vocab = (_positive(config, k) for k in ("num_hidden_layers", "num_attention_heads",
                                                                   "hidden_size", "vocab_size"))  # fmt: skip
    if layers is None or heads is None or hidden is None or vocab is None:
        return None
    return ModelShape(
        layers=layers,
        kv_heads=_positive(config, "num_key_value_heads") or heads,
        head_dim=_positive(config, "head_dim") or hidden // heads,
        vocab=vocab,
    )


def _positive(config: Mapping[str, object], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and value > 0 else None


def samples(train: TrainConfig) -> bool:
    """Whether the run samples rollouts (its method's traits say so: GRPO's do)."""
    return train.traits.samples


def check_generation_length(train: TrainConfig, data: DataConfig, context: int | None, model: str) -> None:
    """Refuse a rollout whose longest sequence (prompt and completion) passes the model's context."""
    if not samples(train) or context is None:
        return
    longest = data.max_seq_length + train.rl.max_new_tokens
    if longest <= context:
        return
    room = context - data.max_seq_length
    fix = (f"lower train.rl.max_new_tokens to at most {room} (or data.max_seq_length)" if room > 0
           else "lower data.max_seq_length")  # fmt: skip
    raise ConfigError(
        f"train.rl.max_new_tokens={train.rl.max_new_tokens} after prompts of up to data.max_seq_length="
        f"{data.max_seq_length} tokens makes sequences of up to {longest} tokens, but model.name={model!r} takes "
        f"{context} (its context); {fix}, or use a model with a longer context"
    )


def actor_resources(rollout: RolloutConfig) -> dict[str, float]:
    """What Ray reserves for one generation actor."""
    wanted = {"CPU": rollout.num_cpus_per_actor}
    if rollout.num_gpus_per_actor > 0:
        wanted["GPU"] = rollout.num_gpus_per_actor
    return wanted


def check_actors_fit(
    per_worker: Mapping[str, float],
    num_workers: int,
    per_actor: Mapping[str, float],
    num_actors: int,
    nodes: Sequence[Mapping[str, float]],
) -> None:
    """Refuse generation actors that cannot be placed beside the training workers on ``nodes`` (each
    node's total resources): one that no node can host, or more of them than the cluster holds."""
    problems = missing_resources(per_actor, num_actors, nodes)
    if not problems:
        totals = {k: sum(n.get(k, 0.0) for n in nodes) for k in {*per_worker, *per_actor}}
        wanted = {k: per_worker.get(k, 0.0) * num_workers + per_actor.get(k, 0.0) * num_actors for k in totals}
        problems = [f"{_amount(wanted[k])} {k} needed with the {num_workers} training worker(s) x "
                    f"{dict(per_worker)}, {_amount(totals[k])} {k} in the cluster"
                    for k in sorted(totals) if wanted[k] > totals[k]]  # fmt: skip
    if problems:
        raise ResourceError(
            f"train.rl.rollout: {num_actors} generation actor(s) x {dict(per_actor)} cannot be placed: "
            f"{'; '.join(problems)}. Lower train.rl.rollout.num_cpus_per_actor (or num_gpus_per_actor, num_actors), "
            "use placement colocated, or add nodes"
        )


def estimate_rollout_bytes(shape: ModelShape, *, rows: int, tokens: int, forward_rows: int) -> int:
    """Bytes a step's rollout holds at its peak on one worker: the KV cache of ``rows`` completions
    sampled at once, ``tokens`` long each (keys and values of every layer), and the float32 logits of a
    training forward pass over ``forward_rows`` of them. Weights, gradients and activations come on top:
    this is a lower bound, enough to refuse what cannot fit."""
    kv_cache = 2 * shape.layers * shape.kv_heads * shape.head_dim * _FLOAT32_BYTES * rows * tokens
    logits = _FLOAT32_BYTES * shape.vocab * forward_rows * tokens
    return kv_cache + logits


def check_rollout_memory(train: TrainConfig, data: DataConfig, shape: ModelShape | None, node_bytes: float) -> None:
    """Refuse a group size whose step's rollout (:func:`estimate_rollout_bytes`) outgrows a node's memory."""
    if not samples(train) or shape is None:
        return
    rows = train.micro_batch_size * train.rl.group_size
    tokens = data.max_seq_length + train.rl.max_new_tokens
    forward_rows = min(train.rl.completions_per_forward or train.rl.group_size, rows)
    estimate = estimate_rollout_bytes(shape, rows=rows, tokens=tokens, forward_rows=forward_rows)
    if estimate <= node_bytes:
        return
    raise ResourceError(
        f"train.rl.group_size={train.rl.group_size}: a step samples train.micro_batch_size={train.micro_batch_size} "
        f"prompts x {train.rl.group_size} = {rows} completions of up to {tokens} tokens at once on each worker, "
        f"which holds at least {_gib(estimate)} (KV cache and logits), more than a node's {_gib(node_bytes)}; "
        "lower train.rl.group_size, train.micro_batch_size or train.rl.max_new_tokens "
        "(train.rl.completions_per_forward bounds the training pass)"
    )


def _gib(count: float) -> str:
    return f"{count / 2**30:.1f} GiB"


def _amount(value: float) -> str:
    return f"{value:g}"
