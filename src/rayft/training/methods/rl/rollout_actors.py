"""Where GRPO's rollouts are sampled: on the training worker itself (colocated), or on Ray generation actors
apart from the trainer that hold a copy of the policy (as verl and OpenRLHF do).

With actors, each training worker owns its share of ``train.rl.rollout.num_actors``. Before it samples, a
worker makes sure its actors hold its current weights (after each training step it sends them, through the
Ray object store: the LoRA adapter's tensors, or the whole state dict of a full fine-tune), then sends each
micro-batch of prompts to one of them with the same seed colocated sampling uses, so an HF actor samples the
completions the trainer would. With ``max_staleness`` k the worker also sends the prompts of the next k steps
right away: the actors sample them while the trainer trains (asynchronous, bounded staleness). Every wait on
an actor has a timeout that ends the run with one line naming what waited, for how long and the field to
raise; nothing waits forever.
"""

from __future__ import annotations

import importlib
import json
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rayft.config.model import LoraConfig, ModelConfig
from rayft.config.rl import RlConfig, RolloutConfig
from rayft.errors import ConfigError, TrainingError, first_line
from rayft.training.methods.rl.episodes import EpisodeRunner, episode_runner
from rayft.training.methods.rl.rollout_plan import actor_of, owned_actors, timeout_message
from rayft.training.methods.rl.sampling import Completions, PromptBatch, Sampler, seed_of
from rayft.training.modeling.model import Method, transformers_model

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ActorSpec:
    """What a generation actor is built from: the policy's model and method (its LoRA layout), the rollout
    settings, and the GPUs it was given."""

    model: ModelConfig
    lora: LoraConfig
    method: Method
    settings: RlConfig
    gpus: float = 0.0
    frozen_bf16: bool = False  # the trainer's frozen base layers multiply in bf16 (train.frozen_precision): so do a
    # CPU actor's, so that it samples what the trainer's model would (the weight updates carry only the adapter)


@dataclass(frozen=True)
class WeightUpdate:
    """The policy's weights after ``version`` training steps: trainable tensors by parameter name (LoRA: the
    adapter's; full: the whole state dict) and, for LoRA, the adapter's PEFT config (a vLLM engine loads the
    adapter from files)."""

    version: int
    tensors: dict[str, Any]
    adapter_config: dict[str, Any] | None = None


def load_policy_weights(model: torch.nn.Module, tensors: dict[str, Any]) -> None:
    """Copy ``tensors`` into ``model``'s parameters of the same names; a name the model lacks is an error."""
    import torch

    with torch.no_grad():
        _, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected:
        raise TrainingError(
            f"the weight update names {len(unexpected)} tensors the generation actor's model lacks (first: "
            f"{unexpected[0]}); the actor was built with another model or LoRA layout than the trainer's"
        )


class HfRolloutActor:
    """A generation actor sampling with Hugging Face ``generate`` (CPU, or its GPU), through the
    :class:`~rayft.training.methods.rl.sampling.Sampler` the trainer samples with."""

    def __init__(self, spec: ActorSpec) -> None:
        import ray

        from rayft.models.loading import hide_unused_bitsandbytes, load_tokenizer
        from rayft.training.modeling.model import build_training_model

        # As a Ray actor, its process samples for one run and ends with it: PEFT would import bitsandbytes (about
        # 1 CPU-s) for nothing unless the run's base is quantized. Built in another process (a test's), it leaves
        # that process's imports alone.
        if ray.get_runtime_context().get_actor_id() is not None:
            hide_unused_bitsandbytes(spec.model, spec.lora.applied_quantize(spec.method))
        device = "cuda" if spec.gpus > 0 else "cpu"
        self.model = build_training_model(
            spec.model, spec.lora, spec.method, device, gradient_checkpointing=False, restore_dir=None,
            frozen_bf16=spec.frozen_bf16 and device == "cpu",
        ).eval()  # fmt: skip
        self.sampler = Sampler(spec.settings, load_tokenizer(spec.model), spec.model.attn_implementation)
        self.episodes = episode_runner(self.sampler)  # multi-turn rollouts (train.rl.environment), else None
        self.version: int | None = None
        rollout = spec.settings.rollout
        # Asynchronous rollouts are sampled with older weights than the step's: the loss weighs them by these.
        self.with_logps = rollout.max_staleness > 0 and rollout.importance_cap is not None

    def ready(self) -> bool:
        """Answers once the model is loaded."""
        return True

    def load_weights(self, update: WeightUpdate) -> int:
        """Take the trainer's weights; returns their version."""
        load_policy_weights(self.model, update.tensors)
        self.version = update.version
        return update.version

    def generate(
        self, prompts: list[list[int]], group: int, seed: int, rows: list[dict[str, Any]] | None = None
    ) -> Completions:
        """``group`` completions of each prompt, seeded as the trainer seeds colocated sampling: episodes of the
        environment (``rows``: their prompts' carried columns) when the run has one."""
        if self.episodes is not None:
            sampled = self.episodes.run(self.model, prompts, rows or [], group, seed)
        else:
            sampled = self.sampler.sample(self.model, prompts, group, seed=seed)
        sampled.version = self.version
        if self.with_logps:
            size = self.sampler.settings.completions_per_forward or group
            repeated = [p for p in prompts for _ in range(group)]
            sampled.logps = self.sampler.completion_logps(self.model, repeated, sampled.token_ids, size, sampled.masks)
        return sampled


