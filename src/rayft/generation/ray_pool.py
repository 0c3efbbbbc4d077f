"""Running a generation backend over a Ray Dataset with a stateful actor pool.

Each actor loads the model once and serves many batches. A batch that fails is not dropped: its
rows come back with ``error`` set and empty ``generation``, so callers can count them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rayft.config.generation import GenerationConfig
from rayft.generation.backend import Generation, Prompt

if TYPE_CHECKING:
    import ray.data

OUTPUT_COLUMNS = ("generation", "finish_reason", "error", "num_prompt_tokens", "num_generated_tokens")


class GenerateActor:
    """A Ray Data callable class: one backend per actor, one generate call per batch."""

    def __init__(self, cfg: GenerationConfig, prompt_column: str, seconds_column: str | None = None) -> None:
        from rayft.generation.factory import build_backend, sampling_params

        self.backend = build_backend(cfg)
        self.params = sampling_params(cfg)
        self.prompt_column = prompt_column
        self.seconds_column = seconds_column

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        prompts = [to_prompt(p) for p in batch[self.prompt_column]]
        try:
            generations = self.backend.generate(prompts, self.params)
        except Exception as exc:  # a failed batch becomes rows with an error, never lost rows
            generations = [Generation("", finish_reason="error", error=f"{type(exc).__name__}: {exc}")] * len(prompts)
        out = {**batch, **generation_columns(generations), "generator": [self.backend.name] * len(prompts)}
        if self.seconds_column:
            # Each row carries its share of the batch's time, so a sum over rows gives the stage's seconds.
            out[self.seconds_column] = [(time.perf_counter() - started) / max(1, len(prompts))] * len(prompts)
        return out


def to_prompt(value: Any) -> Prompt:
    """Turn a value read from Arrow (a string, or an array of role/content records) into a Prompt."""
    if isinstance(value, str):
        return value
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]


def generation_columns(generations: Sequence[Generation]) -> dict[str, list[Any]]:
    """Columns for a batch of generations, named as in OUTPUT_COLUMNS."""
    return {
        "generation": [g.text for g in generations],
        "finish_reason": [g.finish_reason for g in generations],
        "error": [g.error or "" for g in generations],
        "num_prompt_tokens": [g.num_prompt_tokens for g in generations],
        "num_generated_tokens": [g.num_generated_tokens for g in generations],
    }


def generate_dataset(
    ds: ray.data.Dataset,
    cfg: GenerationConfig,
    prompt_column: str = "prompt",
    *,
    seconds_column: str | None = None,
) -> ray.data.Dataset:
    """Add generation columns to every row of ``ds`` (lazily) with an actor pool sized by ``cfg``.

    With ``seconds_column``, each row also gets its share of its batch's generation time.
    """
    return ds.map_batches(
        GenerateActor,
        fn_constructor_kwargs={"cfg": cfg, "prompt_column": prompt_column, "seconds_column": seconds_column},
        batch_size=cfg.batch_size,
        batch_format="numpy",
        compute=_actor_pool(cfg.concurrency),
        num_cpus=cfg.num_cpus_per_actor,
        num_gpus=cfg.num_gpus_per_actor,
    )


def _actor_pool(size: int) -> Any:
    from ray.data import ActorPoolStrategy

    return ActorPoolStrategy(size=size)
