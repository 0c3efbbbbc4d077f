"""Log-probabilities of `rayft serve`: the prompt scorer of `echo` requests against a plain forward pass
and greedy `generate` of the same model (with and without an adapter), and the two OpenAI shapes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rayft.config import ModelConfig
from rayft.serving.engine import Engine, EngineSettings
from rayft.serving.logprobs import TokenLogprob, chat_logprobs, completion_logprobs
from rayft.serving.plan import Adapter, BaseGroup
from rayft.serving.protocol import Job, RequestError

PROMPT = "The quick brown fox jumps"


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    from tests.support.checkpoints import build_lora_checkpoint

    alpha = build_lora_checkpoint(tmp_path_factory.mktemp("scoring") / "alpha", tiny_model_dir, seed=1, scale=0.5)
    group = BaseGroup("base", ModelConfig(name=str(tiny_model_dir)), (Adapter("alpha", str(alpha)),))
    return Engine(group, EngineSettings())


def _reference(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1 by one plain forward pass."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids))]


def _echo(max_tokens: int, top: int = 3, **fields: object) -> Job:
    return Job(PROMPT, max_tokens, 0.0, 1.0, (), None, logprobs=True, top_logprobs=top, echo=True, **fields)  # type: ignore[arg-type]


@pytest.mark.numerics  # run under every CPU kernel path by scripts/test_kernels.py
def test_prompt_logprobs_equal_a_forward_pass(engine: Engine) -> None:
    scored = engine.score(_echo(0), None)
    ids = engine.backend.encode([PROMPT])[0]
    assert [t.token_id for t in scored.prompt] == ids and scored.completion == []
    assert scored.prompt[0].logprob is None and scored.prompt_text == PROMPT
    expected = _reference(engine.backend.model, ids)
    # float32, the engine's batched forward against a plain one: the same sums in products of other shapes.
    # A log-probability (~ -5) moves by about its logits' error, ~sqrt(64) * 2**-24 * |logit| per layer:
    # ~1e-6; abs 1e-4 leaves room for the KV cache's other order of attention sums.
    assert [t.logprob for t in scored.prompt[1:]] == pytest.approx(expected, abs=1e-4)
    for token in scored.prompt[1:]:
        assert len(token.top) == 3 and token.top[0][1] >= token.top[1][1] >= token.top[2][1]
        assert token.logprob is not None and token.logprob <= token.top[0][1] + 1e-6


def test_token_id_prompts_score_as_their_text(engine: Engine) -> None:
    ids = engine.backend.encode([PROMPT])[0]
    by_ids = engine.score(Job("", 0, 0.0, 1.0, (), None, prompt_ids=tuple(ids), logprobs=True, echo=True), None)
    by_text = engine.score(_echo(0, top=0), None)
    assert by_ids.prompt == by_text.prompt
    size = len(engine.backend.tokenizer)
    with pytest.raises(
        RequestError, match=f"2 token ids outside this model's vocabulary of {size} tokens, first 10000"
    ):
        engine.prepare(Job("", 1, 0.0, 1.0, (), None, prompt_ids=(3, 10_000, size)), None)


@pytest.mark.numerics  # run under every CPU kernel path by scripts/test_kernels.py
def test_the_greedy_continuation_equals_generate_and_its_logprobs_a_forward_pass(engine: Engine) -> None:
    scored = engine.score(_echo(4), None)
    prompt = engine.backend.encode([PROMPT])[0]
    with torch.inference_mode():
        generated = engine.backend.model.generate(
            torch.tensor([prompt]), max_new_tokens=4, do_sample=False, pad_token_id=0
        )[0].tolist()
    assert [t.token_id for t in scored.completion] == generated[len(prompt) : len(prompt) + len(scored.completion)]
    whole = _reference(engine.backend.model, [*prompt, *(t.token_id for t in scored.completion)])
    assert [t.logprob for t in [*scored.prompt, *scored.completion][1:]] == pytest.approx(whole, abs=1e-4)
    assert all(t.top[0] == (t.token, t.logprob) for t in scored.completion)  # greedy: the top one


def test_an_adapter_scores_with_its_own_weights(engine: Engine) -> None:
    base = engine.score(_echo(0), None)
    tuned = engine.score(_echo(0), "alpha")
    assert [t.token_id for t in tuned.prompt] == [t.token_id for t in base.prompt]
    assert max(abs((a.logprob or 0) - (b.logprob or 0)) for a, b in zip(base.prompt, tuned.prompt, strict=True)) > 1e-3
    again = engine.score(_echo(0), None)  # the adapter is not left active for the base
    assert [t.logprob for t in again.prompt] == [t.logprob for t in base.prompt]


TOKENS = [
    TokenLogprob("Hel", 1, None, []),
    TokenLogprob("lo", 2, -0.5, [("lo", -0.5), ("p", -1.25)]),
    TokenLogprob("é", 3, -2.0, [("x", -0.1)]),
]


def test_completion_logprobs_have_openai_shape() -> None:
    rendered = completion_logprobs(TOKENS, offset=10)
    assert rendered == {
        "tokens": ["Hel", "lo", "é"],
        "token_logprobs": [None, -0.5, -2.0],
        "top_logprobs": [None, {"lo": -0.5, "p": -1.25}, {"x": -0.1}],
        "text_offset": [10, 13, 15],
    }


def test_alternatives_that_decode_alike_keep_the_likelier_under_their_shared_text() -> None:
    """Two byte pieces of one character both decode to U+FFFD: the text-keyed legacy format keeps the
    likelier one's log-probability (chat keeps both, as a list)."""
    token = TokenLogprob("\ufffd", 7, -0.2, [("\ufffd", -0.2), ("\ufffd", -0.9), ("a", -1.5)])
    assert completion_logprobs([token])["top_logprobs"] == [{"\ufffd": -0.2, "a": -1.5}]
    assert len(chat_logprobs([token])["content"][0]["top_logprobs"]) == 3


def test_chat_logprobs_have_openai_shape() -> None:
    (first, second) = chat_logprobs(TOKENS[1:])["content"]
    assert first == {
        "token": "lo",
        "logprob": -0.5,
        "bytes": [108, 111],
        "top_logprobs": [
            {"token": "lo", "logprob": -0.5, "bytes": [108, 111]},
            {"token": "p", "logprob": -1.25, "bytes": [112]},
        ],
    }
    assert second["bytes"] == [195, 169] and math.isclose(second["logprob"], -2.0)
