"""A saved Hugging Face model directory becomes a GGUF file that llama.cpp and Ollama load.

The file is written with the ``gguf`` package (llama.cpp's own Python writer): its ``GGUFWriter``
lays out the file, ``get_tensor_name_map`` gives llama.cpp's tensor names, ``SpecialVocab`` carries
the BPE merges, special token ids and chat template, and ``gguf.quants`` quantizes to Q8_0 / Q4_0.

Written by hand here, because llama.cpp's ``convert_hf_to_gguf.py`` is not shipped by any PyPI
package (it lives only in the llama.cpp source tree) and ``gguf`` holds the writer, not the
per-architecture conversion:

- the hyperparameters that llama.cpp reads (:func:`_add_params`);
- the rotary permutation of Llama's ``q_proj`` / ``k_proj`` rows (:func:`_permute`): Hugging Face stores
  the rotary halves split, llama.cpp's Llama ``rope`` expects them interleaved (the same reshape as the
  script); Qwen2 runs the split-halves (NeoX) rope in llama.cpp and keeps its rows;
- which pre-tokenizer regex llama.cpp applies (:func:`pre_tokenizer_name`), read from the structure of
  ``tokenizer.json`` for the families rayft supports instead of the script's table of token-id hashes;
- the token list with token types (:func:`_add_vocab`), as the script's ``get_vocab_base`` does;
- which tensors are quantized: 1-D tensors (norms) stay float32 as llama.cpp requires; rows whose
  length is not a multiple of the 32-value block stay float16; with Q4_0 the token embedding and an
  untied output head stay Q8_0, as ``llama-quantize`` keeps the embedding/output above 4 bits.

Supported: the Llama architecture (``LlamaForCausalLM``: Llama 2/3-style models without rope scaling,
SmolLM/SmolLM2, TinyLlama) and Qwen2 (``Qwen2ForCausalLM``: Qwen2/Qwen2.5, biased q/k/v, no sliding
window), with a byte-level BPE tokenizer. Anything else is refused by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rayft.errors import ConfigError

GGUF_TYPES = ("f16", "q8_0", "q4_0")
# Hugging Face architecture -> (llama.cpp's architecture name, whether q/k rows are permuted for its rope)
_ARCHITECTURES = {"LlamaForCausalLM": ("llama", True), "Qwen2ForCausalLM": ("qwen2", False)}
# Qwen2's pre-tokenizer regex (its tokenizer.json's Split pattern), which llama.cpp calls "qwen2"
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_BLOCK = 32  # values per Q8_0 / Q4_0 block


def gguf_file_name(name: str, gguf_type: str) -> str:
    """The file name the export ``name`` gets in ``gguf_type``: ``<name>-<type>.gguf``."""
    return f"{name}-{gguf_type}.gguf"


def write_gguf_exports(model_dir: Path, name: str, gguf_types: list[str]) -> list[dict[str, Any]]:
    """Write one GGUF file per type into ``model_dir`` (a saved merged model) and a Modelfile for the first."""
    from rayft.export.modelfile import write_modelfile

    written = [write_gguf(model_dir, model_dir / gguf_file_name(name, t), t, name=name) for t in gguf_types]
    write_modelfile(model_dir, written[0]["file"])
    return written


def read_hf_config(model_dir: Path) -> dict[str, Any]:
    """``config.json`` of ``model_dir``, refused unless its architecture is one this writer converts."""
    config: dict[str, Any] = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    archs = config.get("architectures") or []
    if not any(a in _ARCHITECTURES for a in archs):
        raise ConfigError(
            f"export.format gguf: {model_dir}/config.json has architectures {archs}; GGUF export supports "
            f"{list(_ARCHITECTURES)}: export format hf and convert with llama.cpp's convert_hf_to_gguf.py"
        )
    if config.get("use_sliding_window"):
        raise ConfigError(
            f"export.format gguf: {model_dir}/config.json sets use_sliding_window, which llama.cpp's qwen2 does not "
            "run; export format hf and convert with llama.cpp's convert_hf_to_gguf.py"
        )
    scaling = rope_parameters(config)
    if scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        raise ConfigError(
            f"export.format gguf: {model_dir}/config.json has rope scaling {scaling}, which this writer does not "
            "convert; export format hf and convert with llama.cpp's convert_hf_to_gguf.py"
        )
    return config


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """The rotary settings of a ``config.json``: transformers 5 writes them under ``rope_parameters``
    (with ``rope_theta``), older releases as top-level ``rope_theta`` and ``rope_scaling``."""
    params: dict[str, Any] = dict(config.get("rope_scaling") or {})
    params.update(config.get("rope_parameters") or {})
    if "rope_theta" not in params and "rope_theta" in config:
        params["rope_theta"] = config["rope_theta"]
    return params


def hf_architecture(config: dict[str, Any]) -> str:
    """The architecture of a ``config.json`` (checked by :func:`read_hf_config`) that this writer converts."""
    archs: list[str] = config.get("architectures") or []
    return next(a for a in archs if a in _ARCHITECTURES)


def pre_tokenizer_name(tokenizer_json: dict[str, Any]) -> str:
    """llama.cpp's name for the pre-tokenizer of a byte-level BPE ``tokenizer.json``.

    GPT-2's ByteLevel regex alone is ``gpt-2``; digits split one by one before it is SmolLM's
    (``smollm``); Qwen2's regex split before a regex-free ByteLevel is ``qwen2``. Others are refused
    rather than guessed: a wrong regex tokenizes silently differently.
    """
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [(s.get("type"), s.get("individual_digits"), s.get("use_regex", True)) for s in steps]
    if kinds == [("ByteLevel", None, True)]:
        return "gpt-2"
    if kinds == [("Digits", True, True), ("ByteLevel", None, True)]:
        return "smollm"
    if kinds == [("Split", None, True), ("ByteLevel", None, False)]:
        split = steps[0]
        if split.get("pattern") == {"Regex": QWEN2_PATTERN} and split.get("behavior") == "Isolated":
            return "qwen2"
    raise ConfigError(
        f"export.format gguf: the tokenizer's pre_tokenizer {pre} is not one this writer knows (GPT-2 byte-level, "
        "SmolLM, Qwen2); export format hf and convert with llama.cpp's convert_hf_to_gguf.py"
    )


def _permute(weights: Any, n_head: int) -> Any:
    """Reorder the rows of a q/k projection from Hugging Face's split rotary halves to llama.cpp's interleaved pairs."""
    rows = weights.shape[0]
    return weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def _add_params(writer: Any, config: dict[str, Any], file_type: int) -> None:
    """The shape and rope of the model, under the keys llama.cpp reads for its architecture."""
    n_head = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(config.get("num_key_value_heads") or n_head)
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
    writer.add_rope_freq_base(float(rope_parameters(config).get("rope_theta", 10000.0)))
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(file_type)


def _add_vocab(writer: Any, model_dir: Path, vocab_size: int) -> str:
    """Token list, token types, merges, special ids and chat template; returns the pre-tokenizer name."""
    import gguf
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    pre = pre_tokenizer_name(json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8")))
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        if i not in by_id:  # the embedding is padded past the tokenizer: llama.cpp needs a name per row
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=vocab_size)
    if special.chat_template is None:  # older gguf releases read no chat_template.jinja
        special.chat_template = tokenizer.chat_template
    # Stated, not left to llama.cpp's per-vocabulary default: whether a plain encoding starts with BOS
    # (SmolLM2's and rayft's tokenizers add none) and ends with EOS, as the Hugging Face tokenizer does.
    plain = tokenizer("a")["input_ids"]
    special.add_special_token["bos"] = tokenizer.bos_token_id is not None and plain[:1] == [tokenizer.bos_token_id]
    special.add_special_token["eos"] = tokenizer.eos_token_id is not None and plain[-1:] == [tokenizer.eos_token_id]
    special.add_to_gguf(writer, quiet=True)
    return pre


def _state_dict(model_dir: Path) -> Iterator[tuple[str, Any]]:
    """(name, float32 numpy array) for every tensor of the safetensors files in ``model_dir``."""
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"export.format gguf: {model_dir} holds no .safetensors weights")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, f.get_tensor(name).float().numpy()


def _encode(name: str, data: Any, gguf_type: str) -> tuple[Any, Any]:
    """The array to write for tensor ``name`` and its GGML type under ``gguf_type``."""
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    if data.ndim == 1:  # norms and biases: llama.cpp reads them as float32
        return data.astype(np.float32), T.F32
    qtype = {"f16": T.F16, "q8_0": T.Q8_0, "q4_0": T.Q4_0}[gguf_type]
    if qtype == T.Q4_0 and name in ("token_embd.weight", "output.weight"):
        qtype = T.Q8_0
    if qtype == T.F16 or data.shape[-1] % _BLOCK:
        return data.astype(np.float16), T.F16
    return quants.quantize(data.astype(np.float32), qtype), qtype


def _add_tensors(writer: Any, model_dir: Path, config: dict[str, Any], gguf_type: str) -> dict[str, int]:
    """Every weight under llama.cpp's name and layout, encoded for ``gguf_type``; how many of each GGML type."""
    import gguf

    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head
    arch, permute = _ARCHITECTURES[hf_architecture(config)]
    model_arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(model_arch, config["num_hidden_layers"])
    counts: dict[str, int] = {}
    for hf_name, weights in _state_dict(model_dir):
        if config.get("tie_word_embeddings") and hf_name == "lm_head.weight":
            continue  # llama.cpp uses token_embd when output.weight is absent
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConfigError(f"export.format gguf: {model_dir} has tensor {hf_name!r} that llama.cpp has no name for")
        data = weights
        if permute and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            data = _permute(weights, n_head)
        elif permute and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            data = _permute(weights, n_kv)
        array, qtype = _encode(name, data, gguf_type)
        writer.add_tensor(name, array, raw_dtype=qtype)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    return counts


def write_gguf(model_dir: Path, out_path: Path, gguf_type: str, *, name: str | None = None) -> dict[str, Any]:
    """Write the model saved in ``model_dir`` as GGUF ``gguf_type`` to ``out_path``; what was written."""
    import gguf

    if gguf_type not in GGUF_TYPES:
        raise ConfigError(f"export.gguf_types: {gguf_type!r} is not one of {list(GGUF_TYPES)}")
    config = read_hf_config(model_dir)
    file_type = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}.get(
        gguf_type, gguf.LlamaFileType.MOSTLY_Q4_0
    )
    writer = gguf.GGUFWriter(str(out_path), _ARCHITECTURES[hf_architecture(config)][0])
    writer.add_name(name or model_dir.name)
    _add_params(writer, config, int(file_type))
    pre = _add_vocab(writer, model_dir, config["vocab_size"])
    counts = _add_tensors(writer, model_dir, config, gguf_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    arch = _ARCHITECTURES[hf_architecture(config)][0]
    size = out_path.stat().st_size
    return {"file": out_path.name, "type": gguf_type, "bytes": size, "arch": arch, "pre": pre, "tensors": counts}
