"""Sampling a policy's completions with Hugging Face ``generate``: one call per micro-batch of prompts,
seeded, each completion cut after its end-of-sequence token.

The training workers (colocated rollouts, greedy validation) and the HF generation actors
(:mod:`rayft.training.methods.rl.rollout_actors`) sample through this one class, so a rollout drawn on an actor
is the rollout the trainer would have drawn with the same weights and seed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from rayft.config.rl import RlConfig
from rayft.training.modeling.attention import generation_attention

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from transformers import PreTrainedTokenizerBase

    from rayft.training.methods.rl.turn_cache import TurnCache
    from rayft.training.modeling.model import TransformersModel


@dataclass
class PromptBatch:
    """A micro-batch of prompts before its rollout: each prompt's token ids, its reference text, and the
    columns of its row carried to the rewards (``train.rl.carried_columns``; empty dicts when none are).
    Generation actors receive the prompts only: the rewards score on the trainer, with these rows."""

    prompts: list[list[int]]
    references: list[str]
    sample_ids: list[int]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def rows_of_completions(self, group: int) -> list[dict[str, Any]]:
        """Each sampled completion's row (``group`` completions per prompt, in prompt order)."""
        rows = self.rows or [{} for _ in self.prompts]
        return [row for row in rows for _ in range(group)]

    def to(self, device: object) -> PromptBatch:
        """Prompts stay host lists until they are sampled from."""
        return self


def seed_of(seed: int, step: int, sample_id: int) -> int:
    """The sampling seed of a micro-batch's rollout at a step, from its first prompt's sample id: a function
    of the three alone (exact resume; the same wherever the micro-batch is sampled)."""
    return (seed * 1_000_003 + step * 10_007 + sample_id * 7_919_113) % (2**63 - 1)


@dataclass
class Completions:
    """Sampled completions: per row its completion token ids (up to and with the end-of-sequence token),
    and, from generation actors, the weights' version (optimizer steps) that sampled them."""

    token_ids: list[list[int]]
    texts: list[str]
    generated_tokens: int
    seconds: float
    version: int | None = None
    logps: list[list[float]] | None = None  # per sampled token, under the sampling weights (asynchronous)
    # Multi-turn episodes (train.rl.environment): per completion token 1 where the model sampled it, 0 where the
    # environment's answer put it; each episode's record (rayft.training.methods.rl.episodes); the seconds the
    # environment's steps took. Texts are then each episode's last model turn, generated_tokens the sampled ones.
    masks: list[list[int]] | None = None
    episodes: list[dict[str, Any]] | None = None
    tool_seconds: float = 0.0


