"""Tool calls read from a model's turn, in the default text format ``<tool_call>{json}</tool_call>``.

The format has one implementation, :mod:`rayft.data.tools`, which the training data's rendering and the
server's parsing use as well; here each block that does not parse is kept as a :class:`BadCall`,
answered to the model with its reason and counted, never skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayft.data.tools import ToolCall, ToolUseError, tool_call_blocks

__all__ = ["BadCall", "ToolCall", "parse_tool_calls"]


@dataclass(frozen=True)
class BadCall:
    """A call block that is not a call; ``reason`` is answered to the model."""

    text: str
    reason: str
    id: str = ""


def parse_tool_calls(text: str) -> list[ToolCall | BadCall]:
    """The calls in a model's turn, in order; empty when the turn is a final answer."""
    return [
        BadCall(block.detail, block.detail, f"call_{index}") if isinstance(block, ToolUseError) else block
        for index, block in enumerate(tool_call_blocks(text))
    ]
