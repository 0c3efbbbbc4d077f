"""BART, the other encoder-decoder family, through the same loop in-process (no Ray): LoRA on its
default targets trains, and the merged export loads with AutoModelForSeq2SeqLM and generates."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rayft.config import load_config
from tests.support.runs import tiny_config, train_losses, train_on


def test_bart_lora_trains_in_process_and_exports_merged(tmp_path: Path) -> None:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from rayft.data.prepare import prepare_data
    from rayft.recipes.export import export_model
    from rayft.testing import build_tiny_bart

    model_dir = build_tiny_bart(tmp_path / "bart")
    rows = [{"instruction": "Write the SQL query.", "input": f"How many rows have age {i}?",
             "output": f"SELECT COUNT(*) FROM t WHERE age = {i}"} for i in range(16)]  # fmt: skip
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tiny_config(model_dir, tmp_path / "runs", "scaling.num_workers=0", "train.max_steps=4",
                      "train.eval_steps=null", "train.save_steps=4",
                      f"data.datasets=[{{path: {tmp_path / 'pairs.jsonl'}}}]")  # fmt: skip
    run_dir = train_on(cfg, prepare_data(cfg.data, cfg.model, cfg.seed, report_dir=None, use_ray=False))

    losses = train_losses(run_dir)
    assert list(losses) == [1, 2, 3, 4] and all(math.isfinite(v) for v in losses.values())
    assert losses[4] < losses[1]
    adapter = json.loads((run_dir / "final" / "adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_2_SEQ_LM"
    assert set(adapter["target_modules"]) == {"q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"}

    result = export_model(load_config(None, [f"model.name={model_dir}"]), str(run_dir), tmp_path / "merged")
    assert result.merged and result.verification["reload_generate_ok"] is True
    model = AutoModelForSeq2SeqLM.from_pretrained(result.output_dir).eval()
    ids = AutoTokenizer.from_pretrained(result.output_dir)("How many rows have age 7?", return_tensors="pt")[
        "input_ids"
    ]
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > 1 and int(out[0, 0]) == model.config.decoder_start_token_id
