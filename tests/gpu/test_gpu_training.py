"""The GPU tier's whole-loop checks (run by ``make gpu-check``): rayft's training loop in this process
(``scaling.num_workers: 0``, no Ray) on CUDA, as a one-GPU user runs it.

- QLoRA: a LoRA adapter on a base quantized by bitsandbytes' CUDA kernels trains (its loss falls)
  and its merged export reloads and generates;
- DPO on a LoRA adapter, on a bf16 base and on an NF4 one: the first step is ln 2 with zero margins
  (the adapter off is the reference) and a few steps make chosen out-reward rejected on every pair;
- a trace window records CUDA kernels and writes a CUDA memory snapshot, and the step breakdown
  reports peak memory and MFU.

``RAYFT_GPU_TIER_DEVICE=cpu`` runs them on the CPU (bitsandbytes' CPU kernels, no CUDA figures), to
check the tier itself where no GPU is lent.
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import pytest

from rayft.config import RayftConfig
from rayft.data.prepared import PreparedData
from tests.support.runs import read_metrics, tiny_config, train_losses, train_on

pytestmark = pytest.mark.gpu

LOCAL = ("scaling.num_workers=0", "train.save_steps=100", "train.eval_steps=null", "train.logging_steps=1")


def _on_device(run_dir: Path, device: str) -> None:
    """The run trained where the tier asked: CUDA runs report their peak memory and MFU."""
    records = [r for r in read_metrics(run_dir) if "train/loss" in r]
    if device == "cuda":
        assert all(r["memory/peak_gib"] > 0 and 0 < r["perf/mfu"] < 1 for r in records), records[-1]
    else:
        assert not any("memory/peak_gib" in r for r in records)


@pytest.mark.parametrize("quantize", ["nf4", "int8"])
def test_qlora_trains_on_the_gpu_and_its_merged_export_generates(
    device: str, qlora_model_dir: Path, qlora_units: PreparedData, tmp_path: Path, quantize: str
) -> None:
    pytest.importorskip("bitsandbytes", reason="QLoRA needs the qlora extra: pip install 'rayft[qlora]'")
    from rayft.config import load_config
    from rayft.recipes.export import export_model

    # 16 qlora_units, 8 a step: each epoch's two batches come back every other step, so the loss must fall.
    cfg = tiny_config(qlora_model_dir, tmp_path / "runs", *LOCAL, "train.max_steps=12", "train.micro_batch_size=8",
                      "train.learning_rate=1e-2", f"lora.quantize={quantize}", "lora.r=8")  # fmt: skip
    run_dir = train_on(cfg, qlora_units)
    losses = list(train_losses(run_dir).values())
    assert len(losses) == 12 and sum(losses[-3:]) < sum(losses[:3]), losses
    _on_device(run_dir, device)

    result = export_model(load_config(None, [f"model.name={qlora_model_dir}"]), str(run_dir), tmp_path / "merged")
    assert result.merged and result.verification["reload_generate_ok"] is True
    assert result.verification["adapter_effect_max_abs_logit"] > 0


def _write_pairs(path: Path, count: int) -> Path:
    """Separable pairs: the answer ending in '!' is chosen, the same answer ending in '?' rejected."""
    rows = [{"prompt": f"Question: {i} + {i % 7}\nAnswer: ", "chosen": f"{2 * i % 97}!", "rejected": f"{2 * i % 97}?"}
            for i in range(count)]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _dpo_config(qlora_model_dir: Path, root: Path, *overrides: str) -> RayftConfig:
    pairs = _write_pairs(root / "pairs.jsonl", 64)
    return tiny_config(qlora_model_dir, root / "runs", *LOCAL, f"data.datasets=[{{path: {pairs}}}]",
                       "data.validation_fraction=0", f"data.cache_dir={root / 'cache'}", "lora.dropout=0",
                       "train.objective=dpo", "train.max_steps=6", "train.micro_batch_size=8",
                       "train.learning_rate=1e-2", *overrides)  # fmt: skip


@pytest.mark.parametrize("quantize", ["none", "nf4"])
def test_dpo_on_the_gpu_starts_at_ln2_and_separates_the_pairs(
    device: str, qlora_model_dir: Path, tmp_path: Path, quantize: str
) -> None:
    if quantize != "none":
        pytest.importorskip("bitsandbytes", reason="QLoRA needs the qlora extra: pip install 'rayft[qlora]'")
    from rayft.training.driver.startup import prepare_training_data

    cfg = _dpo_config(qlora_model_dir, tmp_path, f"lora.quantize={quantize}")
    run_dir = train_on(cfg, prepare_training_data(cfg, None, use_ray=False))
    records = {r["step"]: r for r in read_metrics(run_dir) if "train/loss" in r}
    assert list(records) == list(range(1, 7))
    # The adapter starts at zero, so the policy is the reference in the same precision: exactly ln 2.
    assert records[1]["train/loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert records[1]["rewards/margins"] == 0.0 and records[1]["rewards/accuracies"] == 0.0
    assert records[6]["rewards/accuracies"] > 0.9 and records[6]["rewards/margins"] > 0, records[6]
    _on_device(run_dir, device)


def test_a_trace_window_records_gpu_kernels_and_a_memory_snapshot(
    device: str, qlora_model_dir: Path, qlora_units: PreparedData, tmp_path: Path
) -> None:
    from rayft.runs import layout
    from rayft.training.profiling.report import load_profile

    window = ("train.profile.wait_steps=2", "train.profile.warmup_steps=1", "train.profile.active_steps=2",
              "train.profile.memory_snapshot=true", "train.profile.step_timing=synced")  # fmt: skip
    run_dir = train_on(
        tiny_config(qlora_model_dir, tmp_path / "runs", *LOCAL, "train.max_steps=6", *window), qlora_units
    )

    profile = load_profile(run_dir)
    assert profile.traces == [layout.trace_file(0)]
    events = json.loads((run_dir / layout.trace_file(0)).read_text())["traceEvents"]
    steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#3", "ProfilerStep#4"}, steps
    snapshot = run_dir / layout.memory_snapshot_file(0)
    if device == "cuda":
        assert any(e.get("cat") == "kernel" for e in events)  # the GPU's own kernels, not only the host's calls
        with snapshot.open("rb") as file:
            assert pickle.load(file)["segments"]  # the file this run just wrote
    else:
        assert not snapshot.exists()
    _on_device(run_dir, device)
