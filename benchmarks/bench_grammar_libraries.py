"""The grammar libraries that could enforce ``response_format`` in `rayft serve`, side by side on CPU.

For each library installed (llguidance, xgrammar, outlines-core) and each tokenizer (the tiny test
model's 512-token BPE, SmolLM2-135M-Instruct's 49152 tokens from the built-in GGUF): the one-off cost of
preparing the tokenizer, the compile time of each JSON schema, and the cost per generated token of
computing the allowed-token mask and advancing the matcher by the token, walked along a valid
instance's tokens (the work a serving step does per constrained row). This is how `rayft serve` chose
its library (``docs/performance.md``, "Structured outputs"); a library that is not installed is skipped.

    .venv/bin/python benchmarks/bench_grammar_libraries.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
             "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {
            "type": "array", "items": {"type": "string"}, "maxItems": 4}}, "required": ["id", "tags"]},
        "ok": {"type": "boolean"}, "kind": {"enum": ["a", "b", "c"]}}, "required": ["user", "ok", "kind"]},
    "tool_call": {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["city", "unit"]}}, "required": ["name", "arguments"]},
}  # fmt: skip
INSTANCES = {
    "flat": {"name": "Ada Lovelace", "age": 36},
    "nested": {"user": {"id": 7, "tags": ["x", "yz"]}, "ok": True, "kind": "b"},
    "tool_call": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c", "days": 3}},
}


def tokenizers() -> dict[str, Any]:
    """The tiny test tokenizer (built here) and SmolLM2-135M-Instruct's (read from the built-in GGUF)."""
    from transformers import AutoTokenizer

    from rayft.config import ModelConfig
    from rayft.models.loading import load_tokenizer
    from rayft.testing import build_tiny_tokenizer

    tiny = AutoTokenizer.from_pretrained(build_tiny_tokenizer(Path(tempfile.mkdtemp()) / "tok"))
    return {"tiny (512)": tiny, "smollm2 (49152)": load_tokenizer(ModelConfig(name="smollm2-135m-instruct"))}


def _llguidance(tokenizer: Any) -> tuple[Callable[[dict[str, Any]], Any], Callable[[Any, list[int]], None]]:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    info = llguidance.hf.from_tokenizer(tokenizer)
    mask = llguidance.torch.allocate_token_bitmask(1, info.vocab_size)

    def compile_(schema: dict[str, Any]) -> Any:  # llguidance compiles the grammar as it builds the matcher
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        return llguidance.LLMatcher(info, grammar)

    def walk(matcher: Any, ids: list[int]) -> None:
        for token in ids:
            llguidance.torch.fill_next_token_bitmask(matcher, mask, 0)
            assert matcher.consume_token(token), matcher.get_error()

    return compile_, walk


def _xgrammar(tokenizer: Any) -> tuple[Callable[[dict[str, Any]], Any], Callable[[Any, list[int]], None]]:
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    mask = xgrammar.allocate_token_bitmask(1, info.vocab_size)

    def compile_(schema: dict[str, Any]) -> Any:
        return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))

    def walk(grammar: Any, ids: list[int]) -> None:
        matcher = xgrammar.GrammarMatcher(grammar)
        for token in ids:
            matcher.fill_next_token_bitmask(mask)
            assert matcher.accept_token(token)

    return compile_, walk


def _outlines(tokenizer: Any) -> tuple[Callable[[dict[str, Any]], Any], Callable[[Any, list[int]], None]]:
    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema
    from outlines_core.kernels.torch import allocate_token_bitmask, fill_next_token_bitmask

    vocab: dict[bytes, list[int]] = {}
    eos = tokenizer.eos_token_id
    for token, index in tokenizer.get_vocab().items():
        if index != eos and token not in tokenizer.all_special_tokens:
            vocab.setdefault(tokenizer.convert_tokens_to_string([token]).encode(), []).append(index)
    vocabulary = outlines_core.Vocabulary(eos, vocab)

    def compile_(schema: dict[str, Any]) -> Any:
        return outlines_core.Index(build_regex_from_schema(json.dumps(schema)), vocabulary)

    mask = allocate_token_bitmask(len(tokenizer))

    def walk(index: Any, ids: list[int]) -> None:
        guide = outlines_core.Guide(index)
        for token in ids:
            fill_next_token_bitmask(guide, mask)
            guide.advance(token)

    return compile_, walk


LIBRARIES = {"llguidance": _llguidance, "xgrammar": _xgrammar, "outlines-core": _outlines}


def measure(name: str, tokenizer: Any, repeats: int) -> dict[str, float] | None:
    """Tokenizer set-up (s), mean schema compile (ms) and mean mask + advance per token (µs); None: not installed."""
    started = time.perf_counter()
    try:
        compile_, walk = LIBRARIES[name](tokenizer)
    except ImportError:
        return None
    setup_s = time.perf_counter() - started
    compiles, per_token = [], []
    for schema_name, schema in SCHEMAS.items():
        ids = tokenizer(json.dumps(INSTANCES[schema_name], separators=(",", ":")), add_special_tokens=False)[
            "input_ids"
        ]
        for _ in range(repeats):
            started = time.perf_counter()
            grammar = compile_(schema)
            compiles.append(time.perf_counter() - started)
            started = time.perf_counter()
            walk(grammar, ids)
            per_token.append((time.perf_counter() - started) / len(ids))
    return {"setup_s": setup_s, "compile_ms": 1e3 * statistics.median(compiles),
            "token_us": 1e6 * statistics.median(per_token)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'tokenizer':<17} {'library':<14} {'tokenizer set-up s':>18} {'compile ms':>11} {'µs/token':>9}")
    for label, tokenizer in tokenizers().items():
        for name in LIBRARIES:
            figures = measure(name, tokenizer, args.repeats)
            if figures is None:
                print(f"{label:<17} {name:<14} (not installed)")
                continue
            print(f"{label:<17} {name:<14} {figures['setup_s']:>18.2f} {figures['compile_ms']:>11.1f} "
                  f"{figures['token_us']:>9.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
