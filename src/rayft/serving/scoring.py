"""Prompt scoring for ``echo`` requests: each prompt token's log-probability by one forward pass.

lm-evaluation-harness's log-likelihood tasks (and any client computing a perplexity) send a
completions request with ``echo: true``, ``logprobs: N`` and ``max_tokens`` 0 or 1: they need
``log p(token_i | tokens_<i)`` for every prompt token, which decoding never computes. One forward
pass over the prompt gives them all, and the next token's distribution: lm-eval asks for one
token more, which costs nothing further. A longer greedy continuation takes one more pass over the
whole sequence per token, without a KV cache: such requests are rare and short, and plain forward
passes keep this exact and independent of each model's cache API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rayft.serving.logprobs import TokenLogprob

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Scored:
    """A scored prompt and its greedy continuation.

    Attributes:
        prompt_text: The prompt's text (its token ids decoded).
        text: The continuation's text (without an end-of-sequence token).
        prompt: One entry per prompt token; the first has no log-probability.
        completion: One entry per continued token, an end-of-sequence token included.
        finish_reason: ``"stop"`` when the continuation reached an end-of-sequence token, else ``"length"``.
    """

    prompt_text: str
    text: str
    prompt: list[TokenLogprob]
    completion: list[TokenLogprob]
    finish_reason: str


def score_tokens(
    model: Any,
    ids: list[int],
    *,
    decode: Callable[[list[int]], str],
    top_n: int,
    new_tokens: int = 0,
    eos: frozenset[int] = frozenset(),
    forward_kwargs: dict[str, Any] | None = None,
) -> Scored:
    """Score ``ids`` with a causal LM and continue them greedily by ``new_tokens`` tokens.

    Args:
        model: A transformers causal LM (or a PEFT model around one) in eval mode.
        ids: The prompt's token ids (at least one).
        decode: The text of token ids (the tokenizer's ``decode``).
        top_n: How many alternatives each scored token lists (0: none).
        new_tokens: Tokens to continue by, greedily, stopping early at an end-of-sequence token.
        eos: The end-of-sequence token ids.
        forward_kwargs: Extra arguments of each forward pass (PEFT's ``adapter_names``).
    """
    import torch

    extra = forward_kwargs or {}

    def one(token: int) -> str:
        return decode([token])

    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids], device=model.device), use_cache=False, **extra)
        logits = out.logits[0].float()
        prompt = [TokenLogprob(one(ids[0]), ids[0], None, [])]
        prompt += [_entry(logits[i - 1], ids[i], top_n, one) for i in range(1, len(ids))]
        completion: list[TokenLogprob] = []
        last, sequence = logits[-1], list(ids)
        while len(completion) < new_tokens:
            token = int(last.argmax())
            completion.append(_entry(last, token, top_n, one))
            if token in eos:
                break
            sequence.append(token)
            if len(completion) < new_tokens:
                out = model(input_ids=torch.tensor([sequence], device=model.device), use_cache=False, **extra)
                last = out.logits[0, -1].float()
    stopped = bool(completion) and completion[-1].token_id in eos
    kept = [t.token_id for t in completion if t.token_id not in eos]
    return Scored(decode(ids), decode(kept), prompt, completion, "stop" if stopped else "length")


def _entry(logits: torch.Tensor, token: int, top_n: int, decode: Callable[[int], str]) -> TokenLogprob:
    """The token's log-probability under ``logits`` (one position's), with the ``top_n`` most likely."""
    import torch

    total = torch.logsumexp(logits, dim=-1)
    top: list[tuple[str, float]] = []
    if top_n:
        values, indices = torch.topk(logits, top_n)
        top = [(decode(int(i)), float(v - total)) for v, i in zip(values, indices, strict=True)]
    return TokenLogprob(decode(token), token, float(logits[token] - total), top)
