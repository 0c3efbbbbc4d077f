"""Config section of a multi-turn environment (``train.rl.environment``): which environment, its tools and
the limits of one episode."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rayft.config.base import Section

BuiltinTool = Literal["calculator", "sql", "python"]


class EnvironmentConfig(Section):
    """A multi-turn environment: the built-in tools environment, or a user's class."""

    type: str = Field(
        "tools",
        description=(
            "'tools' (the model calls the tools listed in `tools` by writing <tool_call>{json}</tool_call> blocks; "
            "a turn without a call is its final answer, scored by train.rl.rewards) or 'package.module:Class', a "
            "class with reset(row) -> messages and step(model_turn) -> StepResult (rayft.environments.Environment), "
            "constructed as Class(**options)."
        ),
    )
    tools: list[BuiltinTool] = Field(
        default_factory=lambda: list[BuiltinTool](["calculator"]),
        description=(
            "For type 'tools': 'calculator' (exact arithmetic, evaluated without eval), 'sql' (read-only queries "
            "on the row's table in `table_column`, in the sql reward's sandbox), 'python' (a program run in "
            "rayft's process sandbox: time, memory, processes and output bounded, no network, no writes "
            "outside its scratch directory)."
        ),
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="For a user's class: the keyword arguments it is constructed with."
    )
    max_turns: int = Field(8, ge=1, description="Model turns per episode; an episode cut here scores 0.")
    max_tool_calls: int = Field(
        16, ge=0, description="Tool calls per episode; calls past it are answered with an error and counted."
    )
    max_tokens: int = Field(
        4096, ge=1, description="Tokens per episode (prompt, model turns and tool results); cut here, it scores 0."
    )
    tool_timeout_s: float = Field(
        10.0, gt=0, description="Time one tool call may take; past it the model reads an error, counted as a timeout."
    )
    keep_kv_cache: bool = Field(
        True,
        description="Training rollouts on the hf engine: keep each episode's KV cache between its turns, so that only "
        "the environment's answer is prefilled before the next turn (models whose layers are all full attention; "
        "others prefill the whole conversation each turn, as false does).",
    )
    table_column: str = Field("table", description="For the 'sql' tool: the data column holding each row's table.")
    python_memory_mb: int = Field(512, ge=64, description="For the 'python' tool: memory of its sandbox process, MiB.")

    @model_validator(mode="after")
    def _type_known(self) -> EnvironmentConfig:
        if self.type != "tools" and ":" not in self.type:
            raise ValueError(f"environment type {self.type!r} is neither 'tools' nor 'package.module:Class'")
        # Against the default, not the fields set: a config written out whole (a stage's copy) sets every field.
        if self.type != "tools" and self.tools != ["calculator"]:
            raise ValueError("tools is set for a user's environment class; only type 'tools' reads it")
        if len(set(self.tools)) != len(self.tools):
            raise ValueError(f"tools lists a tool twice: {self.tools}")
        return self
