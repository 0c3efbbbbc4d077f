"""Multi-turn rollouts (``train.rl.environment``): each completion of a group is an episode in the environment,
sampled turn by turn, with the environment's answers (tool results) between the model's turns.

The episodes of a micro-batch advance together: every live episode samples its next turn in one seeded
``generate`` call, then the environment answers every turn at once, apart from the sampling
(:mod:`rayft.training.methods.rl.tool_steps`). The sequence of an episode is its prompt's token ids, then
each turn's ids exactly as sampled, then the ids of the environment's answer: the text the chat template
renders after the turn (the end of the assistant's turn, the ``tool`` messages as the data path renders
them, :func:`rayft.data.tokenize.render_chat`, and the next assistant header), tokenized alone and appended.
Nothing sampled is ever decoded and tokenized again. The mask of a completion marks its sampled tokens: only
they carry loss and enter the probability ratio; the appended answers are context. The batch's KV cache is kept
from one turn to the next (``keep_kv_cache``, :mod:`rayft.training.methods.rl.turn_cache`): a turn prefills
only the environment's answer, not the whole conversation again.

An episode ends when the model answers without a tool call (the environment says it is done), or is cut:
``turns`` (``max_turns`` model turns), ``tokens`` (its sequence reached ``max_tokens``), ``timeout`` (its
environment's step passed the deadline) or ``error`` (the environment's step raised).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rayft.config.environment import EnvironmentConfig
from rayft.environments.episode import Environment, Message
from rayft.environments.loader import build_environment
from rayft.errors import DataError
from rayft.evaluation.rewards import Scores
from rayft.training.methods.rl.tool_steps import StepOutcome, StepRunner, step_runner
from rayft.training.methods.rl.turn_cache import TurnCache, keeps_cache

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rayft.training.methods.rl.sampling import Completions, Sampler
    from rayft.training.modeling.model import TransformersModel

_CONTEXT: list[Message] = [{"role": "user", "content": "?"}]
"""What the rendering of an answer puts before the turn: the answer is the text after the turn, which the
conversation before it does not change (a template that did would not render a conversation as a prefix of
its continuation, which the data path refuses as well)."""
_MARK = "\ue000"
"""A private-use character standing for a turn's text, to find where the template closes a turn."""


@dataclass(frozen=True)
class TurnRenderer:
    """The text that follows a sampled turn until the model's next turn: what is left of the template's end of
    the turn after the sampled end-of-sequence token, the environment's messages and the next assistant header."""

    render: Callable[[Sequence[Mapping[str, Any]], bool], str]
    """``render(messages, generation_prompt)``: :func:`rayft.data.tokenize.render_chat` of the policy's template."""
    eos_text: str

    def closing(self) -> str:
        """What the template writes after an assistant turn's text (ChatML: ``<|im_end|>\\n``)."""
        text = self.render([*_CONTEXT, {"role": "assistant", "content": _MARK}], False)
        return text[text.rindex(_MARK) + len(_MARK) :]

    def answer_text(self, turn: str, ended: bool, messages: Sequence[Message]) -> str:
        """The text to append after ``turn`` (``ended``: its ids end with the end-of-sequence token)."""
        assistant = {"role": "assistant", "content": turn}
        upto = self.render([*_CONTEXT, assistant], False)
        full = self.render([*_CONTEXT, assistant, *messages], True)
        if not full.startswith(upto):
            raise DataError(
                "the chat template does not render a conversation as a prefix of its continuation, so the "
                "environment's answers cannot follow the sampled tokens; set model.chat_template to one that does"
            )
        closing = self.closing()
        if ended and closing.startswith(self.eos_text):
            closing = closing[len(self.eos_text) :]  # the model sampled the end of its turn itself
        return closing + full[len(upto) :]


def turn_renderer(tokenizer: PreTrainedTokenizerBase) -> TurnRenderer:
    """The renderer of ``tokenizer``'s chat template (the one the prompts were rendered with)."""
    from rayft.data.tokenize import TextTokenizer, render_chat

    text = TextTokenizer.from_hf(tokenizer)
    if text.chat_template is None:
        raise DataError("train.rl.environment needs a chat template to render tool results; set model.chat_template")
    template, kwargs = text.chat_template, text.template_kwargs

    def render(messages: Sequence[Mapping[str, Any]], generation_prompt: bool) -> str:
        return render_chat(template, kwargs, messages, generation_prompt=generation_prompt)

    return TurnRenderer(render, str(tokenizer.decode([tokenizer.eos_token_id])))


