"""Preference rows: a prompt, a chosen and a rejected response, turned into two tokenized rows that
share the prompt, with the loss on each response alone.

The shapes users bring:

- ``prompt`` + ``chosen`` + ``rejected``, each a string or chat messages (TRL's "conversational"
  form: the prompt's turns, and each response as its assistant turn(s));
- ``chosen`` + ``rejected`` alone, each a whole conversation (UltraFeedback, Anthropic HH in chat
  form): the prompt is the turns the two share, the response what follows.

A row that cannot be a pair is rejected with a reason (``formats.REASONS``), like any other bad row: a missing or empty
side, a value of the wrong type, two identical responses, two conversations with no shared prompt.

Truncation keeps the end of the prompt (what the responses answer) and cuts the responses last:
the prompt is shortened from the left to what leaves room for the longer response, but never below
``max_prompt_length`` tokens; then both responses are cut to the room left.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rayft.config.data import DatasetConfig
from rayft.data.formats import UNREADABLE_COLUMN, BadRowError, Example, ResolvedFormat, parse_turns
from rayft.data.prepared import IGNORE_INDEX
from rayft.data.tokenize import Rendered, TextTokenizer, TokenizeJob, label_tokens, render
from rayft.errors import DataError

if TYPE_CHECKING:
    import pyarrow as pa

Turns = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class PreferenceExample:
    """A pair before rendering: the prompt (chat turns, or raw text when ``turns`` is None) and the
    two responses."""

    prompt: str
    turns: Turns | None
    chosen: str
    rejected: str

    def side(self, response: str) -> Example:
        """One side as an SFT :class:`~rayft.data.formats.Example`: the prompt, then ``response``."""
        if self.turns is None:
            return Example(prompt=self.prompt, response=response)
        return Example(messages=(*self.turns, ("assistant", response)))


def make_preference(row: Mapping[str, Any], ds: DatasetConfig) -> PreferenceExample:
    """Turn one row into a :class:`PreferenceExample`; :class:`~rayft.data.formats.BadRowError` when it cannot."""
    columns = {name: ds.field_mapping.get(name, name) for name in ("prompt", "chosen", "rejected")}
    chosen_value, rejected_value = _value(row, columns["chosen"]), _value(row, columns["rejected"])
    if columns["prompt"] in row and row[columns["prompt"]] is not None:
        turns = _prompt_turns(row[columns["prompt"]], columns["prompt"])
        chosen = _response(chosen_value, columns["chosen"])
        rejected = _response(rejected_value, columns["rejected"])
    else:
        turns, chosen, rejected = _split_conversations(chosen_value, rejected_value, columns)
    if chosen == rejected:
        raise BadRowError("identical_responses", f"columns {columns['chosen']!r} and {columns['rejected']!r} "
                                                 f"hold the same response ({_clip(chosen)})")  # fmt: skip
    if ds.system_prompt and (not turns or turns[0][0] != "system"):
        turns = (("system", ds.system_prompt), *turns)
    if not ds.use_chat_template:
        return PreferenceExample(_raw_prompt(turns), None, chosen, rejected)
    return PreferenceExample("", turns, chosen, rejected)


def _value(row: Mapping[str, Any], column: str) -> Any:
    value = row.get(column)
    if value is None:
        raise BadRowError("missing_field", f"column {column!r} is missing or null")
    return value


def _prompt_turns(value: Any, column: str) -> Turns:
    if isinstance(value, str):
        if not value.strip():
            raise BadRowError("empty_field", f"column {column!r} is empty")
        return (("user", value),)
    turns = _turns(value, column)
    if turns[-1][0] == "assistant":
        raise BadRowError("wrong_type", f"column {column!r} ends with an assistant turn; the prompt must end "
                                        "with the turn the responses answer")  # fmt: skip
    return turns


def _response(value: Any, column: str) -> str:
    """A response given as text, or as its assistant turn(s) (joined, for a multi-turn response)."""
    if isinstance(value, str):
        text = value
    else:
        turns = _turns(value, column)
        if any(role != "assistant" for role, _ in turns):
            raise BadRowError("wrong_type", f"column {column!r} holds non-assistant turns; with a prompt column, "
                                            "a response is its assistant turn(s) only")  # fmt: skip
        text = "\n".join(content for _, content in turns)
    if not text.strip():
        raise BadRowError("empty_field", f"column {column!r} is an empty response")
    return text


def _split_conversations(chosen: Any, rejected: Any, columns: Mapping[str, str]) -> tuple[Turns, str, str]:
    """Prompt = the turns both conversations share up to the last user turn before their final
    assistant turns; each response = its final assistant turn."""
    if isinstance(chosen, str) or isinstance(rejected, str):
        raise BadRowError("missing_field", f"no prompt column {columns['prompt']!r}: with text responses the row "
                                           "needs one (or give chosen/rejected as whole conversations)")  # fmt: skip
    chosen_turns, rejected_turns = _turns(chosen, columns["chosen"]), _turns(rejected, columns["rejected"])
    for turns, column in ((chosen_turns, columns["chosen"]), (rejected_turns, columns["rejected"])):
        if turns[-1][0] != "assistant":
            raise BadRowError("no_assistant_turn", f"column {column!r} does not end with an assistant turn")
        if not turns[-1][1].strip():
            raise BadRowError("empty_field", f"column {column!r}: its final assistant turn is empty")
    prompt = chosen_turns[:-1]
    if not prompt or rejected_turns[:-1] != prompt:
        raise BadRowError("no_shared_prompt", f"columns {columns['chosen']!r} and {columns['rejected']!r} differ "
                                              "before their final assistant turns")  # fmt: skip
    return prompt, chosen_turns[-1][1], rejected_turns[-1][1]


def _turns(value: Any, column: str) -> Turns:
    if isinstance(value, str):
        raise BadRowError("wrong_type", f"column {column!r} must be text or a list of turns (objects), got str")
    return parse_turns(value, column)


def _raw_prompt(turns: Turns) -> str:
    """The prompt without a chat template: its turns' texts, a system turn first, blank-line separated."""
    return "\n\n".join(content for _, content in turns)


