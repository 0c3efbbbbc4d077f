"""GSM8K as calculator tool-use traces for rayft, with a held-out slice never trained on.

GSM8K's solutions mark every computation with a calculator annotation: ``48/2 = <<48/2=24>>24 clips``.
Each annotation becomes a call of rayft's built-in ``calculator`` tool (``rayft.environments.builtin``),
in OpenAI's shape, at the point of the solution where it is made: the assistant writes the solution's text
up to the annotation and calls ``calculator`` with its expression; the ``tool`` turn holds what the
calculator actually answers (the tool is run here, through ``call_tool`` as the tools environment runs
it, so the trace is exact); the next assistant turn goes on from the result, and the last one ends with
the solution's ``#### N`` line, the answer ``eval.task: gsm8k`` (strict and flexible extraction) and the
``math`` reward read. The rows list the calculator's schema as the tools environment gives it, so a
training prompt renders exactly as an eval or RL episode's prompt does.

Files written to OUT (JSON Lines, one row per problem, ``id`` = the problem's line in the source file):

- ``train_tools.jsonl``: ``messages`` (the trace) and ``tools``; ``format: messages``;
- ``train_plain.jsonl``: ``messages``, the question and the solution with its annotations stripped (the
  same problems as ``train_tools.jsonl``, in the same order);
- ``rl_prompts.jsonl``: the question with ``tools`` and the plain solution as the response (the reference the
  ``math`` reward reads), for ``rl.data``; in the reverse order of the training files, so that the first
  rows RL reads are problems the first rows SFT reads do not hold;
- ``heldout.jsonl``: ``question`` and ``answer`` (GSM8K's own solution) of the held-out problems, for
  ``eval.datasets``;
- ``rejects.jsonl``: every problem left out of training, with its line, reason and detail;
- ``summary.json``: the counts (rows, rejects by reason, calls per trace) and, unless ``--tokenizer none``,
  tokens per rendered row with the model's chat template.

The held-out problems are a seeded shuffle's first ``--heldout`` problems that have a final answer; a
training problem whose question equals a held-out one (after whitespace and case) is a reject. Training
rows are written in the shuffled order, so a dataset's ``max_rows`` takes a random sample.

    .venv/bin/python benchmarks/gsm8k_tool_traces.py OUT [--source ../shared/datasets/gsm8k/train.jsonl]
        [--heldout 100] [--seed 0] [--tokenizer smollm2-135m-instruct|none]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from rayft.environments.builtin import calculator_tool
from rayft.environments.tools import Tool, call_tool

REPO = Path(__file__).resolve().parents[1]
GSM8K_TRAIN = Path("shared", "datasets", "gsm8k", "train.jsonl")
ANNOTATION = re.compile(r"<<([^<>]*)>>")
FINAL_LINE = re.compile(r"^[ \t]*####[ \t]*(\S.*?)[ \t]*$", re.MULTILINE)
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
PERCENT = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*%(?!\s*[\d.(])")  # 25% is 25/100; 7 % 3 stays modulo
TOOL_TIMEOUT_S = 5.0  # configs/agent.yaml's rl.environment.tool_timeout_s
REJECT_REASONS = {
    "no_final_answer": "the solution has no '#### N' line",
    "annotation_without_equals": "an annotation has no '=' (no expression and result)",
    "calculator_error": "the calculator refuses an annotation's expression (its answer is an error)",
    "unparsable_result": "an annotation's stated result is not a number",
    "result_mismatch": "the calculator's value differs from an annotation's stated result beyond its rounding",
    "heldout_duplicate": "the question equals a held-out problem's question",
    "unreadable_row": "the source line is not a JSON object with a question and an answer",
}
"""Why a problem is left out of training."""


class TraceError(ValueError):
    """A problem that cannot become a trace; ``reason`` is a key of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Call:
    """One annotation as a calculator call: the expression sent, the tool's answer, and how it relates to
    the annotation (``normalised``: the expression was rewritten; ``rounded``: the stated result is the
    calculator's value rounded)."""

    expression: str
    result: str
    normalised: bool
    rounded: bool


