"""The step's planner: what ``auto`` becomes for each device, model and memory, and that explicit settings win.

Pure: no torch, no GPU (the facts are given, as a worker would gather them)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rayft.runs.location import RunLocation
from rayft.training.modeling.step_choice import LOGITS_SHARE, StepChoice, StepFacts, StepRequest, choose_step

GIB = 2**30

CPU = StepFacts(
    device_type="cpu", method="lora", hidden_size=576, num_layers=30, vocab_size=49152, seq_length=512,
    micro_batch_size=4, packing=True, free_memory_bytes=12 * GIB, cpus=2, cpu_bf16=True, torch_version=(2, 13),
)  # fmt: skip
GPU = replace(CPU, device_type="cuda", hidden_size=1536, num_layers=28, vocab_size=151936, seq_length=2048,
              free_memory_bytes=120 * GIB, cpus=16)  # fmt: skip


def test_the_planner_imports_no_torch() -> None:
    assert "rayft.training.modeling.step_choice" in sys.modules
    choose_step(StepRequest(), CPU)
    # It may run in a process that has torch already; what matters is that it never needs it.
    import rayft.training.modeling.step_choice as module

    assert "torch" not in module.__dict__


def test_cpu_auto_runs_per_example_sdpa_chunked_loss_fp32_eager_one_thread_per_cpu() -> None:
    choice = choose_step(StepRequest(), CPU)
    assert (choice.attention, choice.loss, choice.compile, choice.mixed_precision, choice.threads) == (
        "sdpa", "chunked", False, "no", 2,
    )  # fmt: skip
    assert choice.padding_free is True


def test_gpu_auto_prefers_flash_attn_then_flex_for_packed_rows_and_sdpa_unpacked() -> None:
    assert (
        choose_step(StepRequest(), replace(GPU, installed=frozenset({"flash_attn"}))).attention == "flash_attention_2"
    )
    assert choose_step(StepRequest(), GPU).attention == "flex_attention"
    assert choose_step(StepRequest(), replace(GPU, packing=False)).attention == "sdpa"
    assert choose_step(StepRequest(), replace(GPU, torch_version=(2, 4))).attention == "sdpa"
    assert choose_step(StepRequest(), replace(GPU, special_attention=True)).attention == "sdpa"


def test_gpu_loss_is_plain_while_its_logits_fit_the_share_of_free_memory() -> None:
    # Qwen2.5-1.5B's vocabulary, 4 rows of 2048: 12 B x 8192 x 151936 = 13.9 GiB of logits.
    logits = GPU.plain_logits_bytes
    assert logits == 12 * 4 * 2048 * 151936
    roomy = replace(GPU, free_memory_bytes=int(logits / LOGITS_SHARE) + 1)
    tight = replace(GPU, free_memory_bytes=int(logits / LOGITS_SHARE) - 1)
    assert choose_step(StepRequest(), roomy).loss == "none"
    assert choose_step(StepRequest(), tight).loss == "chunked"
    assert choose_step(StepRequest(), replace(tight, installed=frozenset({"liger_kernel"}))).loss == "liger"
    assert choose_step(StepRequest(), replace(GPU, free_memory_bytes=None)).loss == "chunked"


def test_gpu_auto_leaves_compile_off_threads_alone_and_precision_to_the_gpu() -> None:
    choice = choose_step(StepRequest(), GPU)
    assert (choice.compile, choice.threads, choice.mixed_precision) == (False, None, "auto")


@pytest.mark.parametrize("facts", [CPU, GPU], ids=["cpu", "gpu"])
def test_explicit_settings_win(facts: StepFacts) -> None:
    request = StepRequest(attn_implementation="eager", fused_loss="none", compile=True, mixed_precision="bf16",
                          cpu_threads=1)  # fmt: skip
    choice = choose_step(request, facts)
    assert (choice.attention, choice.loss, choice.compile, choice.mixed_precision) == ("eager", "none", True, "bf16")
    assert choice.threads == (1 if facts.device_type == "cpu" else None)
    assert "set in model.attn_implementation" in choice.describe()


def test_the_console_line_names_each_choice_and_its_reason() -> None:
    line = choose_step(StepRequest(), CPU).describe()
    assert line.startswith("attention sdpa (per example")
    for part in ("loss chunked (", "compile off (", "precision fp32 (", "2 threads (one per CPU"):
        assert part in line
    assert "\n" not in line
    gpu = choose_step(StepRequest(), GPU).describe()
    assert "loss plain (its logits (13.9 GiB) fit in 25% of the 120.0 GiB free" in gpu


def test_with_step_puts_the_choice_into_the_worker_plan() -> None:
    from rayft.config.model import LoraConfig, ModelConfig
    from rayft.config.train import CheckpointConfig, LoggingConfig, TrainConfig
    from rayft.training.loop.plan import Schedule
    from rayft.training.loop.worker_plan import WorkerPlan

    plan = WorkerPlan(
        model=ModelConfig(), lora=LoraConfig(), train=TrainConfig(), logging=LoggingConfig(),
        checkpoint=CheckpointConfig(), seed=0, location=RunLocation(Path("/tmp/x")), resolved_config="",
        schedule=Schedule(1, 1, 1, 1, 0), shuffle_window=1, has_validation=False,
    )  # fmt: skip
    assert (plan.model.attn_implementation, plan.train.compile, plan.train.cpu_threads) == ("auto", "auto", "auto")
    choice = StepChoice("flex_attention", "none", False, "auto", None, False, ())
    decided = plan.with_step(choice)
    assert decided.model.attn_implementation == "flex_attention"
    assert (decided.train.fused_loss, decided.train.compile, decided.train.cpu_threads) == ("none", False, "auto")
    assert decided.train.padding_free is False


def test_padding_free_with_attention_that_reads_the_bounds_and_for_sft_only() -> None:
    assert choose_step(StepRequest(), CPU).padding_free is True
    assert choose_step(StepRequest(), replace(CPU, packing=False)).padding_free is True
    assert choose_step(StepRequest(attn_implementation="eager"), CPU).padding_free is False
    assert choose_step(StepRequest(), replace(CPU, sft=False)).padding_free is False
    assert choose_step(StepRequest(), GPU).padding_free is False  # flex_attention: measured on separate rows only
    assert choose_step(StepRequest(), replace(GPU, installed=frozenset({"flash_attn"}))).padding_free is True
    assert choose_step(StepRequest(padding_free=False), CPU).padding_free is False
    assert choose_step(StepRequest(padding_free=True), GPU).padding_free is True


def test_liger_kernels_are_refused_on_cpu_and_name_their_install_line_when_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from rayft.errors import ConfigError, MissingDependencyError
    from rayft.training.modeling.kernels import apply_liger_kernels

    net = SimpleNamespace(config=SimpleNamespace(model_type="llama"))
    with pytest.raises(ConfigError, match=r"CUDA GPUs, but this worker's device is cpu; set train.liger_kernels=false"):
        apply_liger_kernels(net, "cpu")
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # not installed, whatever this machine has
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rayft\[liger\]'"):
        apply_liger_kernels(net, "cuda")


def test_auto_attention_loads_sdpa_everywhere_the_planner_does_not_decide() -> None:
    from rayft.config.model import ModelConfig
    from rayft.models.loading import loaded_attention
    from rayft.training.modeling.attention import PER_EXAMPLE_SDPA, row_multiple, training_attention

    assert ModelConfig().attn_implementation == "auto"
    assert loaded_attention("auto") == "sdpa"
    assert loaded_attention("flex_attention") == "flex_attention"
    assert training_attention("auto", "cpu") == PER_EXAMPLE_SDPA
    assert training_attention("auto", "cuda") == "sdpa"
    assert row_multiple("auto") == 1


def test_the_worker_gathers_its_facts(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rayft.config.model import ModelConfig
    from rayft.training.modeling.step_facts import gather_step_facts, model_shape, worker_cpus

    shape = model_shape(ModelConfig(name=str(tiny_model_dir)))
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert shape == {"hidden_size": config["hidden_size"], "num_layers": config["num_hidden_layers"],
                     "vocab_size": config["vocab_size"], "special_attention": False}  # fmt: skip
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray sets for a worker of 1 CPU
    assert worker_cpus() == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert worker_cpus() >= 1
    facts = gather_step_facts("cpu", method="lora", seq_length=64, micro_batch_size=2, packing=True, cpus=1, **shape)
    assert facts.free_memory_bytes is not None and facts.free_memory_bytes > 0
    assert facts.torch_version >= (2, 0)
    assert choose_step(StepRequest(), facts).threads == 1


def test_the_worker_decides_its_step_sets_threads_and_says_so_once(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    from types import SimpleNamespace

    import torch

    from rayft.config.model import LoraConfig, ModelConfig
    from rayft.config.train import CheckpointConfig, LoggingConfig, TrainConfig
    from rayft.training.loop.plan import Schedule
    from rayft.training.loop.worker import choose_worker_step
    from rayft.training.loop.worker_plan import WorkerPlan
    from rayft.training.methods.registry import REGISTERED

    plan = WorkerPlan(
        model=ModelConfig(name=str(tiny_model_dir)), lora=LoraConfig(), train=TrainConfig(fused_loss="none"),
        logging=LoggingConfig(), checkpoint=CheckpointConfig(), seed=0, location=RunLocation(Path("/tmp/x")),
        resolved_config="", schedule=Schedule(1, 1, 1, 1, 0), shuffle_window=1, has_validation=False,
        max_seq_length=64, packing=True,
    )  # fmt: skip
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="rayft.train"):
            session = SimpleNamespace(device=torch.device("cpu"), rank=0)
            decided = choose_worker_step(plan, session, REGISTERED.traits(plan))  # type: ignore[arg-type]
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert decided.model.attn_implementation == "sdpa"
    assert (decided.train.fused_loss, decided.train.compile, decided.train.padding_free) == ("none", False, True)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step: ")]
    assert len(lines) == 1 and "loss plain (set in train.fused_loss)" in lines[0]


def test_cpu_precision_stays_fp32_and_says_why_for_each_cpu() -> None:
    with_bf16 = choose_step(StepRequest(), replace(CPU, cpu_bf16=True))
    without = choose_step(StepRequest(), replace(CPU, cpu_bf16=False))
    assert with_bf16.mixed_precision == without.mixed_precision == "no"
    assert "measured faster on CPUs with bf16 instructions, but to a higher loss" in with_bf16.describe()
    assert "this CPU has no bf16 instructions" in without.describe()
    assert choose_step(StepRequest(mixed_precision="bf16"), replace(CPU, cpu_bf16=True)).mixed_precision == "bf16"


def test_frozen_layers_go_bf16_for_lora_under_fp32_on_a_bf16_cpu_and_say_why_not_elsewhere() -> None:
    choice = choose_step(StepRequest(), CPU)
    assert choice.frozen_precision == "bf16"
    assert "frozen layers bf16 (bf16 products on a CPU with bf16 instructions" in choice.describe()
    kept = {
        "no frozen layers": replace(CPU, method="full"),
        "autocast runs their products": GPU,
        "this CPU has no bf16 instructions": replace(CPU, cpu_bf16=False),
        "the KL term's reference is a frozen copy": replace(CPU, sft=False, reference_copy=True),
        "fsdp shards the frozen weights": replace(CPU, strategy="fsdp"),
        "hidden size 128 < 256": replace(CPU, hidden_size=128),
    }
    for why, facts in kept.items():
        other = choose_step(StepRequest(), facts)
        assert other.frozen_precision == "fp32", why
        assert why in other.describe() or facts.method == "full", why
    # DPO and GRPO score against the same model (the adapter off) or none: their frozen layers go bf16 too.
    assert choose_step(StepRequest(), replace(CPU, sft=False)).frozen_precision == "bf16"
    # Under bf16 autocast the frozen products are bf16 already.
    assert choose_step(StepRequest(mixed_precision="bf16"), CPU).frozen_precision == "fp32"
    # A full fine-tune names no frozen layers at all on the console.
    assert "frozen layers" not in choose_step(StepRequest(), replace(CPU, method="full")).describe()


def test_explicit_frozen_precision_wins_and_reaches_the_worker_plan() -> None:
    from rayft.config.model import LoraConfig, ModelConfig
    from rayft.config.train import CheckpointConfig, LoggingConfig, TrainConfig
    from rayft.training.loop.plan import Schedule
    from rayft.training.loop.worker_plan import WorkerPlan

    assert choose_step(StepRequest(frozen_precision="fp32"), CPU).frozen_precision == "fp32"
    forced = choose_step(StepRequest(frozen_precision="bf16"), replace(CPU, cpu_bf16=False))
    assert forced.frozen_precision == "bf16"
    assert "frozen layers bf16 (set in train.frozen_precision)" in forced.describe()
    plan = WorkerPlan(
        model=ModelConfig(), lora=LoraConfig(), train=TrainConfig(), logging=LoggingConfig(),
        checkpoint=CheckpointConfig(), seed=0, location=RunLocation(Path("/tmp/x")), resolved_config="",
        schedule=Schedule(1, 1, 1, 1, 0), shuffle_window=1, has_validation=False,
    )  # fmt: skip
    assert plan.train.frozen_precision == "auto"
    assert plan.with_step(choose_step(StepRequest(), CPU)).train.frozen_precision == "bf16"


def test_the_step_line_names_the_cpu_s_bf16_unit_and_amx_keeps_the_choices_saying_what_was_not_measured() -> None:
    plain = choose_step(StepRequest(), CPU)
    amx = choose_step(StepRequest(), replace(CPU, cpu_amx=True))
    assert "CPU avx512_bf16, no AMX (its bf16 instructions, read from /proc/cpuinfo)" in plain.describe()
    assert "CPU AMX (amx_bf16, amx_tile)" in amx.describe()
    assert "without bf16 instructions" in choose_step(StepRequest(), replace(CPU, cpu_bf16=False)).describe()
    # The same choices on AMX: fp32 autocast (bf16's rounding is the same), frozen layers in bf16.
    assert (amx.mixed_precision, amx.frozen_precision, amx.threads) == (plain.mixed_precision, "bf16", plain.threads)
    assert "AMX not measured" in amx.describe() and "AMX not measured" not in plain.describe()
    assert "AMX rounds to bf16 alike" in amx.describe()
    assert "CPU" not in choose_step(StepRequest(), GPU).describe()


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        ("fpu avx2 avx512f avx512_bf16 avx512_vnni", {"avx512_bf16"}),  # AMD EPYC (Zen 4), Intel Cooper Lake
        ("fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", {"avx512_bf16", "amx_bf16", "amx_tile"}),  # Xeon 4th+
        ("fpu avx2 fma", set()),
    ],
)
def test_the_cpu_s_bf16_flags_are_read_from_cpuinfo(tmp_path: Path, flags: str, want: set[str]) -> None:
    from rayft.training.modeling import step_facts

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: some CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert step_facts.cpu_bf16_flags(cpuinfo) == want
    assert step_facts.cpu_bf16_flags(tmp_path / "missing") == frozenset()
