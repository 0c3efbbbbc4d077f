"""The export's doer: load a planned checkpoint, verify it (the adapter must change the base
model's logits; merged weights must match base+adapter within ``export.probe_tolerance``), save it
as a Hugging Face model directory with tokenizer, chat template and generation config, reload the
saved directory with ``from_pretrained`` and generate, write the model card, and only then move the
finished directory into place (a failure leaves no partial export behind)."""

from __future__ import annotations

import errno
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rayft.config.evaluation import ExportConfig
from rayft.config.model import LoraConfig
from rayft.errors import CheckpointError, StorageError
from rayft.evaluation.summary import GateResult
from rayft.export import verify as v
from rayft.export.card import render_model_card
from rayft.export.checks import check_adapter, check_against_base, read_adapter_config
from rayft.export.gguf_file import write_gguf_exports
from rayft.export.plan import ExportPlan
from rayft.files import replace_dir, share_like_siblings, staging_dir, write_text_atomic
from rayft.models.loading import load_causal_lm
from rayft.models.sources import ResolvedSource
from rayft.runs import layout

VERIFICATION_FILE = "rayft_export.json"
_COPIED = ("generation_config.json", layout.CHECKPOINT_CONFIG_FILE)
REWRITING_INITS = ("pissa", "olora")  # PEFT's init_lora_weights values that rewrite the base weights