@dataclass(frozen=True)
class Converted:
    """A training problem's three rows and its calls."""

    tools_row: dict[str, Any]
    plain_row: dict[str, Any]
    rl_row: dict[str, Any]
    calls: tuple[Call, ...]


def default_source() -> Path:
    """GSM8K's train file in the ``shared/`` directory beside the checkout (or beside a folder of checkouts)."""
    candidates = [parent / GSM8K_TRAIN for parent in REPO.parents]
    return next((path for path in candidates if path.is_file()), candidates[0])


def calculator_expression(expression: str) -> str:
    """An annotation's expression in the calculator's syntax: ``$`` dropped, thousands commas dropped
    (``1,200``), a percentage as a fraction (``25%`` -> ``(25/100)``); anything else as written."""
    text = THOUSANDS.sub("", expression.replace("$", ""))
    return PERCENT.sub(r"(\1/100)", text).strip()


def _decimals(stated: str) -> int:
    return len(stated.split(".", 1)[1]) if "." in stated else 0


def stated_value(stated: str) -> Fraction:
    """An annotation's stated result as an exact number (``$``, commas and a trailing ``.`` dropped)."""
    cleaned = stated.replace("$", "").replace(",", "").strip().rstrip(".")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        raise TraceError("unparsable_result", f"stated result {stated!r} is not a number") from None


def agrees(result: str, stated: str) -> tuple[bool, bool]:
    """(whether the calculator's ``result`` agrees with the ``stated`` result, whether only once rounded).

    Equal exactly, or equal to the stated number of decimals (``10/3`` stated ``3.33``); with no decimals
    stated, equal up to float rounding (``70*.01*90`` answers ``63.00000000000001``)."""
    value, claimed = Fraction(result), stated_value(stated)
    if value == claimed:
        return True, False
    decimals = _decimals(stated.strip().rstrip("."))
    bound = Fraction(1, 2 * 10**decimals) if decimals else Fraction(1, 10**9) * max(Fraction(1), abs(claimed))
    return abs(value - claimed) <= bound, True


def run_calculator(tool: Tool, annotation: str) -> Call:
    """Call the calculator on one annotation's expression and check its answer against the stated result."""
    if "=" not in annotation:
        raise TraceError("annotation_without_equals", f"<<{annotation}>>")
    written, _, stated = annotation.rpartition("=")
    expression = calculator_expression(written)
    outcome = call_tool(tool, {"expression": expression}, {}, TOOL_TIMEOUT_S)
    if outcome.status != "ok":
        raise TraceError("calculator_error", f"<<{annotation}>>: {outcome.text}")
    try:
        ok, rounded = agrees(outcome.text, stated)
    except (ValueError, ZeroDivisionError):  # a result the calculator writes that Fraction cannot read (inf)
        raise TraceError("calculator_error", f"<<{annotation}>>: answered {outcome.text!r}") from None
    if not ok:
        raise TraceError("result_mismatch", f"<<{annotation}>>: the calculator answers {outcome.text}")
    return Call(expression, outcome.text, expression != written.strip(), rounded)


def final_answer(answer: str) -> str:
    """The solution's final answer (after ``####``); a reject when it has none."""
    found = FINAL_LINE.findall(answer)
    if not found:
        raise TraceError("no_final_answer", repr(answer[-60:]))
    return str(found[-1])


def strip_annotations(answer: str) -> str:
    """The solution as text without tools: every ``<<...>>`` removed."""
    return ANNOTATION.sub("", answer)


