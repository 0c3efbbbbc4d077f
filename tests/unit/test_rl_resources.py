"""What a GRPO config asks for is checked against what the model and the cluster have before anything
starts, with the estimate in the error: the sequence a rollout makes against the model's context, the
generation actors against the cluster's CPUs and GPUs, and the memory a step's rollout holds against
a node's. Pure planners, without Ray or torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError, ResourceError
from rayft.models.architecture import context_tokens
from rayft.training.driver.resources import (
    ModelShape,
    check_actors_fit,
    check_generation_length,
    check_rollout_memory,
    estimate_rollout_bytes,
    model_shape,
)

GRPO = ["train.objective=grpo", "data.packing=false"]


def test_the_context_is_read_from_a_model_config_as_serve_reads_it() -> None:
    assert context_tokens({"max_position_embeddings": 2048}) == 2048
    assert context_tokens({"n_positions": 1024, "model_type": "gpt2"}) == 1024
    assert context_tokens({"model_type": "t5", "n_positions": 512, "is_encoder_decoder": True}) is None


@pytest.mark.parametrize("max_new_tokens", [4000, 10**9])
def test_a_rollout_longer_than_the_context_is_refused_with_the_numbers(max_new_tokens: int) -> None:
    cfg = load_config(None, [*GRPO, f"train.rl.max_new_tokens={max_new_tokens}", "data.max_seq_length=512"])
    with pytest.raises(ConfigError) as caught:
        check_generation_length(cfg.train, cfg.data, 2048, "tiny")
    message = str(caught.value)
    assert f"train.rl.max_new_tokens={max_new_tokens}" in message and "data.max_seq_length=512" in message
    assert f"{512 + max_new_tokens} tokens" in message and "2048" in message and "at most 1536" in message


def test_a_rollout_within_the_context_or_an_unknown_context_passes() -> None:
    cfg = load_config(None, [*GRPO, "train.rl.max_new_tokens=1024", "data.max_seq_length=1024"])
    check_generation_length(cfg.train, cfg.data, 2048, "tiny")
    check_generation_length(cfg.train, cfg.data, None, "tiny")
    sft = load_config(None, ["train.rl.max_new_tokens=4000"])  # sft samples nothing
    check_generation_length(sft.train, sft.data, 2048, "tiny")


def test_actors_asking_more_than_the_cluster_has_are_refused_up_front() -> None:
    nodes = [{"CPU": 2.0, "memory": 8e9}]
    with pytest.raises(ResourceError) as caught:
        check_actors_fit({"CPU": 1.0}, 1, {"CPU": 64.0}, 1, nodes)
    message = str(caught.value)
    assert "1 generation actor(s) x {'CPU': 64.0}" in message and "CPU: 64 needed, 2 in the cluster" in message
    assert "train.rl.rollout.num_cpus_per_actor" in message
    with pytest.raises(ResourceError, match=r"4 CPU needed .*, 2 CPU in the cluster"):
        check_actors_fit({"CPU": 1.0}, 2, {"CPU": 1.0}, 2, nodes)  # each fits, all of them do not
    check_actors_fit({"CPU": 1.0}, 1, {"CPU": 1.0}, 1, nodes)
    with pytest.raises(ResourceError, match="GPU"):
        check_actors_fit({"CPU": 1.0}, 1, {"CPU": 1.0, "GPU": 1.0}, 1, nodes)


SHAPE = ModelShape(layers=2, kv_heads=2, head_dim=16, vocab=256)


def test_the_estimate_of_a_step_is_its_kv_cache_and_logits() -> None:
    rows, tokens = 10_000, 1152
    # K and V of every layer for every token of every row, and float32 logits of the forward rows.
    kv = 2 * 2 * 2 * 16 * 4 * rows * tokens
    logits = 4 * 256 * rows * tokens
    assert estimate_rollout_bytes(SHAPE, rows=rows, tokens=tokens, forward_rows=rows) == kv + logits


def test_a_group_whose_step_outgrows_the_node_is_refused_with_the_estimate() -> None:
    cfg = load_config(None, [*GRPO, "train.rl.group_size=1000", "train.micro_batch_size=4"])
    with pytest.raises(ResourceError) as caught:
        check_rollout_memory(cfg.train, cfg.data, SHAPE, node_bytes=2 * 2**30)
    message = str(caught.value)
    assert "train.rl.group_size=1000" in message and "4000 completions of up to 1152 tokens" in message
    assert "at least 3.3 GiB" in message and "a node's 2.0 GiB" in message and "lower train.rl.group_size" in message
    small = load_config(None, [*GRPO, "train.rl.group_size=8"])
    check_rollout_memory(small.train, small.data, SHAPE, node_bytes=2 * 2**30)


def test_group_size_has_an_upper_bound_in_the_schema() -> None:
    with pytest.raises(ConfigError, match=r"train\.rl\.group_size = 10000: Input should be less than or equal to"):
        load_config(None, [*GRPO, "train.rl.group_size=10000"])


def test_the_shape_is_read_from_a_model_config(tiny_model_dir: Path) -> None:
    import json

    shape = model_shape(json.loads((tiny_model_dir / "config.json").read_text()))
    assert shape is not None and shape.layers >= 1 and shape.vocab > 0 and shape.head_dim > 0
    assert model_shape({}) is None
