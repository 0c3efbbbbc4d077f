"""Batch generation over a JSON Lines file of prompts, streamed: the paths checked before anything
loads, the generation section for a model source, and the doer that reads a line at a time,
sorts lines into prompts and rejected rows, feeds a pool of generation actors a window at a time
(longest first within a window) and appends every usable row, in input order, as its window
finishes. Memory holds one window and counters, never the whole file; both files are written to a
temporary file and renamed at the end, so a crash leaves the previous output (or none)."""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayft.config import RayftConfig
from rayft.config.generation import GenerationConfig
from rayft.config.model import ModelConfig
from rayft.console import Progress
from rayft.data.formats import REASONS
from rayft.data.read.rows import ReadRow, iter_json_lines
from rayft.data.tools import ToolCall, ToolUseError, tool_call_blocks
from rayft.errors import DataError, EndpointError, ModelError
from rayft.files import AtomicJsonl
from rayft.generation.backend import Generation, ToolChat
from rayft.generation.openai_http import OpenAIBackend
from rayft.generation.pool import Runtime, in_input_order, open_pool
from rayft.inference.prompts import PromptRow, RejectedRow, iter_prompts
from rayft.lines import OversizedLine, bounded_lines
from rayft.models.sources import resolve_source
from rayft.runtime import ray_runtime

log = logging.getLogger("rayft.generate")

OUTPUT_FIELDS = ("generation", "finish_reason", "error", "num_prompt_tokens", "num_generated_tokens", "tool_calls",
                 "tool_call_errors")  # fmt: skip
"""The fields each output row gets (replacing input columns of the same name)."""
_LOGGED_REJECTS = 10


@dataclass(frozen=True)
class BatchPaths:
    """The input read, the output written and where rejected lines are listed."""

    input: Path
    output: Path
    rejects: Path


def plan_paths(input_path: Path, output_path: Path, rejects_path: Path | None = None) -> BatchPaths:
    """The paths of a run (rejects beside the output by default), checked before anything loads."""
    input_path, output_path = Path(input_path), Path(output_path)
    rejects = Path(rejects_path) if rejects_path is not None else default_rejects_path(output_path)
    check_paths(input_path, output_path, rejects)
    return BatchPaths(input_path, output_path, rejects)


def default_rejects_path(output_path: Path) -> Path:
    """``out.jsonl`` -> ``out.rejects.jsonl``, beside the output."""
    stem = output_path.name[: -len(".jsonl")] if output_path.name.endswith(".jsonl") else output_path.name
    return output_path.with_name(f"{stem}.rejects.jsonl")


@dataclass
class Tally:
    """What the driver keeps of a run instead of its rows: counts, and the first error seen."""

    written: int = 0
    failed: int = 0
    generated_tokens: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    first_error: str | None = None
    clashes_reported: bool = False

    @property
    def rejected(self) -> int:
        """Lines rejected so far."""
        return sum(self.rejected_by_reason.values())

    def add_generation(self, generation: Generation) -> None:
        """Count one row written."""
        self.written += 1
        self.generated_tokens += generation.num_generated_tokens
        if generation.error:
            self.failed += 1
            self.first_error = self.first_error or generation.error


def generate_file(
    cfg: RayftConfig, source: str, paths: BatchPaths, *, prompt_field: str | None, runtime: Runtime
) -> tuple[Tally, str]:
    """Generate for every usable line of ``paths.input`` with ``source`` into ``paths.output``; what
    was counted, and how the model is described. No model loads when no line is usable."""
    tally = Tally()
    window = cfg.inference.window
    with (
        input_rows(paths.input, cfg.inference.max_row_bytes) as lines,
        AtomicJsonl(paths.rejects) as rejects,
        AtomicJsonl(paths.output) as output,
        Progress("generate", count_lines(paths.input, cfg.inference.max_row_bytes), unit="lines") as progress,
    ):
        rows = usable_rows(iter_prompts(lines, prompt_field), rejects, tally, paths.input, progress)
        first = list(itertools.islice(rows, window))  # before anything loads
        if not first:
            rejects.commit()
            raise DataError(
                f"{paths.input}: no line has a usable prompt ({tally.rejected} rejected, listed in {paths.rejects}); "
                "give each line a 'prompt' string or a 'messages' list, or name the column with --field"
            )
        gen_cfg, model = generation_config(cfg, source)
        if gen_cfg.backend == "openai":
            check_endpoint(gen_cfg)
        log.info("generate: prompts from %s with %s (%s backend), %d at a time", paths.input, model, gen_cfg.backend,
                 window)  # fmt: skip
        with _runtime(runtime, cfg.scaling.address), open_pool(gen_cfg, runtime) as pool:
            windows = in_input_order(itertools.chain(first, rows), lambda r: r.prompt, pool,
                                     batch_size=gen_cfg.batch_size, window=window,
                                     on_batch=progress.advance)  # fmt: skip
            del first  # the chain's reference goes once the first window is read
            for done in windows:
                for row, generation in done:
                    output.write(output_row(row, generation))
                    tally.add_generation(generation)
                output.flush()  # a window at a time, so that the temporary file shows how far the run is
        output.commit()
        rejects.commit()
    return tally, model


def check_endpoint(gen_cfg: GenerationConfig) -> None:
    """The server of the 'openai' backend answers, takes the key and serves the model, before any prompt is sent
    (a refused key is one error, not a file of failed rows)."""
    backend = OpenAIBackend(gen_cfg.model.name, gen_cfg.endpoint)
    try:
        backend.check_serves_model("inference.endpoint")
    finally:
        backend.close()


