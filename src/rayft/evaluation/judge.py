"""An LLM judge as a reward: a rubric filled with each sample's prompt, completion and reference, sent to a
model behind any OpenAI-compatible endpoint (``rayft serve``, vLLM, a hosted API), its score read strictly.

The requests go through :class:`~rayft.generation.openai_http.OpenAIBackend`, rayft's one OpenAI-compatible
client: at most ``endpoint.max_concurrency`` in flight, each bounded by ``endpoint.timeout_s``, retried with
backoff after HTTP 429, 5xx, a timeout or a dropped connection, the key read from the environment variable
``endpoint.api_key_env`` and masked wherever it could be shown. A reply counts only when it holds
``SCORE: <number>`` with the number in ``[score_min, score_max]``; it is mapped onto [0, 1]. A judgement that
failed or did not parse comes back as a :class:`JudgeError` carrying the configured fallback, which
:class:`~rayft.evaluation.rewards.RewardSet` scores and counts in ``rl/reward_errors/<name>``: a judge that
hangs or answers garbage costs those samples their reward, never the run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayft.config.judge import JudgeConfig
from rayft.generation.backend import Generation, SamplingParams
from rayft.generation.openai_http import OpenAIBackend
from rayft.security import redact

log = logging.getLogger(__name__)

SCORE = re.compile(r"\bSCORE:\s*([-+]?\d+(?:\.\d+)?)(?![\d.])")
"""The score line a rubric asks for: ``SCORE: 7`` or ``SCORE: 0.5``; the last one in a reply counts."""


class JudgeError(Exception):
    """A judgement that failed or did not parse; the sample scores ``fallback`` and is counted as an error."""

    def __init__(self, message: str, fallback: float) -> None:
        super().__init__(message)
        self.fallback = fallback


@dataclass
class JudgeCounts:
    """What the judge did since it was built: requests sent, answers taken from the cache, and failures."""

    requests: int = 0
    cache_hits: int = 0
    failed: int = 0
    unparsable: int = 0


def parse_score(reply: str, low: float, high: float) -> float:
    """The reward a judge's ``reply`` gives: its last ``SCORE: <number>``, in ``[low, high]``, mapped onto
    [0, 1]. Raises ValueError when there is no such line or the number is out of range."""
    found = SCORE.findall(reply)
    if not found:
        raise ValueError(f"no 'SCORE: <number>' in the judge's reply {redact(reply[:120])!r}")
    value = float(found[-1])
    if not low <= value <= high:
        raise ValueError(f"the judge's score {value:g} is outside [{low:g}, {high:g}]")
    return (value - low) / (high - low)


class LLMJudge:
    """Scores completions with a judge model; a batch's judgements run concurrently, and each distinct
    rubric text is judged once while it stays in the cache (bounded, least recently used dropped first)."""

    def __init__(self, cfg: JudgeConfig, backend: OpenAIBackend | None = None) -> None:
        self.cfg = cfg
        self.backend = backend or OpenAIBackend(cfg.model, cfg.endpoint)
        self.params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
        self.cache: OrderedDict[str, float] = OrderedDict()
        self.counts = JudgeCounts()

    def rubric_text(self, completion: str, reference: str, row: Mapping[str, Any]) -> str:
        """The rubric filled with one sample's prompt (the row's ``prompt_column``), completion and reference."""
        prompt = row[self.cfg.prompt_column]
        prompt = prompt if isinstance(prompt, str) else json.dumps(prompt, default=str)
        low, high = f"{self.cfg.score_min:g}", f"{self.cfg.score_max:g}"
        return self.cfg.rubric.format(
            prompt=prompt, completion=completion, reference=reference, score_min=low, score_max=high
        )

    def __call__(self, completion: str, reference: str, row: Mapping[str, Any]) -> float:
        """One sample's reward; a failed judgement raises :class:`JudgeError`."""
        (result,) = self.many([completion], [reference], [row])
        if isinstance(result, Exception):
            raise result
        return float(result)

    def many(
        self, completions: Sequence[str], references: Sequence[str], rows: Sequence[Mapping[str, Any]]
    ) -> list[Any]:
        """Per completion, its reward in [0, 1] or the :class:`JudgeError` (or KeyError for a row without
        the prompt column) that stands for it."""
        results: list[Any] = [None] * len(completions)
        todo: dict[str, list[int]] = {}  # cache key -> the samples it scores (a batch may repeat a completion)
        texts: dict[str, str] = {}
        for i, (completion, reference, row) in enumerate(zip(completions, references, rows, strict=True)):
            try:
                text = self.rubric_text(completion, reference, row)
            except KeyError as exc:
                results[i] = exc
                continue
            key = self._key(text)
            if key in self.cache:
                self.cache.move_to_end(key)
                self.counts.cache_hits += 1
                results[i] = self.cache[key]
            else:
                todo.setdefault(key, []).append(i)
                texts[key] = text
        self._judge(todo, texts, results)
        return results

    def _judge(self, todo: dict[str, list[int]], texts: dict[str, str], results: list[Any]) -> None:
        """Send the rubric texts not in the cache, concurrently, and fill in the samples they score."""
        keys = list(todo)
        self.counts.requests += len(keys)
        replies = self.backend.generate([[{"role": "user", "content": texts[k]}] for k in keys], self.params)
        for key, reply in zip(keys, replies, strict=True):
            value = self._read(reply)
            if not isinstance(value, JudgeError):
                self._remember(key, value)
            for i in todo[key]:
                results[i] = value

    def _read(self, reply: Generation) -> float | JudgeError:
        """The reward in one reply, or the failure that stands for it (counted by kind)."""
        if reply.error is not None:
            self.counts.failed += 1
            return JudgeError(f"the judge did not answer: {reply.error}", self.cfg.fallback)
        try:
            return parse_score(reply.text, self.cfg.score_min, self.cfg.score_max)
        except ValueError as exc:
            self.counts.unparsable += 1
            return JudgeError(str(exc), self.cfg.fallback)

    def _key(self, text: str) -> str:
        """The cache key of one rubric text: the judge and its sampling settings, and the text."""
        what = [self.cfg.model, self.backend.base_url, self.cfg.max_new_tokens, self.cfg.temperature, text]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()

    def _remember(self, key: str, value: float) -> None:
        if self.cfg.cache_size == 0:
            return
        self.cache[key] = value
        self.cache.move_to_end(key)
        while len(self.cache) > self.cfg.cache_size:
            self.cache.popitem(last=False)

    def close(self) -> None:
        """Close the judge's pooled connections."""
        self.backend.close()