def trace_messages(question: str, answer: str, calls: Sequence[Call]) -> list[dict[str, Any]]:
    """The tool-use conversation: the solution's text up to each annotation, then its call; the tool's
    answer; and after the last call the rest of the solution (its ``#### N`` line included)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    position = 0
    for index, (match, call) in enumerate(zip(ANNOTATION.finditer(answer), calls, strict=True)):
        call_id = f"call_{index}"
        arguments = json.dumps({"expression": call.expression})
        tool_call = {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": arguments}}
        content = answer[position : match.start()].rstrip()
        messages.append({"role": "assistant", "content": content, "tool_calls": [tool_call]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": call.result})
        position = match.end()
    messages.append({"role": "assistant", "content": answer[position:].lstrip(" ")})
    return messages


def convert(row_id: int, row: dict[str, Any], tool: Tool) -> Converted:
    """A GSM8K row (``question``, ``answer``) as its training rows; :class:`TraceError` when it cannot be."""
    question, answer = str(row["question"]), str(row["answer"])
    final_answer(answer)
    calls = tuple(run_calculator(tool, body) for body in ANNOTATION.findall(answer))
    plain = strip_annotations(answer)
    tools = [tool.schema]
    return Converted(
        tools_row={"id": row_id, "messages": trace_messages(question, answer, calls), "tools": tools},
        plain_row={"id": row_id, "messages": [_user(question), _assistant(plain)]},
        rl_row={"id": row_id, "messages": [_user(question), _assistant(plain)], "tools": tools},
        calls=calls,
    )


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def question_key(question: str) -> str:
    """A question compared with others: whitespace collapsed, lower-case."""
    return " ".join(question.split()).lower()


Source = Sequence[dict[str, Any] | str]
"""A source's rows by line: the row, or why its line could not be read."""


def split_heldout(rows: Source, count: int, seed: int) -> tuple[list[int], list[int]]:
    """(held-out indices, training indices), both in one seeded shuffle's order; only problems with a final
    answer are held out (the eval scores against it)."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    heldout: list[int] = []
    for index in order:
        if len(heldout) == count:
            break
        row = rows[index]
        if isinstance(row, dict) and FINAL_LINE.search(str(row["answer"])):
            heldout.append(index)
    chosen = set(heldout)
    return heldout, [index for index in order if index not in chosen]


@dataclass
class Conversion:
    """What converting a source produced: the rows of each file, the rejects, the calls' figures."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    plain: list[dict[str, Any]] = field(default_factory=list)
    rl: list[dict[str, Any]] = field(default_factory=list)
    heldout: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[dict[str, Any]] = field(default_factory=list)
    calls_per_trace: Counter[int] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)

    def add(self, made: Converted) -> None:
        """Count one converted problem and keep its rows."""
        self.tools.append(made.tools_row)
        self.plain.append(made.plain_row)
        self.rl.append(made.rl_row)
        self.calls_per_trace[len(made.calls)] += 1
        self.calls["calls"] += len(made.calls)
        self.calls["normalised"] += sum(call.normalised for call in made.calls)
        self.calls["rounded"] += sum(call.rounded for call in made.calls)

    def reject(self, row_id: int, bad: TraceError) -> None:
        """Keep a rejected problem with its reason."""
        self.rejects.append({"id": row_id, "reason": bad.reason, "detail": bad.detail})


def convert_rows(rows: Source, heldout_count: int, seed: int) -> Conversion:
    """Split ``rows`` (GSM8K's question/answer rows; ids are their 1-based lines) and convert the training
    part; every problem ends up in exactly one of: held-out, training, rejects."""
    tool, result = calculator_tool(), Conversion()
    heldout, training = split_heldout(rows, heldout_count, seed)
    held = [(index, rows[index]) for index in heldout]
    result.heldout = [
        {"id": i + 1, "question": r["question"], "answer": r["answer"]} for i, r in held if isinstance(r, dict)
    ]
    held_questions = {question_key(row["question"]) for row in result.heldout}
    for index in training:
        try:
            result.add(convert(index + 1, _training_row(rows[index], held_questions), tool))
        except TraceError as bad:
            result.reject(index + 1, bad)
    return result


def _training_row(row: dict[str, Any] | str, held_questions: set[str]) -> dict[str, Any]:
    if isinstance(row, str):
        raise TraceError("unreadable_row", row)
    if question_key(str(row["question"])) in held_questions:
        raise TraceError("heldout_duplicate", str(row["question"])[:80])
    return row