def export_checkpoint(
    plan: ExportPlan, cfg: ExportConfig, *, gates: Sequence[GateResult] = (), name: str | None = None
) -> dict[str, Any]:
    """Carry out ``plan``: write, verify and publish the export at ``plan.target``; the verification record.
    ``gates``: the promotion gates it passed, stated in the model card. ``name``: what the GGUF files are
    named after (``<name>-<type>.gguf``), the directory the export ends in; ``plan.target``'s name by default."""
    staging = _make_staging(plan.target)
    try:
        if plan.kind == "lora":
            verification = export_lora(plan.source, staging, cfg, merge=plan.merge)
        else:
            verification = export_full(plan.source, staging, cfg)
        if cfg.format == "gguf":  # from the saved (merged, verified) directory, before it is published
            verification["gguf"] = write_gguf_exports(staging, name or plan.target.name, list(cfg.gguf_types))
        write_text_atomic(staging / VERIFICATION_FILE, json.dumps(verification, indent=2) + "\n")
        write_text_atomic(
            staging / "README.md", render_model_card(plan.source, verification, merged=plan.merged, gates=gates)
        )
        share_like_siblings(staging)  # the weights are written 0600 through a temporary file
        replace_dir(staging, plan.target)  # the empty directory the plan allowed, if any, is replaced
    except Exception as exc:
        if is_disk_full(exc):
            raise StorageError(
                f"export: {plan.target.parent} ran out of space while the export was written ({exc}); nothing was "
                "left there (the partial export is removed): free space or choose another output directory"
            ) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return verification


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk or quota is full: an OSError (ENOSPC, EDQUOT), or a writer that reports
    the OS error in its text (safetensors' SafetensorError: "No space left on device (os error 28)")."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return f"(os error {errno.ENOSPC})" in str(exc) or "No space left on device" in str(exc)


def _make_staging(target: Path) -> Path:
    """The empty directory the export is written into before it is renamed to ``target``; a
    StorageError here, before any model loads, when ``target``'s parent cannot be written."""
    try:
        return staging_dir(target, "export-partial")
    except OSError as exc:
        raise StorageError(
            f"export: cannot write into {target.parent} ({exc.strerror}); choose a writable output directory"
        ) from exc


def training_lora(checkpoint: Path) -> LoraConfig | None:
    """The lora section the checkpoint was trained with (None for adapters trained elsewhere)."""
    saved = checkpoint / layout.CHECKPOINT_CONFIG_FILE
    if not saved.is_file():
        return None
    raw = yaml.safe_load(saved.read_text(encoding="utf-8")) or {}
    try:
        return LoraConfig.model_validate(raw.get("lora", {}))
    except ValidationError as exc:
        raise CheckpointError(f"{saved}: its lora section is invalid ({exc.errors()[0]['msg']})") from exc


def _limit(cfg: ExportConfig) -> str:
    return f"export.probe_tolerance {cfg.probe_tolerance}"


def _raise_problems(what: str, problems: list[str]) -> None:
    if problems:
        raise CheckpointError(f"{what} failed verification:\n  - " + "\n  - ".join(problems))


def _copy_side_files(checkpoint: Path, staging: Path, tokenizer: Any) -> None:
    tokenizer.save_pretrained(staging)  # tokenizer files and chat_template.jinja
    for name in _COPIED:  # text files, rewritten masked: a checkpoint saved by an older rayft may hold a credential
        if (checkpoint / name).is_file():
            write_text_atomic(staging / name, (checkpoint / name).read_text(encoding="utf-8"))


def export_lora(resolved: ResolvedSource, staging: Path, cfg: ExportConfig, *, merge: bool) -> dict[str, Any]:
    """Check, (merge,) save and verify a LoRA checkpoint; return the verification record."""
    import torch
    from transformers import AutoTokenizer

    assert resolved.adapter_path is not None  # kind == "lora"
    checkpoint = Path(resolved.adapter_path)
    lora = training_lora(checkpoint)
    targets = lora.target_modules if lora is not None and isinstance(lora.target_modules, list) else None
    problems, summary = check_adapter(checkpoint, expected_r=lora.r if lora else None, expected_targets=targets)
    _raise_problems(f"the adapter in {checkpoint}", problems)
    assert summary is not None
    fp32 = resolved.model.model_copy(update={"dtype": "float32"})
    verify_dtype = getattr(torch, cfg.verify_dtype)
    base: Any = load_causal_lm(fp32, "cpu").to(verify_dtype)
    base.eval()
    _raise_problems(f"the adapter in {checkpoint}", check_against_base(summary, base))
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    batch = v.probe_batch(tokenizer, cfg.probe_prompts)
    record: dict[str, Any] = {
        "adapter": {"r": summary.r, "modules": len(summary.modules), "parameters": summary.num_parameters}
    }
    base_logits = v.probe_logits(base, batch) if cfg.verify else None
    peft_model = load_adapter(base, checkpoint, verify_dtype)
    v.check_loaded_adapter(peft_model, checkpoint)
    adapted = v.probe_logits(peft_model, batch) if cfg.verify else None
    if base_logits is not None and adapted is not None:
        record["adapter_effect_max_abs_logit"] = v.max_abs_diff(adapted, base_logits)
        if record["adapter_effect_max_abs_logit"] == 0.0:
            _raise_problems(f"the adapter in {checkpoint}", ["it does not change the base model's logits at all"])
    if merge:
        merged = peft_model.merge_and_unload().eval()
        if adapted is not None:
            record["merge_max_abs_logit_diff"] = diff = v.max_abs_diff(v.probe_logits(merged, batch), adapted)
            if diff > cfg.probe_tolerance:
                _raise_problems(
                    "the merged model",
                    [f"its logits differ from base+adapter by {diff:.3g} > {_limit(cfg)}"],
                )
        merged.to(getattr(torch, cfg.dtype)).save_pretrained(
            staging, safe_serialization=True, max_shard_size=cfg.max_shard_size
        )
    else:
        for name in (layout.ADAPTER_WEIGHTS, layout.ADAPTER_CONFIG):
            shutil.copy2(checkpoint / name, staging / name)
    _copy_side_files(checkpoint, staging, tokenizer)
    if not cfg.verify:
        return record | {"verified": False}

    def reload() -> Any:
        if merge:
            return _load_for_verification(staging, cfg)
        fresh: Any = load_causal_lm(fp32, "cpu").to(verify_dtype)
        return load_adapter(fresh, staging, verify_dtype)

    return record | _verify_reload(staging, reload, batch, adapted, cfg)


def load_adapter(base: Any, adapter_dir: Path, dtype: Any) -> Any:
    """``base`` with the adapter of ``adapter_dir`` loaded (PEFT), in ``dtype``, for evaluation.

    An adapter initialised by PiSSA or OLoRA was trained on base weights less their top-r part; PEFT
    recomputes that split when it loads the adapter onto the original base, but only from float32 or a
    smaller float (its SVD and QR run in float32), so such a base goes through float32 and the adapted
    model to ``dtype`` afterwards.
    """
    import torch
    from peft import PeftModel

    if read_adapter_config(adapter_dir).get("init_lora_weights") in REWRITING_INITS and base.dtype != torch.float32:
        base = base.to(torch.float32)
    return PeftModel.from_pretrained(base, str(adapter_dir)).to(dtype).eval()


def export_full(resolved: ResolvedSource, staging: Path, cfg: ExportConfig) -> dict[str, Any]:
    """Save and verify a full fine-tuning checkpoint; return the verification record."""
    import torch
    from transformers import AutoTokenizer

    assert resolved.checkpoint_dir is not None
    checkpoint = Path(resolved.checkpoint_dir)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model: Any = v.model_class_of(checkpoint).from_pretrained(checkpoint, dtype=torch.float32)
    model.to(getattr(torch, cfg.verify_dtype)).eval()
    batch = v.probe_batch(tokenizer, cfg.probe_prompts)
    reference = v.probe_logits(model, batch) if cfg.verify else None
    model.to(getattr(torch, cfg.dtype)).save_pretrained(
        staging, safe_serialization=True, max_shard_size=cfg.max_shard_size
    )
    _copy_side_files(checkpoint, staging, tokenizer)
    if reference is None:
        return {"verified": False}

    def reload() -> Any:
        return _load_for_verification(staging, cfg)

    return _verify_reload(staging, reload, batch, reference, cfg)


def _load_for_verification(directory: Path, cfg: ExportConfig) -> Any:
    import torch

    model: Any = v.model_class_of(directory).from_pretrained(directory, dtype=torch.float32)
    return model.to(getattr(torch, cfg.verify_dtype)).eval()


def _verify_reload(
    staging: Path, reload: Any, batch: dict[str, Any], reference: Any, cfg: ExportConfig
) -> dict[str, Any]:
    """Reload the export as a user would, compare its logits, check EOS, and generate."""
    from transformers import AutoTokenizer

    model = reload()
    tokenizer = AutoTokenizer.from_pretrained(staging)
    diff = v.max_abs_diff(v.probe_logits(model, batch), reference)
    # Weights saved in bf16/fp16 are rounded: the logit comparison holds only for float32 exports.
    if cfg.dtype == "float32" and diff > cfg.probe_tolerance:
        _raise_problems(
            f"the export in {staging}",
            [f"reloaded logits differ from the checkpoint's by {diff:.3g} > {_limit(cfg)}"],
        )
    eos = v.eos_ids(staging, tokenizer)
    end_of_turn = v.end_of_turn_id(tokenizer)
    if end_of_turn is not None and end_of_turn not in eos:
        _raise_problems(
            f"the export in {staging}",
            [f"generation_config.json stops at {eos} but the chat template ends turns with token {end_of_turn}"],
        )
    text = v.generate_check(model, tokenizer, cfg.probe_prompts[0], eos)
    return {
        "verified": True,
        "reload_max_abs_logit_diff": diff,
        "probe_tolerance": cfg.probe_tolerance,
        "dtype": cfg.dtype,
        "eos_token_ids": eos,
        "end_of_turn_token_id": end_of_turn,
        "reload_generate_ok": True,
        "probe_generation": text,
    }
