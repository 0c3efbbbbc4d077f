"""`rayft data prepare`: prints the key, counts, rejections and token statistics; a second run
says it reused the cache; bad input ends with a one-line error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from rayft.cli.main import cli


def _config(tmp_path: Path, model_dir: Path, data_path: Path) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(
        f"name: prep\nstorage_path: {tmp_path / 'runs'}\nmodel:\n  name: {model_dir}\n"
        f"data:\n  datasets:\n    - path: {data_path}\n  max_rejected_fraction: 0.2\n  validation_fraction: 0\n"
    )
    return path


def test_prepare_prints_statistics_then_reuses_the_cache(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = [{"instruction": f"Add {i} and 1", "input": "", "output": f"{i + 1}"} for i in range(9)]
    rows.append({"instruction": "Broken", "input": "", "output": ""})
    data = tmp_path / "alpaca.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = _config(tmp_path, tiny_model_dir, data)
    runner = CliRunner()

    first = runner.invoke(cli, ["data", "prepare", str(config), "--in-process", "data.packing=true"])
    assert first.exit_code == 0, first.output
    key = re.search(r"Data ([0-9a-f]{24}): prepared in", first.output)
    assert key is not None
    assert "alpaca.jsonl: alpaca (detected from the columns" in first.output
    assert "10 read, 10 train, 0 validation" in first.output
    assert "rejected:   1\n    empty_field: 1" in first.output
    assert "units:      1 train (9 examples), 0 validation (packed)" in first.output
    assert re.search(r"lengths:    p50 \d+, p90 \d+, p99 \d+, max \d+", first.output)
    assert "truncated:  0 rows (0.0%)" in first.output and "padding efficiency: " in first.output
    report = tmp_path / "runs" / "prep" / "data" / "rejected.jsonl"
    assert json.loads(report.read_text())["row_id"] == "alpaca.jsonl:9"

    second = runner.invoke(cli, ["data", "prepare", str(config), "--in-process", "data.packing=true"])
    assert second.exit_code == 0, second.output
    assert f"Data {key.group(1)}: reused the cached dataset (no tokenization)" in second.output


def test_prepare_reports_a_bad_dataset_as_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "odd.jsonl"
    data.write_text(json.dumps({"a": 1, "b": 2}) + "\n")
    result = CliRunner().invoke(cli, ["data", "prepare", str(_config(tmp_path, tiny_model_dir, data)), "--in-process"])
    assert result.exit_code == 2
    assert "Error: cannot detect the dataset format from the columns ['a', 'b']" in result.output


def test_prepare_of_full_dpo_stores_the_reference_pass_that_training_reuses(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft.config import load_config
    from rayft.training.driver.startup import prepare_training_data

    rows = [
        {"prompt": f"Question: {i} + 1\nAnswer: ", "chosen": f"{i + 1}!", "rejected": f"{i + 1}?"} for i in range(6)
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = _config(tmp_path, tiny_model_dir, data)
    monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path / "cache"))
    dpo = ["train.objective=dpo", "train.method=full", "scaling.use_gpu=false"]

    result = CliRunner().invoke(cli, ["data", "prepare", str(config), "--in-process", *dpo])
    assert result.exit_code == 0, result.output
    manifests = list((tmp_path / "cache").rglob("reference-*/reference.json"))
    assert len(manifests) == 1 and json.loads(manifests[0].read_text())  # the pass ran and was committed
    before = manifests[0].stat().st_mtime_ns
    # A run of the same config finds the pairs and their reference log-probabilities in the cache.
    prepared = prepare_training_data(load_config(str(config), dpo), None, use_ray=False)
    assert all(f.startswith(str(manifests[0].parent)) for f in prepared.train.files)
    assert manifests[0].stat().st_mtime_ns == before
