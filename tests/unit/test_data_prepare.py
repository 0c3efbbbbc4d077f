"""prepare_data in-process on the tiny tokenizer: units follow the contract, the prompt is masked,
the cache is reused, rejected rows are reported, and the rejected-share threshold stops the run."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rayft.config import load_config
from rayft.config.schema import RayftConfig
from rayft.data.prepare import prepare_data
from rayft.data.prepared import IGNORE_INDEX, UNIT_COLUMNS, PreparedData
from rayft.errors import DataError


def _config(model_dir: Path, *overrides: str) -> RayftConfig:
    return load_config(None, [f"model.name={model_dir}", *overrides])


def _rows(prepared: PreparedData, split: str = "train") -> list[dict[str, object]]:
    files = prepared.train.files if split == "train" else prepared.validation.files  # type: ignore[union-attr]
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def test_builtin_arithmetic_units_follow_the_contract(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    cfg = _config(tiny_model_dir, "data.datasets=[{path: 'builtin:arithmetic', max_rows: 40}]")
    prepared = prepare_data(cfg.data, cfg.model, 7, report_dir=tmp_path / "report", use_ray=False)

    assert prepared.train.num_units == 38 and prepared.validation is not None
    assert prepared.validation.num_units == 2
    assert prepared.stats["formats"]["builtin:arithmetic"].startswith("prompt_completion (detected")
    units = _rows(prepared)
    assert set(units[0]) == set(UNIT_COLUMNS)
    ids = sorted(s for u in units + _rows(prepared, "validation") for s in u["sample_ids"])  # type: ignore[attr-defined]
    assert ids == list(range(40))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for unit in units:
        labels, input_ids = unit["labels"], unit["input_ids"]
        assert unit["position_ids"] == list(range(len(input_ids)))  # type: ignore[arg-type]
        assert unit["num_label_tokens"] == sum(1 for x in labels if x != IGNORE_INDEX)  # type: ignore[attr-defined]
        trained = tokenizer.decode([x for x in labels if x != IGNORE_INDEX])  # type: ignore[attr-defined]
        text = tokenizer.decode(input_ids)
        assert text.startswith("<|im_start|>user\n")
        # Exactly the assistant turn is trained: the answer with its end-of-turn token.
        assert text.endswith(trained) and trained.startswith(text.split("<|im_start|>assistant\n")[1][:10])
        assert "#### " in trained and "<|im_end|>" in trained and "user" not in trained
    assert (tmp_path / "report" / "rejected.jsonl").read_text() == ""
    assert json.loads((tmp_path / "report" / "stats.json").read_text())["key"] == prepared.key


def test_same_inputs_reuse_the_cache_and_other_inputs_do_not(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = _config(tiny_model_dir, "data.datasets=[{path: 'builtin:arithmetic', max_rows: 20}]")
    first = prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)
    manifest = Path(first.root) / "prepared.json"
    stamp = manifest.stat().st_mtime_ns
    again = prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)
    assert again == first and manifest.stat().st_mtime_ns == stamp
    longer = _config(tiny_model_dir, "data.datasets=[{path: 'builtin:arithmetic', max_rows: 20}]",
                     "data.max_seq_length=768")  # fmt: skip
    assert prepare_data(longer.data, longer.model, 0, report_dir=None, use_ray=False).key != first.key
    assert prepare_data(cfg.data, cfg.model, 1, report_dir=None, use_ray=False).key != first.key


def test_bad_rows_are_reported_and_the_threshold_stops(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "qa.jsonl"
    rows = [{"prompt": f"What is {i}+1?", "completion": str(i + 1)} for i in range(18)]
    rows += [{"prompt": "Empty answer", "completion": "  "}, {"prompt": "No answer", "completion": None}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = [f"data.datasets=[{{path: '{data}'}}]", "data.validation_fraction=0"]
    cfg = _config(tiny_model_dir, *base)
    with pytest.raises(DataError, match=r"2 of 20 rows \(10.0%\) were rejected.*empty_field: 1.*missing_field: 1"):
        prepare_data(cfg.data, cfg.model, 0, report_dir=tmp_path / "r1", use_ray=False)
    report = [json.loads(line) for line in (tmp_path / "r1" / "rejected.jsonl").read_text().splitlines()]
    assert sorted((r["row_id"], r["reason"]) for r in report) == [("qa.jsonl:18", "empty_field"),
                                                                  ("qa.jsonl:19", "missing_field")]  # fmt: skip
    lenient = _config(tiny_model_dir, *base, "data.max_rejected_fraction=0.2")
    prepared = prepare_data(lenient.data, lenient.model, 0, report_dir=tmp_path / "r2", use_ray=False)
    assert prepared.train.num_units == 18 and prepared.stats["rejected_total"] == 2


def test_packing_fills_sequences_and_keeps_every_example(tiny_model_dir: Path) -> None:
    rows = "data.datasets=[{path: 'builtin:arithmetic', max_rows: 60}]"
    plain = _config(tiny_model_dir, rows, "data.max_seq_length=1024")
    packed_cfg = _config(tiny_model_dir, rows, "data.max_seq_length=1024", "data.packing=true")
    unpacked = prepare_data(plain.data, plain.model, 0, report_dir=None, use_ray=False)
    packed = prepare_data(packed_cfg.data, packed_cfg.model, 0, report_dir=None, use_ray=False)

    assert packed.packed and packed.key != unpacked.key
    assert packed.train.num_examples == unpacked.train.num_examples == 57
    assert packed.train.num_tokens == unpacked.train.num_tokens
    assert packed.train.num_label_tokens == unpacked.train.num_label_tokens
    assert packed.train.num_units < unpacked.train.num_units / 2
    units = _rows(packed)
    assert all(u["num_tokens"] <= 1024 for u in units)  # type: ignore[operator]
    assert sorted(s for u in units for s in u["sample_ids"]) == sorted(  # type: ignore[attr-defined]
        s
        for u in _rows(unpacked)
        for s in u["sample_ids"]  # type: ignore[attr-defined]
    )
    assert packed.stats["padding_efficiency"] == packed.train.num_tokens / (packed.train.num_units * 1024)
    assert packed.stats["padding_efficiency"] > 0.8  # 57 examples of ~200 tokens in ~11 bins


def test_a_cache_hit_needs_neither_transformers_nor_torch(tiny_model_dir: Path) -> None:
    import os
    import subprocess
    import sys

    rows = "data.datasets=[{path: 'builtin:arithmetic', max_rows: 20}]"
    cfg = _config(tiny_model_dir, rows)
    built = prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)
    script = (
        "import sys\n"
        "from rayft.config import load_config\n"
        "from rayft.data.prepare import prepare\n"
        f"cfg = load_config(None, ['model.name={tiny_model_dir}', {rows!r}])\n"
        "out = prepare(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)\n"
        "print(out.reused, out.prepared.key, sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ, check=True)
    assert result.stdout.split() == ["True", built.key, "[]"]


def test_tokenization_blocks_give_each_cpu_a_few_long_tasks() -> None:
    from rayft.data.executors import BATCH_ROWS, block_rows

    assert block_rows(14946, 2) == 1869  # 8 tasks of ~1.9k rows on 2 CPUs
    assert block_rows(100, 2) == BATCH_ROWS  # tiny data: one small task, not 8 of 13 rows
    assert block_rows(1_000_000, 64) == 3907
    assert block_rows(10, 0) == BATCH_ROWS  # a cluster reporting no CPU yet


def test_many_rows_cut_to_the_length_limit_are_warned_about_with_counts_and_the_fix(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "completion": " word" * (40 if i < 6 else 2)}) + "\n"
                            for i in range(10)))  # fmt: skip
    cut = _config(tiny_model_dir, f"data.datasets=[{{path: '{rows}'}}]", "data.max_seq_length=24",
                  "data.validation_fraction=0")  # fmt: skip
    with caplog.at_level("WARNING", logger="rayft.data"):
        prepare_data(cut.data, cut.model, 0, report_dir=None, use_ray=False)
    warned = [r.getMessage() for r in caplog.records if "cut to it" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("data: 6 of 10 rows (60%) are longer than data.max_seq_length=24")
    assert "Raise data.max_seq_length" in warned[0] and "data.overlong=drop" in warned[0]
    caplog.clear()
    whole = _config(tiny_model_dir, f"data.datasets=[{{path: '{rows}'}}]", "data.max_seq_length=512",
                    "data.validation_fraction=0")  # fmt: skip
    with caplog.at_level("WARNING", logger="rayft.data"):
        prepare_data(whole.data, whole.model, 0, report_dir=None, use_ray=False)
    assert not [r for r in caplog.records if "cut to it" in r.getMessage()]