def read_source(path: Path) -> list[dict[str, Any] | str]:
    """The source's rows by line; a line that is not a JSON object with a ``question`` text and an
    ``answer`` keeps its place as the reason, so that ids stay line numbers and it is counted as a reject."""
    rows: list[dict[str, Any] | str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            rows.append(f"{path}:{number}: not JSON ({exc.msg})")
            continue
        if isinstance(row, dict) and isinstance(row.get("question"), str) and isinstance(row.get("answer"), str):
            rows.append(row)
        else:
            rows.append(f"{path}:{number}: not an object with question and answer texts")
    return rows


def _spread(values: Sequence[int]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"rows": 0}
    return {
        "rows": len(ordered), "mean": round(statistics.fmean(ordered), 1), "median": statistics.median(ordered),
        "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], "max": ordered[-1],
    }  # fmt: skip


def token_figures(conversion: Conversion, model: str, max_seq_length: int) -> dict[str, Any]:
    """Tokens per row as training renders it with ``model``'s chat template (the tools in its format, or
    rayft's default one), the tools prompt alone (what an episode starts from) and the plain solution."""
    from rayft.config import ModelConfig
    from rayft.data.tokenize import TextTokenizer
    from rayft.models.loading import load_tokenizer

    tokenizer = TextTokenizer.from_hf(load_tokenizer(ModelConfig(name=model)))

    def lengths(rows: Iterable[dict[str, Any]], *, prompt_only: bool = False) -> list[int]:
        texts = [
            tokenizer.chat_text(row["messages"][:1] if prompt_only else row["messages"],
                                generation_prompt=prompt_only, tools=row.get("tools", ()))
            for row in rows
        ]  # fmt: skip
        return [len(ids) for ids in tokenizer.encode(texts)[0]]

    traces = lengths(conversion.tools)
    answers = [len(ids) for ids in tokenizer.encode([row["messages"][-1]["content"] for row in conversion.plain])[0]]
    return {
        "model": model,
        "tools_trace": _spread(traces),
        "plain_row": _spread(lengths(conversion.plain)),
        "tools_prompt": _spread(lengths(conversion.tools, prompt_only=True)),
        "plain_solution": _spread(answers),
        f"tools_traces_over_{max_seq_length}": sum(length > max_seq_length for length in traces),
    }


def summary(conversion: Conversion, source: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The conversion's figures (summary.json)."""
    reasons = Counter(reject["reason"] for reject in conversion.rejects)
    return {
        "source": str(source), "heldout_seed": args.seed,
        "source_rows": len(conversion.heldout) + len(conversion.tools) + len(conversion.rejects),
        "heldout": len(conversion.heldout), "train": len(conversion.tools), "rejected": len(conversion.rejects),
        "rejects_by_reason": {reason: reasons[reason] for reason in REJECT_REASONS if reasons[reason]},
        "calls": dict(conversion.calls),
        "calls_per_trace": {str(k): conversion.calls_per_trace[k] for k in sorted(conversion.calls_per_trace)},
    }  # fmt: skip


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Rows as JSON Lines, written whole or not at all (a temporary file renamed)."""
    partial = path.with_suffix(".partial")
    with partial.open("w", encoding="utf-8") as out:
        out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    partial.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="Directory for the JSON Lines files and summary.json.")
    parser.add_argument("--source", type=Path, default=default_source(), help="GSM8K rows (question, answer), JSONL.")
    parser.add_argument("--heldout", type=int, default=100, help="Problems held out of training, for the eval.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the shuffle that picks the held-out problems.")
    parser.add_argument("--tokenizer", default="smollm2-135m-instruct", help="Model whose tokens are counted; 'none'.")
    parser.add_argument("--max-seq-length", type=int, default=768, help="Count traces longer than this (data's).")
    args = parser.parse_args()
    source = args.source.resolve()
    if not source.is_file():
        raise SystemExit(f"--source {source}: no such file; give GSM8K's train.jsonl (question and answer rows)")
    conversion = convert_rows(read_source(source), args.heldout, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    files = {"train_tools": conversion.tools, "train_plain": conversion.plain, "rl_prompts": conversion.rl[::-1],
             "heldout": conversion.heldout, "rejects": conversion.rejects}  # fmt: skip
    for name, rows in files.items():
        write_jsonl(args.out / f"{name}.jsonl", rows)
    figures = summary(conversion, source, args)
    if args.tokenizer != "none":
        figures["tokens"] = token_figures(conversion, args.tokenizer, args.max_seq_length)
    (args.out / "summary.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
