"""Strategies without a process group: which modules FSDP shards, the checkpoint state every
strategy writes (whole tensors, optimizer state keyed by name), and the refusal to save a shard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayft.errors import TrainingError


def _lora_model(model_dir: Path) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))


def _one_step(model: Any) -> Any:
    import torch

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.arange(3, 11).unsqueeze(0)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return optimizer


def test_fsdp_units_are_the_transformer_blocks_through_peft(tiny_model_dir: Path) -> None:
    from rayft.training.strategies.parallel import block_classes, shard_units

    model = _lora_model(tiny_model_dir)
    blocks = block_classes(model)
    assert blocks == frozenset({"LlamaDecoderLayer"})
    units = shard_units(model, blocks)
    assert units == list(model.get_base_model().model.layers)


def test_a_model_that_does_not_name_its_blocks_is_refused_for_fsdp() -> None:
    import torch

    from rayft.training.strategies.parallel import block_classes, shard_units

    with pytest.raises(TrainingError, match=r"Linear does not name its transformer blocks.*strategy=ddp"):
        block_classes(torch.nn.Linear(2, 2))
    with pytest.raises(TrainingError, match=r"no module of the classes \['Block'\]"):
        shard_units(torch.nn.Sequential(torch.nn.Linear(2, 2)), ["Block"])


def test_checkpoint_state_is_a_copy_keyed_by_name_and_loads_into_a_fresh_optimizer(tiny_model_dir: Path) -> None:
    import torch

    from rayft.training.strategies.parallel import TorchParallelism, trainable_names

    model = _lora_model(tiny_model_dir)
    optimizer = _one_step(model)
    single = TorchParallelism(wrap=None)
    weights = single.model_state(model, "lora", rank=0)
    saved = single.optimizer_state(model, optimizer, rank=0)
    assert weights is not None and saved is not None
    assert list(weights) == trainable_names(model)
    assert set(saved["state"]) == set(trainable_names(model))  # names, not positions
    assert (
        single.model_state(model, "lora", rank=1) is None and single.optimizer_state(model, optimizer, rank=1) is None
    )

    before = {name: t.clone() for name, t in weights.items()}
    _one_step_with(model, optimizer)  # training goes on while the snapshot is written
    assert all(weights[name].equal(t) for name, t in before.items())

    fresh = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    single.load_optimizer_state(model, fresh, saved)
    first = next(p for p in model.parameters() if p.requires_grad)
    name = trainable_names(model)[0]
    assert fresh.state[first]["exp_avg"].equal(saved["state"][name]["exp_avg"])


def _one_step_with(model: Any, optimizer: Any) -> None:
    import torch

    ids = torch.arange(3, 11).unsqueeze(0)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def test_optimizer_state_keyed_by_position_still_loads(tiny_model_dir: Path) -> None:
    import torch

    from rayft.training.strategies.parallel import TorchParallelism

    model = _lora_model(tiny_model_dir)
    optimizer = _one_step(model)
    legacy = optimizer.state_dict()
    fresh = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    TorchParallelism(wrap=None).load_optimizer_state(model, fresh, legacy)
    first = next(p for p in model.parameters() if p.requires_grad)
    assert fresh.state[first]["exp_avg"].equal(optimizer.state[first]["exp_avg"])


def test_a_shard_or_an_empty_adapter_is_never_saved(tiny_model_dir: Path) -> None:
    from rayft.training.strategies.parallel import TorchParallelism, check_full_shapes

    model = _lora_model(tiny_model_dir)
    whole = TorchParallelism(wrap=None).model_state(model, "lora", rank=0)
    assert whole is not None
    check_full_shapes(whole, model)
    name, tensor = next(iter(whole.items()))
    one_rank = {**whole, name: tensor[: tensor.shape[0] // 2]}
    with pytest.raises(TrainingError, match=rf"not the whole model: {name}: \(2, 32\) instead of \(4, 32\)"):
        check_full_shapes(one_rank, model)
    with pytest.raises(TrainingError, match="not the whole model: missing "):
        check_full_shapes({}, model)


def test_evaluation_batches_without_a_process_group_are_left_as_they_are() -> None:
    from rayft.data.collate import collate
    from rayft.data.packing import make_unit
    from rayft.training.loop.steps import in_lockstep

    batch = collate([make_unit([3, 4, 5], [-100, 4, 5], [0, 1, 2], [0])], pad_token_id=0)
    assert in_lockstep([batch]) == [batch]
    assert in_lockstep([]) == []


def test_gathered_tied_weights_share_one_tensor_again(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rayft.training.strategies.parallel import retie

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    gathered = {name: t.clone() for name, t in model.state_dict().items()}  # what gathering returns
    assert gathered["lm_head.weight"] is not gathered["model.embed_tokens.weight"]
    state = retie(gathered, model)
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]
    assert state["model.norm.weight"] is gathered["model.norm.weight"]


def test_deepspeed_config_is_rayfts_with_the_users_entries_merged_over_it() -> None:
    from rayft.training.strategies.zero3 import deepspeed_config

    extra = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}, "communication_data_type": "fp32"}
    config = deepspeed_config(micro_batch_size=4, world_size=2, max_grad_norm=None, autocast="bf16", extra=extra)
    assert config["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    assert config["communication_data_type"] == "fp32"
    assert (config["train_micro_batch_size_per_gpu"], config["train_batch_size"]) == (4, 8)
    assert config["gradient_accumulation_steps"] == 1  # rayft marks the end of each step itself
    assert config["gradient_clipping"] == 0.0
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    assert extra == {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}, "communication_data_type": "fp32"}


def test_deepspeed_entries_that_rayft_decides_are_refused() -> None:
    from rayft.config import load_config
    from rayft.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train.deepspeed is set but train.strategy is 'ddp'; set train.strategy="):
        load_config(None, ["train.deepspeed={zero_optimization: {offload_param: {device: cpu}}}"])
    with pytest.raises(ConfigError, match=r"sets gradient_clipping, zero_optimization.stage=2, which rayft decides"):
        load_config(None, ["train.strategy=deepspeed",
                           "train.deepspeed={gradient_clipping: 0.5, zero_optimization: {stage: 2}}"])  # fmt: skip
    cfg = load_config(None, ["train.strategy=deepspeed", "train.deepspeed={zero_optimization: {stage: 3}}"])
    assert cfg.train.deepspeed == {"zero_optimization": {"stage": 3}}


def test_a_missing_deepspeed_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from rayft.training.strategies.zero3 import import_deepspeed

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # as if it were not installed
    with pytest.raises(TrainingError, match=r"pip install 'rayft\[deepspeed\]'"):
        import_deepspeed()


def test_deepspeed_joins_without_building_its_inference_all_reduce_kernel() -> None:
    deepspeed = pytest.importorskip("deepspeed", reason="needs the deepspeed extra: pip install 'rayft[deepspeed]'")
    from deepspeed.comm.torch import build_shm_op

    from rayft.training.strategies.zero3 import skip_inference_comm_kernel

    skip_inference_comm_kernel(deepspeed)
    # What DeepSpeed's backend calls as it joins the process group: no kernel, and no compiler run.
    assert build_shm_op() is None


def test_one_worker_shares_nothing_whatever_the_strategy() -> None:
    from rayft.training.strategies.parallel import TorchParallelism
    from rayft.training.strategies.table import parallelism

    for strategy in ("ddp", "fsdp", "deepspeed"):
        single = parallelism(strategy, world_size=1)  # type: ignore[arg-type]
        assert isinstance(single, TorchParallelism) and single.wrap is None and not single.sharded
    assert parallelism("fsdp", world_size=2).sharded and not parallelism("ddp", world_size=2).sharded


def test_an_adapter_written_empty_sliced_or_untrained_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    from rayft.errors import CheckpointError
    from rayft.training.loop.checkpointing import check_written_adapter
    from rayft.training.strategies.parallel import trainable_names

    model = _lora_model(tiny_model_dir)
    modules = sum(".lora_A." in name for name in trainable_names(model))
    model.save_pretrained(tmp_path / "untrained")
    with pytest.raises(CheckpointError, match=rf"lora_B of {modules} of {modules} modules is all zero"):
        check_written_adapter(tmp_path / "untrained", 4, modules=modules)

    _one_step(model)
    model.save_pretrained(tmp_path / "trained")
    check_written_adapter(tmp_path / "trained", 4, modules=modules)

    state = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    sliced = {n: (t[:2] if ".lora_A." in n else t) for n, t in state.items()}  # half of each A: one rank's rows
    model.save_pretrained(tmp_path / "sliced", state_dict=sliced)
    with pytest.raises(CheckpointError, match=r"has lora_A \(2, 32\) and lora_B .* expected \(r, in\)"):
        check_written_adapter(tmp_path / "sliced", 4, modules=modules)

    first_module = {n: t for n, t in state.items() if ".layers.0.self_attn.q_proj." in n}
    model.save_pretrained(tmp_path / "partial", state_dict=first_module)
    with pytest.raises(CheckpointError, match=rf"it adapts 1 modules, but the model trains {modules}"):
        check_written_adapter(tmp_path / "partial", 4, modules=modules)


@pytest.mark.parametrize("method", ["lora", "full"])
def test_a_model_built_without_weights_has_the_loaded_ones_names_shapes_and_trainability(
    tiny_model_dir: Path, method: str
) -> None:
    from rayft.config import LoraConfig, ModelConfig
    from rayft.training.modeling.model import build_training_model, on_meta

    def build(weights: bool) -> Any:
        return build_training_model(ModelConfig(name=str(tiny_model_dir)), LoraConfig(r=4), method, "cpu",  # type: ignore[arg-type]
                                    gradient_checkpointing=False, restore_dir=None, weights=weights)  # fmt: skip

    loaded, empty = build(True), build(False)
    assert on_meta(empty) and not on_meta(loaded)
    assert [(n, p.shape, p.dtype, p.requires_grad) for n, p in empty.named_parameters()] == [
        (n, p.shape, p.dtype, p.requires_grad) for n, p in loaded.named_parameters()
    ]
    assert [n for n, _ in empty.named_buffers()] == [n for n, _ in loaded.named_buffers()]
    assert empty.get_output_embeddings().weight is empty.get_input_embeddings().weight  # still tied

    import torch

    from rayft.training.strategies.parallel import materialize

    allocated = materialize(empty, torch.device("cpu"))  # allocating unties them; materialize ties them again
    assert not on_meta(allocated)
    assert [n for n, _ in allocated.named_parameters()] == [n for n, _ in loaded.named_parameters()]
    assert allocated.get_output_embeddings().weight is allocated.get_input_embeddings().weight


def test_memory_estimate_splits_the_state_over_workers_only_when_sharded() -> None:
    from rayft.training.strategies.memory import GIB, estimate_worker_memory

    billion = 10**9
    ddp = estimate_worker_memory(total_params=8 * billion, trainable_params=8 * billion, weight_bytes=4,
                                 sharded=False, world_size=8)  # fmt: skip
    assert (ddp.weights, ddp.gradients, ddp.optimizer) == (32 * billion, 32 * billion, 64 * billion)
    assert ddp.step == 32 * billion  # AdamW's multi-tensor temporaries
    fsdp = estimate_worker_memory(total_params=8 * billion, trainable_params=8 * billion, weight_bytes=4,
                                  sharded=True, world_size=8)  # fmt: skip
    assert fsdp.total * 8 == ddp.total
    lora = estimate_worker_memory(total_params=8 * billion, trainable_params=20_000_000, weight_bytes=2,
                                  sharded=False, world_size=8)  # fmt: skip
    assert lora.weights == 16 * billion and lora.optimizer == 160_000_000
    master = estimate_worker_memory(total_params=10, trainable_params=10, weight_bytes=2, sharded=False,
                                    world_size=1, master_copy=True)  # fmt: skip
    assert master.optimizer == 120
    assert f"{ddp.total / GIB:.1f} GiB" in ddp.describe()


def test_a_model_state_that_cannot_fit_names_the_fixes() -> None:
    from rayft.training.strategies.memory import GIB, estimate_worker_memory, memory_problem

    estimate = estimate_worker_memory(total_params=7 * 10**9, trainable_params=7 * 10**9, weight_bytes=4,
                                      sharded=False, world_size=4)  # fmt: skip
    problem = memory_problem(estimate, 80 * GIB, where="GPU cuda:0 of rank 0", strategy="ddp", method="full")
    assert problem is not None
    assert problem.startswith("the model's state needs about 130.4 GiB (weights 26.1, gradients 26.1, optimizer")
    assert "optimizer step 26.1" in problem
    assert "GPU cuda:0 of rank 0 has 80.0 GiB free" in problem
    assert "train.strategy=fsdp (splits it over the workers), or train.method=lora, or a smaller model" in problem
    assert memory_problem(estimate, 200 * GIB, where="GPU", strategy="ddp", method="full") is None
    sharded = memory_problem(estimate, GIB, where="GPU", strategy="fsdp", method="lora")
    assert sharded is not None and "Use more workers (scaling.num_workers), or a smaller model." in sharded
