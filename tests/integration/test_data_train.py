"""`rayft.recipes.train.run` end to end on the tiny model with 2 workers: data prepared by Ray Data
from the built-in arithmetic set, then trained; a second run reuses the cached data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import tiny_config, train_losses

pytestmark = pytest.mark.integration


def test_train_run_prepares_with_ray_and_trains(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    from rayft.data.prepare import prepare_data
    from rayft.recipes.train import run

    data = "data.datasets=[{path: 'builtin:arithmetic', max_rows: 72}]"
    cfg = tiny_config(tiny_model_dir, tmp_path, data, "train.max_steps=3", "data.validation_fraction=0.12")
    result = run(cfg)

    assert result.steps == 3 and sorted(train_losses(result.run_dir)) == [1, 2, 3]
    assert result.train_loss is not None and result.train_loss > 0
    stats = json.loads((result.run_dir / "data" / "stats.json").read_text())
    assert stats["key"] == result.data_key
    assert stats["rows"] == {"train": 63, "validation": 9} and stats["rejected_total"] == 0
    assert (result.run_dir / "data" / "rejected.jsonl").read_text() == ""
    # The in-process path, into a fresh cache, writes exactly the units the Ray Data job wrote.
    monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path / "other-cache"))
    local = prepare_data(cfg.data, cfg.model, cfg.seed, report_dir=None, use_ray=False)
    assert local.key == result.data_key and local.train.num_units == 63
    ray_root = Path(json.loads((result.run_dir / "data" / "stats.json").read_text())["root"])
    for name in ("train/part-00000.parquet", "validation/part-00000.parquet"):
        assert pq.read_table(Path(local.root) / name).equals(pq.read_table(ray_root / name))