@dataclass
class Episode:
    """One episode: its sequence (prompt, then completion tokens), which completion tokens were sampled, and
    what it did."""

    env: Environment
    ids: list[int]
    prompt_length: int
    sampled: list[int] = field(default_factory=list)
    """Per completion token: 1 where the model sampled it, 0 where the environment's answer put it."""
    turn: list[int] = field(default_factory=list)
    text: str = ""
    """The last model turn's text (what the rewards score when the episode ends)."""
    done: bool = False
    truncated: str | None = None
    turns: int = 0
    env_reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None
    prefilled: int = 0
    """The tokens of the episode that its turns' prefills computed (each token once with the kept KV cache)."""

    def take_turn(self, ids: list[int], text: str) -> None:
        """Append a sampled turn."""
        self.ids += ids
        self.sampled += [1] * len(ids)
        self.turn, self.text = ids, text
        self.turns += 1

    def append_answer(self, ids: list[int]) -> None:
        """Append the environment's answer (never trained on)."""
        self.ids += ids
        self.sampled += [0] * len(ids)

    def end(self, truncated: str | None, reward: float = 0.0) -> None:
        """The episode is over (``truncated``: why it was cut, None when it ended itself)."""
        self.done, self.truncated, self.env_reward = True, truncated, reward

    @property
    def completion(self) -> list[int]:
        """The tokens after the prompt."""
        return self.ids[self.prompt_length :]

    def record(self) -> dict[str, Any]:
        """What the episode did, as plain values (kept with the completions, and summed into the step's figures)."""
        info = self.info
        calls = info.get("tool_calls_by_tool")
        return {
            "turns": self.turns, "truncated": self.truncated, "env_reward": self.env_reward,
            "model_tokens": sum(self.sampled), "tool_tokens": len(self.sampled) - sum(self.sampled),
            "tool_calls": {str(k): int(v) for k, v in calls.items()} if isinstance(calls, dict) else {},
            "tool_errors": _count(info.get("tool_errors")), "tool_timeouts": _count(info.get("tool_timeouts")),
            "env_failure": self.failure, "prefill_tokens": self.prefilled,
        }  # fmt: skip


