"""A model's GGUF files run in llama.cpp against the Hugging Face model they were written from, on an
evaluation set, with rayft's paired tests: for each file the accuracy difference (GGUF - HF) with
its interval, McNemar's p, TOST equivalence at the given margins, the right-to-wrong and
wrong-to-right flips, identical completions, file size and tokens/s.

Inputs: an export directory written by ``rayft export --format gguf`` (``rayft run`` with
``export.format: gguf`` writes one to <run>/export): the merged Hugging Face model and its
``*-f16.gguf``, ``*-q8_0.gguf``, ``*-q4_0.gguf``. Without one, the built-in SmolLM2-135M-Instruct is
written as GGUF into a temporary directory and measured (what ``benchmarks/run_all.py`` runs). The
examples, prompts, stop sequences and scoring are those of the config's eval section (``rayft
eval``'s own code); both sides decode greedily. The
Hugging Face side runs as ``rayft eval`` does on the local runtime (batches of ``eval.batch_size``);
llama.cpp (llama-cpp-python, ``make setup-llama``) runs one prompt at a time on ``--threads``
threads, as ``llama-cli`` would. Needs the compiled binding.

    .venv/bin/python benchmarks/bench_gguf.py [RUN/export] [--config configs/quickstart.yaml]
        [--max-samples 80] [--margins 0.02,0.05] [--threads 2] [--metric accuracy_strict]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from rayft.config import load_config
from rayft.config.schema import RayftConfig
from rayft.data.tokenize import render_chat
from rayft.evaluation.runner import Example, generate, generation_config, load_examples
from rayft.evaluation.stats import PairedTest, paired_test
from rayft.evaluation.tasks import Task, build_task
from rayft.generation.backend import Generation, Prompt, SamplingParams, truncate_at_stop
from rayft.generation.factory import sampling_params
from rayft.models.sources import resolve_source

REPO = Path(__file__).resolve().parents[1]
TYPES = ("f16", "q8_0", "q4_0")


def llama_generate(path: Path, texts: Sequence[str], params: SamplingParams, threads: int) -> list[Generation]:
    """Greedy completions of the rendered prompts ``texts`` by llama.cpp from the GGUF file ``path``:
    the prompt tokenized by llama.cpp (special tokens parsed, as the chat template wrote them), decoding
    until an end-of-generation token, a stop sequence or ``params.max_new_tokens``."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=2048, n_threads=threads, seed=0, verbose=False)
    out: list[Generation] = []
    with contextlib.closing(llm):
        for text in texts:
            ids = llm.tokenize(text.encode(), add_bos=True, special=True)
            result: Any = llm.create_completion(
                ids, max_tokens=params.max_new_tokens, temperature=0.0, repeat_penalty=1.0, stop=list(params.stop)
            )
            choice, usage = result["choices"][0], result["usage"]
            reply, _ = truncate_at_stop(choice["text"], params.stop)
            reason = "length" if choice["finish_reason"] == "length" else "stop"
            out.append(Generation(reply, len(ids), int(usage["completion_tokens"]), reason))
    return out


def render(tokenizer: Any, prompt: Prompt) -> str:
    """The prompt text the Hugging Face backend feeds its model (chat template, training's rendering)."""
    if isinstance(prompt, str):
        return prompt
    return render_chat(tokenizer.get_chat_template(), tokenizer.special_tokens_map, prompt, generation_prompt=True)


def scored(task: Task, examples: Sequence[Example], generations: Sequence[Generation]) -> list[float]:
    """The task's primary metric for each example (1.0 right, 0.0 wrong for gsm8k's strict match)."""
    rows = task.score_all([g.text for g in generations], [e.reference for e in examples], [e.table for e in examples])
    return [row.scores[task.primary] for row in rows]


def describe(test: PairedTest) -> str:
    tost = ", ".join(f"TOST@{e.margin:g} p={e.p_value:.3f} {'equivalent' if e.equivalent else 'not shown'}"
                     for e in test.equivalence)  # fmt: skip
    flips = test.flips
    return (
        f"diff {test.difference:+.4f} [{test.diff_ci_low:+.4f}, {test.diff_ci_high:+.4f}], "
        f"McNemar p={test.p_value:.3f}; "
        f"{tost}; flips right->wrong {flips['right_to_wrong']}, wrong->right {flips['wrong_to_right']}"
    )


