"""GRPO with multi-turn episodes (``train.rl.environment``) on a tiny random model and a local Ray: the
tokens trained are the tokens sampled, turn for turn, the loss falls on them alone, tools that hang or
get bad arguments are counted while the run goes on, and an asynchronous multi-turn run on generation
actors resumed from a checkpoint equals the uninterrupted run.

A random model writes no tool calls, so the episodes run in rayft.testing's ScriptedCalls: the calculator
tools environment reading each model turn with scripted calls appended (well formed, bad arguments, a
tool that hangs past the call's timeout); the calls, their answers and the model's tokens are real."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from rayft.data.prepared import IGNORE_INDEX, PreparedData
from rayft.testing.environments import BAD_ARGUMENTS, GOOD
from rayft.training.methods.rl.method import RlTraining
from rayft.training.methods.rl.sampling import Sampler
from tests.integration.test_train_rl import BUILTIN_REWARDS, prompts, rl_config
from tests.support.runs import crashed_copy, read_metrics, train_losses, train_on

pytestmark = pytest.mark.integration
__all__ = ["prompts"]  # the prepared prompts, shared with the single-turn tests

SCRIPTED = "rayft.testing.environments:ScriptedCalls"
EPISODES = (BUILTIN_REWARDS, "train.learning_rate=5e-2", "train.rl.max_new_tokens=6",
            f"train.rl.environment={{type: '{SCRIPTED}', options: {{tool_timeout_s: 1.0}}, max_turns: 3, "
            "max_tokens: 400}")  # fmt: skip
ACTORS = ("train.rl.rollout.placement=actors", "train.rl.rollout.start_timeout_s=120",
          "train.rl.rollout.sync_timeout_s=120", "train.rl.rollout.generate_timeout_s=120")  # fmt: skip
EPISODE_FIGURES = ("rl/reward", "rl/episode/turns", "rl/episode/tool_calls", "rl/episode/tool_calls/calculator",
                   "rl/episode/tool_errors", "rl/episode/tool_timeouts", "rl/episode/truncated",
                   "rl/episode/model_tokens", "rl/episode/tool_tokens", "rl/staleness")  # fmt: skip


def trained_records(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in read_metrics(run_dir) if "train/loss" in r]


def test_episodes_train_on_their_sampled_tokens_and_count_tools_that_hang_or_get_bad_arguments(
    tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each turn's ids as sampled, by the sequence it continued (a group's first turns share their prompt).
    sampled: dict[tuple[int, ...], list[list[int]]] = defaultdict(list)
    trained: list[tuple[list[int], list[int]]] = []  # each trained row's input ids and labels
    sample_rows, loss_sum = Sampler.sample_rows, RlTraining.loss_sum

    def record_turns(self: Sampler, inner: Any, rows: list[list[int]], **kwargs: Any) -> Any:
        out = sample_rows(self, inner, rows, **kwargs)
        for row, ids in zip(rows, out[0], strict=True):
            sampled[tuple(row)].append(ids)
        return out

    def record_rows(self: RlTraining, model: Any, batch: Any, precision: Any) -> Any:
        trained.extend(zip(batch.rows.input_ids.tolist(), batch.rows.labels.tolist(), strict=True))
        return loss_sum(self, model, batch, precision)

    # Spies around the real sampler and loss (the trainer runs in this process: scaling.num_workers=0).
    monkeypatch.setattr(Sampler, "sample_rows", record_turns)
    monkeypatch.setattr(RlTraining, "loss_sum", record_rows)
    # Room for all three turns: the first answer (three results, two of them errors) is ~220 tokens of the tiny BPE.
    run = train_on(rl_config(tiny_model_dir, tmp_path, *EPISODES, "scaling.num_workers=0", "train.max_steps=2",
                             "train.save_steps=2", "train.rl.environment.max_tokens=1024"), prompts)  # fmt: skip
    assert len(trained) == 2 * 2 * 4 and (run / "final").is_dir()  # 2 steps of 2 prompts x 4 episodes
    tokenizer = tokenizer_of(tiny_model_dir)
    for ids, labels in trained:
        runs = label_runs(labels)
        assert len(runs) == 3  # three model turns, each trained exactly as sampled
        for start, end in runs:
            assert ids[start:end] in sampled[tuple(ids[:start])]
        answers = [tokenizer.decode(ids[end:start]) for (_, end), (start, _) in itertools.pairwise(runs)]
        assert all("<tool_response>" in a and a.endswith("<|im_start|>assistant\n") for a in answers), answers
    records = trained_records(run)
    for record in records:  # every episode: 3 calculator calls (one with bad arguments) and a hang that timed out
        assert record["rl/episode/turns"] == 3.0 and record["rl/episode/tool_calls/calculator"] == 3.0
        assert record["rl/episode/tool_calls/hang"] == 1.0 and record["rl/episode/tool_calls/malformed"] == 0.0
        assert record["rl/episode/tool_errors"] == 8 and record["rl/episode/tool_timeouts"] == 8
        assert record["rl/episode/truncated"] == 0 and record["rl/episode/tool_tokens"] > 0
        assert record["rl/episode/tool_s"] >= 1.0  # the hanging calls waited out their 1 s timeout


def tokenizer_of(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def label_runs(labels: list[int]) -> list[tuple[int, int]]:
    """The [start, end) spans of consecutive trained positions."""
    runs: list[tuple[int, int]] = []
    for position, label in enumerate(labels):
        if label == IGNORE_INDEX:
            continue
        if runs and runs[-1][1] == position:
            runs[-1] = (runs[-1][0], position + 1)
        else:
            runs.append((position, position + 1))
    return runs


def test_an_asynchronous_multi_turn_run_resumed_from_a_checkpoint_equals_the_uninterrupted_run(
    tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path
) -> None:
    script = json.dumps([GOOD + BAD_ARGUMENTS, GOOD])  # no hanging tool: the run stays short
    run = (*EPISODES, f"train.rl.environment.options={{script: {script}}}", "train.max_steps=4", "train.save_steps=2",
           "scaling.num_workers=0", *ACTORS, "train.rl.rollout.max_staleness=1")  # fmt: skip
    whole = train_on(rl_config(tiny_model_dir, tmp_path / "whole", *run), prompts)
    crashed_copy(whole, tmp_path / "resumed", crashed_at=3)
    resumed = train_on(rl_config(tiny_model_dir, tmp_path / "resumed", *run), prompts, resume=True)
    assert train_losses(resumed) == pytest.approx(train_losses(whole), rel=1e-6, abs=1e-9)
    want = {r["step"]: {k: r[k] for k in EPISODE_FIGURES} for r in trained_records(whole)}
    got = {r["step"]: {k: r[k] for k in EPISODE_FIGURES} for r in trained_records(resumed)}
    assert list(want) == [1, 2, 3, 4] and [want[s]["rl/staleness"] for s in want] == [0.0, 1.0, 1.0, 1.0]
    for step, values in got.items():
        assert values == pytest.approx(want[step], rel=1e-6, abs=1e-9), step
    assert all(values["rl/episode/turns"] == 3.0 and values["rl/episode/tool_errors"] == 8 for values in want.values())


def test_synchronous_actors_run_the_episodes_colocated_rollouts_run(
    tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path
) -> None:
    script = json.dumps([GOOD + BAD_ARGUMENTS, GOOD])
    common = (*EPISODES, f"train.rl.environment.options={{script: {script}}}", "train.max_steps=2",
              "train.save_steps=2", "scaling.num_workers=0")  # fmt: skip
    colocated = train_on(rl_config(tiny_model_dir, tmp_path / "colocated", *common), prompts)
    on_actors = train_on(rl_config(tiny_model_dir, tmp_path / "actors", *common, *ACTORS), prompts)
    assert train_losses(on_actors) == pytest.approx(train_losses(colocated), rel=1e-5, abs=1e-7)
    want = {r["step"]: {k: r[k] for k in EPISODE_FIGURES} for r in trained_records(colocated)}
    for record in trained_records(on_actors):
        assert {k: record[k] for k in EPISODE_FIGURES} == pytest.approx(want[record["step"]], rel=1e-5, abs=1e-7)
