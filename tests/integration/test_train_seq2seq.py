"""An encoder-decoder (the tiny random T5) through the same loop on 2 Ray Train workers (gloo, CPU):
LoRA under DDP, exported merged; in the slow tier, resumed bitwise after a worker is killed, and
full fine-tuning under DeepSpeed ZeRO-3 with optimizer and parameters offloaded to the CPU, and
under FSDP2, trains as under DDP and exports whole. Every export loads with AutoModelForSeq2SeqLM
and generates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayft.config import load_config
from rayft.data.prepared import PreparedData
from tests.support.kills import kill_a_worker_at
from tests.support.runs import adapter_tensors, read_metrics, tiny_config, train_losses, train_on

pytestmark = pytest.mark.integration

# 32 units, 2 workers x 4 per micro-batch: 4 steps per epoch; 6 steps cross an epoch boundary.
LORA = ("train.max_steps=6", "train.save_steps=3", "train.eval_steps=3")
FULL = ("train.method=full", "train.max_steps=2", "train.save_steps=2", "train.eval_steps=null",
        "train.learning_rate=1e-3")  # fmt: skip
ZERO3_OFFLOAD = (
    "train.strategy=deepspeed",
    "train.deepspeed={zero_optimization: {offload_optimizer: {device: cpu}, offload_param: {device: cpu}}}",
)


@pytest.fixture(scope="module")
def prepared(tiny_t5_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    from rayft.data.prepare import prepare_data

    root = tmp_path_factory.mktemp("sql-pairs")
    rows = [{"instruction": "Write the SQL query.", "input": f"How many rows have age {i}?",
             "output": f"SELECT COUNT(*) FROM t WHERE age = {i}"} for i in range(36)]  # fmt: skip
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [f"model.name={tiny_t5_dir}", f"data.datasets=[{{path: {root / 'pairs.jsonl'}}}]",
                             "data.validation_fraction=0.1"])  # fmt: skip
    return prepare_data(cfg.data, cfg.model, cfg.seed, report_dir=None, use_ray=False)


@pytest.fixture(scope="module")
def lora_run(ray_session: None, tiny_t5_dir: Path, prepared: PreparedData, tmp_path_factory: Any) -> Path:
    return train_on(tiny_config(tiny_t5_dir, tmp_path_factory.mktemp("lora"), *LORA), prepared)


def _generates(directory: Path) -> None:
    """The export loads with AutoModelForSeq2SeqLM and generates decoder tokens for a source."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    ids = tokenizer("Write the SQL query.\n\nHow many rows have age 7?<|im_end|>", return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > 1 and int(out[0, 0]) == model.config.decoder_start_token_id


def test_lora_trains_and_exports_merged(lora_run: Path, tiny_t5_dir: Path, tmp_path: Path) -> None:
    from rayft.recipes.export import export_model

    losses = train_losses(lora_run)
    assert list(losses) == list(range(1, 7)) and losses[6] < losses[1]
    assert [r["step"] for r in read_metrics(lora_run) if "eval/loss" in r] == [3, 6]
    config = json.loads((lora_run / "final" / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_2_SEQ_LM" and set(config["target_modules"]) == {"q", "k", "v", "o", "wi_0",
                                                                                        "wi_1", "wo"}  # fmt: skip

    result = export_model(load_config(None, [f"model.name={tiny_t5_dir}"]), str(lora_run), tmp_path / "merged")
    assert result.merged and result.verification["reload_generate_ok"] is True
    assert result.verification["merge_max_abs_logit_diff"] <= 1e-4
    _generates(result.output_dir)


# The default tiers check a bitwise resume after a worker kill on the causal model (under DDP in
# tests/chaos/test_chaos_workers.py, under FSDP in test_train_strategies.py): the loop and its
# checkpoints do not depend on the architecture.
@pytest.mark.slow
def test_lora_resumes_bitwise_after_a_worker_is_killed(
    lora_run: Path, tiny_t5_dir: Path, prepared: PreparedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    seen: list[int] = []
    watcher = kill_a_worker_at(run_dir, 4, seen, monkeypatch)
    train_on(tiny_config(tiny_t5_dir, tmp_path, *LORA), prepared)
    watcher.join(timeout=5)
    assert seen, "no worker was killed"
    assert train_losses(run_dir) == train_losses(lora_run)  # bitwise, every step
    want = adapter_tensors(lora_run / "final")
    assert all(adapter_tensors(run_dir / "final")[name].equal(t) for name, t in want.items())


# Sharded full fine-tuning is checked against DDP in the default tiers on the causal model
# (test_train_strategies.py); the encoder-decoder, with parameters offloaded too, in the slow tier.
@pytest.mark.slow
def test_full_fine_tuning_under_zero3_with_offload_and_fsdp2_trains_as_ddp_and_exports(
    ray_session: None, tiny_t5_dir: Path, prepared: PreparedData, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from rayft.recipes.export import export_model

    ddp = train_on(tiny_config(tiny_t5_dir, tmp_path / "ddp", *FULL), prepared)
    zero3 = train_on(tiny_config(tiny_t5_dir, tmp_path / "zero3", *FULL, *ZERO3_OFFLOAD), prepared)
    fsdp = train_on(tiny_config(tiny_t5_dir, tmp_path / "fsdp", *FULL, "train.strategy=fsdp"), prepared)

    want = load_file(str(ddp / "final" / "model.safetensors"))
    for sharded in (zero3, fsdp):
        a, b = train_losses(sharded), train_losses(ddp)
        assert a.keys() == b.keys() == {1, 2}
        assert all(a[step] == pytest.approx(b[step], rel=1e-4) for step in a), sharded
        got = load_file(str(sharded / "final" / "model.safetensors"))
        assert got.keys() == want.keys()
        # 1e-4, a tenth of one Adam step at lr 1e-3: Adam's normalised update turns the summation-order
        # noise of a near-zero gradient into up to ~2e-5 on single elements (seen on one wi_0 weight, all
        # other tensors within 6e-7), while a lost or doubled shard moves weights by about lr per step.
        assert all((got[name] - tensor).abs().max() < 1e-4 for name, tensor in want.items()), sharded

    result = export_model(load_config(None, [f"model.name={tiny_t5_dir}"]), str(zero3), tmp_path / "export")
    assert result.kind == "full" and result.verification["reload_generate_ok"] is True
    _generates(result.output_dir)
