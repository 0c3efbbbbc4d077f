"""Named model architectures, built from their published hyper-parameters with random weights and
no download: for benchmarks and GPU tests that need a real model's shapes, not its weights."""

from __future__ import annotations

from typing import Any

# transformers config class, then its arguments (from each model's published config.json).
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-1.5b": ("Qwen2Config", {
        "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
        "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    }),
    "llama-3.2-1b": ("LlamaConfig", {
        "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
        "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    }),
    "smollm2-135m": ("LlamaConfig", {
        "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
        "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
    }),
    # Qwen2's shapes scaled down (GQA, biased q/k/v, tied head): seconds on a CPU, for smoke runs and tests.
    "qwen2-tiny": ("Qwen2Config", {
        "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    }),
    # Encoder-decoders (T5: gated-GELU feed-forward wi_0/wi_1 in v1.1 and Flan-T5; plain ReLU wi in the original).
    "t5-v1.1-base": ("T5Config", {
        "vocab_size": 32128, "d_model": 768, "d_kv": 64, "d_ff": 2048, "num_layers": 12, "num_decoder_layers": 12,
        "num_heads": 12, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
        "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1,
    }),
    "t5-3b": ("T5Config", {
        "vocab_size": 32128, "d_model": 1024, "d_kv": 128, "d_ff": 16384, "num_layers": 24, "num_decoder_layers": 24,
        "num_heads": 32, "feed_forward_proj": "relu", "tie_word_embeddings": True,
        "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1,
    }),
    "t5-11b": ("T5Config", {
        "vocab_size": 32128, "d_model": 1024, "d_kv": 128, "d_ff": 65536, "num_layers": 24, "num_decoder_layers": 24,
        "num_heads": 128, "feed_forward_proj": "relu", "tie_word_embeddings": True,
        "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1,
    }),
    # T5 v1.1's shapes scaled down: seconds on a CPU.
    "t5-tiny": ("T5Config", {
        "vocab_size": 4096, "d_model": 128, "d_kv": 32, "d_ff": 256, "num_layers": 2, "num_decoder_layers": 2,
        "num_heads": 4, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
        "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1,
    }),
}  # fmt: skip


def architecture_config(name: str, **overrides: Any) -> Any:
    """The transformers config of the named architecture (see :data:`ARCHITECTURES`)."""
    import transformers

    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; choose one of {', '.join(ARCHITECTURES)}")
    class_name, arguments = ARCHITECTURES[name]
    return getattr(transformers, class_name)(**{**arguments, **overrides})


def random_model(name: str, *, dtype: Any, device: Any, attn_implementation: str = "sdpa", seed: int = 0) -> Any:
    """A random-initialised model of the named architecture (a causal LM, or an encoder-decoder for
    the T5 entries), built directly on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    torch.manual_seed(seed)
    config = architecture_config(name)
    auto: Any = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    with torch.device(device):
        return auto.from_config(config, dtype=dtype, attn_implementation=attn_implementation)


def linear_parameters(model: Any) -> int:
    """Parameters of every linear layer, the output head included (tied or not): the ``N`` of the
    ``6N`` FLOPs per token of training (embedding lookups and norms do no matrix products)."""
    import torch

    net = getattr(model, "module", model)
    base = net.get_base_model() if hasattr(net, "get_base_model") else net
    seen: set[int] = set()
    total = 0
    for module in base.modules():
        if type(module) is torch.nn.Linear and id(module.weight) not in seen:
            seen.add(id(module.weight))
            total += module.weight.numel()
    head = base.get_output_embeddings()
    if head is not None and id(head.weight) not in seen:  # a PEFT-wrapped head
        total += head.weight.numel()
    return total
