"""The torch side of export verification: probe logits, adapter loading checks, reload and generate."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayft.errors import CheckpointError


def probe_batch(tokenizer: Any, prompts: Sequence[str]) -> dict[str, Any]:
    """Probe inputs: each prompt rendered with the chat template, left-padded into one batch."""
    texts = [
        str(tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True))
        for p in prompts
    ]
    tokenizer.padding_side = "left"
    return dict(tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False))


def probe_logits(model: Any, batch: dict[str, Any]) -> Any:
    """Logits (in float64, whatever the model's dtype) of every non-padding position of the probe batch."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return logits.double()[batch["attention_mask"].bool()]


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
    """The token that ends an assistant turn in the chat template (``<|im_end|>``, ``<|eot_id|>``, ...)."""
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
    new = out[0, batch["input_ids"].shape[1] :].tolist()
    if not new:
        raise CheckpointError("the exported model generated no token for the probe prompt")
    return str(tokenizer.decode(new, skip_special_tokens=True))
