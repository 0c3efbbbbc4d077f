"""GSM8K as lm-evaluation-harness scores it: prompt format, answer extraction, normalisation.

The harness's ``gsm8k`` task prompts with ``Question: {question}\\nAnswer:``, joins few-shot
examples with a blank line, stops at ``Question:``, and reads two answers from each output:

- strict: the first ``#### <number>`` (``#### (\\-?[0-9\\.\\,]+)``), the format GSM8K teaches;
- flexible: the last number in the output (``(-?[$0-9.,]{2,})|(-?[0-9]+)``), which instruct
  models that never print ``####`` still get credit for.

Both the extracted answer and the reference then lose commas, ``$``, everything up to
``#### `` and a trailing ``.``, and are compared case-insensitively. Outputs with no match
score as ``[invalid]``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rayft.generation.backend import Prompt

INVALID = "[invalid]"
STOP_SEQUENCES = ("Question:",)
FEWSHOT_DELIMITER = "\n\n"
TARGET_DELIMITER = " "

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORE = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))


def question_text(question: str) -> str:
    """The harness's prompt for one question."""
    return f"Question: {question}\nAnswer:"


def build_prompt(
    question: str,
    fewshot: Sequence[tuple[str, str]] = (),
    *,
    chat: bool = False,
    system_prompt: str | None = None,
) -> Prompt:
    """The prompt for ``question`` after the solved ``fewshot`` (question, answer) pairs.

    As raw text, examples are joined by a blank line; as a chat, each example is a user turn
    and an assistant turn (what the harness does with ``--apply_chat_template``).
    """
    if not chat:
        shots = [f"{question_text(q)}{TARGET_DELIMITER}{a}" for q, a in fewshot]
        return FEWSHOT_DELIMITER.join([*shots, question_text(question)])
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for q, a in fewshot:
        messages += [{"role": "user", "content": question_text(q)}, {"role": "assistant", "content": a}]
    return [*messages, {"role": "user", "content": question_text(question)}]


def _select(matches: list[str | tuple[str, ...]], index: int) -> str:
    if not matches:
        return INVALID
    match = matches[index]
    if isinstance(match, tuple):
        groups = [g for g in match if g]
        return groups[0].strip() if groups else INVALID
    return match.strip()


def extract_strict(output: str) -> str:
    """The number after the first ``####`` of the output, or ``[invalid]``."""
    return _select(STRICT.findall(output), 0)


def extract_flexible(output: str) -> str:
    """The last number of the output, or ``[invalid]``."""
    return _select(FLEXIBLE.findall(output), -1)


def normalize(text: str) -> str:
    """Drop commas, ``$``, everything up to ``#### `` and a trailing ``.``; lower-case."""
    for pattern in _IGNORE:
        text = pattern.sub("", text)
    return text.lower()


def reference_answer(answer: str) -> str:
    """The final answer of a GSM8K reference solution (the text after ``#### ``), normalised."""
    return normalize(answer).strip()


def is_correct(extracted: str, reference: str) -> bool:
    """Whether an extracted answer matches the reference solution's final answer."""
    return extracted != INVALID and normalize(extracted) == normalize(reference)