class VllmRolloutActor:
    """A generation actor with a vLLM engine on its GPU (``pip install 'rayft[vllm]'``). LoRA weights arrive as
    a new adapter version written to a local directory; full weights are loaded into the engine's model in
    place (``load_weights`` of vLLM's model runner, the engine's in-process executor). Each completion is
    sampled from its own seed (the micro-batch's seed plus its row), so its samples differ from HF's."""

    def __init__(self, spec: ActorSpec) -> None:
        from rayft.generation.vllm import import_vllm, vllm_engine_args
        from rayft.models.loading import load_tokenizer, model_location

        self.vllm = import_vllm()
        location, kwargs = model_location(spec.model)
        rank = spec.lora.r if spec.method == "lora" else None
        self.llm = self.vllm.LLM(**vllm_engine_args(
            spec.model, location, kwargs.get("revision"), adapter_rank=rank, gpu_memory_utilization=0.9,
            tensor_parallel_size=1,
        ))  # fmt: skip
        self.spec = spec
        self.tokenizer = load_tokenizer(spec.model)
        self.adapters = Path(tempfile.mkdtemp(prefix="rayft-rollout-adapter-"))
        self.lora: Any = None  # vLLM's LoRARequest (vllm is an optional extra, not imported to type it)
        self.version: int | None = None

    def ready(self) -> bool:
        """Answers once the engine is up."""
        return True

    def load_weights(self, update: WeightUpdate) -> int:
        """Take the trainer's weights: a new adapter version, or the full weights loaded in place."""
        if update.adapter_config is not None:
            self.lora = self.write_adapter(update)
        else:
            runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
            runner.model.load_weights(update.tensors.items())
        self.version = update.version
        return update.version

    def write_adapter(self, update: WeightUpdate) -> Any:  # vLLM's LoRARequest (optional extra)
        """The update as a PEFT adapter directory (names without PEFT's '.default' adapter name)."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        directory = self.adapters / f"v{update.version}"
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {name.replace(".default", ""): t.contiguous() for name, t in update.tensors.items()}
        save_file(tensors, str(directory / "adapter_model.safetensors"))
        (directory / "adapter_config.json").write_text(json.dumps(update.adapter_config))
        return LoRARequest(f"policy-v{update.version}", update.version + 1, str(directory))

    def generate(self, prompts: list[list[int]], group: int, seed: int) -> Completions:
        """``group`` completions of each prompt, one seed per completion."""
        import time

        s = self.spec.settings
        rows = [{"prompt_token_ids": p} for p in prompts for _ in range(group)]
        params = [self.vllm.SamplingParams(max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                                           seed=seed + i, stop_token_ids=[int(self.tokenizer.eos_token_id)])
                  for i in range(len(rows))]  # fmt: skip
        started = time.perf_counter()
        outputs = self.llm.generate(rows, params, lora_request=self.lora, use_tqdm=False)
        token_ids = [list(output.outputs[0].token_ids) for output in outputs]
        texts = self.tokenizer.batch_decode(token_ids, skip_special_tokens=True)
        seconds = time.perf_counter() - started
        return Completions(token_ids, texts, sum(len(t) for t in token_ids), seconds, self.version)


ENGINES: dict[str, type] = {"hf": HfRolloutActor, "vllm": VllmRolloutActor}


class Rollouts(Protocol):
    """Where a training worker's rollouts are sampled."""

    def sample(
        self, model: torch.nn.Module, step: int, batches: Sequence[PromptBatch], ahead: Sequence[Sequence[PromptBatch]]
    ) -> list[Completions]:
        """The completions of ``step``'s micro-batches of prompts (``ahead``: the next steps' prompts, which
        asynchronous rollouts start sampling now)."""
        ...

    def after_update(self, model: torch.nn.Module, version: int) -> None:
        """The policy took its ``version``-th training step."""
        ...

    def close(self) -> None:
        """Release what sampling holds."""
        ...

    def state(self) -> str | None:
        """What a checkpoint keeps to resume exactly (the rollouts sampled ahead), as JSON; None: nothing."""
        ...

    def restore(self, text: str) -> None:
        """Take back what :meth:`state` returned at the checkpoint resumed from."""
        ...


