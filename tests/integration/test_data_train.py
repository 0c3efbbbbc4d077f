"""`rayft train` end to end on the tiny model with 2 workers: data of two formats prepared by Ray Data,
packed, then trained, and the same units written by the in-process path; the splits of both paths agree
whatever their windows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_a_tokenization_block_ships_only_its_own_rows(ray_session: None) -> None:
    import pyarrow as pa
    import ray
    import ray.data  # registers Ray's Arrow serializers, as tokenize_on_ray does

    table = pa.table({"sample_id": list(range(1000)), "row": ["x" * 100] * 1000})
    context = ray._private.worker.global_worker.get_serialization_context()
    block = context.serialize(table.slice(100, 10)).total_bytes
    assert block < context.serialize(table).total_bytes / 20


def test_rayft_train_cli_prepares_two_mixed_formats_on_ray_packs_and_trains(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from rayft.cli.main import cli
    from rayft.config import load_config
    from rayft.data.builtin.arithmetic import iter_arithmetic_problems
    from rayft.data.prepare import prepare_data

    problems = list(iter_arithmetic_problems(80, seed=5))
    chats = tmp_path / "chats.jsonl"
    turns = [[{"from": "human", "value": p["question"]}, {"from": "gpt", "value": p["answer"]}] for p in problems[:40]]
    chats.write_text("".join(json.dumps({"conversations": t}) + "\n" for t in turns))
    alpaca = tmp_path / "alpaca.jsonl"
    alpaca.write_text("".join(
        json.dumps({"instruction": "Solve the problem.", "input": p["question"], "output": p["answer"]}) + "\n"
        for p in problems[40:]
    ))  # fmt: skip
    config = tmp_path / "cfg.yaml"
    config.write_text(
        f"name: packed\nstorage_path: {tmp_path / 'runs'}\nmodel:\n  name: {tiny_model_dir}\n"
        f"data:\n  datasets:\n    - path: {chats}\n      weight: 1\n    - path: {alpaca}\n      weight: 1\n"
        "  packing: true\n  max_seq_length: 512\n  validation_fraction: 0.1\n"
        "scaling:\n  num_workers: 2\ntrain:\n  max_steps: 3\n  micro_batch_size: 2\n  eval_steps: 3\n"
        "  save_steps: 3\n  learning_rate: 0.003\nlora:\n  r: 4\nlogging:\n  tensorboard: false\n"
    )
    result = CliRunner().invoke(cli, ["train", str(config)])
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "runs" / "packed"
    stats = json.loads((run_dir / "data" / "stats.json").read_text())
    assert stats["formats"] == {
        "chats.jsonl": "messages (detected from the columns: messages=conversations)",
        "alpaca.jsonl": "alpaca (detected from the columns: input=input, instruction=instruction, output=output)",
    }
    assert stats["rows"] == {"train": 72, "validation": 8} and stats["padding_efficiency"] > 0.7
    assert stats["rejected_total"] == 0 and (run_dir / "data" / "rejected.jsonl").read_text() == ""
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "train/loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3] and all(m["train/loss"] > 0 for m in steps)
    assert any("eval/loss" in m for m in metrics)
    efficiency = [m["train/padding_efficiency"] for m in metrics if "train/padding_efficiency" in m]
    assert efficiency and efficiency[-1] > 0.7
    # The in-process path, into a fresh cache, writes exactly the units the Ray Data job wrote.
    cfg = load_config(config)
    monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path / "other-cache"))
    local = prepare_data(cfg.data, cfg.model, cfg.seed, report_dir=None, use_ray=False)
    assert local.key == stats["key"] and local.validation is not None
    ray_root = Path(stats["root"])
    for split in (local.train, local.validation):
        for file in split.files:
            assert pq.read_table(file).equals(pq.read_table(ray_root / Path(file).relative_to(local.root))), file


def test_splits_are_the_same_in_one_process_and_on_two_ray_workers(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayft.config import load_config
    from rayft.data import windows
    from rayft.data.prepare import prepare_data

    datasets = ("data.datasets=[{path: 'builtin:arithmetic', max_rows: 40}, "
                "{path: 'builtin:sql', max_rows: 12, weight: 2.0}]")  # fmt: skip

    def units(packing: bool, window: int, cache: str, *, use_ray: bool) -> list[pa.Table]:
        cfg = load_config(None, [f"model.name={tiny_model_dir}", "data.validation_fraction=0.2", datasets,
                                 f"data.packing={str(packing).lower()}"])  # fmt: skip
        monkeypatch.setattr(windows, "WINDOW_MIN", window)
        monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path / cache))
        prepared = prepare_data(cfg.data, cfg.model, 3, report_dir=None, use_ray=use_ray)
        assert prepared.validation is not None
        return [pq.read_table(f) for split in (prepared.train, prepared.validation) for f in split.files]

    # Windows of 7 examples: many small tasks over both Ray workers; in-process, batches of 5 rows.
    on_ray = units(True, 7, "ray-packed", use_ray=True)
    monkeypatch.setattr(windows, "BATCH_ROWS", 5)
    assert len(on_ray) == 8 and units(True, 7, "local-packed", use_ray=False) == on_ray
    # Without packing, the windows do not shape the units either: any window size, the same rows.
    whole = pa.concat_tables(units(False, 4096, "local-whole", use_ray=False))
    assert pa.concat_tables(units(False, 7, "ray-windows", use_ray=True)).equals(whole)


def test_a_row_refused_in_a_ray_data_task_stops_preparation_with_the_same_error_as_in_process(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft.config import load_config
    from rayft.data import windows
    from rayft.data.prepare import prepare_data
    from rayft.errors import DataError

    rows = "data.datasets=[{path: 'builtin:arithmetic', max_rows: 40}]"
    cfg = load_config(None, [f"model.name={tiny_model_dir}", rows, "data.overlong=error", "data.max_seq_length=16"])
    monkeypatch.setattr(windows, "WINDOW_MIN", 7)  # several windows: a Ray Data job
    errors = []
    for use_ray in (True, False):
        monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path / f"ray-{use_ray}"))
        with pytest.raises(DataError) as failed:
            prepare_data(cfg.data, cfg.model, 3, report_dir=None, use_ray=use_ray)
        errors.append(str(failed.value))
    assert errors[0] == errors[1] and "tokens > max_seq_length 16" in errors[0], errors