def _count(value: object) -> int:
    """A count the environment reports per tool (a dict) or as one number."""
    if isinstance(value, dict):
        return int(sum(value.values()))
    return int(value) if isinstance(value, int | float) else 0


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of an episode batch's ``turn``-th turn (turn 0 samples with the micro-batch's seed; None:
    greedy)."""
    return None if seed is None else (seed + turn * 1_000_000_007) % (2**63 - 1)


def step_deadline(cfg: EnvironmentConfig) -> float:
    """How long one turn's steps may take: each call's timeout for every call an episode may make, and a margin."""
    return cfg.tool_timeout_s * max(cfg.max_tool_calls, 1) + 10.0


@dataclass
class EpisodeRunner:
    """Runs a micro-batch's episodes with a sampler's model, its environment's steps on ``steps``."""

    sampler: Sampler
    cfg: EnvironmentConfig
    steps: StepRunner
    renderer: TurnRenderer

    def new_env(self) -> Environment:
        """A fresh environment for one episode; the episode's tokens are counted here, on its token ids."""
        return build_environment(self.cfg, count_tokens=_no_tokens)

    def start(self, prompt: list[int], row: Mapping[str, Any]) -> Episode:
        """An episode of ``prompt``: the environment reset with the row's carried columns and the prompt's text."""
        env = self.new_env()
        text = self.sampler.tokenizer.decode(prompt, skip_special_tokens=True)
        env.reset({**row, "prompt": str(text)})
        return Episode(env, list(prompt), len(prompt))

    def run(
        self, inner: TransformersModel, prompts: Sequence[list[int]], rows: Sequence[Mapping[str, Any]], group: int,
        seed: int | None,
    ) -> Completions:  # fmt: skip
        """``group`` episodes of each prompt (consecutive), played to their end (sampled from ``seed``, greedy
        without one)."""
        from rayft.training.methods.rl.sampling import Completions

        episodes = [self.start(p, r) for p, r in zip(prompts, rows or [{}] * len(prompts), strict=True)
                    for _ in range(group)]  # fmt: skip
        sample_s = tool_s = 0.0
        cache = TurnCache() if self.cfg.keep_kv_cache and keeps_cache(inner) else None
        for turn in range(self.cfg.max_turns):
            keys = [i for i, e in enumerate(episodes) if not e.done]
            if not keys:
                break
            live = [episodes[i] for i in keys]
            if cache is not None:
                cache.select(keys)
            sample_s += self.sample_turn(inner, live, turn_seed(seed, turn), cache)
            stepping = [e for e in live if not e.done]
            if stepping:
                outcomes = self.steps.step(
                    [e.env for e in stepping], [e.text for e in stepping], step_deadline(self.cfg)
                )
                tool_s += max(o.seconds for o in outcomes)
                for episode, outcome in zip(stepping, outcomes, strict=True):
                    self.answer(episode, outcome)
        for episode in episodes:
            if not episode.done:  # unreachable with the tools environment, which cuts at max_turns itself
                episode.end("turns")
        completions = [e.completion for e in episodes]
        return Completions(completions, [e.text for e in episodes], sum(sum(e.sampled) for e in episodes), sample_s,
                           masks=[e.sampled for e in episodes], episodes=[e.record() for e in episodes],
                           tool_seconds=tool_s)  # fmt: skip

    def sample_turn(
        self, inner: TransformersModel, live: list[Episode], seed: int | None, cache: TurnCache | None = None
    ) -> float:
        """Every live episode's next turn, from one ``generate`` call (continuing ``cache`` when one is kept); an
        episode whose sequence reaches ``max_tokens`` without ending its turn is cut (``tokens``). Returns the
        sampling seconds."""
        limit = self.cfg.max_tokens
        budget = max(*(limit - len(e.ids) for e in live), 1)
        rows = [e.ids for e in live]
        turns, seconds = self.sampler.sample_rows(inner, rows, seed=seed, max_new_tokens=budget, turns=cache)
        prefilled = cache.prefilled if cache is not None else [len(row) for row in rows]
        for episode, turn, fed in zip(live, turns, prefilled, strict=True):
            episode.prefilled += fed
            ids = turn[: max(limit - len(episode.ids), 1)]  # at least one token: an episode trains on something
            episode.take_turn(ids, str(self.sampler.tokenizer.decode(ids, skip_special_tokens=True)))
            if len(episode.ids) >= limit and ids[-1] not in self.sampler.eos_ids:
                episode.end("tokens")
        return seconds

    def answer(self, episode: Episode, outcome: StepOutcome) -> None:
        """The environment's answer to the episode's turn: the end, or its messages appended as tokens."""
        episode.env = outcome.env
        if outcome.result is None:
            episode.failure = outcome.failure
            episode.end("timeout" if outcome.failure == "timeout" else "error")
            return
        result = outcome.result
        episode.info = dict(result.info)
        if result.done:
            truncated = result.info.get("truncated")
            episode.end(str(truncated) if truncated else None, float(result.reward))
            return
        if episode.turns >= self.cfg.max_turns:
            episode.end("turns")
            return
        ended = bool(episode.turn) and episode.turn[-1] in self.sampler.eos_ids
        text = self.renderer.answer_text(episode.text, ended, result.messages)
        ids = list(self.sampler.tokenizer.encode(text, add_special_tokens=False))
        if len(episode.ids) + len(ids) >= self.cfg.max_tokens:
            episode.end("tokens")  # no room left for the model's next turn
            return
        episode.append_answer(ids)


def episode_runner(sampler: Sampler) -> EpisodeRunner | None:
    """The runner of the sampler's ``train.rl.environment``, None for single-turn rollouts."""
    cfg = sampler.settings.environment
    if cfg is None:
        return None
    return EpisodeRunner(sampler, cfg, step_runner(), turn_renderer(sampler.tokenizer))


def _no_tokens(text: str) -> int:
    """The environment's token count: none (the rollout counts an episode's token ids itself)."""
    return 0


def episode_scores(scores: Scores, records: Sequence[Mapping[str, Any]]) -> Scores:
    """The episodes' rewards: the configured rewards of each final answer plus the environment's own reward; an
    episode cut short scores its environment's reward alone (0 for the tools environment)."""
    kept = [0.0 if record["truncated"] else 1.0 for record in records]
    by_function = {
        name: [v * k for v, k in zip(values, kept, strict=True)] for name, values in scores.by_function.items()
    }
    total = [t * k + float(r["env_reward"]) for t, k, r in zip(scores.total, kept, records, strict=True)]
    return Scores(total, by_function, scores.errors)


