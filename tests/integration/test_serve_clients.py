"""`rayft serve` as the field's clients use it, through the real `openai` client and plain HTTP: prompts as
token ids and in batches, chat content as text parts, prompt log-probabilities (`echo`), one model's
route, `/health`, and every error (routing ones included) in OpenAI's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import rayft
from rayft.config import RayftConfig

pytestmark = pytest.mark.integration

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def alpha(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter of the tiny model, served as 'alpha'."""
    from tests.support.checkpoints import build_lora_checkpoint

    return build_lora_checkpoint(tmp_path_factory.mktemp("clients") / "alpha", tiny_model_dir, seed=1, scale=0.5)


@pytest.fixture(scope="module")
def server(ray_session: None, alpha: Path) -> Iterator[rayft.ServeHandle]:
    cfg = RayftConfig.model_validate({"serve": {"max_batch_size": 8, "max_tokens": 8}})
    with rayft.api.serve(cfg, [alpha], port=0) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server: rayft.ServeHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _root(server: rayft.ServeHandle) -> str:
    return server.base_url.removesuffix("/v1")


def _greedy(client: openai.OpenAI, prompt: Any, **fields: Any) -> Any:
    return client.completions.create(model="alpha", prompt=prompt, max_tokens=6, temperature=0, **fields)


def test_token_id_prompts_answer_as_their_text(client: openai.OpenAI, tokenizer: Any) -> None:
    ids = tokenizer(PROMPT)["input_ids"]
    by_text = _greedy(client, PROMPT)
    by_ids = _greedy(client, ids)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(ids)


def test_a_batch_of_prompts_answers_one_choice_per_prompt_in_order(client: openai.OpenAI, tokenizer: Any) -> None:
    prompts = [PROMPT, "Question: 3 + 4 =", "SELECT name FROM"]
    alone = [_greedy(client, p).choices[0].text for p in prompts]
    batch = _greedy(client, prompts)
    assert [c.index for c in batch.choices] == [0, 1, 2] and [c.text for c in batch.choices] == alone
    by_ids = _greedy(client, [tokenizer(p)["input_ids"] for p in prompts])
    assert [c.text for c in by_ids.choices] == alone
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == sum(
        len(tokenizer(p)["input_ids"]) for p in prompts
    )
    streamed: dict[int, str] = {}
    for chunk in _greedy(client, prompts, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert [streamed[i] for i in range(3)] == alone


def test_chat_content_as_text_parts_equals_the_string(client: openai.OpenAI) -> None:
    def ask(content: Any) -> str | None:
        messages = [{"role": "user", "content": content}]
        reply = client.chat.completions.create(model="alpha", messages=messages, max_tokens=6, temperature=0)  # type: ignore[arg-type]
        return reply.choices[0].message.content

    assert ask([{"type": "text", "text": "What is 12 + 7?"}]) == ask("What is 12 + 7?")
    with pytest.raises(openai.BadRequestError) as caught:
        ask([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}])
    error: Any = caught.value.body
    assert "type 'image_url'" in error["message"] and error["param"] == "messages.0.content"


def test_echo_returns_the_prompt_logprobs_of_a_forward_pass(
    client: openai.OpenAI, tokenizer: Any, tiny_model_dir: Path, alpha: Path
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    reply = client.completions.create(model="alpha", prompt=PROMPT, max_tokens=0, echo=True, logprobs=2, temperature=0)
    (choice,) = reply.choices
    ids = tokenizer(PROMPT)["input_ids"]
    assert choice.text == PROMPT and choice.logprobs is not None
    assert choice.logprobs.tokens == [tokenizer.decode([i]) for i in ids]
    assert choice.logprobs.token_logprobs is not None and choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.top_logprobs is not None and all(len(top) <= 2 for top in choice.logprobs.top_logprobs[1:])
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), alpha).eval()
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    expected = [float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids))]
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    assert reply.usage is not None and (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(ids), 0)


