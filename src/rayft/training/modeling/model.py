"""Building the model a worker trains: the base model, its LoRA adapter, and restored weights."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

from rayft.config.model import LoraConfig, ModelConfig
from rayft.errors import ConfigError, ModelError
from rayft.models.architecture import lora_targets
from rayft.models.loading import auto_model_class, empty_causal_lm, load_causal_lm, loaded_attention, resolve_dtype
from rayft.training.modeling.attention import use_training_attention
from rayft.training.modeling.kernels import apply_liger_kernels

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from transformers import PreTrainedModel

    # What a causal-LM objective trains: the transformers model, or the PEFT model around it (LoRA).
    TransformersModel: TypeAlias = PreTrainedModel | PeftModel

log = logging.getLogger(__name__)

Method = Literal["lora", "full"]


def training_dtype(model: ModelConfig, method: Method, device_type: str) -> str:
    """The dtype to load weights in for training.

    'auto' keeps full fine-tuning in float32 master weights (autocast does the bf16 math) and
    loads a frozen LoRA base in bf16/fp16 on GPU, where it halves memory at no accuracy cost.
    """
    if model.dtype != "auto":
        return model.dtype
    if device_type != "cuda" or method == "full":
        return "float32"
    return "auto"


def build_training_model(
    model: ModelConfig,
    lora: LoraConfig,
    method: Method,
    device_type: str,
    *,
    gradient_checkpointing: bool,
    restore_dir: Path | None,
    weights: bool = True,
    compile_blocks: bool = False,
    liger_kernels: bool = False,
    frozen_bf16: bool = False,
) -> TransformersModel:
    """Load the model to train; with ``restore_dir``, weights (or the adapter) come from it.

    Without ``weights``, the same model is built on the meta device and nothing is read but its
    config: for the workers of a strategy that fills every worker from rank 0's copy, so that one
    copy of the weights, not one per worker, is read and held in host memory. Attention switches
    to the training variant for the device (:func:`rayft.training.modeling.attention.training_attention`).
    """
    load_cfg = model.model_copy(update={"dtype": training_dtype(model, method, device_type)})
    full_restore = restore_dir if method == "full" else None
    quantize = lora.applied_quantize(method)
    net: PreTrainedModel
    if quantize != "none" and not weights:
        # The config refuses the strategies that build workers without weights (FSDP, ZeRO-3) for a quantized base.
        raise ModelError(
            f"lora.quantize={quantize!r}: a quantized base is loaded by every worker; use train.strategy=ddp"
        )
    if not weights:
        net = empty_causal_lm(load_cfg, device_type, location=str(full_restore) if full_restore else None)
    elif full_restore is not None:
        net = _load_full_from(full_restore, load_cfg, device_type)
    else:
        net = load_causal_lm(load_cfg, device_type, quantize=quantize, quantize_embeddings=lora.quantize_embeddings)
        if lora.quantize_embeddings and quantize != "none":
            _refuse_trained_tables(net, lora.modules_to_save)
    return prepare_training_model(
        net, lora, method, load_cfg.attn_implementation, device_type, gradient_checkpointing=gradient_checkpointing,
        compile_blocks=compile_blocks, restore_dir=restore_dir if weights else None, liger_kernels=liger_kernels,
        frozen_bf16=frozen_bf16,
    )  # fmt: skip


def prepare_training_model(
    net: PreTrainedModel,
    lora: LoraConfig,
    method: Method,
    attn_implementation: str,
    device_type: str,
    *,
    gradient_checkpointing: bool,
    compile_blocks: bool,
    restore_dir: Path | None = None,
    liger_kernels: bool = False,
    frozen_bf16: bool = False,
) -> TransformersModel:
    """Turn a loaded model into the one a worker trains: training attention for the device (causal
    LMs; an encoder-decoder keeps its configured attention, which takes the padding mask), the LoRA
    adapter (restored from ``restore_dir`` when given; its input dropout without a copy of each adapted
    layer's input, :func:`~rayft.training.modeling.lora_dropout.lean_lora_dropout`), activation
    checkpointing of every block, and each block compiled; with ``liger_kernels``, Liger's RMSNorm,
    SwiGLU and RoPE patched in first; with ``frozen_bf16`` (LoRA), the adapted layers' frozen base weights
    stored and multiplied in bf16 (:func:`~rayft.training.modeling.frozen_bf16.bf16_frozen_layers`)."""
    if liger_kernels:
        apply_liger_kernels(net, device_type)
    if not is_seq2seq(net):
        use_training_attention(net, attn_implementation, device_type)
    model: TransformersModel = net
    if method == "lora":
        from rayft.training.modeling.lora_dropout import lean_lora_dropout  # imports torch

        model = _attach_adapter(net, lora, restore_dir)
        lean_lora_dropout(model)
        if frozen_bf16:
            from rayft.training.modeling.frozen_bf16 import bf16_frozen_layers  # imports torch

            bf16_frozen_layers(model)
    if gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.config.use_cache = False
    # from_pretrained returns a model in eval mode, from_config (the meta-device build) in train mode, and a
    # fresh adapter's modules train: every build trains with the model's own dropout (T5's, LoRA's) switched on,
    # so that a resumed or sharded worker runs the same computation as a fresh one.
    model.train()
    if compile_blocks:
        compile_each_block(model)
    return model


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Checkpoint every block of a transformers (or PEFT) model, non-reentrant: transformers 5 renamed the
    method (``gradient_checkpointing_enable`` warns that it goes in 6); earlier 5.x releases have the old one only."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]


def compile_each_block(net: torch.nn.Module) -> int:
    """Compile every transformer block of ``net`` in place with ``torch.compile`` (parameter names
    and wrappers stay as they are; each block compiles once, and identical blocks share the code).
    Returns how many blocks were compiled."""
    base = base_model(net)
    names = frozenset(getattr(base, "_no_split_modules", None) or ())
    blocks = [m for m in base.modules() if type(m).__name__ in names]
    if not blocks:
        raise ModelError(
            f"train.compile compiles each transformer block, but {type(base).__name__} does not name its blocks "
            "(transformers' _no_split_modules); set train.compile=false"
        )
    for block in blocks:
        block.compile()
    return len(blocks)


def is_seq2seq(net: torch.nn.Module) -> bool:
    """Whether ``net`` (inside DDP / PEFT wrappers) is an encoder-decoder model."""
    base = base_model(net)
    return bool(getattr(base.config, "is_encoder_decoder", False))


def is_sequence_classifier(net: torch.nn.Module) -> bool:
    """Whether ``net`` is a transformers sequence classifier (a reward model): its LoRA adapter is PEFT's
    SEQ_CLS kind, which trains and saves the score head beside the adapter."""
    return type(base_model(net)).__name__.endswith("ForSequenceClassification")


def _load_full_from(directory: Path, cfg: ModelConfig, device_type: str) -> PreTrainedModel:
    model: PreTrainedModel = auto_model_class(cfg).from_pretrained(
        directory,
        dtype=resolve_dtype(cfg.dtype, device_type),
        attn_implementation=loaded_attention(cfg.attn_implementation),
    )
    return model


def _refuse_trained_tables(net: PreTrainedModel, modules_to_save: list[str]) -> None:
    """A quantized embedding or head is a frozen table: it cannot also be trained in full."""
    head = net.get_output_embeddings()  # type: ignore[no-untyped-call] # transformers leaves it unannotated
    tables = {n for n, m in net.named_modules() if m is net.get_input_embeddings() or m is head}
    trained = [name for name in modules_to_save if any(t == name or t.endswith(f".{name}") for t in tables)]
    if trained:
        raise ModelError(
            f"lora.modules_to_save={trained} trains the embedding or head in full, but lora.quantize_embeddings "
            "stores them quantized and frozen: remove them from lora.modules_to_save, or set "
            "lora.quantize_embeddings=false"
        )


def _attach_adapter(net: PreTrainedModel, lora: LoraConfig, restore_dir: Path | None) -> PeftModel:
    from peft import LoraConfig as PeftLoraConfig
    from peft import PeftModel, get_peft_model

    if restore_dir is not None:
        return PeftModel.from_pretrained(net, str(restore_dir), is_trainable=True)
    seq2seq = is_seq2seq(net)
    targets: list[str] | str = lora.target_modules
    if seq2seq:
        targets = lora_targets(net.config.model_type, [n for n, _ in net.named_modules()], targets)
    peft_cfg = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # type: ignore[arg-type] # PEFT types it int, uses it as a float
        lora_dropout=lora.dropout,
        target_modules=targets,
        modules_to_save=lora.modules_to_save or None,
        task_type="SEQ_2_SEQ_LM" if seq2seq else "SEQ_CLS" if is_sequence_classifier(net) else "CAUSAL_LM",
        use_dora=lora.use_dora,
        use_rslora=lora.use_rslora,
        # A worker built on the meta device (its weights come from rank 0's copy) has no weights to decompose:
        # it starts with PEFT's default init, overwritten by rank 0's rewritten base and adapter.
        init_lora_weights=True if lora.init == "default" or on_meta(net) else lora.init,
    )
    model = get_peft_model(net, peft_cfg)
    peft_cfg.init_lora_weights = True if lora.init == "default" else lora.init  # the adapter's config says as trained
    return model


def check_adapter_off_is_base(model: torch.nn.Module, what: str) -> None:
    """Refuse to use the model with its adapter off as ``what`` when the adapter's initialisation (PiSSA, OLoRA)
    rewrote the base weights: switched off, it leaves the rewritten base, not the model it started from."""
    configs = getattr(model, "peft_config", {})
    rewritten = sorted({str(c.init_lora_weights) for c in configs.values()} & {"pissa", "olora"})
    if rewritten:
        raise ConfigError(
            f"{what} is the model with its LoRA adapter off, but lora.init={rewritten[0]!r} rewrote the base weights, "
            "so that is not the model training started from; set lora.init=default"
            + (" or train.rl.reference=copy" if "GRPO" in what else "")
        )


def on_meta(net: torch.nn.Module) -> bool:
    """Whether ``net`` was built without weights (see :func:`build_training_model`)."""
    return any(p.is_meta for p in net.parameters())


def trainable_parameters(net: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters the optimizer updates, in a fixed order (so optimizer state restores exactly)."""
    return [p for _, p in named_trainable(net)]


def named_trainable(net: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of every parameter the optimizer updates, in module order (a sharded
    strategy's parameters are DTensors or DeepSpeed's emptied tensors)."""
    return [(n, p) for n, p in net.named_parameters() if p.requires_grad]


def full_shape(param: torch.Tensor) -> tuple[int, ...]:
    """A parameter's whole shape, also when it is sharded (a DTensor's shape is the whole one;
    DeepSpeed ZeRO-3 empties the tensor and keeps the shape as ``ds_shape``)."""
    return tuple(int(d) for d in getattr(param, "ds_shape", param.shape))


def parameter_groups(net: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices only, never on biases and norms."""
    params = dict(net.named_parameters())
    groups = [
        {"params": [params[n] for n in names], "weight_decay": decay}
        for names, decay in _group_names(net, weight_decay)
    ]
    return groups


def parameter_group_names(net: torch.nn.Module) -> list[list[str]]:
    """The names of the trainable parameters in each group of :func:`parameter_groups`, in order."""
    return [names for names, _ in _group_names(net, 0.0)]


def _group_names(net: torch.nn.Module, weight_decay: float) -> list[tuple[list[str], float]]:
    named = [(n, len(full_shape(p))) for n, p in named_trainable(net)]
    groups = [([n for n, ndim in named if ndim >= 2], weight_decay)]
    no_decay = [n for n, ndim in named if ndim < 2]
    if no_decay:
        groups.append((no_decay, 0.0))
    return groups


def unwrap(net: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP wrapper or a DeepSpeed engine (or the module itself)."""
    return cast("torch.nn.Module", getattr(net, "module", net))


def transformers_model(net: torch.nn.Module) -> TransformersModel:
    """The model inside DDP / DeepSpeed wrappers of a causal-LM objective (as :func:`build_training_model` built it)."""
    return cast("TransformersModel", unwrap(net))


def base_model(net: torch.nn.Module) -> PreTrainedModel:
    """The transformers model inside DDP / DeepSpeed and PEFT wrappers (a causal-LM objective's model)."""
    inner = unwrap(net)
    get_base_model = getattr(inner, "get_base_model", None)
    return cast("PreTrainedModel", get_base_model() if get_base_model is not None else inner)


def count_parameters(net: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts of the whole model, also when it is sharded (a DeepSpeed
    ZeRO-3 parameter is an empty tensor that keeps its size as ``ds_numel``)."""

    def numel(p: torch.nn.Parameter) -> int:
        return int(getattr(p, "ds_numel", p.numel()))

    return sum(numel(p) for p in trainable_parameters(net)), sum(numel(p) for p in net.parameters())
