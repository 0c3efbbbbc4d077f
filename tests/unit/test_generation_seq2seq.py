"""Generation with an encoder-decoder model in the HF backend: outputs are the decoder's new tokens,
and batching (right-padded encoder inputs) changes no greedy output. vLLM refuses such models."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.config.model import ModelConfig
from rayft.errors import ModelError
from rayft.generation.backend import SamplingParams
from rayft.generation.hf import HFBackend, is_encoder_decoder
from rayft.generation.vllm import refuse_encoder_decoder
from rayft.testing.tiny import build_tiny_t5

PROMPTS = [
    "question: How many players are there where the age is 30? table: players (name text, age integer)",
    "SELECT",
    "Translate the following into a SQL query",
]


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import GenerationConfig

    out = build_tiny_t5(tmp_path_factory.mktemp("t5"))
    generation = GenerationConfig.from_pretrained(out)
    generation.suppress_tokens = [generation.pad_token_id]  # random weights favour it; it ends nothing
    generation.save_pretrained(out)
    return out


def test_outputs_are_the_new_tokens_and_batching_changes_nothing(tiny_t5: Path) -> None:
    import torch

    model = ModelConfig(name=str(tiny_t5))
    assert is_encoder_decoder(model)
    params = SamplingParams(max_new_tokens=6)
    one_by_one = HFBackend(model, device="cpu", batch_size=1)
    batched = HFBackend(model, device="cpu", batch_size=3)
    assert batched.tokenizer.padding_side == "right"
    singles = [one_by_one.generate([p], params)[0] for p in PROMPTS]
    assert batched.generate(PROMPTS, params) == singles
    # The reference: the model's own generate on one prompt, minus the decoder start token.
    eos = one_by_one.tokenizer.eos_token_id
    enc = {"input_ids": torch.tensor([[*one_by_one.tokenizer(PROMPTS[0])["input_ids"], eos]])}  # as in training
    with torch.inference_mode():
        ids = one_by_one.model.generate(**enc, max_new_tokens=6, do_sample=False)[0].tolist()
    assert ids[0] == one_by_one.model.config.decoder_start_token_id
    assert singles[0].text == one_by_one.tokenizer.decode(ids[1:], skip_special_tokens=True)
    assert singles[0].num_prompt_tokens == enc["input_ids"].shape[1]
    assert 0 < singles[0].num_generated_tokens <= 6
    # T5 has no chat template: a chat prompt is its messages' contents joined by blank lines.
    chat = [{"role": "system", "content": "Translate."}, {"role": "user", "content": PROMPTS[1]}]
    assert batched.render(chat) == f"Translate.\n\n{PROMPTS[1]}"
    assert batched.generate([chat], params) == batched.generate([f"Translate.\n\n{PROMPTS[1]}"], params)


def test_vllm_refuses_an_encoder_decoder_model(tiny_t5: Path) -> None:
    with pytest.raises(ModelError, match="encoder-decoder model, which the vLLM backend does not generate with"):
        refuse_encoder_decoder(ModelConfig(name=str(tiny_t5)))