def test_generated_tokens_carry_their_logprobs_as_a_forward_pass_gives_them(
    client: openai.OpenAI, tokenizer: Any, tiny_model_dir: Path, alpha: Path
) -> None:
    """Completions with ``logprobs``: each generated token's log-probability (and its alternatives) equals
    the log-softmax of a forward pass of the same model over the prompt and the tokens before it."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    reply = _greedy(client, PROMPT, logprobs=2)
    (choice,) = reply.choices
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    ids = tokenizer(PROMPT)["input_ids"]
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), alpha).eval()
    with torch.inference_mode():  # the server's greedy tokens are HF generate's
        out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=6, do_sample=False, min_new_tokens=6)
        generated = out[0, len(ids) :].tolist()
        logits = model(input_ids=out).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    expected = [float(logprobs[len(ids) + i - 1, token]) for i, token in enumerate(generated)]
    assert choice.logprobs.tokens == [tokenizer.decode([t]) for t in generated]
    assert choice.logprobs.token_logprobs == pytest.approx(expected, abs=1e-4)
    assert choice.logprobs.top_logprobs is not None
    for position, top in enumerate(choice.logprobs.top_logprobs):  # keyed by text: alike pieces share a key
        values, alternatives = logprobs[len(ids) + position - 1].topk(2)
        wanted: dict[str, float] = {}
        for value, token in zip(values.tolist(), alternatives.tolist(), strict=True):
            wanted.setdefault(tokenizer.decode([token]), value)
        assert top == pytest.approx(wanted, abs=1e-4)
    chat = client.chat.completions.create(model="alpha", messages=[{"role": "user", "content": PROMPT}],
                                          max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)  # fmt: skip
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_echo_with_one_more_token_serves_lm_eval_loglikelihood(client: openai.OpenAI, tokenizer: Any) -> None:
    """lm-eval's request: token ids, echo, logprobs 1, max_tokens 1; it reads ``token_logprobs[ctxlen:-1]``."""
    ids = tokenizer(PROMPT)["input_ids"]
    reply = client.completions.create(model="alpha", prompt=[ids, ids[:3]], max_tokens=1, echo=True, logprobs=1,
                                      temperature=0, seed=1234)  # fmt: skip
    first, second = reply.choices
    assert first.logprobs is not None and first.logprobs.token_logprobs is not None
    assert len(first.logprobs.token_logprobs) == len(ids) + 1 and first.finish_reason in ("length", "stop")
    assert second.logprobs is not None and second.logprobs.token_logprobs is not None
    assert second.logprobs.token_logprobs[1:3] == pytest.approx(first.logprobs.token_logprobs[1:3], abs=1e-5)
    next_token = first.logprobs.top_logprobs[-1]  # type: ignore[index]
    assert first.logprobs.token_logprobs[-1] == pytest.approx(max(next_token.values()))  # greedy: the top one
    with pytest.raises(openai.BadRequestError, match="decoded greedily"):
        client.completions.create(model="alpha", prompt=PROMPT, max_tokens=2, echo=True, temperature=0.7)


def test_one_model_and_health(server: rayft.ServeHandle, client: openai.OpenAI) -> None:
    assert client.models.retrieve("alpha").id == "alpha"
    base = server.model_ids[0]
    assert httpx.get(f"{server.base_url}/models/{base}", timeout=30).json()["id"] == base
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gamma")
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]
    health = httpx.get(f"{_root(server)}/health", timeout=30)
    assert health.status_code == 200 and health.json()["models"] == server.model_ids, health.text


