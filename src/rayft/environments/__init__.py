"""Environments for multi-turn episodes: a protocol, a tools environment and the tools rayft ships.

An episode starts from a data row and alternates model turns with the environment's answers (tool
results), until a final answer scored by a reward, or a limit. :func:`build_environment` makes one from
its config section (``train.rl.environment``); :class:`ToolsEnvironment` runs typed Python functions as
tools (:func:`tool_from_function`); the shipped tools are a calculator, SQL on the row's table and
Python in :mod:`rayft.sandbox`. See docs/guides/environments.md.
"""

from rayft.environments.calls import BadCall, ToolCall, parse_tool_calls
from rayft.environments.episode import Environment, EpisodeLimits, EpisodeStats, StepResult
from rayft.environments.loader import build_environment, build_tools, load_environment
from rayft.environments.tool_env import ToolsEnvironment
from rayft.environments.tools import Tool, ToolOutcome, call_tool, tool_from_function

__all__ = [
    "BadCall", "Environment", "EpisodeLimits", "EpisodeStats", "StepResult", "Tool", "ToolCall", "ToolOutcome",
    "ToolsEnvironment", "build_environment", "build_tools", "call_tool", "load_environment", "parse_tool_calls",
    "tool_from_function",
]  # fmt: skip
