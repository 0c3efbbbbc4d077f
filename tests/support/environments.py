"""A user environment for tests (``tests.support.environments:Nudging``): it answers every model turn with a
user message for ``turns - 1`` turns, then ends the episode with a reward of 1 when the last turn is not
empty. Its episodes have the same number of turns whatever a random model writes."""

from __future__ import annotations

from typing import Any

from rayft.environments import StepResult


class Nudging:
    """Multi-turn episodes of a fixed length, whatever the model writes."""

    def __init__(self, turns: int = 2) -> None:
        self.turns = turns
        self.taken = 0

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        self.taken = 0
        return list(row["messages"]) if "messages" in row else [{"role": "user", "content": row["prompt"]}]

    def step(self, model_turn: str) -> StepResult:
        self.taken += 1
        if self.taken < self.turns:
            return StepResult([{"role": "user", "content": "Go on."}], 0.0, False, {"turns": self.taken})
        return StepResult([], float(bool(model_turn.strip())), True, {"turns": self.taken})
