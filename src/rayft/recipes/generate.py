"""``rayft generate SOURCE --input prompts.jsonl --output out.jsonl``: batch inference, streamed.

Reads top to bottom: check the paths, then generate (:func:`rayft.inference.batch.generate_file`:
read the input a line at a time, sorting lines into prompts and rejected rows; with the first
window of prompts in hand, resolve the model source as ``rayft eval`` does and start one pool of
generation actors with the backend of ``inference.backend``; append every usable row, in input
order, with the generation columns added, as its window finishes), then report what was rejected
or failed. Memory holds one window and counters, never the whole file; a crash leaves the previous
output (or none), never half of one.

Public entry point: :func:`run` (also ``rayft.api.generate``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rayft.config import RayftConfig
from rayft.generation.pool import Runtime
from rayft.inference.batch import check_some_generated, generate_file, plan_paths, report_outcome


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


def run(
    cfg: RayftConfig,
    source: str,
    input_path: Path,
    output_path: Path,
    *,
    prompt_field: str | None = None,
    rejects_path: Path | None = None,
    runtime: Runtime = "ray",
) -> GenerateResult:
    """Generate a completion for every usable row of ``input_path`` with ``source``, into ``output_path``
    (on Ray actors, or with ``runtime='local'`` in this process)."""
    started = time.monotonic()
    paths = plan_paths(input_path, output_path, rejects_path)
    tally, model = generate_file(cfg, source, paths, prompt_field=prompt_field, runtime=runtime)
    report_outcome(tally, paths.rejects)
    check_some_generated(tally, paths.output, cfg.inference.backend)
    return GenerateResult(
        output_path=paths.output, rejects_path=paths.rejects, model=model, num_lines=tally.written + tally.rejected,
        num_written=tally.written, num_rejected=tally.rejected, num_failed=tally.failed,
        generated_tokens=tally.generated_tokens, elapsed_s=round(time.monotonic() - started, 3),
        rejected_by_reason=dict(tally.rejected_by_reason),
    )  # fmt: skip