def check_some_generated(tally: Tally, output_path: Path, backend: str) -> None:
    """Refuse a run in which every row written failed: it is no success (its rows, with their error, are kept)."""
    if tally.written and tally.failed == tally.written:
        error = EndpointError if backend == "openai" else ModelError
        raise error(
            f"generate: all {tally.written} generations failed (first: {tally.first_error}); each row is in "
            f"{output_path} with its error; fix the cause and run again"
        )


def report_outcome(tally: Tally, rejects_path: Path) -> None:
    """Log the count of rejected lines by reason, and the failed generations."""
    report_rejected(tally, rejects_path)
    if tally.failed:
        log.warning("generate: %d generations failed (first: %s); their rows have 'error' set", tally.failed,
                    tally.first_error)  # fmt: skip


def _runtime(runtime: Runtime, address: str | None) -> contextlib.AbstractContextManager[object]:
    if runtime == "local":
        return contextlib.nullcontext()

    return ray_runtime(address)


def check_paths(input_path: Path, output_path: Path, rejects_path: Path) -> None:
    """Refuse a missing input, and outputs that would overwrite the input."""
    if not input_path.is_file():
        raise DataError(f"--input {str(input_path)!r} is not a file; give a JSON Lines file of prompts")
    for option, path in (("--output", output_path), ("--rejects", rejects_path)):
        if path.resolve() == input_path.resolve():
            raise DataError(f"{option} {str(path)!r} is the input file; write the results to another file")


def count_lines(input_path: Path, max_row_bytes: int) -> int:
    """Non-blank lines of the input (the progress total), read a line at a time (none held whole)."""
    count = 0
    with contextlib.suppress(OSError), input_path.open("rb") as handle:
        count = sum(
            1 for line in bounded_lines(handle, max_row_bytes) if isinstance(line, OversizedLine) or line.strip()
        )
    return count


@contextlib.contextmanager
def input_rows(input_path: Path, max_row_bytes: int) -> Iterator[Iterator[ReadRow]]:
    """The input's rows, read by the one reader of JSON Lines a line at a time as they are consumed; a line of
    more than ``max_row_bytes`` is rejected by its size, unread."""
    try:
        input_path.open("rb").close()
    except OSError as exc:
        raise DataError(f"--input {str(input_path)!r}: cannot read it ({exc.strerror})") from None
    rows = _rows(input_path, max_row_bytes)
    try:
        yield rows
    finally:
        rows.close()  # closes the file


def _rows(input_path: Path, max_row_bytes: int) -> Generator[ReadRow, None, None]:
    try:
        yield from iter_json_lines(input_path, max_row_bytes, str(input_path), setting="inference.max_row_bytes")
    except OSError as exc:  # an OSError of the caller's work (a model that cannot load, say) is not the input's
        raise DataError(f"--input {str(input_path)!r}: cannot read it ({exc.strerror})") from None


def usable_rows(
    items: Iterable[PromptRow | RejectedRow], rejects: AtomicJsonl, tally: Tally, input_path: Path, progress: Progress
) -> Iterator[PromptRow]:
    """The prompt rows of ``items``; each rejected row goes to ``rejects`` and is counted (the first
    few logged) as it is read."""
    for item in items:
        if isinstance(item, PromptRow):
            if not tally.clashes_reported and any(key in OUTPUT_FIELDS for key in item.row):
                tally.clashes_reported = True
                clashes = sorted(key for key in item.row if key in OUTPUT_FIELDS)
                log.warning("generate: the input's %s column(s) are replaced by the generation's in the output "
                            "(from line %d on)", clashes, item.line)  # fmt: skip
            yield item
            continue
        rejects.write(item.to_dict())
        if tally.rejected < _LOGGED_REJECTS:
            log.warning("generate: %s line %d rejected, %s: %s; the line: %.200s", input_path, item.line,
                        item.reason, item.detail, item.value)  # fmt: skip
        tally.rejected_by_reason[item.reason] = tally.rejected_by_reason.get(item.reason, 0) + 1
        progress.advance(1)


def report_rejected(tally: Tally, rejects_path: Path) -> None:
    """The count of rejected lines by reason."""
    if tally.rejected:
        counts = ", ".join(f"{reason} {n} ({REASONS[reason]})" for reason, n in tally.rejected_by_reason.items())
        log.warning("generate: %d lines rejected (%s); every one is in %s", tally.rejected, counts, rejects_path)


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


def output_row(row: PromptRow, generation: Generation) -> dict[str, Any]:
    """An input row with the generation fields added; a tool-use row also gets the calls read from the
    generation (``tool_calls``, OpenAI's shape) and why a call block could not be read (``tool_call_errors``)."""
    out = {
        **row.row,
        "generation": generation.text,
        "finish_reason": generation.finish_reason,
        "error": generation.error,
        "num_prompt_tokens": generation.num_prompt_tokens,
        "num_generated_tokens": generation.num_generated_tokens,
    }
    if isinstance(row.prompt, ToolChat):
        blocks = tool_call_blocks(generation.text)
        out["tool_calls"] = [b.to_openai(arguments_as_text=True) for b in blocks if isinstance(b, ToolCall)]
        out["tool_call_errors"] = [b.detail for b in blocks if isinstance(b, ToolUseError)]
    return out
