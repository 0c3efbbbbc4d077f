"""Batched generation with Hugging Face ``generate``: left padding, chat templates, stop strings.

Runs on CPU or GPU; optionally with a LoRA adapter applied on top of the base model, unmerged.
Encoder-decoder models (T5, BART: ``is_encoder_decoder`` in their config) are loaded with
``AutoModelForSeq2SeqLM``: the prompt goes to the encoder (right-padded, with the tokenizer's
special tokens, as in training) and the output is the decoder's tokens after its start token.
A decoder-only model can decode with a static KV cache and a compiled step (:mod:`rayft.generation.kv_cache`).
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rayft.config.generation import CompileSetting, KVCacheSetting
from rayft.config.model import ModelConfig
from rayft.data.tokenize import render_chat
from rayft.generation.backend import (
    FinishReason,
    Generation,
    Prompt,
    SamplingParams,
    StopFilter,
    prompt_tools,
    truncate_at_stop,
)
from rayft.generation.kv_cache import cache_length, filled_batch, plan_cache
from rayft.models.architecture import context_tokens, resolve_architecture
from rayft.models.loading import load_causal_lm, load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def length_sorted_batches(lengths: Sequence[int], batch_size: int, *, sort: bool = True) -> list[list[int]]:
    """Indices of ``lengths`` in batches of ``batch_size``: longest first (ties in input order), or
    in input order without ``sort``."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)) if sort else list(range(len(lengths)))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def is_encoder_decoder(model: ModelConfig) -> bool:
    """Whether ``model`` is an encoder-decoder (``AutoModelForSeq2SeqLM``) model: ``model.architecture``,
    or, when 'auto', ``is_encoder_decoder`` in its config (:func:`rayft.models.architecture.resolve_architecture`)."""
    return resolve_architecture(model) == "seq2seq"


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
        kv_cache: KVCacheSetting = "dynamic",
        compile: CompileSetting = False,
    ) -> None:
        import torch

        self._device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._label = f"hf:{model.name}" + (f"+{adapter_path}" if adapter_path else "")
        self.tokenizer: PreTrainedTokenizerBase = load_tokenizer(model)
        self.encoder_decoder = is_encoder_decoder(model)
        # A decoder-only model continues the prompt, so prompts are padded on the left; an encoder
        # reads the whole prompt under its attention mask, and T5-style models are trained right-padded.
        self.tokenizer.padding_side = "right" if self.encoder_decoder else "left"
        loaded: Any = load_causal_lm(model, self._device)  # AutoModelForSeq2SeqLM for an encoder-decoder
        compilable = bool(getattr(loaded, "_can_compile_fullgraph", False))  # the model class says so
        if adapter_path:
            from peft import PeftModel

            loaded = PeftModel.from_pretrained(loaded, adapter_path)
        self.model: Any = loaded.to(self._device).eval()
        self.batch_size = batch_size
        self.sort_by_length = sort_by_length  # batches of similar prompt lengths (less left padding)
        self._device_type = torch.device(self._device).type
        self.cache = plan_cache(
            kv_cache, compile, self._device_type, encoder_decoder=self.encoder_decoder, compilable=compilable
        )

    @property
    def name(self) -> str:
        """The model (and adapter) this backend generates with."""
        return self._label

    def render(self, prompt: Prompt, chat_template: str | None = None, tools: Sequence[Mapping[str, Any]] = ()) -> str:
        """The exact text fed to the model: chat prompts go through the chat template (``chat_template``,
        else the tokenizer's) with training's own rendering (:func:`rayft.data.tokenize.render_chat`, with
        the OpenAI function schemas ``tools``, else those a :class:`ToolChat` carries), or, for a model
        without one (T5, BART), their contents joined by blank lines, as such models are trained."""
        if isinstance(prompt, str):
            return prompt
        template = chat_template or (self.tokenizer.get_chat_template() if self.tokenizer.chat_template else None)
        if template is None:
            return "\n\n".join(str(message.get("content", "")) for message in prompt)
        special = self.tokenizer.special_tokens_map
        return render_chat(template, special, prompt, tools=tools or prompt_tools(prompt), generation_prompt=True)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Generation]:
        """Generate for every prompt, ``batch_size`` at a time, in the order of ``prompts``.

        Batches are formed longest prompt first (:func:`length_sorted_batches`), so that a batch's
        prompts need little left padding; greedy results are the same in any order.
        """
        texts = [self.render(p) for p in prompts]
        lengths = [len(ids) for ids in self.encode(texts)] if texts else []
        out: list[Generation | None] = [None] * len(texts)
        for batch in length_sorted_batches(lengths, self.batch_size, sort=self.sort_by_length):
            for index, generation in zip(batch, self._generate_batch([texts[i] for i in batch], params), strict=True):
                out[index] = generation
        return [g for g in out if g is not None]

    def count_tokens(self, prompt: Prompt) -> int:
        """Tokens of the rendered prompt."""
        return len(self.encode([self.render(prompt)])[0])

    def context_tokens(self) -> int | None:
        """The longest sequence the model takes (prompt and completion), when its config says."""
        return context_tokens(self.model.config.to_dict())

    def stream(self, prompt: Prompt, params: SamplingParams, stop: threading.Event) -> Generator[str, None, None]:
        """Generate for one prompt, yielding the text as it is decoded (without stop sequences).

        Generation runs on a thread; setting ``stop`` (or closing the iterator) ends it after the
        current token. An error of the generation thread is raised here. One interactive prompt
        decodes with the dynamic cache, whatever the backend's cache plan.
        """
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return torch.full((input_ids.shape[0],), stop.is_set(), dtype=torch.bool, device=input_ids.device)

        enc = self.tokenizer.pad({"input_ids": self.encode([self.render(prompt)])}, return_tensors="pt")
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        kwargs = {**{k: v.to(self._device) for k, v in enc.items()}, **self.generate_kwargs(params)}
        kwargs.update(streamer=streamer, stopping_criteria=StoppingCriteriaList([_Stop()]))
        failure: list[BaseException] = []
        thread = threading.Thread(target=self._generate_into, args=(kwargs, params.seed, failure), daemon=True)
        thread.start()
        shown = StopFilter(params.stop)
        try:
            for piece in streamer:
                yield shown.feed(piece)
                if shown.stopped:
                    break
            yield shown.flush()
        finally:
            stop.set()
            thread.join()
        if failure:
            raise failure[0]

    def _generate_into(self, kwargs: dict[str, Any], seed: int | None, failure: list[BaseException]) -> None:
        import torch

        try:
            if seed is not None:
                torch.manual_seed(seed)
            with torch.inference_mode():
                self.model.generate(**kwargs)
        except BaseException as exc:  # handed to the reading thread, which raises it
            failure.append(exc)
            kwargs["streamer"].end()

    def _generate_batch(self, texts: list[str], params: SamplingParams) -> list[Generation]:
        import torch

        count = len(texts)
        ids = self.encode(filled_batch(texts, self.batch_size) if self.cache.compile else texts)
        padded = self.tokenizer.pad({"input_ids": ids}, return_tensors="pt")
        enc = {k: v.to(self._device) for k, v in padded.items()}
        cache = self._cache_kwargs(max(len(row) for row in ids), params.max_new_tokens)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        with torch.inference_mode():
            output = self.model.generate(**enc, **self.generate_kwargs(params), **cache)
        # generate returns the prompt then the new tokens for a decoder-only model, and the decoder
        # start token then the new tokens for an encoder-decoder one.
        prompt_len = 1 if self.encoder_decoder else enc["input_ids"].shape[1]
        eos_ids = self.eos_ids()
        results = []
        for row, generated in enumerate(output[:count, prompt_len:].tolist()):
            n_prompt = int(enc["attention_mask"][row].sum())
            results.append(self._to_generation(generated, n_prompt, eos_ids, params))
        return results

    def _cache_kwargs(self, longest_prompt: int, max_new_tokens: int) -> dict[str, Any]:
        """``generate`` arguments of the cache plan: nothing for the dynamic cache; a static cache of a
        bucketed length, and the compilation switched on or off explicitly (transformers compiles a
        static cache's step on CUDA by default)."""
        if not self.cache.static:
            return {}
        kwargs: dict[str, Any] = {
            "cache_implementation": "static",
            "max_cache_len": cache_length(longest_prompt, max_new_tokens),
        }
        if not self.cache.compile:
            return {**kwargs, "disable_compile": True}
        from transformers import CompileConfig

        config = CompileConfig()
        if self._device_type != "cuda":
            # transformers compiles only on accelerators unless this private flag is set
            # (tests/unit/test_generation_cache.py fails if compilation stops happening on CPU).
            config._compile_all_devices = True  # type: ignore[assignment]
        return {**kwargs, "compile_config": config}

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of prompts: as they are for a decoder-only model (a chat template adds its own
        special tokens); for an encoder-decoder, with the tokenizer's special tokens and ending with
        EOS, as its training sources are."""
        ids: list[list[int]] = self.tokenizer(texts, add_special_tokens=self.encoder_decoder)["input_ids"]
        eos = self.tokenizer.eos_token_id
        if not self.encoder_decoder or eos is None:
            return ids
        return [row if row and row[-1] == eos else [*row, eos] for row in ids]

    def generate_kwargs(self, params: SamplingParams) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": sorted(self.eos_ids()),
        }
        if params.temperature > 0:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        return kwargs

    def eos_ids(self) -> set[int]:
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
