"""`rayft generate` streams, in this process with the tiny model: windows of prompts sent longest
first, the output in input order with the rejects listed, written to a temporary file and renamed
only when complete, and the driver's memory bounded by a window whatever the number of prompts."""

from __future__ import annotations

import codecs
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from rayft.config import load_config
from rayft.config.model import ModelConfig
from rayft.generation import factory
from rayft.generation.backend import Generation, Prompt, SamplingParams
from rayft.generation.hf import HFBackend
from rayft.generation.pool import in_input_order, window_batches
from rayft.inference.prompts import PromptRow, RejectedRow, iter_prompts
from rayft.recipes.generate import run
from tests.support.generation import json_lines

CHAT = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog"}]
LINES = [
    '{"id": 0, "prompt": "1 2"}',
    '{"id": 1, "prompt": "A baker has 12 apples and buys 7 more"}',
    "{broken",
    '{"id": 3, "messages": ' + json.dumps(CHAT) + "}",
    '{"id": 4, "prompt": "SELECT name"}',
    '{"id": 5, "prompt": ""}',
    '{"id": 6, "prompt": "0 1 2 3 4 5 6 7 8 9"}',
    '{"id": 7, "prompt": "x"}',
    '{"id": 8, "prompt": 3}',
    '{"id": 9, "prompt": "The quick brown fox"}',
]
GOOD = [0, 1, 3, 4, 6, 7, 9]


def _config(window: int, batch_size: int = 2) -> Any:
    return load_config(None, ["inference.temperature=0", "inference.max_new_tokens=3",
                              f"inference.batch_size={batch_size}", f"inference.window={window}"])  # fmt: skip


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_byte_order_mark_opening_the_file_is_skipped() -> None:
    items = list(
        iter_prompts(json_lines([codecs.BOM_UTF8 + b'{"prompt": "a"}\n', codecs.BOM_UTF8 + b'{"prompt": "b"}\n']))
    )
    assert isinstance(items[0], PromptRow) and items[0].prompt == "a"
    assert isinstance(items[1], RejectedRow) and items[1].reason == "bad_json"  # only the file's first bytes are a mark


def test_windows_send_text_then_chat_prompts_longest_first() -> None:
    prompts: list[Prompt] = ["ab", [{"role": "user", "content": "long chat turn"}], "abcd", "a", "abcd"]
    assert window_batches(prompts, 2) == [[2, 4], [0, 3], [1]]


def test_results_come_back_in_input_order_across_windows() -> None:
    class Echo:
        """A pool that records the batches it is given and answers each prompt with itself."""

        def __init__(self) -> None:
            self.batches: list[list[Prompt]] = []

        def map(self, batches: Any) -> Any:
            for tag, prompts in batches:
                self.batches.append(prompts)
                yield tag, [Generation(str(p)) for p in prompts]

    pool = Echo()
    items = ["a", "bbb", "cc", "dddd", "e", "ff", "g"]
    windows = list(in_input_order(items, lambda p: p, pool, batch_size=2, window=3))
    assert [[(item, g.text) for item, g in window] for window in windows] == [
        [("a", "a"), ("bbb", "bbb"), ("cc", "cc")],
        [("dddd", "dddd"), ("e", "e"), ("ff", "ff")],
        [("g", "g")],
    ]
    assert pool.batches == [["bbb", "cc"], ["a"], ["dddd", "ff"], ["e"], ["g"]]  # longest first within a window


def test_output_is_in_input_order_across_windows_with_rejects_listed(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "prompts.jsonl"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    result = run(_config(window=3), str(tiny_model_dir), source, out, runtime="local")
    rows = _read(out)
    assert [r["id"] for r in rows] == GOOD
    backend = HFBackend(ModelConfig(name=str(tiny_model_dir)), device="cpu")
    prompts = [json.loads(LINES[i]).get("prompt") or CHAT for i in GOOD]
    expected = backend.generate(prompts, SamplingParams(max_new_tokens=3, temperature=0.0))
    assert [r["generation"] for r in rows] == [g.text for g in expected]
    assert [r["num_prompt_tokens"] for r in rows] == [g.num_prompt_tokens for g in expected]
    assert [(r["line"], r["reason"]) for r in _read(tmp_path / "out.rejects.jsonl")] == [
        (3, "bad_json"), (6, "empty_field"), (9, "wrong_type")]  # fmt: skip
    assert (result.num_lines, result.num_written, result.num_rejected, result.num_failed) == (10, 7, 3, 0)
    assert result.rejected_by_reason == {"bad_json": 1, "empty_field": 1, "wrong_type": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "out.rejects.jsonl", "prompts.jsonl"]


def test_the_output_appears_only_complete(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "prompts.jsonl"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    out.write_text('{"old": true}\n')
    seen: list[tuple[list[Any], list[str]]] = []  # at each batch: the output file's rows, the temporary file's ids
    built: list[str] = []

    def watched(cfg: Any) -> HFBackend:
        built.append(cfg.model.name)
        backend = HFBackend(cfg.model, device="cpu", batch_size=cfg.batch_size)
        generate = backend.generate

        def generate_and_look(prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
            temps = list(tmp_path.glob(".out.jsonl.tmp-*"))
            seen.append((_read(out), [r["id"] for temp in temps for r in _read(temp)]))
            return generate(prompts, params)

        backend.generate = generate_and_look  # type: ignore[method-assign]
        return backend

    monkeypatch.setitem(factory.BACKENDS, "hf", watched)
    run(_config(window=3), str(tiny_model_dir), source, out, runtime="local")
    assert all(before == [{"old": True}] for before, _ in seen)  # the old output stays whole until the end
    # Finished windows are appended to the temporary file while later ones generate.
    assert [ids for _, ids in seen] == [[], [], [0, 1, 3], [0, 1, 3], [0, 1, 3, 4, 6, 7]]
    assert [r["id"] for r in _read(out)] == GOOD
    assert not list(tmp_path.glob(".*tmp-*"))
    assert len(built) == 1  # one model load serves every window


def _traced_peak(tiny_model_dir: Path, tmp_path: Path, prompts: int) -> int:
    source = tmp_path / f"in-{prompts}.jsonl"
    payload = "p" * 4000  # a wide column carried to the output: what a driver holding rows would hold
    with source.open("w", encoding="utf-8") as handle:
        for i in range(prompts):
            handle.write(json.dumps({"id": i, "prompt": f"{i} + {i % 7} =", "payload": payload}) + "\n")
    cfg = load_config(None, ["inference.temperature=0", "inference.max_new_tokens=1", "inference.batch_size=25",
                             "inference.window=50"])  # fmt: skip
    tracemalloc.start()
    try:
        run(cfg, str(tiny_model_dir), source, tmp_path / f"out-{prompts}.jsonl", runtime="local")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_driver_memory_does_not_grow_with_the_prompts(tiny_model_dir: Path, tmp_path: Path) -> None:
    small, large = 200, 800
    _traced_peak(tiny_model_dir, tmp_path, small)  # first model load: its one-off caches are not the rows'
    growth = _traced_peak(tiny_model_dir, tmp_path, large) - _traced_peak(tiny_model_dir, tmp_path, small)
    # Holding every row (a window as large as the input) grows the peak by about 3 MB here; windows of 50 by
    # under 100 KB (a window of these rows is 200 KB, whatever the number of windows).
    assert growth < 400 * 1024, f"peak grew by {growth} bytes from {small} to {large} prompts"