def run_hf(cfg: RayftConfig, export: Path, task: Task, examples: Sequence[Example]) -> tuple[list[Generation], float]:
    """The Hugging Face model's completions as ``rayft eval`` makes them (local runtime), and the seconds."""
    source = resolve_source(str(export), cfg.model)
    gen_cfg = generation_config(cfg.eval, source, task)
    start = time.perf_counter()
    generations = generate([e.prompt for e in examples], gen_cfg, "local", what="hf")
    return generations, time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path, nargs="?", help="an export directory with the model and its GGUF files")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "quickstart.yaml")
    parser.add_argument("--max-samples", type=int, default=0, help="examples scored (0: the eval section's)")
    parser.add_argument("--margins", default="0.02,0.05", help="TOST equivalence margins, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--metric", default=None, help="the binary metric compared (default: the task's primary)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.export is None:
            args.export = builtin_export(Path(tmp))
        measure(args)


def builtin_export(tmp: Path) -> Path:
    """The built-in SmolLM2-135M-Instruct and its GGUF files in ``tmp``, as ``rayft export`` writes them."""
    import shutil

    from rayft.export.gguf_file import GGUF_TYPES, write_gguf_exports
    from rayft.models.loading import ensure_builtin_model

    export = Path(shutil.copytree(ensure_builtin_model("smollm2-135m-instruct"), tmp / "smollm2"))
    write_gguf_exports(export, "smollm2", list(GGUF_TYPES))
    return export


def measure(args: argparse.Namespace) -> None:
    """Run the Hugging Face model and each GGUF file on the eval section's examples; print the comparison."""
    overrides = ["eval.runtime=local"] + ([f"eval.max_samples={args.max_samples}"] if args.max_samples else [])
    cfg = load_config(args.config, overrides)
    task = build_task(cfg.eval)
    task = replace(task, primary=args.metric or task.primary)
    examples = load_examples(cfg.eval, task).items
    margins = [float(m) for m in args.margins.split(",") if m]
    tokenizer = AutoTokenizer.from_pretrained(args.export)
    hf, hf_s = run_hf(cfg, args.export, task, examples)
    reference = scored(task, examples, hf)
    hf_tokens = sum(g.num_generated_tokens for g in hf)
    weights = sum(p.stat().st_size for p in args.export.glob("*.safetensors"))
    print(f"{len(examples)} examples of {args.config.name}'s eval ({task.primary}), greedy, "
          f"max {cfg.eval.generation.max_new_tokens} new tokens")  # fmt: skip
    print(f"hf ({cfg.eval.batch_size} per batch): {task.primary} {sum(reference) / len(reference):.4f}, "
          f"{weights / 2**20:.1f} MiB safetensors, {hf_tokens / hf_s:.1f} tokens/s ({hf_s:.0f} s)")  # fmt: skip
    texts = [render(tokenizer, e.prompt) for e in examples]
    params = sampling_params(generation_config(cfg.eval, resolve_source(str(args.export), cfg.model), task))
    for gguf_type in TYPES:
        path = next(iter(sorted(args.export.glob(f"*-{gguf_type}.gguf"))), None)
        if path is None:
            print(f"{gguf_type}: no *-{gguf_type}.gguf in {args.export}")
            continue
        start = time.perf_counter()
        ours = llama_generate(path, texts, params, args.threads)
        elapsed = time.perf_counter() - start
        values = scored(task, examples, ours)
        same = sum(a.text == b.text for a, b in zip(hf, ours, strict=True))
        tokens = sum(g.num_generated_tokens for g in ours)
        test = paired_test("binary", reference, values, margins=margins)
        print(f"{gguf_type}: {task.primary} {sum(values) / len(values):.4f}, {path.stat().st_size / 2**20:.1f} MiB, "
              f"{tokens / elapsed:.1f} tokens/s ({elapsed:.0f} s), {same}/{len(examples)} completions identical to hf; "
              f"{describe(test)}")  # fmt: skip


if __name__ == "__main__":
    main()