def _clip(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


@dataclass(frozen=True)
class TokenizedPair:
    """Both sides of a pair as training rows (ids and labels; -100 off the response)."""

    chosen_ids: list[int]
    chosen_labels: list[int]
    rejected_ids: list[int]
    rejected_labels: list[int]
    length: int  # the longer side's untruncated token count
    truncated: bool


def tokenize_preference(
    example: PreferenceExample,
    tokenizer: TextTokenizer,
    *,
    max_seq_length: int,
    max_prompt_length: int,
    overlong: str = "truncate",
) -> TokenizedPair:
    """Render and tokenize both sides (each as one text, as the model sees it), then fit them to
    ``max_seq_length`` (see the module's docstring). BadRowError ``over_length`` when the pair does not
    fit and ``overlong`` is not ``truncate`` (checked first: such a pair is refused for its length, not
    cut), and ``all_labels_masked`` when a side keeps no response token."""
    sides = [render(example.side(response), tokenizer, train_on_prompt=False)
             for response in (example.chosen, example.rejected)]  # fmt: skip
    ids_list, offsets_list = tokenizer.encode([side.text for side in sides])
    rows = [_row(ids, offsets, side, tokenizer.eos_token_id)
            for ids, offsets, side in zip(ids_list, offsets_list, sides, strict=True)]  # fmt: skip
    length = max(len(ids) for ids, _ in rows)
    (chosen, chosen_labels), (rejected, rejected_labels), truncated = fit_pair(rows[0], rows[1], max_seq_length,
                                                                                max_prompt_length)  # fmt: skip
    if truncated and overlong != "truncate":
        raise BadRowError("over_length", f"{length} tokens > max_seq_length {max_seq_length}")
    for labels, side in ((chosen_labels, "chosen"), (rejected_labels, "rejected")):
        if all(label == IGNORE_INDEX for label in labels):
            raise BadRowError("all_labels_masked", f"the {side} response has no token left (max_seq_length "
                                                   f"{max_seq_length}, {length} tokens)")  # fmt: skip
    return TokenizedPair(chosen, chosen_labels, rejected, rejected_labels, length, truncated)


def _row(
    ids: list[int], offsets: Sequence[tuple[int, int]], side: Rendered, eos: int | None
) -> tuple[list[int], list[int]]:
    labels = label_tokens(ids, offsets, side.spans)
    if side.add_eos and eos is not None:
        ids, labels = [*ids, eos], [*labels, eos]
    return ids, labels


Row = tuple[list[int], list[int]]


def fit_pair(chosen: Row, rejected: Row, max_seq_length: int, max_prompt_length: int) -> tuple[Row, Row, bool]:
    """Both rows cut to ``max_seq_length``: the shared prompt first, from its start (keeping its end),
    down to what leaves room for the longer response but not below ``max_prompt_length``; then the
    responses from their ends. A row's prompt is its tokens before the first label."""
    prompts = [_prompt_length(labels) for _, labels in (chosen, rejected)]
    responses = [len(ids) - p for (ids, _), p in zip((chosen, rejected), prompts, strict=True)]
    if max(p + r for p, r in zip(prompts, responses, strict=True)) <= max_seq_length:
        return chosen, rejected, False
    keep_prompt = min(max(prompts), max(max_seq_length - max(responses), min(max_prompt_length, max_seq_length)))
    drops = [max(prompt - keep_prompt, 0) for prompt in prompts]
    fitted = [(ids[drop:][:max_seq_length], labels[drop:][:max_seq_length])
              for (ids, labels), drop in zip((chosen, rejected), drops, strict=True)]  # fmt: skip
    return fitted[0], fitted[1], True


def _prompt_length(labels: Sequence[int]) -> int:
    return next((index for index, label in enumerate(labels) if label != IGNORE_INDEX), len(labels))


@dataclass(frozen=True)
class PairPreparation:
    """How preparation turns preference rows into pair units (set for train.objective dpo, orpo, simpo)."""

    max_prompt_length: int


def pair_preparation(preference: bool, max_prompt_length: int) -> PairPreparation | None:
    """The pair settings of a run whose ``train.objective`` trains on preference pairs (None for any other)."""
    return PairPreparation(max_prompt_length) if preference else None


PAIR_COLUMNS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")


def tokenize_pair_rows(
    job: TokenizeJob, pairs: PairPreparation, sample_ids: list[int], datasets: list[int], rows: list[str]
) -> pa.Table:
    """A batch of preference rows as a table: ``sample_id``, the four :data:`PAIR_COLUMNS`, ``length`` (the
    longer side, untruncated), ``truncated``, ``reason`` and ``detail`` (a rejected row keeps its id,
    empty sides and its reason, as :func:`rayft.data.tokenize.tokenize_rows` does)."""
    import pyarrow as pa

    out: dict[str, list[Any]] = {k: [] for k in (*PAIR_COLUMNS, "length", "truncated", "reason", "detail")}
    for dataset, row in zip(datasets, rows, strict=True):
        ds, fmt = job.datasets[int(dataset)]
        try:
            pair = _tokenize_row(json.loads(row), ds, fmt, job, pairs)
        except BadRowError as bad:
            values: tuple[Any, ...] = ([], [], [], [], 0, False, bad.reason, bad.detail)
        else:
            values = (pair.chosen_ids, pair.chosen_labels, pair.rejected_ids, pair.rejected_labels, pair.length,
                      pair.truncated, "", "")  # fmt: skip
        for key, value in zip(out, values, strict=True):
            out[key].append(value)
    tokens = pa.list_(pa.int32())
    schema = pa.schema([("sample_id", pa.int64()), *((name, tokens) for name in PAIR_COLUMNS), ("length", pa.int64()),
                        ("truncated", pa.bool_()), ("reason", pa.string()), ("detail", pa.string())])  # fmt: skip
    return pa.table({"sample_id": [int(s) for s in sample_ids], **out}, schema=schema)


def _tokenize_row(
    row: Mapping[str, Any], ds: DatasetConfig, fmt: ResolvedFormat, job: TokenizeJob, pairs: PairPreparation
) -> TokenizedPair:
    if row.get(UNREADABLE_COLUMN):
        reason, detail = row[UNREADABLE_COLUMN]
        raise BadRowError(str(reason), str(detail))
    if fmt.format != "preference":
        raise BadRowError("wrong_type", f"format {fmt.format!r} holds no chosen/rejected pair")
    return tokenize_preference(make_preference(row, ds), job.tokenizer, max_seq_length=job.max_seq_length,
                               max_prompt_length=pairs.max_prompt_length, overlong=job.overlong)  # fmt: skip


def pair_units(examples: pa.Table) -> pa.Table:
    """Training units of kept pairs: the four :data:`PAIR_COLUMNS`, ``sample_ids`` (the pair's id),
    ``num_tokens`` (both sides) and ``num_label_tokens`` (the response tokens of both sides)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def count(name: str) -> np.ndarray:
        return np.asarray(pc.list_value_length(examples[name]).to_numpy(zero_copy_only=False), np.int64)

    def trained(name: str) -> np.ndarray:
        sizes = count(name)
        flat = pc.list_flatten(examples[name]).to_numpy(zero_copy_only=False) != IGNORE_INDEX
        ends = np.concatenate([[0], np.cumsum(flat)])
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        return np.diff(ends[bounds])

    ids = examples["sample_id"].combine_chunks()
    sample_ids = pa.ListArray.from_arrays(pa.array(np.arange(len(ids) + 1), pa.int32()), ids)
    columns = {name: examples[name].combine_chunks() for name in PAIR_COLUMNS}
    return pa.table({
        **columns, "sample_ids": sample_ids,
        "num_tokens": pa.array(count("chosen_input_ids") + count("rejected_input_ids"), pa.int32()),
        "num_label_tokens": pa.array(trained("chosen_labels") + trained("rejected_labels"), pa.int32()),
    })  # fmt: skip


def refuse_mismatched_formats(formats: Sequence[tuple[str, str]], pairs: bool) -> None:
    """DataError when a dataset's format does not fit the objective: preference rows for SFT, or
    SFT rows for a preference objective (``formats``: each dataset's name and resolved format)."""
    for name, fmt in formats:
        if pairs and fmt != "preference":
            raise DataError(
                f"dataset {name}: format {fmt!r} holds no preference pairs, and train.objective trains on pairs; "
                "give rows with prompt, chosen and rejected (or chosen and rejected conversations), or set "
                "train.objective=sft"
            )
        if not pairs and fmt == "preference":
            raise DataError(
                f"dataset {name}: format 'preference' (chosen/rejected pairs) with train.objective=sft; set "
                "train.objective to dpo, orpo or simpo, or give SFT rows (prompt and completion, or messages)"
            )
