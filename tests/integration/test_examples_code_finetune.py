"""The code fine-tuning example: continued pre-training on a folder of source files (rayft's own
.py files), in-process on the tiny model at a tiny size; the Hub variant's config validates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayft.config import load_config
from tests.support.runs import train_losses

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "code_finetune"


def test_local_sources_config_trains_on_source_files(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rayft

    monkeypatch.chdir(REPO)  # the config reads src/rayft relative to the repository
    monkeypatch.setenv("RAY_ADDRESS", "")
    cfg = load_config(EXAMPLES / "local-sources.yaml", [
        f"model.name={tiny_model_dir}", f"storage_path={tmp_path}", "scaling.num_workers=0", "train.max_steps=2",
        "train.gradient_accumulation_steps=1", "data.max_seq_length=256", "data.datasets.0.chunk_chars=600",
        "data.datasets.0.max_rows=24", "lora.r=4", "train.eval_steps=2",
    ])  # fmt: skip
    result = rayft.api.train(cfg)

    assert result.steps == 2 and sorted(train_losses(result.run_dir)) == [1, 2]
    stats = json.loads((result.run_dir / "data" / "stats.json").read_text())
    assert stats["rows_total"] == 24 and stats["rejected_total"] == 0
    assert stats["formats"] == {"rayft": "text (from the config: text=text)"}


def test_hub_config_reads_the_rust_split_of_the_stack_smol() -> None:
    cfg = load_config(EXAMPLES / "rust-hub.yaml")
    (dataset,) = cfg.data.datasets
    assert (dataset.path, dataset.data_dir, dataset.format) == ("bigcode/the-stack-smol", "data/rust", "text")
    assert dataset.field_mapping == {"text": "content"} and cfg.data.packing
