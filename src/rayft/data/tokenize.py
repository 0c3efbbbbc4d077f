"""Rendering examples to text and tokenizing them with labels, one batch at a time.

Labels come from character spans of the rendered text: the text is tokenized once, with offsets,
and a token is trained when its characters overlap a trained span (an assistant turn, or the
response). Pieces are never tokenized separately, so the ids are exactly those the model sees
at inference with the same template.

:class:`TokenizeJob` is what preparation's window tasks run (:mod:`rayft.data.windows`), on Ray Data
or in-process: both produce the same rows.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayft.config.data import DatasetConfig
from rayft.data.formats import BadRowError, Example, ResolvedFormat, make_example
from rayft.data.prepared import IGNORE_INDEX
from rayft.data.seq2seq import Pair, fit, source_target, with_eos
from rayft.data.tools import default_messages, with_object_arguments
from rayft.errors import DataError

Span = tuple[int, int]


@dataclass(frozen=True)
class Rendered:
    """An example as text, the character spans to train on, and whether to append EOS (trained)."""

    text: str
    spans: tuple[Span, ...]
    add_eos: bool


@dataclass(frozen=True)
class TextTokenizer:
    """What rendering and tokenizing need from a Hugging Face tokenizer, cheap to ship to Ray workers.

    Holds the Rust ``tokenizers`` backend (or, for a tokenizer without one, the tokenizer itself),
    the chat template and the special-token strings the template sees. Workers then never import
    transformers' model stack: they render with transformers' own jinja renderer, exactly as
    ``apply_chat_template(tokenize=False)`` does, and encode with the backend.
    """

    backend: Any
    chat_template: str | None
    template_kwargs: dict[str, str]
    eos_token_id: int | None
    fast: bool

    @classmethod
    def from_hf(cls, tokenizer: Any) -> TextTokenizer:
        """Extract what is needed from a loaded transformers tokenizer."""
        template = tokenizer.get_chat_template() if getattr(tokenizer, "chat_template", None) else None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and (backend.padding is not None or backend.truncation is not None):
            # A tokenizer.json saved after a padded or truncating call keeps that setting, and the backend
            # would then pad every batch of rows to its longest or cut them: rows are encoded one by one.
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(backend.to_str())
            backend.no_padding()
            backend.no_truncation()
        return cls(
            backend=backend if backend is not None else tokenizer,
            chat_template=template,
            template_kwargs=dict(tokenizer.special_tokens_map),
            eos_token_id=tokenizer.eos_token_id,
            fast=backend is not None,
        )

    def chat_text(
        self, messages: Sequence[Mapping[str, Any]], *, generation_prompt: bool, tools: Sequence[Mapping[str, Any]] = ()
    ) -> str:
        """The conversation rendered by the chat template, as ``apply_chat_template(tokenize=False)`` renders
        it (see :func:`render_chat`)."""
        if self.chat_template is None:
            raise DataError("the tokenizer has no chat template; set model.chat_template or use_chat_template=false")
        return render_chat(self.chat_template, self.template_kwargs, messages, tools=tools,
                           generation_prompt=generation_prompt)  # fmt: skip

    def encode(
        self, texts: list[str], *, special_tokens: bool = False
    ) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
        """Token ids and character offsets of ``texts``, with the tokenizer's special tokens added
        only when ``special_tokens`` (as an encoder-decoder's inputs and targets are tokenized)."""
        if self.fast:
            encodings = self.backend.encode_batch(texts, add_special_tokens=special_tokens)
            return [list(e.ids) for e in encodings], [list(e.offsets) for e in encodings]
        encoded = self.backend(texts, add_special_tokens=special_tokens, return_offsets_mapping=True)
        return [list(i) for i in encoded["input_ids"]], [list(o) for o in encoded["offset_mapping"]]


def render_chat(
    template: str,
    template_kwargs: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] = (),
    generation_prompt: bool,
) -> str:
    """A conversation as text: the one rendering of chat messages that training, evaluation, ``rayft chat``,
    ``rayft generate`` and ``rayft serve`` share, equal to transformers' ``apply_chat_template(messages,
    tools=..., tokenize=False)``.

    ``template_kwargs`` are the variables the template sees besides the messages (the tokenizer's special
    tokens). With ``tools``, a template that renders tools (:func:`template_renders_tools`) gets the
    messages and the tools as they are; another gets the conversation in rayft's default tool format
    (:func:`rayft.data.tools.default_messages`).
    """
    from transformers.utils.chat_template_utils import render_jinja_template

    chat = with_object_arguments(messages)
    schemas: list[dict[str, Any]] | None = [dict(t) for t in tools] or None
    uses_tools = schemas is not None or any(m.get("tool_calls") or m.get("role") == "tool" for m in chat)
    if uses_tools and not template_renders_tools(template):
        chat, schemas = [dict(m) for m in default_messages(chat, tools)], None
    render_fn: Any = render_jinja_template  # its stubs do not type the template's extra variables
    rendered, _ = render_fn(
        conversations=[chat], tools=schemas, chat_template=template, add_generation_prompt=generation_prompt,
        **template_kwargs,
    )  # fmt: skip
    return str(rendered[0])


