"""Config section for ``rayft serve``: an OpenAI-compatible endpoint on Ray Serve."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rayft.config.base import Section

VLLM_SET_BY_RAYFT = frozenset({"model", "dtype", "max_num_seqs", "chat_template", "enable_lora", "max_loras"})
"""vLLM engine arguments rayft sets itself (from model:, serve.max_batch_size, the adapters), never from ``extra``."""


class VllmEngineConfig(Section):
    """vLLM engine arguments of the vllm backend (Ray Serve LLM's ``engine_kwargs``); unset: vLLM's default."""

    max_lora_rank: int | None = Field(
        None,
        gt=0,
        description=(
            "Largest LoRA rank the engine accepts (vLLM's default is 16; an adapter of a higher rank does not load). "
            "Unset: the smallest of vLLM's ranks (1, 8, 16, 32, 64, 128, 256, 320, 512) that holds every served "
            "adapter's rank."
        ),
    )
    tensor_parallel_size: int | None = Field(
        None, gt=0, description="GPUs each replica shards the model over (vLLM's tensor_parallel_size)."
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Share of each GPU's memory vLLM takes for weights and KV cache (0-1]."
    )
    max_model_len: int | None = Field(
        None, gt=0, description="Context length the engine serves (prompt plus completion); below the model's own."
    )
    enforce_eager: bool | None = Field(
        None, description="Run eagerly, without CUDA graphs (starts faster, decodes slower)."
    )
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Further vLLM engine arguments passed as they are (e.g. {swap_space: 4, enable_prefix_caching: true}); "
            "not the ones above, nor those rayft sets (model, dtype, max_num_seqs, chat_template, enable_lora, "
            "max_loras)."
        ),
    )

    @field_validator("extra")
    @classmethod
    def _check_extra(cls, value: dict[str, Any]) -> dict[str, Any]:
        named = set(cls.model_fields) - {"extra"}
        for key in value:
            if key in named:
                raise ValueError(f"serve.vllm.extra.{key}: set it as serve.vllm.{key}, not in extra")
            if key in VLLM_SET_BY_RAYFT:
                raise ValueError(
                    f"serve.vllm.extra.{key}: rayft sets this vLLM argument itself (from model: and serve:); "
                    "remove it from extra"
                )
        return value

    def engine_kwargs(self) -> dict[str, Any]:
        """The arguments that are set, ``extra`` included, as vLLM's engine takes them."""
        named = self.model_dump(exclude={"extra"}, exclude_none=True)
        return {**named, **self.extra}


class ServeConfig(Section):
    """How ``rayft serve`` deploys its models: backend, replicas, batching, adapters and the HTTP address.

    Each base model gets one deployment (a replica set); the LoRA adapters trained on it are loaded
    into its replicas on demand, by model id, and kept in a bounded least-recently-used cache.
    """

    backend: Literal["hf", "vllm"] = Field(
        "hf",
        description=(
            "'hf': transformers + PEFT on CPU or GPU with continuous batching; 'vllm': Ray Serve LLM "
            "(ray.serve.llm) on GPUs, with continuous batching (pip install 'rayft[vllm]')."
        ),
    )
    sources: list[str] = Field(
        default_factory=list,
        description=(
            "Models served when rayft serve is given no SOURCE (and by the RayService of rayft k8s render): run "
            "directories, checkpoints, exports or model names, as the serving machines see them."
        ),
    )
    host: str = Field("127.0.0.1", description="Address the HTTP server binds (0.0.0.0: every interface).")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port (0: a free port, chosen at start).")
    num_replicas: int = Field(1, gt=0, description="Replicas of each base model's deployment (without autoscaling).")
    min_replicas: int | None = Field(
        None, ge=0, description="Autoscaling lower bound of replicas per base model (set with max_replicas)."
    )
    max_replicas: int | None = Field(
        None, gt=0, description="Autoscaling upper bound of replicas per base model (set with min_replicas)."
    )
    target_ongoing_requests: float = Field(
        8.0, gt=0, description="Autoscaling aims at this many requests in flight per replica."
    )
    max_ongoing_requests: int = Field(
        64, gt=0, description="Requests a replica accepts at once (more wait in Serve's queue: serve_queue_requests)."
    )
    serve_queue_requests: int | None = Field(
        32,
        gt=0,
        description=(
            "Requests Ray Serve holds for the model replicas (the router's queue for them: their deployments' "
            "max_queued_requests) waiting for a replica with room under max_ongoing_requests; one more is "
            "answered 503 with Retry-After at once instead of waiting without bound. Serve's proxy holds as many "
            "requests for the router as the router takes at once. Unset (null): no bound."
        ),
    )
    serve_retry_after_s: int = Field(
        2, gt=0, description="Retry-After, in seconds, of a 503 answered because serve_queue_requests are waiting."
    )
    num_cpus_per_replica: float = Field(1.0, gt=0, description="CPUs reserved by each model replica.")
    num_gpus_per_replica: float = Field(0.0, ge=0, description="GPUs reserved by each model replica (0: CPU).")
    max_batch_size: int = Field(
        16,
        gt=0,
        description=(
            "Requests a replica decodes together (hf: rows of its running batch, joined and left at every "
            "decoding step; vllm: max_num_seqs)."
        ),
    )
    kv_cache_tokens: int = Field(
        32768,
        gt=0,
        description=(
            "hf: KV cache tokens a replica reserves for its running requests (each takes its prompt plus its "
            "max_tokens while it runs); a request that does not fit waits in the queue."
        ),
    )
    max_queued_requests: int = Field(
        48,
        ge=0,
        description=(
            "hf: requests that wait per replica for a row of the running batch; one more is answered 429 with "
            "Retry-After. Keep max_batch_size + max_queued_requests <= max_ongoing_requests, or Serve queues the "
            "rest before they reach the replica."
        ),
    )
    max_prefill_tokens: int = Field(
        64,
        gt=0,
        description=(
            "hf: prompt tokens a replica prefills in one step besides the first request's (a longer prompt "
            "still joins, alone). While rows decode they wait for each prefill step, so a low bound spreads a "
            "burst over steps, keeps the rows that joined together from ending (and their clients' next "
            "requests from arriving) together, and lowers the time to first token under load; a high bound "
            "prefills a burst in fewer, larger steps, for more tokens per second."
        ),
    )
    mixed_steps: bool = Field(
        True,
        description=(
            "hf: prefill the requests that join a replica's running batch in the same forward as the running "
            "rows' next tokens (a mixed step), so that a forward's fixed cost (reading the weights) is paid once "
            "per step instead of once more per prefill. Llama, Mistral, Mixtral, Qwen2/3 (and MoE), Gemma, Phi, Phi-3, "
            "Granite, OLMo 2, Cohere, StarCoder2, GLM, Helium, SmolLM3, GPT-2, GPT-NeoX and GPT-J models without a "
            "sliding window; other models, and false, prefill in steps of their own between decoding steps."
        ),
    )
    prefix_cache_tokens: int = Field(
        0,
        ge=0,
        description=(
            "hf: prompt tokens whose keys and values a replica keeps, in blocks of 16 tokens, so that a request "
            "whose prompt starts like an earlier one's (a shared system prompt, few-shot examples) prefills only "
            "the rest; per base model and adapter, least recently used out first. The memory is apart from "
            "kv_cache_tokens: 2 x layers x KV heads x head size x dtype bytes per token (SmolLM2-135M in float32: "
            "46 KB). 0: off."
        ),
    )
    max_adapters_per_replica: int = Field(
        4, gt=0, description="LoRA adapters a replica keeps loaded; the least recently used is unloaded first."
    )
    max_runtime_adapters: int = Field(
        8,
        ge=0,
        description=(
            "hf: LoRA adapters loaded at run time (POST /v1/load_lora_adapter) the server keeps; loading one more "
            "unloads the least recently used of them (those given at start stay). 0: loading at run time is off."
        ),
    )
    max_tokens: int = Field(
        256, gt=0, description="Completion tokens when a request gives no max_tokens (capped by the context)."
    )
    vllm_lora_path: str | None = Field(
        None,
        description=(
            "vllm backend: the s3://, gs:// or azure:// prefix holding each adapter as <prefix>/<adapter id> "
            "(Ray Serve LLM loads adapters from remote storage); requested as model '<base id>:<adapter id>'."
        ),
    )
    vllm: VllmEngineConfig = Field(
        default_factory=VllmEngineConfig,
        description="vllm backend: the engine's settings (max_lora_rank, tensor_parallel_size, ...), checked by name.",
    )
    api_keys_env: str | None = Field(
        "RAYFT_API_KEYS",
        description=(
            "Environment variable holding the API keys (comma- or newline-separated): requests must then send "
            "'Authorization: Bearer <key>' (401 otherwise). Unset or empty: no key needed. Keys are never taken "
            "from the command line or this file."
        ),
    )
    api_keys_file: str | None = Field(
        None, description="A file of API keys, one a line ('#' starts a comment), added to those of api_keys_env."
    )
    api_keys_secret: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description=(
            "RayService (rayft k8s render): the Kubernetes Secret whose key named after api_keys_env holds the API "
            "keys; every pod gets that variable from it."
        ),
    )
    access_log_console: bool = Field(
        False,
        description=(
            "Also print Ray Serve's access log (method, route, status, latency; never a key or a prompt) on the "
            "console; it always goes to the Serve log files under the Ray session's logs/serve/."
        ),
    )
    graceful_shutdown_timeout_s: float = Field(
        30.0, ge=0, description="On shutdown, how long replicas finish the requests in flight before they stop."
    )

    @model_validator(mode="after")
    def _check_keys_secret(self) -> ServeConfig:
        if self.api_keys_secret and not self.api_keys_env:
            raise ValueError("serve.api_keys_secret needs serve.api_keys_env (the variable the pods read); set it")
        return self

    @model_validator(mode="after")
    def _check_autoscaling(self) -> ServeConfig:
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("serve.min_replicas and serve.max_replicas go together; set both or neither")
        if self.min_replicas is not None and self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(
                f"serve.min_replicas ({self.min_replicas}) is above serve.max_replicas ({self.max_replicas}); "
                "lower min_replicas or raise max_replicas"
            )
        return self
