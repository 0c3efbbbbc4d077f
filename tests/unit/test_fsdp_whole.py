"""FSDP2's units gathered whole for sampling (:func:`rayft.training.strategies.gathered.fsdp_whole`), in a
process group of one (gloo, in this process): inside, every parameter is a whole plain tensor, so the
forwards of ``generate`` gather nothing; after, the units are sharded again and training goes on. That two
workers sample and train as DDP does is tests/integration/test_train_rl_sharded.py's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def group_of_one(tmp_path: Any) -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def tiny_lora_model(seed: int) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    return get_peft_model(LlamaForCausalLM(config), LoraConfig(r=2, target_modules=["q_proj"]))


def sharded(model: Any) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1,))
    for block in model.base_model.model.model.layers:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def test_sampling_inside_the_gathered_units_runs_on_whole_weights_and_training_goes_on(group_of_one: None) -> None:
    import torch
    from torch.distributed.tensor import DTensor

    from rayft.training.strategies.gathered import fsdp_whole

    plain, model = tiny_lora_model(0), sharded(tiny_lora_model(0))
    prompt = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        want = plain.generate(input_ids=prompt, do_sample=False, max_new_tokens=6, pad_token_id=0)
        with fsdp_whole(model):
            assert not any(isinstance(p, DTensor) for p in model.parameters())
            got = model.generate(input_ids=prompt, do_sample=False, max_new_tokens=6, pad_token_id=0)
    assert got.equal(want)
    assert all(isinstance(p, DTensor) for p in model.parameters())  # sharded again
    for net in (plain, model):  # a training step after sampling: the same loss and gradients
        net(input_ids=prompt, labels=prompt).loss.backward()
    grads = {n: p.grad for n, p in plain.named_parameters() if p.requires_grad}
    for name, param in model.named_parameters():
        if param.requires_grad:
            # One rank: the same float32 operations in the same order, so the gradients are equal bitwise.
            assert param.grad.full_tensor().equal(grads[name]), name
