"""`rayft serve` without a server: request parsing and errors, the serving plan, Serve's options, the
vLLM configs, the serve section, and the CLI's bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rayft.cli.main import cli
from rayft.config import ModelConfig, RayftConfig
from rayft.errors import ConfigError, ModelError
from rayft.serving.app import deployment_options, router_capacity
from rayft.serving.plan import BaseGroup, plan_serving
from rayft.serving.protocol import (
    DONE,
    ChatRequest,
    Job,
    RequestError,
    ResponseBuilder,
    Usage,
    parse_request,
    sse,
    to_jobs,
    unknown_model,
)
from rayft.serving.vllm import llm_configs, validate_llm_configs


def _body(**fields: object) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}).encode()


def test_a_chat_request_becomes_a_job() -> None:
    request = parse_request(_body(max_tokens=5, temperature=0, stop="\n", seed=3, user="u-1"), "chat")
    assert isinstance(request, ChatRequest)
    (job,) = to_jobs(request)
    assert (job.prompt, job.max_tokens, job.temperature, job.stop, job.seed) == (
        [{"role": "user", "content": "hi"}], 5, 0.0, ("\n",), 3,
    )  # fmt: skip
    assert to_jobs(parse_request(_body(max_completion_tokens=7), "chat"))[0].max_tokens == 7
    text = parse_request(json.dumps({"model": "m", "prompt": ["one"], "stop": ["a", "b"]}).encode(), "completion")
    assert [(j.prompt, j.stop) for j in to_jobs(text)] == [("one", ("a", "b"))]


@pytest.mark.parametrize(
    ("raw", "param", "says"),
    [
        (b"{nope", None, "not valid JSON"),
        (b"\xff\xfe", None, "not valid JSON"),
        (b'"text"', None, "JSON str"),
        (_body(max_tokens="10"), "max_tokens", "valid integer"),
        (_body(max_tokens=True), "max_tokens", "valid integer"),
        (_body(temperature=3), "temperature", "less than or equal to 2"),
        (_body(top_p=0), "top_p", "greater than 0"),
        (_body(n=17), "n", "less than or equal to 16"),
        (_body(top_k=-2), "top_k", "greater than or equal to -1"),
        (_body(min_p=1.5), "min_p", "less than or equal to 1"),
        (_body(presence_penalty=2.5), "presence_penalty", "less than or equal to 2"),
        (_body(repetition_penalty=0), "repetition_penalty", "greater than 0"),
        (_body(messages=[{"role": "robot", "content": "x"}]), "messages.0.role", "'user', 'assistant' or 'tool'"),
        (_body(messages=[]), "messages", "at least 1 item"),
        (_body(model=7), "model", "valid string"),
    ],
)
def test_bad_requests_name_the_field(raw: bytes, param: str | None, says: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(raw, "chat")
    assert caught.value.status == 400 and caught.value.param == param and says in caught.value.message
    assert caught.value.body()["error"]["type"] == "invalid_request_error"


def _completion(**fields: object) -> list[Job]:
    return to_jobs(parse_request(json.dumps({"model": "m", **fields}).encode(), "completion"))


def test_prompts_are_text_or_token_ids_one_or_a_batch() -> None:
    assert [j.prompt for j in _completion(prompt=["a", "b"])] == ["a", "b"]
    assert [(j.prompt, j.prompt_ids) for j in _completion(prompt=[5, 6])] == [("", (5, 6))]
    batch = _completion(prompt=[[1, 2], [3]], echo=True, logprobs=2, max_tokens=0)
    assert [j.prompt_ids for j in batch] == [(1, 2), (3,)]
    assert all(j.echo and j.logprobs and j.top_logprobs == 2 and j.max_tokens == 0 for j in batch)
    chat = to_jobs(parse_request(_body(logprobs=True, top_logprobs=3), "chat"))[0]
    assert (chat.logprobs, chat.top_logprobs, chat.echo) == (True, 3, False)


def test_chat_content_may_be_text_parts() -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    request = parse_request(_body(messages=[{"role": "user", "content": parts}]), "chat")
    assert to_jobs(request)[0].prompt == [{"role": "user", "content": "one\ntwo"}]


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"prompt": ""}, "prompt", "the prompt is empty"),
        ({"prompt": []}, "prompt", "the list of prompts is empty"),
        ({"prompt": ["a", ""]}, "prompt.1", "the prompt is empty"),
        ({"prompt": [[1], []]}, "prompt.1", "the prompt is empty"),
        ({"prompt": [-1]}, "prompt", "token ids (integers >= 0)"),
        ({"prompt": [True]}, "prompt", "token ids (integers >= 0)"),
        ({"prompt": {"text": "a"}}, "prompt", "give a string"),
        ({"prompt": ["a"] * 257}, "prompt", "at most 256"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens", "0 asks for nothing without echo"),
        ({"prompt": "a", "logprobs": 21}, "logprobs", "less than or equal to 20"),
    ],
)
def test_bad_prompts_name_the_field(fields: dict[str, object], param: str, says: str) -> None:
    with pytest.raises(RequestError) as caught:
        _completion(**fields)
    assert caught.value.status == 400 and caught.value.param == param and says in caught.value.message


@pytest.mark.parametrize(
    ("raw", "param", "says"),
    [
        (_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
         "messages.0.content", "content part 0 has type 'image_url'"),
        (_body(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages.0.content", "needs 'text'"),
        (_body(top_logprobs=2), "top_logprobs", "needs logprobs: true"),
        (b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None, "nests too deeply"),
        (b'{"model": "m", "seed": ' + b"9" * 5000 + b"}", None, "not valid JSON"),
    ],
)  # fmt: skip
def test_bad_chat_bodies_are_refused_by_name(raw: bytes, param: str | None, says: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(raw, "chat")
    assert caught.value.status == 400 and caught.value.param == param and says in caught.value.message


def test_errors_take_openai_types_by_status() -> None:
    kinds = {
        status: RequestError(status, "x").body()["error"]["type"] for status in (400, 401, 404, 405, 429, 500, 503)
    }
    assert kinds == {
        400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
        405: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "service_unavailable_error",
    }  # fmt: skip


def test_unknown_model_names_the_served_ids() -> None:
    error = unknown_model("x", ["a", "b"])
    assert error.status == 404 and error.body()["error"]["code"] == "model_not_found"
    assert "served models: a, b" in error.message


def test_responses_and_chunks_have_the_openai_shape() -> None:
    chat = ResponseBuilder("chat", "m")
    whole = chat.response([chat.choice(0, "hi", "stop")], Usage(3, 2))
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"] == {
        "role": "assistant",
        "content": "hi",
    }
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    first = chat.chunk(None, first=True)
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"] == {"role": "assistant"}
    assert chat.chunk(None, "length")["choices"][0] == {
        "index": 0, "delta": {}, "logprobs": None, "finish_reason": "length",
    }  # fmt: skip
    text = ResponseBuilder("completion", "m").chunk("a")
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "a"
    assert sse({"a": 1}) == b'data: {"a":1}\n\n' and DONE == b"data: [DONE]\n\n"


def test_adapters_of_one_base_share_a_deployment(tmp_path: Path, tiny_model_dir: Path) -> None:
    from tests.support.checkpoints import build_lora_checkpoint, build_run_dir

    a = build_lora_checkpoint(tmp_path / "alpha", tiny_model_dir, seed=1)
    run = build_run_dir(tmp_path / "my-run", tiny_model_dir, eval_losses={2: 1.0})
    plan = plan_serving([str(a), str(run), str(run / "checkpoints" / "step-000002")], ModelConfig())
    (group,) = plan.groups
    assert group.model.name == str(tiny_model_dir) and group.model_id == tiny_model_dir.name
    assert plan.model_ids == [tiny_model_dir.name, "alpha", "my-run", "my-run/step-000002"]
    assert plan.routes["alpha"] == (0, "alpha") and plan.routes[tiny_model_dir.name] == (0, None)
    with pytest.raises(ConfigError, match="served as model id 'alpha'"):
        plan_serving([str(a), str(a)], ModelConfig())
    with pytest.raises(ModelError, match="does not exist"):
        plan_serving([str(tmp_path / "missing")], ModelConfig())


def test_deployment_options_follow_the_serve_section() -> None:
    fixed = deployment_options(RayftConfig().serve)
    assert fixed["num_replicas"] == 1 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.0}
    scaled = deployment_options(
        RayftConfig.model_validate({"serve": {"min_replicas": 1, "max_replicas": 3, "num_gpus_per_replica": 1}}).serve
    )
    assert scaled["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 8.0}
    assert "num_replicas" not in scaled and scaled["ray_actor_options"]["num_gpus"] == 1
    assert fixed["max_queued_requests"] == 32 and fixed["backpressure_config"]["retry_after_s"] == 2
    unbounded = deployment_options(RayftConfig.model_validate({"serve": {"serve_queue_requests": None}}).serve)
    assert unbounded["max_queued_requests"] == -1  # Serve's 'no bound'


def test_the_router_has_room_for_every_request_its_models_hold_and_for_refusing_those_beyond() -> None:
    def serve(**options: Any) -> Any:
        return RayftConfig.model_validate({"serve": options}).serve

    assert router_capacity(serve(max_ongoing_requests=1, serve_queue_requests=1), 1) == 3
    assert router_capacity(serve(max_ongoing_requests=8, num_replicas=2, serve_queue_requests=4), 3) == 3 * (16 + 8)
    assert router_capacity(serve(max_ongoing_requests=8, min_replicas=1, max_replicas=4), 1) == 32 + 64
    assert router_capacity(serve(max_ongoing_requests=8, serve_queue_requests=None), 2) == 16


def test_serves_queue_for_the_router_is_bounded_by_its_capacity_not_by_the_models_queue() -> None:
    # Requests that reach Serve's proxy together count as queued together until each is assigned: a router
    # queue as small as the models' would let the proxy refuse one, in its own plain-text shape, while the
    # router still has room to answer it in OpenAI's.
    from rayft.serving.app import build_application
    from rayft.serving.plan import BaseGroup, ServePlan

    def deployments(options: dict[str, Any]) -> tuple[Any, Any]:
        cfg = RayftConfig.model_validate({"serve": options}).serve
        router = build_application(ServePlan((BaseGroup("m", ModelConfig()),), {"m": (0, None)}), cfg)
        return router._bound_deployment, router._bound_deployment.init_args[0][0]._bound_deployment

    router, model = deployments({"max_ongoing_requests": 1, "serve_queue_requests": 1})
    assert (router.max_ongoing_requests, router.max_queued_requests) == (3, 3)
    assert (model.max_ongoing_requests, model.max_queued_requests) == (1, 1)
    router, model = deployments({"max_ongoing_requests": 1, "serve_queue_requests": None})
    assert (router.max_queued_requests, model.max_queued_requests) == (-1, -1)


def test_a_full_serve_queue_is_a_503_with_retry_after_in_openais_shape() -> None:
    from ray.serve.exceptions import BackPressureError

    from rayft.serving.router import _error, _failure

    response = _error(_failure(BackPressureError(num_queued_requests=4, max_queued_requests=4, retry_after_s=2.5)))
    assert response.status_code == 503 and response.headers["Retry-After"] == "3"
    error = json.loads(bytes(response.body))["error"]
    assert error["code"] == "server_busy" and "serve.serve_queue_requests" in error["message"]


def test_the_serve_section_checks_its_autoscaling_bounds() -> None:
    from rayft.config.loader import validate_config

    with pytest.raises(ConfigError, match="go together"):
        validate_config({"serve": {"min_replicas": 1}}, source="test")
    with pytest.raises(ConfigError, match=r"serve.min_replicas \(3\) is above serve.max_replicas \(2\)"):
        validate_config({"serve": {"min_replicas": 3, "max_replicas": 2}}, source="test")


def test_vllm_configs_validate_with_ray_serve_llm(tmp_path: Path) -> None:
    from rayft.serving.plan import Adapter, ServePlan

    base = BaseGroup("smol", ModelConfig(name="HuggingFaceTB/SmolLM2-135M-Instruct", dtype="bfloat16"))
    plan = ServePlan((BaseGroup(base.model_id, base.model, (Adapter("alpha", str(tmp_path)),)),))
    serve = RayftConfig.model_validate(
        {"serve": {"backend": "vllm", "min_replicas": 1, "max_replicas": 2, "vllm_lora_path": "s3://bucket/adapters"}}
    ).serve
    (config,) = validate_llm_configs(llm_configs(plan, serve))
    assert config.model_id == "smol" and config.lora_config.dynamic_lora_loading_path == "s3://bucket/adapters"
    assert config.deployment_config["autoscaling_config"]["max_replicas"] == 2
    with pytest.raises(ConfigError, match="serve.vllm_lora_path is unset"):
        llm_configs(plan, RayftConfig.model_validate({"serve": {"backend": "vllm"}}).serve)
    local = serve.model_copy(update={"vllm_lora_path": str(tmp_path)})
    with pytest.raises(ConfigError, match="is invalid: Value error, Invalid lora_config"):
        validate_llm_configs(llm_configs(plan, local))


def test_the_cli_refuses_a_missing_source_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", str(tmp_path / "nowhere"), "--port", "0"])
    assert result.exit_code == 2
    assert result.output.startswith("Error: model source") and "does not exist" in result.output
    assert "Traceback" not in result.output


def test_the_cli_takes_dotted_overrides_after_the_sources(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`rayft serve SOURCE KEY=VALUE`, as chat and generate take them: the override is a setting, not a source
    (a keys file that is a directory is refused by what it is, before Ray starts)."""
    (tmp_path / "keys").mkdir()
    result = CliRunner().invoke(cli, ["serve", str(tiny_model_dir), f"serve.api_keys_file={tmp_path / 'keys'}"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: serve.api_keys_file=") and "is a directory, not a file" in result.output
    result = CliRunner().invoke(cli, ["serve", str(tiny_model_dir), "serve.prot=8001"])
    assert result.exit_code == 2 and "serve.prot" in result.output and "model source" not in result.output


def test_overrides_are_told_from_sources_by_their_dotted_key() -> None:
    from rayft.cli.serve_cmd import split_overrides

    arguments = ("runs/a=b", "org/model", "tiny", "serve.port=8001", "eval.checkpoint=best", "./x=1")
    assert split_overrides(arguments) == (("runs/a=b", "org/model", "tiny", "./x=1"),
                                          ["serve.port=8001", "eval.checkpoint=best"])  # fmt: skip


def test_a_pipeline_directory_serves_its_final_model_under_the_run_name(tmp_path: Path, tiny_model_dir: Path) -> None:
    from rayft.runs.records import StageRecord, write_record
    from tests.support.checkpoints import build_lora_checkpoint

    pipeline = tmp_path / "quickstart"

    def trained(stage: str, seed: int) -> None:  # a training stage's run directory: final/ beside its config
        build_lora_checkpoint(pipeline / stage / "final", tiny_model_dir, seed=seed)
        (pipeline / stage / "config.yaml").write_text("name: x\n")
        write_record(pipeline, StageRecord(stage, f"f{seed}", {}, {"final": f"{stage}/final"}))

    trained("train", 1)
    plan = plan_serving([str(pipeline)], ModelConfig())
    assert plan.model_ids == [tiny_model_dir.name, "quickstart"]
    assert plan.served_from == {"quickstart": str(pipeline / "train" / "final")}
    trained("preference", 2)
    assert plan_serving([str(pipeline)], ModelConfig()).served_from == {
        "quickstart": str(pipeline / "preference" / "final")
    }
    trained("rl", 3)
    assert plan_serving([str(pipeline)], ModelConfig()).served_from == {"quickstart": str(pipeline / "rl" / "final")}
    untrained = tmp_path / "only-data"
    write_record(untrained, StageRecord("sdg", "f0", {}, {"data": "sdg/data.jsonl"}))
    with pytest.raises(ConfigError, match="only-data is a pipeline run that has trained no model yet"):
        plan_serving([str(untrained)], ModelConfig())


def _rank_adapter(directory: Path, rank: int) -> str:
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank}))
    return str(directory)


