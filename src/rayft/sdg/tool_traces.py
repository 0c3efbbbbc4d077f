"""Tool-use traces from verified math rows (``sdg.tool_use``): each ``<<expression=result>>`` step of a
row's solution becomes a call of a ``calculator`` tool and its answer, and the solution follows.

The trace is an OpenAI-shaped conversation (see :mod:`rayft.data.tools`): the question as the user
turn; per annotation, an assistant turn that calls ``calculator`` with the expression and a tool turn
with the result the calculator gives; then the solution itself as the last assistant turn. So a
model trained on it learns to hand each computation to the calculator, in order, and to answer with
the results it got back. Rows carry the trace as JSON text in a ``messages`` column and the tool's
schema in a ``tools`` column, which ``format: auto`` reads as a tool-use conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rayft.calculator import SCHEMA, CalculatorError, calculate
from rayft.sdg.mathcheck import AnswerError, parse_annotations
from rayft.sdg.rows import reject
from rayft.sdg.stages import Row

CALCULATOR_TOOL: dict[str, Any] = SCHEMA
"""The schema of the tool every trace calls: the tools environment's own, so a model trained on the traces
sees the tool listed in training exactly as in its RL and eval episodes."""
TRACE_COLUMNS = ("messages", "tools")
"""The columns a tool-use SDG run adds to its rows (JSON text)."""


def calculator_trace(question: str, answer: str) -> list[dict[str, Any]]:
    """The conversation that solves ``question`` with one calculator call per annotation of ``answer``
    (a verified GSM8K-style solution), answered by ``answer``; :class:`AnswerError` when an annotation
    does not parse or is wrong."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for index, step in enumerate(parse_annotations(answer)):
        call_id = f"call_{index}"
        expression = "".join(step.tokens)
        try:  # the tool turn holds what the calculator answers in an episode, not the solution's rounding
            result = calculate(expression)
        except CalculatorError as refused:
            raise AnswerError("calculator_refused", f"{expression!r}: {refused}") from None
        arguments = json.dumps({"expression": expression})
        call = {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": arguments}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    messages.append({"role": "assistant", "content": answer})
    return messages


@dataclass(frozen=True)
class ToolTraceStage:
    """Stage function: every accepted row gets its calculator trace (``messages``) and ``tools``; a row
    whose trace cannot be made is rejected with the annotation's reason."""

    def __call__(self, rows: list[Row]) -> list[Row]:
        tools = json.dumps([CALCULATOR_TOOL])
        for row in rows:
            row["messages"], row["tools"] = "", tools
            if row["reject_reason"]:
                continue
            try:
                row["messages"] = json.dumps(calculator_trace(row["question"], row["answer"]), ensure_ascii=False)
            except AnswerError as bad:
                reject(row, "tool_traces", f"math_{bad.reason}", str(bad))
        return rows