@dataclass(frozen=True)
class Sampler:
    """Completions of prompts by a causal LM with the rollout settings of ``settings``."""

    settings: RlConfig
    tokenizer: PreTrainedTokenizerBase
    attn_implementation: str

    def sample(
        self, inner: TransformersModel, prompts: list[list[int]], group: int, *, seed: int | None
    ) -> Completions:
        """``group`` completions of each prompt (consecutive), each cut after its end-of-sequence token, from
        one ``generate`` call over every row (one call of 32 rows ran 1.6x the tokens/s of four calls of 8 for
        SmolLM2 on CPU): sampled with the rollout settings from ``seed``, or greedy without one. With
        ``train.rl.rollout.shared_prefix`` each prompt is prefilled once for its group
        (:mod:`rayft.training.methods.rl.shared_prefix`)."""
        if group > 1 and self.settings.rollout.shared_prefix:
            token_ids, seconds = self.sample_rows(inner, prompts, seed=seed, group=group)
        else:
            token_ids, seconds = self.sample_rows(inner, [p for p in prompts for _ in range(group)], seed=seed)
        texts = self.tokenizer.batch_decode(token_ids, skip_special_tokens=True)
        return Completions(token_ids, texts, sum(len(t) for t in token_ids), seconds)

    def sample_rows(
        self, inner: TransformersModel, rows: list[list[int]], *, seed: int | None, max_new_tokens: int | None = None,
        turns: TurnCache | None = None, group: int = 1,
    ) -> tuple[list[list[int]], float]:  # fmt: skip
        """``group`` completions of each row, consecutive (sampled from ``seed``, greedy without one), and the
        seconds they took; ``max_new_tokens``: fewer than the rollout's (an episode's token budget); ``turns``:
        the episodes' cache kept across their turns (one completion per row)."""
        import torch

        was_training = inner.training
        inner.eval()
        started = time.perf_counter()
        with torch.no_grad(), generation_attention(inner, self.attn_implementation):
            if seed is not None:
                torch.manual_seed(seed)
            token_ids = self.generate(inner, rows, greedy=seed is None, max_new_tokens=max_new_tokens, turns=turns,
                                      group=group)  # fmt: skip
        inner.train(was_training)
        return token_ids, time.perf_counter() - started

    def generate(
        self, inner: TransformersModel, rows: list[list[int]], *, greedy: bool, max_new_tokens: int | None = None,
        turns: TurnCache | None = None, group: int = 1,
    ) -> list[list[int]]:  # fmt: skip
        """One ``generate`` call over ``rows`` (left-padded, or continuing ``turns``' cache), each completion cut
        after its end of sequence; with ``group`` > 1, over ``group`` consecutive copies of each row, the rows
        prefilled once."""
        from transformers import GenerationConfig

        from rayft.training.methods.rl.shared_prefix import generate_shared, left_padded

        pad = self.pad_id
        s = self.settings
        sampling = {} if greedy else {"temperature": s.temperature, "top_p": s.top_p, "top_k": 0}
        # A fresh config, not the model's: its sampling defaults must not leak into greedy or sampled runs.
        new_tokens = s.max_new_tokens if max_new_tokens is None else min(s.max_new_tokens, max_new_tokens)
        config = GenerationConfig(do_sample=not greedy, max_new_tokens=new_tokens, pad_token_id=pad,
                                  eos_token_id=self.eos_ids, **sampling)  # type: ignore[no-untyped-call]  # fmt: skip
        if turns is not None:
            if group != 1:
                raise ValueError("a kept turn cache continues one completion per row: group must be 1")
            return turns.generate(inner, rows, config, pad, self.cut)
        input_ids, attention = left_padded(rows, pad, next(inner.parameters()).device)
        width = input_ids.shape[1]
        if group > 1:
            generated = generate_shared(inner, input_ids, attention, group, generation_config=config)
        else:
            generate = cast("Callable[..., torch.Tensor]", inner.generate)  # the token ids (no dict asked for)
            generated = generate(input_ids=input_ids, attention_mask=attention, generation_config=config)
        return [self.cut(row) for row in generated[:, width:].tolist()]

    def completion_logps(
        self, inner: TransformersModel, prompts: list[list[int]], completions: list[list[int]], rows_per_forward: int,
        masks: list[list[int]] | None = None,
    ) -> list[list[float]]:  # fmt: skip
        """The log-probability of each sampled completion token (completion ``i`` follows ``prompts[i]``; with
        ``masks``, the tokens marked 1) under ``inner``, computed as the trainer computes its own (one forward
        of at most ``rows_per_forward`` rows at a time), so that the two compare token for token."""
        import torch

        from rayft.data.collate import collate
        from rayft.data.prepared import IGNORE_INDEX
        from rayft.training.methods.rl.losses import completion_logps, kept_positions
        from rayft.training.modeling.attention import row_multiple

        out: list[list[float]] = []
        device = next(inner.parameters()).device
        for start in range(0, len(completions), rows_per_forward):
            pairs = list(zip(prompts[start : start + rows_per_forward], completions[start : start + rows_per_forward],
                             strict=True))  # fmt: skip
            units = [{"input_ids": p + c, "labels": [IGNORE_INDEX] * len(p) + c, "position_ids": range(len(p) + len(c)),
                      "sample_ids": []} for p, c in pairs]  # fmt: skip
            rows = collate(units, self.pad_id, row_multiple(self.attn_implementation)).to(device)
            with torch.no_grad():
                logps = completion_logps(inner, rows, None)[0].tolist()
            # Target t (of labels[:, 1:]) predicts token t + 1: a row's completion token j is at len(p) - 1 + j.
            column = {position: i for i, position in enumerate(kept_positions(rows.labels).tolist())}
            for (p, c), row in zip(pairs, logps, strict=True):
                out.append([row[column[len(p) - 1 + j]] for j in range(len(c))])
        if masks is None:
            return out
        return [[v for v, m in zip(values, mask, strict=True) if m] for values, mask in zip(out, masks, strict=True)]

    @property
    def pad_id(self) -> int:
        """The padding token (the end-of-sequence token when the tokenizer has none)."""
        tokenizer = self.tokenizer
        return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)

    @property
    def eos_ids(self) -> list[int]:
        """The tokens that end a completion: the tokenizer's end of sequence (what the SFT rows end with)."""
        return [int(self.tokenizer.eos_token_id)]

    def cut(self, row: list[int]) -> list[int]:
        """A generated row up to and with its first end-of-sequence token (the padding after it dropped)."""
        for index, token in enumerate(row):
            if token in self.eos_ids:
                return row[: index + 1]
        return row
