"""Preparing preference pairs (in-process; the Ray Data path is the integration tier's): pair units,
bad rows reported with file, line and reason, cache keys that separate pairs from SFT examples, a
format that does not fit the objective refused, and full-fine-tuning DPO's stored reference
log-probabilities (computed once, equal to the base model's, reused)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayft.config import load_config
from rayft.data.formats import detect_format
from rayft.data.preference import pair_preparation
from rayft.data.prepare import prepare
from rayft.errors import DataError


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def pairs(count: int) -> list[dict[str, Any]]:
    return [{"prompt": f"What is {i} + 1?", "chosen": f"{i + 1}", "rejected": f"{i + 2}"} for i in range(count)]


def run_prepare(model: Path, data: Path, tmp_path: Path, *overrides: str, objective: str = "dpo") -> Any:
    cfg = load_config(None, [f"model.name={model}", f"data.datasets=[{{path: {data}}}]", f"train.objective={objective}",
                             "data.validation_fraction=0", f"data.cache_dir={tmp_path / 'cache'}",
                             "data.max_rejected_fraction=0.5", *overrides])  # fmt: skip
    settings = pair_preparation(cfg.train.preference_objective, cfg.train.preference.max_prompt_length)
    return prepare(cfg.data, cfg.model, cfg.seed, report_dir=tmp_path / "report", use_ray=False, pairs=settings)


def test_pairs_become_units_and_bad_rows_are_reported_with_file_line_and_reason(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    bad = [{"prompt": "p", "chosen": "same", "rejected": "same"}, {"prompt": "p", "chosen": "", "rejected": "b"},
           {"prompt": "p", "chosen": "a"}]  # fmt: skip
    data = write_rows(tmp_path / "pairs.jsonl", [*pairs(10), *bad])
    prepared = run_prepare(tiny_model_dir, data, tmp_path).prepared
    assert prepared.pairs and prepared.train.num_units == 10
    units = [u for f in prepared.train.files for u in pq.read_table(f).to_pylist()]
    for unit in units:
        chosen, rejected = unit["chosen_labels"], unit["rejected_labels"]
        prompt = next(i for i, label in enumerate(chosen) if label != -100)
        assert unit["chosen_input_ids"][:prompt] == unit["rejected_input_ids"][:prompt]  # the shared, masked prompt
        assert rejected[:prompt] == [-100] * prompt and chosen[prompt:] != rejected[prompt:]
        assert unit["num_tokens"] == len(unit["chosen_input_ids"]) + len(unit["rejected_input_ids"])
        assert unit["num_label_tokens"] == sum(label != -100 for label in chosen + rejected)
    assert len({u["sample_ids"][0] for u in units}) == 10
    report = [json.loads(line) for line in (tmp_path / "report" / "rejected.jsonl").read_text().splitlines()]
    assert sorted((r["line"], r["reason"], r["file"]) for r in report) == [
        (11, "identical_responses", str(data)), (12, "empty_field", str(data)), (13, "missing_field", str(data))
    ]  # fmt: skip


def test_the_cache_key_separates_pairs_from_sft_and_follows_the_prompt_limit(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    data = write_rows(tmp_path / "pairs.jsonl", pairs(6))
    dpo = run_prepare(tiny_model_dir, data, tmp_path)
    orpo = run_prepare(tiny_model_dir, data, tmp_path, objective="orpo")
    shorter = run_prepare(tiny_model_dir, data, tmp_path, "train.preference.max_prompt_length=8")
    assert orpo.reused and orpo.prepared.key == dpo.prepared.key  # the same tokens: one cache entry
    assert not shorter.reused and shorter.prepared.key != dpo.prepared.key
    sft = write_rows(tmp_path / "sft.jsonl", [{"prompt": "p", "completion": "c"}] * 4)
    with pytest.raises(DataError, match=r"format 'prompt_completion' holds no preference pairs.*train.objective=sft"):
        run_prepare(tiny_model_dir, sft, tmp_path)
    with pytest.raises(DataError, match=r"format 'preference' .* with train.objective=sft; set train.objective"):
        run_prepare(tiny_model_dir, data, tmp_path, objective="sft")


def test_chosen_and_rejected_columns_are_detected_as_preference_rows() -> None:
    assert detect_format(["prompt", "chosen", "rejected"], {}) == "preference"
    assert detect_format(["chosen", "rejected", "messages"], {}) == "preference"  # UltraFeedback-style rows
    assert detect_format(["prompt", "completion"], {}) == "prompt_completion"


def test_full_dpo_reference_logps_are_the_base_models_and_are_reused(tiny_model_dir: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM

    from rayft.config import LoraConfig, ModelConfig
    from rayft.training.methods.preference.method import collate_preference, pair_logps
    from rayft.training.methods.preference.reference import ReferenceJob, attach_reference, needs_reference
    from rayft.training.modeling.precision import Precision

    assert needs_reference("dpo", "full") and not needs_reference("dpo", "lora") and not needs_reference("orpo", "full")
    prepared = run_prepare(tiny_model_dir, write_rows(tmp_path / "pairs.jsonl", pairs(11)), tmp_path).prepared
    job = ReferenceJob(ModelConfig(name=str(tiny_model_dir)), LoraConfig(), "auto", "cpu")  # fp32 on CPU
    stored = attach_reference(prepared, job, use_ray=False)
    table = pq.read_table(stored.train.files[0])
    units = table.to_pylist()
    assert len(units) == 11 and stored.train.num_units == 11

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        want = pair_logps(model, collate_preference(units, 0).rows, Precision(None, False))
    assert table.column("ref_chosen_logps").to_pylist() == pytest.approx(want.chosen.tolist(), abs=1e-4)
    assert table.column("ref_rejected_logps").to_pylist() == pytest.approx(want.rejected.tolist(), abs=1e-4)
    before = Path(stored.train.files[0]).stat().st_mtime_ns
    again = attach_reference(prepared, job, use_ray=False)
    assert again.train.files == stored.train.files and Path(again.train.files[0]).stat().st_mtime_ns == before
    other = attach_reference(prepared, ReferenceJob(job.model, job.lora, "fp32", "cpu"), use_ray=False)
    assert other.train.files != stored.train.files  # another key, another pass


def test_training_refuses_data_prepared_for_the_other_kind_of_objective(tiny_model_dir: Path, tmp_path: Path) -> None:
    from rayft.training.driver.startup import check_model_fits_data

    prepared = run_prepare(tiny_model_dir, write_rows(tmp_path / "pairs.jsonl", pairs(4)), tmp_path).prepared
    check_model_fits_data(load_config(None, [f"model.name={tiny_model_dir}", "train.objective=simpo"]), prepared)
    with pytest.raises(DataError, match=r"holds preference pairs, but train.objective='sft'; prepare the data"):
        check_model_fits_data(load_config(None, [f"model.name={tiny_model_dir}"]), prepared)