@pytest.mark.parametrize(
    ("method", "route", "body", "status", "says"),
    [
        ("GET", "/v1/nowhere", None, 404, "no route /v1/nowhere"),
        ("GET", "/", None, 404, "no route /"),
        ("GET", "/v1/completions", None, 405, "GET is not allowed on /v1/completions; use POST"),
        ("DELETE", "/v1/models", None, 405, "DELETE is not allowed"),
        ("POST", "/v1/completions", {"model": "alpha", "prompt": ""}, 400, "the prompt is empty"),
        ("POST", "/v1/completions", {"model": "alpha", "prompt": [99999]}, 400, "outside this model's vocabulary"),
        ("POST", "/v1/chat/completions", "[" * 200_000 + "]" * 200_000, 400, "nests too deeply"),
        (
            "POST",
            "/v1/chat/completions",
            '{"messages": ' + "[" * 200_000 + "]" * 200_000 + "}",
            400,
            "nests too deeply",
        ),
    ],
)
def test_every_error_has_the_openai_shape(  # noqa: PLR0917 (the parameters of the table)
    server: rayft.ServeHandle, method: str, route: str, body: Any, status: int, says: str
) -> None:
    content = None if body is None else body if isinstance(body, str) else json.dumps(body)
    response = httpx.request(method, _root(server) + route, content=content, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and says in error["message"], error


QUESTIONS = [
    {"question": "Question: 3 + 4 =", "choices": [" 7", " 8", " 12"], "answer": 0, "target": "7"},
    {"question": "The quick brown fox", "choices": [" jumps", " sleeps"], "answer": 0, "target": "jumps"},
    {"question": "SELECT name FROM", "choices": [" table", " users", " dog"], "answer": 0, "target": "table"},
]


def _write_tasks(root: Path) -> Path:
    """A multiple-choice (log-likelihood) task and a generation task on a three-row JSON Lines file."""
    data = root / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (root / "mc.yaml").write_text(
        f"task: rayft_mc\n{common}output_type: multiple_choice\ndoc_to_text: '{{{{question}}}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n",
        encoding="utf-8",
    )
    (root / "gen.yaml").write_text(
        f"task: rayft_gen\n{common}output_type: generate_until\ndoc_to_text: '{{{{question}}}}'\n"
        "doc_to_target: '{{target}}'\ngeneration_kwargs:\n  until: ['\\n']\n  max_gen_toks: 6\n  do_sample: false\n"
        "  temperature: 0\nmetric_list:\n  - metric: exact_match\n",
        encoding="utf-8",
    )
    return root


def _loglikelihoods(results: dict[str, Any]) -> list[float]:
    return [float(resp[0][0]) for sample in results["samples"]["rayft_mc"] for resp in sample["resps"]]


def test_lm_eval_local_completions_scores_as_lm_eval_in_process(
    server: rayft.ServeHandle, tiny_model_dir: Path, alpha: Path, tmp_path: Path
) -> None:
    """lm-eval's own `local-completions` (token-id requests, batched) gives the log-likelihoods its `hf`
    model computes in-process with the same adapter."""
    lm_eval = pytest.importorskip("lm_eval", reason="needs lm-eval (the dev extra)")
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=str(_write_tasks(tmp_path)))
    served = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"base_url": f"{server.base_url}/completions", "model": "alpha", "tokenizer": str(tiny_model_dir),
                    "tokenizer_backend": "huggingface", "batch_size": 4, "max_retries": 1},
        tasks=["rayft_mc"], task_manager=tasks, log_samples=True,
    )  # fmt: skip
    local = lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": str(tiny_model_dir), "peft": str(alpha), "device": "cpu"},
        tasks=["rayft_mc"], task_manager=tasks, log_samples=True,
    )  # fmt: skip
    assert served is not None and local is not None
    assert len(_loglikelihoods(served)) == sum(len(q["choices"]) for q in QUESTIONS)
    assert _loglikelihoods(served) == pytest.approx(_loglikelihoods(local), abs=1e-4)
    assert served["results"]["rayft_mc"]["acc,none"] == local["results"]["rayft_mc"]["acc,none"]


def test_lm_eval_local_chat_completions_generates(
    server: rayft.ServeHandle, client: openai.OpenAI, tmp_path: Path
) -> None:
    """lm-eval's `local-chat-completions` (generate_until) through the chat template; its answers are the server's."""
    lm_eval = pytest.importorskip("lm_eval", reason="needs lm-eval (the dev extra)")
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="local-chat-completions",
        model_args={"base_url": f"{server.base_url}/chat/completions", "model": "alpha", "max_retries": 1},
        tasks=["rayft_gen"], task_manager=TaskManager(include_path=str(_write_tasks(tmp_path))),
        apply_chat_template=True, log_samples=True,
    )  # fmt: skip
    assert results is not None and "exact_match,none" in results["results"]["rayft_gen"]
    answers = [sample["resps"][0][0] for sample in results["samples"]["rayft_gen"]]
    expected = []
    for question in QUESTIONS:
        messages = [{"role": "user", "content": question["question"]}]
        reply = client.chat.completions.create(
            model="alpha", messages=messages, max_tokens=6, temperature=0, stop=["\n"]
        )  # type: ignore[arg-type]
        expected.append(reply.choices[0].message.content)
    assert sorted(answers) == sorted(expected)