@dataclass(frozen=True)
class ColocatedRollouts:
    """Rollouts sampled on the training worker, from the model it trains (episodes, with an environment)."""

    sampler: Sampler
    seed: int
    episodes: EpisodeRunner | None = None

    def sample(
        self, model: torch.nn.Module, step: int, batches: Sequence[PromptBatch], ahead: Sequence[Sequence[PromptBatch]]
    ) -> list[Completions]:
        """One seeded ``generate`` call per micro-batch (``ahead`` is empty: colocated rollouts are synchronous)."""
        group = self.sampler.settings.group_size
        out = []
        for batch in batches:
            seed = seed_of(self.seed, step, batch.sample_ids[0])
            if self.episodes is not None:
                sampled = self.episodes.run(transformers_model(model), batch.prompts, batch.rows, group, seed)
            else:
                sampled = self.sampler.sample(transformers_model(model), batch.prompts, group, seed=seed)
            sampled.version = step - 1
            out.append(sampled)
        return out

    def after_update(self, model: torch.nn.Module, version: int) -> None:
        """Nothing travels: the next rollout samples from the model itself."""

    def close(self) -> None:
        """End the environment's step actor, if any."""
        if self.episodes is not None:
            self.episodes.steps.close()

    def state(self) -> str | None:
        """Nothing is sampled ahead."""
        return None

    def restore(self, text: str) -> None:
        """Nothing is sampled ahead."""


def policy_weights(model: torch.nn.Module, method: str, version: int) -> WeightUpdate:
    """The trainer's weights to send to the actors: the trainable (adapter) tensors of a LoRA policy, or the
    whole state dict of a full fine-tune, on the host."""
    inner = transformers_model(model)
    if method != "lora":
        return WeightUpdate(version, {name: t.detach().cpu() for name, t in whole_state(inner).items()})
    tensors = {name: p.detach().cpu() for name, p in inner.named_parameters() if p.requires_grad}
    config = inner.peft_config["default"].to_dict()  # type: ignore[union-attr]  # a LoRA policy's PeftConfig
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    return WeightUpdate(version, tensors, json.loads(json.dumps(config, default=str)))


