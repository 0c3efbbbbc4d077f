"""Batched generation with Hugging Face ``generate``: left padding, chat templates, stop strings.

Runs on CPU or GPU; optionally with a LoRA adapter applied on top of the base model, unmerged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rayft.config.model import ModelConfig
from rayft.generation.backend import FinishReason, Generation, Prompt, SamplingParams, truncate_at_stop

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def length_sorted_batches(lengths: Sequence[int], batch_size: int, *, sort: bool = True) -> list[list[int]]:
    """Indices of ``lengths`` in batches of ``batch_size``: longest first (ties in input order), or
    in input order without ``sort``."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)) if sort else list(range(len(lengths)))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


class HFBackend:
    """Generation with transformers on one device; load once, call ``generate`` many times."""

    def __init__(
        self,
        model: ModelConfig,
        *,
        adapter_path: str | None = None,
        device: str | None = None,
        batch_size: int = 16,
        sort_by_length: bool = True,
    ) -> None:
        import torch

        from rayft.models.loading import load_causal_lm, load_tokenizer

        self._device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._label = f"hf:{model.name}" + (f"+{adapter_path}" if adapter_path else "")
        self.tokenizer: PreTrainedTokenizerBase = load_tokenizer(model)
        self.tokenizer.padding_side = "left"
        loaded: Any = load_causal_lm(model, self._device)
        if adapter_path:
            from peft import PeftModel

            loaded = PeftModel.from_pretrained(loaded, adapter_path)
        self.model: Any = loaded.to(self._device).eval()
        self.batch_size = batch_size
        self.sort_by_length = sort_by_length  # batches of similar prompt lengths (less left padding)

    @property
    def name(self) -> str:
        """The model (and adapter) this backend generates with."""
        return self._label

    def render(self, prompt: Prompt) -> str:
        """The exact text fed to the model: chat prompts go through the chat template."""
        if isinstance(prompt, str):
            return prompt
        text = self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return str(text)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Generation]:
        """Generate for every prompt, ``batch_size`` at a time, in the order of ``prompts``.

        Batches are formed longest prompt first (:func:`length_sorted_batches`), so that a batch's
        prompts need little left padding; greedy results are the same in any order.
        """
        texts = [self.render(p) for p in prompts]
        lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
        out: list[Generation | None] = [None] * len(texts)
        for batch in length_sorted_batches(lengths, self.batch_size, sort=self.sort_by_length):
            for index, generation in zip(batch, self._generate_batch([texts[i] for i in batch], params), strict=True):
                out[index] = generation
        return [g for g in out if g is not None]

    def _generate_batch(self, texts: list[str], params: SamplingParams) -> list[Generation]:
        import torch

        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(self._device) for k, v in enc.items()}
        if params.seed is not None:
            torch.manual_seed(params.seed)
        with torch.inference_mode():
            output = self.model.generate(**enc, **self._generate_kwargs(params))
        prompt_len = enc["input_ids"].shape[1]
        eos_ids = self._eos_ids()
        results = []
        for row, ids in enumerate(output[:, prompt_len:].tolist()):
            n_prompt = int(enc["attention_mask"][row].sum())
            results.append(self._to_generation(ids, n_prompt, eos_ids, params))
        return results

    def _generate_kwargs(self, params: SamplingParams) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": sorted(self._eos_ids()),
        }
        if params.temperature > 0:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        return kwargs

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        configured = self.model.generation_config.eos_token_id
        if isinstance(configured, int):
            ids.add(configured)
        elif configured:
            ids.update(configured)
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    def _to_generation(self, ids: list[int], n_prompt: int, eos_ids: set[int], params: SamplingParams) -> Generation:
        pad = self.tokenizer.pad_token_id
        ended = next((i for i, t in enumerate(ids) if t in eos_ids), None)
        kept = ids[:ended] if ended is not None else [t for t in ids if t != pad]
        text, stopped = truncate_at_stop(str(self.tokenizer.decode(kept, skip_special_tokens=True)), params.stop)
        finish: FinishReason = "stop" if ended is not None or stopped else "length"
        n_generated = (ended + 1) if ended is not None else len(kept)
        return Generation(text, n_prompt, n_generated, finish)