def test_vllm_engine_settings_reach_the_engine_args(tmp_path: Path) -> None:
    from rayft.serving.plan import Adapter, ServePlan

    base = ModelConfig(name="HuggingFaceTB/SmolLM2-135M-Instruct", dtype="bfloat16")
    adapter = Adapter("wide", _rank_adapter(tmp_path / "wide", 64))
    plan = ServePlan((BaseGroup("smol", base, (adapter,)),))
    settings = {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.8, "max_model_len": 4096,
                "enforce_eager": True, "extra": {"swap_space": 4, "enable_prefix_caching": True}}  # fmt: skip
    serve = RayftConfig.model_validate({"serve": {"backend": "vllm", "vllm_lora_path": "s3://b/a", "vllm": settings,
                                                  "max_batch_size": 12}}).serve  # fmt: skip
    (config,) = llm_configs(plan, serve)
    assert config["engine_kwargs"] == {
        "tensor_parallel_size": 2, "gpu_memory_utilization": 0.8, "max_model_len": 4096, "enforce_eager": True,
        "swap_space": 4, "enable_prefix_caching": True, "dtype": "bfloat16", "max_num_seqs": 12,
        "enable_lora": True, "max_loras": 4, "max_lora_rank": 64,  # the smallest of vLLM's ranks holding r=64
    }  # fmt: skip
    (validated,) = validate_llm_configs([config])
    assert validated.engine_kwargs["max_lora_rank"] == 64
    plain = RayftConfig.model_validate({"serve": {"backend": "vllm"}}).serve
    assert llm_configs(ServePlan((BaseGroup("smol", base),)), plain)[0]["engine_kwargs"] == {
        "dtype": "bfloat16", "max_num_seqs": 16}  # fmt: skip