def episode_figure_names(tool_names: Sequence[str]) -> list[str]:
    """The sums a step adds up for its episodes, in one order on every rank (``tool_names``: each counted apart)."""
    fixed = ["episodes", "episode_turns", "episode_tool_calls", "episode_tool_errors", "episode_tool_timeouts",
             "episode_truncated", "episode_env_failures", "episode_model_tokens", "episode_tool_tokens",
             "episode_prefill_tokens", "time/rollout_sample_s", "time/rollout_tools_s"]  # fmt: skip
    return fixed + [f"episode_tool_calls/{name}" for name in tool_names]


def episode_sums(records: Sequence[Mapping[str, Any]], tool_names: Sequence[str]) -> dict[str, float]:
    """The sums of :func:`episode_figure_names` (but the times) over a batch's episode records."""
    sums = {
        "episodes": float(len(records)),
        "episode_turns": float(sum(r["turns"] for r in records)),
        "episode_tool_calls": float(sum(sum(r["tool_calls"].values()) for r in records)),
        "episode_tool_errors": float(sum(r["tool_errors"] for r in records)),
        "episode_tool_timeouts": float(sum(r["tool_timeouts"] for r in records)),
        "episode_truncated": float(sum(r["truncated"] is not None for r in records)),
        "episode_env_failures": float(sum(r["env_failure"] is not None for r in records)),
        "episode_model_tokens": float(sum(r["model_tokens"] for r in records)),
        "episode_tool_tokens": float(sum(r["tool_tokens"] for r in records)),
        # .get: episodes sampled ahead and checkpointed before the count existed resume without it.
        "episode_prefill_tokens": float(sum(r.get("prefill_tokens", 0) for r in records)),
    }
    for name in tool_names:
        sums[f"episode_tool_calls/{name}"] = float(sum(r["tool_calls"].get(name, 0) for r in records))
    return sums


def episode_figures(total: Mapping[str, float], tool_names: Sequence[str], world_size: int) -> dict[str, float]:
    """The step's episode figures from every rank's sums: means per episode (turns, tool calls in all and per tool,
    model and tool tokens, tokens prefilled), counts (tool errors, timeouts, truncated episodes, failed environment
    steps), and the seconds of sampling and of the environment's steps (a rank's mean)."""
    episodes = max(total["episodes"], 1.0)
    figures = {
        "rl/episode/turns": total["episode_turns"] / episodes,
        "rl/episode/tool_calls": total["episode_tool_calls"] / episodes,
        "rl/episode/model_tokens": total["episode_model_tokens"] / episodes,
        "rl/episode/tool_tokens": total["episode_tool_tokens"] / episodes,
        "rl/episode/prefill_tokens": total["episode_prefill_tokens"] / episodes,
        "rl/episode/tool_errors": total["episode_tool_errors"],
        "rl/episode/tool_timeouts": total["episode_tool_timeouts"],
        "rl/episode/truncated": total["episode_truncated"],
        "rl/episode/env_failures": total["episode_env_failures"],
        "rl/episode/sample_s": total["time/rollout_sample_s"] / world_size,
        "rl/episode/tool_s": total["time/rollout_tools_s"] / world_size,
    }
    for name in tool_names:  # '<malformed>' and '<unknown>' as 'malformed' and 'unknown': trackers refuse '<'
        figures[f"rl/episode/tool_calls/{name.strip('<>')}"] = total[f"episode_tool_calls/{name}"] / episodes
    return figures


def tool_names(cfg: EnvironmentConfig | None) -> list[str]:
    """The tools counted apart in the figures: those of a tools environment (built-in, or a user's class that is
    one) and its two kinds of bad calls; another environment's calls are counted in all only."""
    from rayft.environments.tool_env import BAD_CALL, UNKNOWN_TOOL

    if cfg is None:
        return []
    tools = getattr(build_environment(cfg, count_tokens=_no_tokens), "tools", None)
    if not isinstance(tools, Mapping):
        return []
    return [str(name) for name in tools] + [BAD_CALL, UNKNOWN_TOOL]
