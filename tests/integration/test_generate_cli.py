"""`rayft generate` on the shared local Ray: a tiny model, good and bad rows, order and columns kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rayft.config.model import ModelConfig
from rayft.generation.backend import SamplingParams
from rayft.generation.hf import HFBackend

pytestmark = pytest.mark.integration

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 + 7?"}]
ROWS = [
    '{"id": "a", "prompt": "Question: 3 + 4 =", "tag": [1]}',
    '{"id": "b", "messages": ' + json.dumps(CHAT) + "}",
    '{"id": "c", "text": "no prompt column"}',
    "{not json",
    '{"id": "e", "prompt": "The quick brown fox"}',
    '{"id": "f", "prompt": 7}',
    '{"id": "g", "messages": [{"role": "user", "content": "hello"}], "score": 0.5}',
]


def test_generate_writes_every_good_row_in_order_and_lists_the_bad_ones(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from rayft.cli.main import cli

    source = tmp_path / "prompts.jsonl"
    source.write_text("\n".join(ROWS) + "\n", encoding="utf-8")
    out = tmp_path / "out" / "gen.jsonl"
    args = ["generate", str(tiny_model_dir), "--input", str(source), "--output", str(out), "--temperature", "0",
            "--max-new-tokens", "4", "--batch-size", "2"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert f"generate: 4 of 7 rows written to {out}; 3 rejected (listed in {out.parent / 'gen.rejects.jsonl'})" in (
        result.output
    )
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in rows] == ["a", "b", "e", "g"]
    assert (rows[0]["tag"], rows[3]["score"], rows[1]["messages"]) == ([1], 0.5, CHAT)
    # Greedy generations equal the backend's own, in-process, for the same prompts (chat ones through the template).
    backend = HFBackend(ModelConfig(name=str(tiny_model_dir)), device="cpu")
    prompts = ["Question: 3 + 4 =", CHAT, "The quick brown fox", [{"role": "user", "content": "hello"}]]
    expected = backend.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0))
    assert [r["generation"] for r in rows] == [g.text for g in expected]
    assert all(r["error"] is None and 0 < r["num_generated_tokens"] <= 4 for r in rows)
    rejects = [json.loads(line) for line in (out.parent / "gen.rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [(3, "missing_field"), (4, "bad_json"), (6, "wrong_type")]
    assert rejects[1]["value"] == "{not json"
    assert sorted(p.name for p in out.parent.iterdir()) == ["gen.jsonl", "gen.rejects.jsonl"]


def test_generate_streams_windows_through_two_actors_in_input_order(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from rayft.cli.main import cli

    source = tmp_path / "prompts.jsonl"
    source.write_text("\n".join(ROWS) + "\n", encoding="utf-8")
    out = tmp_path / "gen.jsonl"
    args = ["generate", str(tiny_model_dir), "inference.window=3", "--input", str(source), "--output", str(out),
            "--temperature", "0", "--max-new-tokens", "4", "--batch-size", "1", "--num-workers", "2"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in rows] == ["a", "b", "e", "g"]
    backend = HFBackend(ModelConfig(name=str(tiny_model_dir)), device="cpu")
    prompts = ["Question: 3 + 4 =", CHAT, "The quick brown fox", [{"role": "user", "content": "hello"}]]
    expected = backend.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0))
    assert [r["generation"] for r in rows] == [g.text for g in expected]
    rejects = [json.loads(line) for line in (tmp_path / "gen.rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [(3, "missing_field"), (4, "bad_json"), (6, "wrong_type")]
