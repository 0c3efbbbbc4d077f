"""The Ray Data actor pool runs a real backend over a dataset and keeps every row."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from rayft.config.generation import GenerationConfig
from rayft.config.model import ModelConfig

pytestmark = pytest.mark.integration


def test_pool_generates_for_every_row(ray_session: None, tiny_model_dir: Path) -> None:
    import ray

    from rayft.generation.ray_pool import generate_dataset

    cfg = GenerationConfig(model=ModelConfig(name=str(tiny_model_dir)), max_new_tokens=4, batch_size=3)
    rows = [{"id": i, "prompt": [{"role": "user", "content": f"What is {i} + 1?"}]} for i in range(7)]
    rows.append({"id": 7, "prompt": [{"role": "user", "content": "plain"}]})
    generated = generate_dataset(ray.data.from_items(rows), cfg).materialize()
    # Chat prompts pass through the actors with their Arrow type, not pickled as Python objects.
    prompt_type = generated.schema().base_schema.field("prompt").type  # type: ignore[union-attr]
    assert pa.types.is_list(prompt_type) and pa.types.is_struct(prompt_type.value_type), prompt_type
    out = generated.take_all()
    assert sorted(r["id"] for r in out) == list(range(8))
    for row in out:
        assert row["error"] == ""
        assert row["finish_reason"] in ("stop", "length")
        assert 0 < row["num_generated_tokens"] <= 4
        assert row["generator"] == f"hf:{tiny_model_dir}"