@functools.lru_cache(maxsize=16)
def template_renders_tools(template: str) -> bool:
    """Whether a chat template renders tools itself: it reads the ``tools`` variable and the messages'
    ``tool_calls`` (so it shows both the tool list and the calls), as Qwen2.5's, Llama 3.1's and most
    recent templates do. Otherwise rayft renders tools in its default format (:mod:`rayft.data.tools`)."""
    import jinja2
    from jinja2 import meta

    try:
        variables = meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateSyntaxError:
        return False  # rendering reports the template's error itself
    return "tools" in variables and "tool_calls" in template


def render(example: Example, tokenizer: TextTokenizer, *, train_on_prompt: bool) -> Rendered:
    """Render an example to text and find the character spans that carry the loss (every assistant turn,
    tool calls included; tool results and the tool list are prompt)."""
    if example.messages is None:
        text = example.prompt + example.response
        start = 0 if train_on_prompt else len(example.prompt)
        return Rendered(text, ((start, len(text)),), True)
    messages: list[dict[str, Any]] = [{"role": r, "content": c} for r, c in example.messages]
    tools: tuple[dict[str, Any], ...] = ()
    if example.chat is not None and template_renders_tools(tokenizer.chat_template or ""):
        messages, tools = [dict(m) for m in example.chat], example.tools
    full = _chat_text(tokenizer, messages, generation_prompt=False, tools=tools)
    if train_on_prompt:
        return Rendered(full, ((0, len(full)),), False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _chat_text(tokenizer, messages[:index], generation_prompt=True, tools=tools)
        upto = full if index == len(messages) - 1 else _chat_text(tokenizer, messages[: index + 1], False, tools)
        if not (upto.startswith(before) and full.startswith(upto)):
            raise DataError(
                "the tokenizer's chat template does not render a conversation as a prefix of its continuation, "
                "so assistant turns cannot be located; set use_chat_template=false for this dataset or set "
                "model.chat_template to a template that does"
            )
        spans.append((len(before), len(upto)))
    return Rendered(full, tuple(spans), False)


def _chat_text(
    tokenizer: TextTokenizer, messages: list[dict[str, Any]], generation_prompt: bool, tools: Sequence[Any] = ()
) -> str:
    """The messages rendered for training; a conversation the template itself refuses (its
    ``raise_exception``: roles that do not alternate, more tool calls in a turn than it takes) is a
    rejected row (``template_error``), not a failed preparation."""
    from jinja2 import TemplateError

    if not messages:
        return ""
    try:
        return tokenizer.chat_text(messages, generation_prompt=generation_prompt, tools=tools)
    except TemplateError as exc:
        raise BadRowError("template_error", f"the chat template refuses this conversation: {exc}") from None


def label_tokens(ids: Sequence[int], offsets: Sequence[tuple[int, int]], spans: Sequence[Span]) -> list[int]:
    """Labels for ``ids``: the id where the token overlaps a trained span, else IGNORE_INDEX.

    A token overlaps ``[lo, hi)`` when it starts before ``hi`` and ends after ``lo``; an
    empty-width token (some special tokens) counts when it sits inside the span.
    """
    labels = []
    for token, (start, end) in zip(ids, offsets, strict=True):
        trained = False
        for lo, hi in spans:
            if (start < hi and end > lo) or (start == end and lo <= start < hi):
                trained = True
                break
        labels.append(token if trained else IGNORE_INDEX)
    return labels


@dataclass(frozen=True)
class TokenizeJob:
    """Everything needed to turn mixture rows into tokenized rows; picklable for Ray workers."""

    tokenizer: TextTokenizer
    datasets: tuple[tuple[DatasetConfig, ResolvedFormat], ...]
    max_seq_length: int
    overlong: str
    train_on_prompt: bool
    seq2seq_limits: tuple[int, int] | None = None  # (max source, max target tokens) of an encoder-decoder
    carry: tuple[str, ...] = ()  # columns kept with each example, as JSON in a ``row`` column (train.rl's rewards)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Tokenize a batch with columns ``sample_id``, ``dataset``, ``row`` (JSON text)."""
        return tokenize_rows(self, list(batch["sample_id"]), list(batch["dataset"]), list(batch["row"]))


def tokenize_rows(job: TokenizeJob, sample_ids: list[int], datasets: list[int], rows: list[str]) -> dict[str, Any]:
    """Columns ``sample_id, input_ids, labels, length, truncated, reason, detail`` for a batch of rows,
    and ``row`` (the carried columns as JSON) when the job carries columns.

    A rejected row keeps its sample id with empty ids and its reason; ``length`` is the
    untruncated token count. An encoder-decoder job makes source/target pairs instead
    (:func:`tokenize_pairs`).
    """
    if job.seq2seq_limits is not None:
        return tokenize_pairs(job, job.seq2seq_limits, sample_ids, datasets, rows)
    rendered: list[Rendered | BadRowError] = []
    carried: list[str] = []
    for dataset, row in zip(datasets, rows, strict=True):
        ds, fmt = job.datasets[int(dataset)]
        raw = json.loads(row)
        item: Rendered | BadRowError
        try:
            text = carried_text(raw, job.carry)
            item = render(make_example(raw, ds, fmt), job.tokenizer, train_on_prompt=job.train_on_prompt)
        except BadRowError as bad:
            text, item = "", bad
        carried.append(text)
        rendered.append(item)
    ids_list, offsets_list = job.tokenizer.encode([r.text if isinstance(r, Rendered) else "" for r in rendered])
    out: dict[str, list[Any]] = {k: [] for k in ("input_ids", "labels", "length", "truncated", "reason", "detail")}
    eos = job.tokenizer.eos_token_id
    for index, item in enumerate(rendered):
        if isinstance(item, BadRowError):
            _append(out, [], [], 0, False, item.reason, item.detail)
            continue
        ids = ids_list[index]
        labels = label_tokens(ids, offsets_list[index], item.spans)
        if item.add_eos and eos is not None:
            ids.append(eos)
            labels.append(eos)
        _append(out, *finish(ids, labels, job.max_seq_length, job.overlong))
    extra = {"row": carried} if job.carry else {}
    return {"sample_id": [int(s) for s in sample_ids], **out, **extra}


def carried_text(row: dict[str, Any], columns: Sequence[str]) -> str:
    """The ``columns`` of a raw row as JSON text ("" when none are carried); BadRowError when one is
    missing or null, naming it, so the row is rejected and counted."""
    if not columns:
        return ""
    missing = [c for c in columns if row.get(c) is None]
    if missing:
        raise BadRowError(
            "missing_row_column",
            f"no value in column(s) {missing} that train.rl carries to its rewards (columns: {sorted(row)})",
        )
    return json.dumps({c: row[c] for c in columns}, ensure_ascii=False, default=str)


def tokenize_pairs(
    job: TokenizeJob, limits: tuple[int, int], sample_ids: list[int], datasets: list[int], rows: list[str]
) -> dict[str, Any]:
    """:func:`tokenize_rows` for an encoder-decoder: ``input_ids`` is the source, ``labels`` the target
    (every token trained), ``length`` their untruncated sum (see :mod:`rayft.data.seq2seq`)."""
    tokenizer = job.tokenizer
    chat = tokenizer.chat_text if tokenizer.chat_template is not None else None
    pairs: list[Pair | BadRowError] = []
    for dataset, row in zip(datasets, rows, strict=True):
        ds, fmt = job.datasets[int(dataset)]
        try:
            pairs.append(source_target(make_example(json.loads(row), ds, fmt), chat))
        except BadRowError as bad:
            pairs.append(bad)
    texts = [(p.source, p.target) if isinstance(p, Pair) else ("", "") for p in pairs]
    sources, _ = tokenizer.encode([t[0] for t in texts], special_tokens=True)
    targets, _ = tokenizer.encode([t[1] for t in texts], special_tokens=True)
    out: dict[str, list[Any]] = {k: [] for k in ("input_ids", "labels", "length", "truncated", "reason", "detail")}
    for index, item in enumerate(pairs):
        if isinstance(item, BadRowError):
            _append(out, [], [], 0, False, item.reason, item.detail)
            continue
        source = with_eos(sources[index], tokenizer.eos_token_id)
        target = with_eos(targets[index], tokenizer.eos_token_id)
        length = len(source) + len(target)
        source, target, truncated, over = fit(source, target, limits, job.overlong)
        _append(out, source, target, length, truncated, "over_length" if over else "", over)
    return {"sample_id": [int(s) for s in sample_ids], **out}


def finish(
    ids: list[int], labels: list[int], max_seq_length: int, overlong: str
) -> tuple[list[int], list[int], int, bool, str, str]:
    """Apply the length limit and the no-label check: (ids, labels, length, truncated, reason, detail).

    The first label is always ignored: it would be predicted from the previous example in a pack.
    """
    length = len(ids)
    truncated = False
    if length > max_seq_length:
        if overlong != "truncate":
            detail = f"{length} tokens > max_seq_length {max_seq_length}"
            return [], [], length, False, "over_length", detail
        ids, labels, truncated = ids[:max_seq_length], labels[:max_seq_length], True
    if labels:
        labels[0] = IGNORE_INDEX
    if all(label == IGNORE_INDEX for label in labels):
        why = f"truncated from {length} to {max_seq_length} tokens" if truncated else "no response tokens"
        return [], [], length, truncated, "all_labels_masked", f"every label is masked ({why})"
    return ids, labels, length, truncated, "", ""


def _append(out: dict[str, list[Any]], *values: Any) -> None:
    for key, value in zip(("input_ids", "labels", "length", "truncated", "reason", "detail"), values, strict=True):
        out[key].append(value)


def as_table(columns: dict[str, Any]) -> Any:
    """The output of :func:`tokenize_rows` as an Arrow table with a fixed schema (and ``row`` when carried)."""
    import pyarrow as pa

    schema = pa.schema([
        ("sample_id", pa.int64()), ("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32())),
        ("length", pa.int64()), ("truncated", pa.bool_()), ("reason", pa.string()), ("detail", pa.string()),
    ])  # fmt: skip
    if "row" in columns:
        schema = schema.append(pa.field("row", pa.string()))
    return pa.table(columns, schema=schema)


def job_key(job: TokenizeJob) -> str:
    """A key naming the job's content: a hash of its pickled bytes (tokenizer, datasets, settings).

    Workers keep the job they last deserialised under this key, so a later preparation with the
    same tokenizer and settings (another mixture of the same datasets, a repeated run in one
    process) skips fetching and deserialising the tokenizer again.
    """
    return hashlib.sha256(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)).hexdigest()


_JOBS: dict[str, TokenizeJob] = {}


def load_job(job_key: str, job_ref: Sequence[Any]) -> TokenizeJob:
    """The job behind ``job_ref[0]``, fetched and deserialised once per worker process and content key
    (``job_key``, from :func:`job_key`) and reused for every later task that process runs with that key."""
    # Ray gave the task one CPU: keep the Rust tokenizer from spreading over every core of the node
    # (unless the user set TOKENIZERS_PARALLELISM).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    job = _JOBS.get(job_key)
    if job is None:
        import ray

        _JOBS.clear()  # keep one tokenizer per worker: drop the previous job's
        job = _JOBS[job_key] = ray.get(job_ref[0])
    return job
