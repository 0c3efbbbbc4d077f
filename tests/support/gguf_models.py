"""Tiny model directories for the GGUF export tests beyond rayft's tiny Llama: a Qwen2 (biased q/k/v,
split-halves rope) and tokenizers with the other pre-tokenizers the writer names (SmolLM's, Qwen2's),
built offline in a second."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rayft.export.gguf_file import QWEN2_PATTERN


def _as_json(pre: Any) -> dict[str, Any]:
    state = pre.__getstate__()
    loaded: dict[str, Any] = json.loads(state if isinstance(state, str) else state.decode())
    return loaded


def qwen2_pre_tokenizer() -> dict[str, Any]:
    """Qwen2's pre-tokenizer as its tokenizer.json holds it (serialised by the tokenizers library)."""
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated")
    return _as_json(pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))


def smollm_pre_tokenizer() -> dict[str, Any]:
    """SmolLM's pre-tokenizer: digits one by one, then GPT-2's byte-level regex."""
    from tokenizers import pre_tokenizers

    digits = pre_tokenizers.Digits(individual_digits=True)
    return _as_json(pre_tokenizers.Sequence([digits, pre_tokenizers.ByteLevel(add_prefix_space=False)]))


def with_pre_tokenizer(model_dir: Path, out_dir: Path, pre_tokenizer: dict[str, Any]) -> Path:
    """A copy of ``model_dir`` whose tokenizer splits text with ``pre_tokenizer`` (same vocabulary and merges)."""
    shutil.copytree(model_dir, out_dir)
    path = out_dir / "tokenizer.json"
    tokenizer = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps(tokenizer | {"pre_tokenizer": pre_tokenizer}), encoding="utf-8")
    return out_dir


def tiny_family(name: str, tiny_model_dir: Path, out_dir: Path) -> Path:
    """A tiny model directory of ``name``: ``llama`` (rayft's tiny Llama, GPT-2 pre-tokenizer),
    ``llama-smollm`` (the same under SmolLM's pre-tokenizer) or ``qwen2`` (a Qwen2 with Qwen2's)."""
    if name == "llama":
        return Path(shutil.copytree(tiny_model_dir, out_dir))
    if name == "llama-smollm":
        return with_pre_tokenizer(tiny_model_dir, out_dir, smollm_pre_tokenizer())
    tokenizer = with_pre_tokenizer(
        tiny_model_dir, out_dir.with_name(out_dir.name + "-tokenizer"), qwen2_pre_tokenizer()
    )
    return build_tiny_qwen2(tokenizer, out_dir)


def build_tiny_qwen2(tokenizer_dir: Path, out_dir: Path, *, seed: int = 0, tied: bool = True) -> Path:
    """A random 2-layer Qwen2 (``qwen2-tiny``'s shape, narrowed) with the tokenizer of ``tokenizer_dir``;
    its q/k/v biases random too (Hugging Face starts them at zero), so that their conversion is seen."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from rayft.testing.architectures import architecture_config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = architecture_config(
        "qwen2-tiny",
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        max_position_embeddings=2048,
        tie_word_embeddings=tied,
    )
    config.eos_token_id = tokenizer.eos_token_id
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("_proj.bias"):
                parameter.normal_(std=0.5)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
