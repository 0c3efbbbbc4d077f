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
}  # fmt: skip


def architecture_config(name: str, **overrides: Any) -> Any:
    """The transformers config of the named architecture (see :data:`ARCHITECTURES`)."""
    import transformers

    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; choose one of {', '.join(ARCHITECTURES)}")
    class_name, arguments = ARCHITECTURES[name]
    return getattr(transformers, class_name)(**{**arguments, **overrides})


def random_model(name: str, *, dtype: Any, device: Any, attn_implementation: str = "sdpa", seed: int = 0) -> Any:
    """A random-initialised causal LM of the named architecture, built directly on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = architecture_config(name)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)  # type: ignore[no-untyped-call]


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
