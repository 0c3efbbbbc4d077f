"""Source/target pairs for encoder-decoder models (T5, BART): the prompt is the encoder's input, the
response the decoder's target, and every target token is trained.

A training unit of an encoder-decoder keeps the unit schema of :mod:`rayft.data.prepared`:
``input_ids`` holds the source tokens and ``labels`` the target tokens (a sequence of its own
length, not aligned with ``input_ids``); ``num_tokens`` counts both. The model builds its decoder
input from the labels (shifted right behind its decoder start token).

The source is the text of the turns before the trained answer: rendered by the tokenizer's chat
template with the generation prompt when it has one, else their contents joined by blank lines (a
plain prompt, as T5 and BART are prompted). Both sequences end with EOS: the tokenizer's own special
tokens are added (T5's ``</s>``, BART's ``<s> ... </s>``) and EOS is appended when they hold none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rayft.data.formats import Example
from rayft.errors import DataError


@dataclass(frozen=True)
class Pair:
    """An example as an encoder input and a decoder target, both text."""

    source: str
    target: str


def source_target(example: Example, chat_text: Callable[..., str] | None) -> Pair:
    """The source and target text of ``example``. ``chat_text`` renders messages with the chat
    template (``TextTokenizer.chat_text``), or is None when the tokenizer has none."""
    if example.messages is None:
        return Pair(example.prompt, example.response)
    turns = list(example.messages)
    last = max(i for i, (role, _) in enumerate(turns) if role == "assistant")
    before = [{"role": role, "content": content} for role, content in turns[:last]]
    if chat_text is not None and before:
        source = chat_text(before, generation_prompt=True)
    else:
        source = "\n\n".join(m["content"] for m in before)
    return Pair(source, turns[last][1])


def with_eos(ids: list[int], eos: int | None) -> list[int]:
    """``ids`` ending with EOS (appended when the tokenizer's special tokens did not end it)."""
    return ids if eos is None or (ids and ids[-1] == eos) else [*ids, eos]


def fit(
    source: list[int], target: list[int], limits: tuple[int, int], overlong: str
) -> tuple[list[int], list[int], bool, str]:
    """Apply ``limits`` (max source, max target tokens) under the ``overlong`` policy:
    (source, target, truncated, over-length detail, '' when within the limits or truncated)."""
    max_source, max_target = limits
    over = [
        f"{what} {len(ids)} tokens > {name} {limit}"
        for what, ids, name, limit in (("source", source, "max_source_length", max_source),
                                       ("target", target, "max_target_length", max_target))
        if len(ids) > limit
    ]  # fmt: skip
    if not over:
        return source, target, False, ""
    if overlong != "truncate":
        return [], [], False, "; ".join(over)
    return source[:max_source], target[:max_target], True, ""


def refuse_unpaired_formats(formats: Sequence[str]) -> None:
    """DataError when a dataset's format has no source to feed an encoder (``text``)."""
    if "text" in formats:
        raise DataError(
            "format 'text' (continued pre-training) has no prompt to feed an encoder-decoder model's encoder; "
            "give the dataset prompt/response columns (alpaca, prompt_completion, template or messages) or "
            "train a causal model"
        )
