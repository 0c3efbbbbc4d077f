"""The torch side of export verification: probe logits, adapter loading checks, reload and generate."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayft.errors import CheckpointError


def probe_batch(tokenizer: Any, prompts: Sequence[str]) -> dict[str, Any]:
    """Probe inputs: each prompt rendered with the chat template, left-padded into one batch. A
    tokenizer without a chat template (an encoder-decoder's, such as T5's) takes the prompts as plain
    text with its special tokens, right-padded as an encoder's input is. The tokenizer is left as it
    was: it is saved beside the export afterwards."""
    side = tokenizer.padding_side
    try:
        if not getattr(tokenizer, "chat_template", None):
            tokenizer.padding_side = "right"
            return dict(tokenizer(list(prompts), return_tensors="pt", padding=True))
        chats = [[{"role": "user", "content": p}] for p in prompts]
        texts = [str(tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)) for c in chats]
        tokenizer.padding_side = "left"
        return dict(tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False))
    finally:
        # A padded call switches padding on in the fast backend, and save_pretrained writes that into
        # tokenizer.json: every later encode of the exported tokenizer would pad (training data included).
        tokenizer.padding_side = side
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            backend.no_padding()


def is_encoder_decoder(model: Any) -> bool:
    """Whether ``model`` (or the base model of a PEFT wrapper) is an encoder-decoder."""
    return bool(getattr(model.config, "is_encoder_decoder", False))


def probe_logits(model: Any, batch: dict[str, Any]) -> Any:
    """Logits (in float64, whatever the model's dtype) of every non-padding position of the probe batch
    (an encoder-decoder's decoder is fed the probe tokens too, so that both halves are compared)."""
    import torch

    extra = {"decoder_input_ids": batch["input_ids"]} if is_encoder_decoder(model) else {}
    with torch.inference_mode():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **extra).logits
    return logits.double()[batch["attention_mask"].bool()]


def model_class_of(directory: Path) -> Any:
    """The transformers auto class that loads the model saved in ``directory``: AutoModelForSeq2SeqLM
    for an encoder-decoder, AutoModelForCausalLM otherwise."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    return AutoModelForSeq2SeqLM if config.get("is_encoder_decoder") else AutoModelForCausalLM


def max_abs_diff(a: Any, b: Any) -> float:
    """The largest absolute difference of two logit tensors."""
    return float((a - b).abs().max())


def check_loaded_adapter(peft_model: Any, adapter_dir: Path) -> None:
    """Raise unless every tensor of the adapter file was loaded into the model unchanged.

    PEFT only warns when keys do not match its modules; an adapter that silently failed to load
    would then merge into nothing.
    """
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    on_disk = load_file(str(adapter_dir / "adapter_model.safetensors"))
    loaded = {k: v.detach().cpu() for k, v in get_peft_model_state_dict(peft_model).items()}
    missing = sorted(set(on_disk) - set(loaded))
    if missing:
        raise CheckpointError(
            f"{adapter_dir}: {len(missing)} adapter tensors match no module of the base model (e.g. {missing[0]}); "
            "the adapter belongs to another base model"
        )
    changed = [k for k, v in on_disk.items() if not torch.equal(loaded[k].to(v.dtype), v)]
    if changed:
        raise CheckpointError(
            f"{adapter_dir}: {len(changed)} adapter tensors did not load as saved (e.g. {changed[0]})"
        )


def eos_ids(directory: Path, tokenizer: Any) -> list[int]:
    """The EOS ids generation stops at: generation_config.json's, plus the tokenizer's."""
    ids: set[int] = set()
    path = directory / "generation_config.json"
    if path.is_file():
        configured = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
        ids.update([configured] if isinstance(configured, int) else list(configured or []))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def end_of_turn_id(tokenizer: Any) -> int | None:
    """The token that ends an assistant turn in the chat template (``<|im_end|>``, ``<|eot_id|>``, ...);
    None without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    rendered = str(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], tokenize=False
        )
    )
    tail = rendered.rsplit("y", maxsplit=1)[-1]
    for token, token_id in sorted(tokenizer.get_added_vocab().items(), key=lambda kv: -len(kv[0])):
        if token and token in tail:
            return int(token_id)
    return None


def generate_check(model: Any, tokenizer: Any, prompt: str, eos: Sequence[int], max_new_tokens: int = 16) -> str:
    """Greedy generation from the reloaded export; returns the text (raises if nothing comes out)."""
    import torch

    batch = probe_batch(tokenizer, [prompt])
    with torch.inference_mode():
        out = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=list(eos),
            pad_token_id=tokenizer.pad_token_id,
        )
    # A causal LM's output continues the prompt; an encoder-decoder's is the decoder's, after its start token.
    new = out[0, 1 if is_encoder_decoder(model) else batch["input_ids"].shape[1] :].tolist()
    if not new:
        raise CheckpointError("the exported model generated no token for the probe prompt")
    return str(tokenizer.decode(new, skip_special_tokens=True))
