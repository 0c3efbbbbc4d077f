"""The weights a GRPO trainer sends its generation actors: a full fine-tune's are its state dict, read from the
modules (FSDP answers ``state_dict()`` with its shards, so a gathered model's are read this way)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("lora", [False, True])
def test_a_full_weight_update_holds_the_state_dict_read_from_the_modules(*, lora: bool) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from rayft.training.methods.rl.rollout_actors import policy_weights

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    model: torch.nn.Module = LlamaForCausalLM(config)
    if lora:
        model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    want, got = model.state_dict(), policy_weights(model, "full", 3).tensors
    assert list(got) == list(want)  # tied embeddings under both names, non-persistent buffers left out
    assert all(got[name].equal(tensor) for name, tensor in want.items())