def whole_state(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What ``net.state_dict()`` holds (every parameter under each of its names, as tied ones have two, and the
    persistent buffers), read from the modules: a sharded model's are read while it is gathered whole, and
    FSDP answers ``state_dict()`` with its shards (it reshards first)."""
    state: dict[str, torch.Tensor] = {}
    for prefix, module in net.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        state.update({f"{dot}{name}": p for name, p in module.named_parameters(recurse=False) if p is not None})
        skipped = module._non_persistent_buffers_set  # what state_dict() leaves out
        state.update({f"{dot}{name}": b for name, b in module.named_buffers(recurse=False)
                      if b is not None and name not in skipped})  # fmt: skip
    return state


def first_ids(batches: Sequence[PromptBatch]) -> list[int]:
    """What identifies a step's prompts on a worker: each micro-batch's first sample id."""
    return [batch.sample_ids[0] for batch in batches]


def load_actor_class(path: str) -> type:
    """The class ``train.rl.rollout.actor_class`` names ('package.module:Class')."""
    module_name, _, name = path.rpartition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"train.rl.rollout.actor_class={path!r}: cannot import {module_name!r} ({exc}); install the package or "
            "add its directory to PYTHONPATH"
        ) from None
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ConfigError(f"train.rl.rollout.actor_class={path!r}: {module_name} defines no class {name!r}")
    return cls


def wait(refs: list[Any], timeout_s: float, what: str, field_name: str, cause: str) -> list[Any]:
    """``ray.get`` of ``refs`` within ``timeout_s``; a wait that runs out, an actor that died or a call that
    raised ends the run with one line."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    try:
        return list(ray.get(refs, timeout=timeout_s))
    except GetTimeoutError:
        raise TrainingError(timeout_message(what, timeout_s, field_name, cause)) from None
    except RayActorError as exc:
        raise TrainingError(f"{what} failed: a generation actor died ({first_line(exc)}); check its log") from None
    except RayTaskError as exc:
        cause_exc = exc.cause if isinstance(exc.cause, BaseException) else exc
        raise TrainingError(f"{what} failed on a generation actor: {type(cause_exc).__name__}: {cause_exc}") from None


@dataclass
class ActorRollouts:
    """Rollouts sampled by this training worker's generation actors, kept in step with its weights."""

    actors: list[Any]
    config: RolloutConfig
    method: str
    group: int
    seed: int
    pending: dict[int, list[Any]] = field(default_factory=dict)  # step -> its micro-batches' generate calls
    ready: dict[int, list[Completions]] = field(default_factory=dict)  # step -> completions already collected
    prompts_of: dict[int, list[int]] = field(default_factory=dict)  # step -> its micro-batches' first sample ids
    syncs: list[Any] = field(default_factory=list)  # load_weights calls not yet waited on
    pushed: int | None = None  # the version last sent to the actors
    multi_turn: bool = False  # episodes of train.rl.environment: the actors are sent the prompts' carried rows

    def sample(
        self, model: torch.nn.Module, step: int, batches: Sequence[PromptBatch], ahead: Sequence[Sequence[PromptBatch]]
    ) -> list[Completions]:
        """``step``'s completions (sampled ahead if they were submitted earlier), then the next
        ``max_staleness`` steps' prompts submitted with the current weights (those after ``step - 1`` steps)."""
        if step in self.ready and self.prompts_of.get(step) != first_ids(batches):
            del self.ready[step]  # saved by a run whose workers held other prompts: sample them again
        if not self.has(step):
            self.submit(model, step - 1, step, batches)
        completions = self.collect(step)
        for offset, upcoming in enumerate(ahead[: self.config.max_staleness], start=1):
            if not self.has(step + offset):
                self.submit(model, step - 1, step + offset, upcoming)
        return completions

    def has(self, step: int) -> bool:
        """Whether ``step``'s rollout is sampled or on its way."""
        return step in self.pending or step in self.ready

    def submit(self, model: torch.nn.Module, version: int, step: int, batches: Sequence[PromptBatch]) -> None:
        """Send ``step``'s micro-batches to the actors, once they hold the trainer's weights (after ``version``
        steps; sent now at the first submission of the run or after a resume)."""
        if self.pushed is None:
            self.after_update(model, version)
        self.wait_for_sync()
        self.prompts_of[step] = first_ids(batches)
        self.pending[step] = [
            self.actors[actor_of(index, len(self.actors))].generate.remote(
                batch.prompts, self.group, seed_of(self.seed, step, batch.sample_ids[0]),
                *([batch.rows] if self.multi_turn else []),
            )
            for index, batch in enumerate(batches)
        ]  # fmt: skip

    def collect(self, step: int) -> list[Completions]:
        """The completions of ``step``'s generate calls, within ``generate_timeout_s``."""
        self.prompts_of.pop(step, None)
        if step in self.ready:
            return self.ready.pop(step)
        refs = self.pending.pop(step)
        what = f"the rollout of step {step} on the generation actors"
        cause = "completions too long for the actors' speed, or an actor that hangs"
        return wait(refs, self.config.generate_timeout_s, what, "generate_timeout_s", cause)

    def after_update(self, model: torch.nn.Module, version: int) -> None:
        """Send the weights after ``version`` steps to every actor through the object store (one copy), without
        waiting: the next submission waits for them."""
        import ray

        update = ray.put(policy_weights(model, self.method, version))
        self.syncs = [actor.load_weights.remote(update) for actor in self.actors]
        self.pushed = version

    def wait_for_sync(self) -> None:
        """Wait, within ``sync_timeout_s``, until every actor holds the weights last sent."""
        if self.syncs:
            refs, self.syncs = self.syncs, []
            wait(refs, self.config.sync_timeout_s, f"the weight sync of step {self.pushed} to the generation actors",
                 "sync_timeout_s", "an actor that is busy or hangs, or weights too large for the object store's "
                 "bandwidth")  # fmt: skip

    def state(self) -> str | None:
        """The rollouts sampled ahead of the trained step (collected now, so the checkpoint holds them): a run
        resumed from it trains on them as the uninterrupted run does."""
        for step in sorted(self.pending):
            ids = self.prompts_of[step]
            self.ready[step] = self.collect(step)
            self.prompts_of[step] = ids
        return json.dumps({
            str(step): {"prompts": self.prompts_of[step], "completions": [asdict(c) for c in done]}
            for step, done in sorted(self.ready.items())
        })  # fmt: skip

    def restore(self, text: str) -> None:
        """The rollouts sampled ahead at the checkpoint resumed from (used only for the same prompts)."""
        for step, saved in json.loads(text).items():
            self.ready[int(step)] = [Completions(**c) for c in saved["completions"]]
            self.prompts_of[int(step)] = saved["prompts"]

    def close(self) -> None:
        """End the actors (their pending calls with them)."""
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def start_actors(spec: ActorSpec, config: RolloutConfig, *, world_size: int, rank: int) -> list[Any]:
    """This worker's generation actors, each answered ``ready()`` within ``start_timeout_s``."""
    import ray

    if not ray.is_initialized():
        raise TrainingError("train.rl.rollout.placement=actors needs Ray; run with scaling.num_workers >= 1")
    cls = load_actor_class(config.actor_class) if config.actor_class else ENGINES[config.resolved_engine]
    # "DEFAULT": placed on the cluster, not in the training workers' placement group (which has no room).
    # Any: Ray's stubs type ray.remote(cls).options() as a class with no remote() of the actor's arguments.
    remote: Any = ray.remote(cls).options(num_cpus=config.num_cpus_per_actor, num_gpus=config.num_gpus_per_actor,
                                     scheduling_strategy="DEFAULT", max_restarts=0)  # fmt: skip
    actors = [remote.remote(spec) for _ in owned_actors(config.num_actors or world_size, world_size, rank)]
    try:
        wait([actor.ready.remote() for actor in actors], config.start_timeout_s,
             f"starting {len(actors)} generation actors of rank {rank}", "start_timeout_s",
             f"the cluster lacks {config.num_cpus_per_actor:g} CPUs and {config.num_gpus_per_actor:g} GPUs per "
             "actor beside the training workers, or the model loads slowly")  # fmt: skip
    except TrainingError:
        for actor in actors:
            ray.kill(actor)
        raise
    return actors


def build_rollouts(
    spec: ActorSpec, config: RolloutConfig, sampler: Sampler, seed: int, *, world_size: int, rank: int
) -> Rollouts:
    """The rollouts of ``config.placement``: colocated, or this worker's generation actors started."""
    if config.placement == "colocated":
        return ColocatedRollouts(sampler, seed, episode_runner(sampler))
    actors = start_actors(spec, config, world_size=world_size, rank=rank)
    return ActorRollouts(actors, config, spec.method, spec.settings.group_size, seed,
                         multi_turn=spec.settings.environment is not None)  # fmt: skip