def test_vllm_lora_rank_is_checked_against_the_adapters(tmp_path: Path) -> None:
    from rayft.serving.plan import Adapter, ServePlan
    from rayft.serving.vllm import lora_rank

    base = ModelConfig(name="HuggingFaceTB/SmolLM2-135M-Instruct")
    group = BaseGroup("smol", base, (Adapter("a", _rank_adapter(tmp_path / "a", 4)),
                                     Adapter("b", _rank_adapter(tmp_path / "b", 40))))  # fmt: skip
    serve = RayftConfig.model_validate({"serve": {"backend": "vllm", "vllm_lora_path": "s3://b/a"}}).serve
    assert lora_rank(group, serve) == 64  # r=40 needs vLLM's next allowed rank
    assert lora_rank(BaseGroup("smol", base, (group.adapters[0],)), serve) == 16  # vLLM's default, at least
    fixed = serve.model_copy(update={"vllm": serve.vllm.model_copy(update={"max_lora_rank": 32})})
    with pytest.raises(ConfigError, match=r"adapter 'b' has LoRA rank 40, above serve.vllm.max_lora_rank \(32\)"):
        llm_configs(ServePlan((group,)), fixed)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tensor_paralel_size": 2}, "serve.vllm.tensor_paralel_size"),
        ({"gpu_memory_utilization": 1.5}, "serve.vllm.gpu_memory_utilization"),
        ({"extra": {"max_lora_rank": 64}}, "set it as serve.vllm.max_lora_rank, not in extra"),
        ({"extra": {"dtype": "half"}}, "rayft sets this vLLM argument itself"),
    ],
)
def test_vllm_engine_settings_refuse_typos_and_conflicts_by_name(settings: dict[str, Any], message: str) -> None:
    from rayft.config.loader import validate_config

    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config({"serve": {"vllm": settings}}, source="test")
