"""Running a generation backend on Ray actors: over a Ray Dataset (:func:`generate_dataset`, a Ray
Data actor pool) or over a stream of batches (:class:`RayActorPool`, actors that live as long as the
pool, so that a stream fed window by window loads the model once).

Each actor loads the model once and serves many batches. A batch that fails is not dropped: its
rows come back with ``error`` set and empty ``generation``, so callers can count them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from rayft.config.generation import GenerationConfig
from rayft.generation.backend import Generation, Prompt, generate_batch
from rayft.generation.factory import build_backend, sampling_params
from rayft.models.resolve import anchored_name

if TYPE_CHECKING:
    import ray.data

Tag = TypeVar("Tag")

OUTPUT_COLUMNS = ("generation", "finish_reason", "error", "num_prompt_tokens", "num_generated_tokens")
COLUMN_TYPES: dict[str, pa.DataType] = {
    "generation": pa.string(),
    "finish_reason": pa.string(),
    "error": pa.string(),
    "generator": pa.string(),
    "num_prompt_tokens": pa.int64(),
    "num_generated_tokens": pa.int64(),
}
"""The Arrow type of each column the actor adds."""
CHAT_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
"""The Arrow type of a column of chat prompts."""


class GenerateActor:
    """A Ray Data callable class: one backend per actor, one generate call per batch.

    Batches are Arrow tables in and out: the input columns pass through with their Arrow types
    (a chat prompt stays a ``list<struct<role, content>>``) and the generation columns are added
    with explicit types, so no column falls back to pickled Python objects.
    """

    def __init__(self, cfg: GenerationConfig, prompt_column: str, seconds_column: str | None = None) -> None:
        self.backend = build_backend(cfg)
        self.params = sampling_params(cfg)
        self.prompt_column = prompt_column
        self.seconds_column = seconds_column

    def __call__(self, batch: pa.Table) -> pa.Table:
        started = time.perf_counter()
        prompts = [to_prompt(p) for p in batch.column(self.prompt_column).to_pylist()]
        generations = generate_batch(self.backend, self.params, prompts)
        columns = {**generation_columns(generations), "generator": [self.backend.name] * len(prompts)}
        if self.seconds_column:
            # Each row carries its share of the batch's time, so a sum over rows gives the stage's seconds.
            columns[self.seconds_column] = [(time.perf_counter() - started) / max(1, len(prompts))] * len(prompts)
        return with_columns(batch, columns)


def with_columns(table: pa.Table, columns: dict[str, list[Any]]) -> pa.Table:
    """``table`` with ``columns`` added (or replaced), each with its declared Arrow type
    (:data:`COLUMN_TYPES`; float64 for a time column)."""
    for name, values in columns.items():
        array = pa.array(values, type=COLUMN_TYPES.get(name, pa.float64()))
        index = table.schema.get_field_index(name)
        table = table.set_column(index, name, array) if index >= 0 else table.append_column(name, array)
    return table


def prompt_table(prompts: Sequence[Prompt], column: str = "prompt") -> pa.Table:
    """Prompts as an Arrow table with a ``row`` index: text prompts as ``string``, chat prompts as
    :data:`CHAT_TYPE` (one type for the whole column)."""
    kinds = {isinstance(p, str) for p in prompts}
    if len(kinds) > 1:
        raise ValueError("prompts mix plain text and chat messages; build every prompt the same way")
    prompt_type = pa.string() if kinds == {True} else CHAT_TYPE
    return pa.table({"row": pa.array(range(len(prompts)), pa.int64()), column: pa.array(prompts, type=prompt_type)})


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
    cfg = anchored(cfg)
    return ds.map_batches(
        GenerateActor,
        fn_constructor_kwargs={"cfg": cfg, "prompt_column": prompt_column, "seconds_column": seconds_column},
        batch_size=cfg.batch_size,
        batch_format="pyarrow",
        compute=_actor_pool(cfg.concurrency),
        num_cpus=cfg.num_cpus_per_actor,
        num_gpus=cfg.num_gpus_per_actor,
    )


def anchored(cfg: GenerationConfig) -> GenerationConfig:
    """``cfg`` with its model and adapter as paths a Ray worker (whose working directory differs)
    resolves to the same files."""
    model = cfg.model.model_copy(update={"name": anchored_name(cfg.model.name)})
    adapter = anchored_name(cfg.adapter_path) if cfg.adapter_path else None
    return cfg.model_copy(update={"model": model, "adapter_path": adapter})


class BatchGenerator:
    """A Ray actor's state: one backend, loaded once, generating one batch of prompts per call."""

    def __init__(self, cfg: GenerationConfig) -> None:
        if cfg.backend == "hf":
            # The actor's process loads this one model and ends with it: PEFT (for an adapter) would import
            # bitsandbytes for nothing, with its kernels' offline warning on the console, unless the base
            # is quantized (hide_unused_bitsandbytes leaves it importable then).
            from rayft.models.loading import hide_unused_bitsandbytes

            hide_unused_bitsandbytes(cfg.model, "none")
        self.backend = build_backend(cfg)
        self.params = sampling_params(cfg)

    def generate(self, prompts: list[Prompt]) -> list[Generation]:
        """One generation per prompt, in order (a failed batch as rows with its error)."""
        return generate_batch(self.backend, self.params, prompts)


class RayActorPool:
    """``cfg.concurrency`` Ray actors, each with the backend loaded once, serving batches until
    :meth:`close`. At most two batches per actor are in flight, so a long stream of batches is never
    all submitted at once. An actor that dies is restarted and its batch retried (twice)."""

    def __init__(self, cfg: GenerationConfig) -> None:
        import ray
        from ray.util import ActorPool

        remote = ray.remote(
            num_cpus=cfg.num_cpus_per_actor, num_gpus=cfg.num_gpus_per_actor, max_restarts=2, max_task_retries=2
        )(BatchGenerator)
        self.actors: list[Any] = [remote.remote(anchored(cfg)) for _ in range(cfg.concurrency)]
        self.pool = ActorPool(self.actors)
        self.in_flight = 2 * len(self.actors)

    def map(self, batches: Iterable[tuple[Tag, list[Prompt]]]) -> Iterator[tuple[Tag, list[Generation]]]:
        """One list of generations per batch, in batch order."""
        tags: deque[Tag] = deque()
        for tag, prompts in batches:
            self.pool.submit(lambda actor, chunk: actor.generate.remote(chunk), prompts)
            tags.append(tag)
            if len(tags) >= self.in_flight:
                yield tags.popleft(), self.pool.get_next()
        while tags:
            yield tags.popleft(), self.pool.get_next()

    def close(self) -> None:
        """Stop the actors (their resources go back to the cluster)."""
        import ray

        for actor in self.actors:
            ray.kill(actor)


def _actor_pool(size: int) -> Any:
    from ray.data import ActorPoolStrategy

    return ActorPoolStrategy(size=size)
