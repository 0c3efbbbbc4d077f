"""HF generation batches prompts of similar length together and returns results in prompt order."""

from __future__ import annotations

from pathlib import Path

from rayft.generation.hf import length_sorted_batches


def test_batches_are_longest_first_with_ties_in_input_order() -> None:
    assert length_sorted_batches([3, 9, 5, 9, 1], 2) == [[1, 3], [2, 0], [4]]
    assert length_sorted_batches([3, 9, 5], 2, sort=False) == [[0, 1], [2]]
    assert length_sorted_batches([], 4) == []


def test_sorted_generation_returns_what_unsorted_does_in_prompt_order(tiny_model_dir: Path) -> None:
    from rayft.config.model import ModelConfig
    from rayft.generation.backend import SamplingParams
    from rayft.generation.hf import HFBackend

    backend = HFBackend(ModelConfig(name=str(tiny_model_dir)), device="cpu", batch_size=2)
    prompts = ["1 2", "The quick brown fox jumps over", "SELECT name", "A baker has 12 apples and buys 7 more"]
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    ordered = backend.generate(prompts, params)
    backend.sort_by_length = False
    unsorted = backend.generate(prompts, params)
    assert [g.text for g in ordered] == [g.text for g in unsorted]
    assert [g.num_prompt_tokens for g in ordered] == [g.num_prompt_tokens for g in unsorted]
    assert ordered[0].num_prompt_tokens < ordered[1].num_prompt_tokens  # results follow the prompts, not the batches


def test_eval_generation_sends_longest_prompts_first_and_answers_in_prompt_order(tiny_model_dir: Path) -> None:
    from rayft.config.generation import GenerationConfig
    from rayft.config.model import ModelConfig
    from rayft.evaluation import runner
    from rayft.generation.pool import prompt_size

    cfg = GenerationConfig(model=ModelConfig(name=str(tiny_model_dir)), max_new_tokens=5, batch_size=2)
    prompts = ["1 2", [{"role": "user", "content": "The quick brown fox jumps over the lazy dog"}], "SELECT", "0 1 2 3"]
    assert [prompt_size(p) for p in prompts] == [3, 43, 6, 7]
    sorted_run = runner.generate(prompts, cfg, "local")
    in_order = runner._generate_local(prompts, cfg)
    assert [g.text for g in sorted_run] == [g.text for g in in_order]
    assert [g.num_prompt_tokens for g in sorted_run] == [g.num_prompt_tokens for g in in_order]
