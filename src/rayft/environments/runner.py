"""Running episodes of an environment with a text generator, a turn at a time for many episodes at once.

An :class:`Episode` is one conversation's state (pure data); :func:`turn_prompts` says what every episode
still going asks the model now, and :func:`take_turn` hands one generation to its episode's environment
(the doer: it runs the tools) and records what came back. :func:`run_episodes` loops the two with any
``generate`` that maps a batch of prompts to generations (a local backend, a pool of Ray actors, a served
model), so that a batch holds the current turn of every unfinished episode. Evaluation drives episodes
this way; a failure of one episode (a row the environment refuses, a generation error, an environment
that raises) ends that episode with its error, never the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayft.data.tools import ToolUseError, split_tool_calls
from rayft.environments.episode import Environment, Message, Row
from rayft.generation.backend import Generation, Prompt, ToolChat

GenerateTurns = Callable[[list[Prompt]], list[Generation]]
"""``generate(prompts) -> generations``: one generation per prompt, in order (errors set, never raised)."""


@dataclass
class Episode:
    """One episode's conversation so far, its figures, and how it ended."""

    environment: Environment
    messages: list[Message]
    tools: tuple[dict[str, Any], ...] = ()
    turns: list[Generation] = field(default_factory=list)
    done: bool = False
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def answer(self) -> str:
        """The model's last turn (its final answer when the episode ended by itself)."""
        return self.turns[-1].text if self.turns else ""

    def prompt(self) -> Prompt:
        """What the model answers next: the conversation with the tools it may call."""
        return ToolChat(self.messages, self.tools)


def start_episode(environment: Environment, row: Row) -> Episode:
    """A new episode of ``row``; one the environment refuses is ended with the reason as its error."""
    tools = tuple(getattr(environment, "schemas", ()) or ())
    try:
        return Episode(environment, list(environment.reset(row)), tools)
    except Exception as exc:  # the row's failure (or a user environment's), not the run's
        return Episode(environment, [], tools, done=True, error=f"reset: {type(exc).__name__}: {exc}")


def turn_prompts(episodes: Sequence[Episode]) -> list[tuple[int, Prompt]]:
    """(index, prompt) of every episode still going, in order."""
    return [(index, episode.prompt()) for index, episode in enumerate(episodes) if not episode.done]


def assistant_message(text: str) -> Message:
    """The model's turn as the conversation holds it: its calls as OpenAI ``tool_calls`` (ids as the tools
    environment gives them, so the results answer them), so that each chat template renders the calls its
    own way; a turn whose calls cannot be read stays text, as the model wrote it."""
    try:
        content, calls = split_tool_calls(text)
    except ToolUseError:
        return {"role": "assistant", "content": text}
    if not calls:
        return {"role": "assistant", "content": text}
    message: dict[str, Any] = {"role": "assistant", "content": content}
    message["tool_calls"] = [call.to_openai(arguments_as_text=True) for call in calls]
    return message


def take_turn(episode: Episode, generation: Generation, max_turns: int) -> None:
    """Give the model's turn to the environment and record its answer; ``max_turns`` bounds an environment
    that never ends an episode (the tools environment ends its own at its limit)."""
    episode.turns.append(generation)
    if generation.error:
        episode.done, episode.error = True, f"generation: {generation.error}"
        return
    episode.messages.append(assistant_message(generation.text))
    try:
        result = episode.environment.step(generation.text)
    except Exception as exc:  # a user environment's failure ends its episode only
        episode.done, episode.error = True, f"step: {type(exc).__name__}: {exc}"
        return
    episode.messages.extend(result.messages)
    episode.reward, episode.info = result.reward, dict(result.info)
    if result.done:
        episode.done = True
    elif len(episode.turns) >= max_turns:
        episode.done, episode.info["truncated"] = True, "turns"


def run_episodes(
    rows: Sequence[Row], make_environment: Callable[[], Environment], generate: GenerateTurns, *, max_turns: int,
    on_finished: Callable[[int], None] | None = None,
) -> list[Episode]:  # fmt: skip
    """Run an episode of every row to its end, a turn of every unfinished episode per ``generate`` call;
    ``on_finished`` is told how many episodes ended at each turn (for progress while a long window runs)."""
    episodes = [start_episode(make_environment(), row) for row in rows]
    going = len(turn_prompts(episodes))
    if on_finished is not None and going < len(episodes):
        on_finished(len(episodes) - going)  # refused at reset
    while pending := turn_prompts(episodes):
        generations = generate([prompt for _, prompt in pending])
        for (index, _), generation in zip(pending, generations, strict=True):
            take_turn(episodes[index], generation, max_turns)
        ended, going = going - len(turn_prompts(episodes)), len(turn_prompts(episodes))
        if on_finished is not None and ended:
            on_finished(ended)
    return episodes


def episode_record(episode: Episode) -> dict[str, Any]:
    """What a per-example record keeps of an episode: its figures, reward, error and conversation."""
    return {
        "turns": len(episode.turns),
        "prompt_tokens": episode.turns[-1].num_prompt_tokens if episode.turns else 0,
        "tool_calls": int(episode.info.get("tool_calls", 0)),
        "tool_calls_by_tool": dict(episode.info.get("tool_calls_by_tool", {})),
        "tool_errors": sum(dict(episode.info.get("tool_errors", {})).values()),
        "tool_timeouts": sum(dict(episode.info.get("tool_timeouts", {})).values()),
        "truncated": episode.info.get("truncated"),
        "reward": episode.reward,
        "reward_error": episode.info.get("reward_error"),
        "error": episode.error,
        "messages": _jsonable(episode.messages),
    }


def as_generation(episode: Episode) -> Generation:
    """The episode as one generation: its final answer, the tokens of every turn, its first error."""
    last = episode.turns[-1] if episode.turns else None
    return Generation(
        episode.answer if episode.error is None else "",
        num_prompt_tokens=last.num_prompt_tokens if last else 0,
        num_generated_tokens=sum(turn.num_generated_tokens for turn in episode.turns),
        finish_reason="error" if episode.error else (last.finish_reason if last else "stop"),
        error=episode.error,
        extra={"episode": episode_record(episode)},
    )


def _jsonable(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(json.dumps(dict(m), default=str)) for m in messages]
