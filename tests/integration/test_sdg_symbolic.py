"""`rayft sdg` end to end on Ray with the symbolic generator, and resume after a real kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rayft.cli.main import cli
from rayft.config import load_config
from rayft.sdg.mathcheck import check_math_answer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cli_writes_verified_rows_with_provenance(ray_session: None, tmp_path: Path) -> None:
    out = tmp_path / "sdg"
    result = CliRunner().invoke(
        cli,
        [
            "sdg",
            str(REPO / "configs" / "sdg.yaml"),
            "--seeds",
            "40",
            "--variations",
            "2",
            "--output-dir",
            str(out),
            "sdg.seeds_per_batch=10",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "dedup_near" in result.output and "Accepted" in result.output
    accepted, rejected = read_jsonl(out / "data.jsonl"), read_jsonl(out / "rejected.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert accepted and summary["rows"]["accepted"] == len(accepted)
    assert len({r["id"] for r in accepted + rejected}) == len(accepted) + len(rejected)
    for row in accepted:
        assert check_math_answer(row["answer"]) is None
        assert row["generator"] == "symbolic" and row["seed_id"] and row["config_hash"] == summary["config_hash"]
        assert row["question"] != row["seed_question"]
    for row in rejected:
        assert row["reject_stage"] and row["reject_reason"]
    # Every seed is accounted for: K rows per usable seed, one row per unusable seed.
    skipped = summary["seeds"]["skipped"]
    assert len(accepted) + len(rejected) == (40 - skipped) * 2 + skipped
    import pyarrow.parquet as pq

    assert pq.read_table(out / "data.parquet").num_rows == len(accepted)


def test_cli_writes_tool_use_traces_that_train_as_conversations(ray_session: None, tmp_path: Path) -> None:
    from rayft.config.data import DatasetConfig
    from rayft.data.formats import make_example, resolve_format

    out = tmp_path / "sdg"
    args = ["sdg", str(REPO / "configs" / "sdg.yaml"), "--seeds", "20", "--variations", "2", "--output-dir",
            str(out), "sdg.tool_use=true", "sdg.operand_scale=1000", "sdg.seeds_per_batch=10"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    accepted = read_jsonl(out / "data.jsonl")
    assert accepted
    ds = DatasetConfig(path=str(out / "data.jsonl"))
    fmt = resolve_format(ds, list(accepted[0]))
    assert fmt.format == "messages"  # format auto reads the traces, not question/answer
    for row in accepted:
        assert check_math_answer(row["answer"]) is None
        example = make_example(row, ds, fmt)  # a bad trace would raise its reject reason here
        assert example.chat is not None and example.chat[0]["content"] == row["question"]
        calls = [m for m in example.chat if m.get("tool_calls")]
        assert len(calls) == row["answer"].count("<<") and example.chat[-1]["content"] == row["answer"]
        assert [t["function"]["name"] for t in example.tools] == ["calculator"]
    import pyarrow.parquet as pq

    assert {"messages", "tools"} <= set(pq.read_table(out / "data.parquet").column_names)


def test_cli_test_mode_uses_two_seeds(ray_session: None, tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    args = ["sdg", str(REPO / "configs" / "sdg.yaml"), "--test-mode", "--output-dir", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"]["processed"] == 2 and summary["rows"]["requested"] == 6


def test_rerun_after_sigkill_finishes_without_duplicates(ray_session: None, tmp_path: Path) -> None:
    import ray

    out = tmp_path / "sdg"
    overrides = [
        f"sdg.output_dir={out}",
        "sdg.num_seeds=800",
        "sdg.variations=2",
        "sdg.seeds_per_batch=8",
        "sdg.dedup.near=false",
        f"scaling.address={ray.get_runtime_context().gcs_address}",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayft", "sdg", str(REPO / "configs" / "sdg.yaml"), *overrides],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list((out / "parts").glob("*.done.json"))) < 3:
            assert proc.poll() is None, "the run ended before it could be killed; give it more seeds"
            assert time.monotonic() < deadline, "no part was committed within 120 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    committed_before = len(list((out / "parts").glob("*.done.json")))
    assert not (out / "summary.json").exists(), "the run finished before the kill"

    from rayft.recipes.sdg import run

    result = run(load_config(REPO / "configs" / "sdg.yaml", overrides[:-1]))
    summary = result.summary
    assert summary["seeds"]["done_before_this_run"] >= committed_before * 8 > 0
    assert summary["seeds"]["processed"] == 800
    accepted, rejected = read_jsonl(result.data_jsonl), read_jsonl(result.rejected_jsonl)
    ids = [r["id"] for r in accepted + rejected]
    assert len(ids) == len(set(ids)), "a seed was generated twice"
    questions = [r["question"] for r in accepted]
    assert len(questions) == len(set(questions))
    skipped = summary["seeds"]["skipped"]
    assert len(ids) == (800 - skipped) * 2 + skipped
    assert all(check_math_answer(r["answer"]) is None for r in accepted)
