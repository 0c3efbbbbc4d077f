"""The vLLM backend of ``rayft serve``: Ray Serve LLM (``ray.serve.llm``) configs, one per base model.

:func:`llm_configs` builds them from a :class:`~rayft.serving.plan.ServePlan` and ``serve:`` as
plain dicts, and :func:`validate_llm_configs` checks them with Ray Serve LLM's own ``LLMConfig``
model, which needs no GPU and no vLLM; :func:`start_vllm` deploys them (a GPU machine with vLLM).
Ray Serve LLM serves adapters from remote storage, by the id ``<base id>:<adapter id>``. The engine's
settings of ``serve.vllm`` go into each config's ``engine_kwargs`` as vLLM names them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rayft.config.serve import ServeConfig
from rayft.errors import ConfigError, MissingDependencyError
from rayft.serving.app import APP_NAME, deployment_options, free_port, start_serve
from rayft.serving.plan import BaseGroup, ServePlan


def llm_configs(plan: ServePlan, cfg: ServeConfig) -> list[dict[str, Any]]:
    """One ``LLMConfig`` (as a dict) per base model of the plan."""
    return [_llm_config(group, cfg) for group in plan.groups]


def _llm_config(group: BaseGroup, cfg: ServeConfig) -> dict[str, Any]:
    options = deployment_options(cfg)
    deployment = {key: options[key] for key in ("max_ongoing_requests", "graceful_shutdown_timeout_s")}
    if "autoscaling_config" in options:
        deployment["autoscaling_config"] = options["autoscaling_config"]
    else:
        deployment["autoscaling_config"] = {"min_replicas": cfg.num_replicas, "max_replicas": cfg.num_replicas}
    config: dict[str, Any] = {
        "model_loading_config": {"model_id": group.model_id, "model_source": group.model.name},
        "deployment_config": deployment,
        "engine_kwargs": {**cfg.vllm.engine_kwargs(), "dtype": group.model.dtype, "max_num_seqs": cfg.max_batch_size},
    }
    if group.model.chat_template:
        config["engine_kwargs"]["chat_template"] = group.model.chat_template
    if group.adapters:
        if not cfg.vllm_lora_path:
            ids = ", ".join(a.model_id for a in group.adapters)
            raise ConfigError(
                f"serve.vllm_lora_path is unset, but the vllm backend loads the LoRA adapters ({ids}) from remote "
                "storage; copy each adapter directory to <prefix>/<adapter id> and set serve.vllm_lora_path: "
                "s3://bucket/prefix (or use serve.backend: hf)"
            )
        config["lora_config"] = {
            "dynamic_lora_loading_path": cfg.vllm_lora_path,
            "max_num_adapters_per_replica": cfg.max_adapters_per_replica,
        }
        config["engine_kwargs"].update(enable_lora=True, max_loras=cfg.max_adapters_per_replica,
                                       max_lora_rank=lora_rank(group, cfg))  # fmt: skip
    return config


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM's ``max_lora_rank`` takes (its LoRAConfig refuses others)."""


def adapter_rank(path: str) -> int | None:
    """The rank ``r`` of the adapter in directory ``path`` (None: not a local directory with a readable config)."""
    config = Path(path) / "adapter_config.json"
    try:
        rank = json.loads(config.read_text(encoding="utf-8")).get("r")
    except (OSError, ValueError):
        return None
    return int(rank) if isinstance(rank, int) else None


def lora_rank(group: BaseGroup, cfg: ServeConfig) -> int:
    """``max_lora_rank`` of a base's engine: serve.vllm.max_lora_rank, checked against each adapter's rank;
    unset, the smallest of vLLM's ranks that holds them all (16, vLLM's default, at least)."""
    ranks = {a.model_id: r for a in group.adapters if (r := adapter_rank(a.path)) is not None}
    largest = max(ranks.values(), default=0)
    if cfg.vllm.max_lora_rank is not None:
        if largest > cfg.vllm.max_lora_rank:
            name = max(ranks, key=ranks.__getitem__)
            raise ConfigError(
                f"adapter {name!r} has LoRA rank {largest}, above serve.vllm.max_lora_rank "
                f"({cfg.vllm.max_lora_rank}); vLLM would refuse to load it: raise serve.vllm.max_lora_rank to at "
                f"least {largest}"
            )
        return cfg.vllm.max_lora_rank
    fitting = [r for r in VLLM_LORA_RANKS if r >= max(largest, 16)]
    if not fitting:
        raise ConfigError(
            f"an adapter has LoRA rank {largest}, above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]}); serve "
            "it with serve.backend: hf, or merge it (rayft export)"
        )
    return fitting[0]


def validate_llm_configs(configs: list[dict[str, Any]]) -> list[Any]:
    """Ray Serve LLM's ``LLMConfig`` of each dict; a :class:`ConfigError` naming the first bad one."""
    # ray.serve.llm re-exports this class but imports vLLM on the way; the model itself needs neither.
    from pydantic import ValidationError
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    validated = []
    for config in configs:
        try:
            validated.append(LLMConfig.model_validate(config))
        except ValidationError as exc:
            model_id = config["model_loading_config"]["model_id"]
            raise ConfigError(
                f"the vllm backend's config of {model_id!r} is invalid: {exc.errors()[0]['msg']}"
            ) from exc
    return validated


def start_vllm(plan: ServePlan, cfg: ServeConfig, host: str, port: int) -> str:
    """Deploy the plan with Ray Serve LLM's OpenAI app; the base URL."""
    configs = validate_llm_configs(llm_configs(plan, cfg))
    try:
        from ray.serve.llm import build_openai_app
    except ImportError as exc:
        raise MissingDependencyError("vllm", "vllm", "serve.backend: vllm (on a GPU machine)") from exc
    from ray import serve

    port = port or free_port(host)
    start_serve(host, port)
    serve.run(build_openai_app({"llm_configs": configs}), name=APP_NAME, route_prefix="/")
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/v1"
