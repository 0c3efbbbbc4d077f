"""A tools environment for testing multi-turn rollouts with a model that writes no tool calls.

A random-init model never writes a ``<tool_call>`` block, so its episodes would end after one turn.
:class:`ScriptedCalls` is rayft's calculator tools environment with a ``hang`` tool beside it, which reads
each model turn with the calls of its script for that turn appended: the model's tokens are its own, the
calls run for real (well formed, with bad arguments, or hanging past the call's timeout) and are counted
as any call is. Name it in a config as ``train.rl.environment.type: rayft.testing.environments:ScriptedCalls``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from rayft.environments.builtin import calculator_tool
from rayft.environments.episode import EpisodeLimits, StepResult
from rayft.environments.tool_env import ToolsEnvironment
from rayft.environments.tools import tool_from_function

GOOD = '<tool_call>{"name": "calculator", "arguments": {"expression": "123456789 * 987654321"}}</tool_call>'
BAD_ARGUMENTS = '<tool_call>{"name": "calculator", "arguments": {"expr": "1 + 1"}}</tool_call>'
HANGS = '<tool_call>{"name": "hang", "arguments": {"seconds": 120}}</tool_call>'
SCRIPT = (GOOD + BAD_ARGUMENTS + HANGS, GOOD)
"""Turn 1: a good call, a call with bad arguments and a call that hangs; turn 2: a good call; then none."""


def hang(seconds: float) -> str:
    """Wait ``seconds`` before answering (a tool that hangs past any reasonable timeout)."""
    threading.Event().wait(seconds)
    return "done"


class ScriptedCalls(ToolsEnvironment):
    """The calculator (and ``hang``) tools environment, whose model turns carry the calls ``script`` gives each."""

    def __init__(
        self, script: Sequence[str] = SCRIPT, max_turns: int = 3, tool_timeout_s: float = 1.0
    ) -> None:  # fmt: skip
        tools = [calculator_tool(), tool_from_function(hang)]
        limits = EpisodeLimits(max_turns=max_turns, tool_timeout_s=tool_timeout_s)
        super().__init__(tools, limits=limits, count_tokens=_no_tokens)
        self.script = list(script)

    def step(self, model_turn: str) -> StepResult:
        """The turn with its scripted calls appended (none past the script)."""
        turn = self.stats.turns
        return super().step(model_turn + (self.script[turn] if turn < len(self.script) else ""))


def _no_tokens(text: str) -> int:
    return 0  # the rollout counts an episode's token ids itself
