"""``rayft generate SOURCE --input prompts.jsonl --output out.jsonl``: batch inference on Ray Data.

Reads top to bottom: sort the input lines into prompts and rejected rows (the rejects file lists
each with its line number, reason and text), resolve the model source as ``rayft eval`` does,
generate on a Ray Data actor pool with the backend of ``inference.backend`` (hf, vllm or an
OpenAI-compatible server), and write every usable row, in input order, with its other columns
and the generation columns added. Both files are written atomically: a crash leaves the previous
output (or none), never half of one.

Public entry point: :func:`run` (also ``rayft.generate``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft.config import RayftConfig
from rayft.config.generation import GenerationConfig
from rayft.config.model import ModelConfig
from rayft.errors import DataError, StorageError
from rayft.evaluation.runner import generate
from rayft.files import replacing
from rayft.generation.backend import Generation, Prompt
from rayft.inference.prompts import REASONS, PromptFile, PromptRow, read_prompts
from rayft.models.sources import resolve_source
from rayft.runtime import ray_runtime
from rayft.security import redact

log = logging.getLogger("rayft.generate")

OUTPUT_FIELDS = ("generation", "finish_reason", "error", "num_prompt_tokens", "num_generated_tokens")
"""The fields each output row gets (replacing input columns of the same name)."""
_LOGGED_REJECTS = 10


@dataclass(frozen=True)
class GenerateResult:
    """What ``rayft generate`` wrote and counted."""

    output_path: Path
    rejects_path: Path
    model: str
    num_lines: int
    num_written: int
    num_rejected: int
    num_failed: int
    generated_tokens: int
    elapsed_s: float
    rejected_by_reason: dict[str, int]

    def summary(self) -> str:
        """One line for the console."""
        failed = f" ({self.num_failed} with a generation error)" if self.num_failed else ""
        return (
            f"generate: {self.num_written} of {self.num_lines} rows written to {self.output_path}{failed}; "
            f"{self.num_rejected} rejected (listed in {self.rejects_path}); {self.generated_tokens} tokens "
            f"generated in {self.elapsed_s:.1f} s"
        )


def default_rejects_path(output_path: Path) -> Path:
    """``out.jsonl`` -> ``out.rejects.jsonl``, beside the output."""
    stem = output_path.name[: -len(".jsonl")] if output_path.name.endswith(".jsonl") else output_path.name
    return output_path.with_name(f"{stem}.rejects.jsonl")


def run(
    cfg: RayftConfig,
    source: str,
    input_path: Path,
    output_path: Path,
    *,
    prompt_field: str | None = None,
    rejects_path: Path | None = None,
) -> GenerateResult:
    """Generate a completion for every usable row of ``input_path`` with ``source``, into ``output_path``."""
    started = time.monotonic()
    input_path, output_path = Path(input_path), Path(output_path)
    rejects_path = Path(rejects_path) if rejects_path is not None else default_rejects_path(output_path)
    check_paths(input_path, output_path, rejects_path)
    prompts = read_input(input_path, prompt_field)
    write_jsonl_atomic(rejects_path, (r.to_dict() for r in prompts.rejected))
    report_rejected(prompts, input_path, rejects_path)
    if not prompts.rows:
        raise DataError(
            f"{input_path}: no line has a usable prompt ({len(prompts.rejected)} rejected, listed in {rejects_path}); "
            "give each line a 'prompt' string or a 'messages' list, or name the column with --field"
        )
    clashes = sorted({key for row in prompts.rows for key in row.row if key in OUTPUT_FIELDS})
    if clashes:
        log.warning("generate: the input's %s column(s) are replaced by the generation's in the output", clashes)
    gen_cfg, model = generation_config(cfg, source)
    log.info("generate: %d prompts from %s with %s (%s backend)", len(prompts.rows), input_path, model, gen_cfg.backend)

    with ray_runtime(cfg.scaling.address):
        generations = generate_by_kind([row.prompt for row in prompts.rows], gen_cfg)
    write_jsonl_atomic(output_path, output_rows(prompts.rows, generations))
    result = GenerateResult(
        output_path=output_path, rejects_path=rejects_path, model=model,
        num_lines=len(prompts.rows) + len(prompts.rejected), num_written=len(prompts.rows),
        num_rejected=len(prompts.rejected), num_failed=sum(1 for g in generations if g.error),
        generated_tokens=sum(g.num_generated_tokens for g in generations),
        elapsed_s=round(time.monotonic() - started, 3), rejected_by_reason=prompts.rejected_by_reason(),
    )  # fmt: skip
    if result.num_failed:
        first = next(g.error for g in generations if g.error)
        log.warning(
            "generate: %d generations failed (first: %s); their rows have 'error' set", result.num_failed, first
        )
    return result


def check_paths(input_path: Path, output_path: Path, rejects_path: Path) -> None:
    """Refuse a missing input, and outputs that would overwrite the input."""
    if not input_path.is_file():
        raise DataError(f"--input {str(input_path)!r} is not a file; give a JSON Lines file of prompts")
    for option, path in (("--output", output_path), ("--rejects", rejects_path)):
        if path.resolve() == input_path.resolve():
            raise DataError(f"{option} {str(path)!r} is the input file; write the results to another file")


def read_input(input_path: Path, prompt_field: str | None) -> PromptFile:
    """The prompts and rejected rows of the input file."""
    try:
        with input_path.open("rb") as handle:
            return read_prompts(handle, prompt_field)
    except OSError as exc:
        raise DataError(f"--input {str(input_path)!r}: cannot read it ({exc.strerror})") from None


def report_rejected(prompts: PromptFile, input_path: Path, rejects_path: Path) -> None:
    """A warning per rejected line (the first few), then the count by reason."""
    for item in prompts.rejected[:_LOGGED_REJECTS]:
        log.warning("generate: %s line %d rejected, %s: %s; the line: %.200s", input_path, item.line, item.reason,
                    item.detail, item.value)  # fmt: skip
    if prompts.rejected:
        counts = ", ".join(f"{reason} {n} ({REASONS[reason]})" for reason, n in prompts.rejected_by_reason().items())
        log.warning("generate: %d lines rejected (%s); every one is in %s", len(prompts.rejected), counts, rejects_path)


def generation_config(cfg: RayftConfig, source: str) -> tuple[GenerationConfig, str]:
    """The generation section for ``source`` (resolved as ``rayft eval`` does; for the 'openai'
    backend, the model name the server is asked for), and how the model is described."""
    inference = cfg.inference
    adapter: str | None = None
    if inference.backend == "openai":
        model, described = ModelConfig(name=source), f"{source} at {inference.endpoint.base_url}"
    else:
        resolved = resolve_source(source, cfg.model, cfg.eval.checkpoint)
        model, adapter, described = resolved.model, resolved.adapter_path, resolved.describe()
    gen_cfg = GenerationConfig(
        backend=inference.backend, model=model, adapter_path=adapter, max_new_tokens=inference.max_new_tokens,
        temperature=inference.temperature, top_p=inference.top_p, stop=list(inference.stop), seed=inference.seed,
        batch_size=inference.batch_size, kv_cache=inference.kv_cache, compile=inference.compile,
        concurrency=inference.num_workers,
        num_cpus_per_actor=inference.num_cpus_per_worker, num_gpus_per_actor=inference.num_gpus_per_worker,
        endpoint=inference.endpoint,
    )  # fmt: skip
    return gen_cfg, described


def generate_by_kind(prompts: list[Prompt], gen_cfg: GenerationConfig) -> list[Generation]:
    """One generation per prompt, in order, on the Ray Data actor pool; text and chat prompts go in
    separate passes (a dataset column holds one type)."""
    out: list[Generation | None] = [None] * len(prompts)
    for chat in (False, True):
        indices = [i for i, p in enumerate(prompts) if isinstance(p, list) == chat]
        if not indices:
            continue
        what = "generate (chat prompts)" if chat else "generate (text prompts)"
        for index, generation in zip(indices, generate([prompts[i] for i in indices], gen_cfg, "ray", what=what),
                                     strict=True):  # fmt: skip
            out[index] = generation
    return [g for g in out if g is not None]


def output_rows(rows: list[PromptRow], generations: list[Generation]) -> Iterator[dict[str, Any]]:
    """Each input row with the generation fields added, in input order."""
    for row, generation in zip(rows, generations, strict=True):
        yield {
            **row.row,
            "generation": generation.text,
            "finish_reason": generation.finish_reason,
            "error": generation.error,
            "num_prompt_tokens": generation.num_prompt_tokens,
            "num_generated_tokens": generation.num_generated_tokens,
        }


def write_jsonl_atomic(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write one JSON object per line, its credentials masked, to a temporary file beside ``path``,
    then rename it into place: readers see the old file or the whole new one."""
    try:
        with replacing(path, sync=True) as handle:
            for row in rows:
                handle.write(redact(json.dumps(row, ensure_ascii=False)) + "\n")
    except OSError as exc:
        raise StorageError(f"cannot write {path} ({exc.strerror}); choose a writable location") from exc
    return path
