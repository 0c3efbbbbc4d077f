"""The model card (README.md) of an exported model: lineage, verification, usage, training config."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayft.evaluation.summary import GateResult
from rayft.models.architecture import resolve_architecture
from rayft.models.registry import BUILTIN_MODELS
from rayft.models.sources import ResolvedSource
from rayft.runs import layout


def base_model_id(name: str) -> str:
    """The public id of a base model: the Hub id behind a built-in name, else the name itself."""
    return BUILTIN_MODELS[name].hub_id if name in BUILTIN_MODELS else name


def render_model_card(
    resolved: ResolvedSource, verification: dict[str, Any], *, merged: bool, gates: Sequence[GateResult] = ()
) -> str:
    """Markdown with a YAML header the Hub understands (base_model, library_name, tags); with ``gates``,
    the promotion gates the export passed and their evidence."""
    base = base_model_id(str(resolved.lineage.get("base_model") or resolved.model.name))
    library = "peft" if resolved.kind == "lora" and not merged else "transformers"
    what = {True: "LoRA adapter merged into the base weights", False: "LoRA adapter (unmerged)"}
    form = what[merged] if resolved.kind == "lora" else "full fine-tuning"
    lines = [
        "---",
        f"base_model: {json.dumps(base)}",
        f"library_name: {library}",
        "tags:",
        "  - rayft",
        f"  - {'lora' if resolved.kind == 'lora' else 'full-finetune'}",
        "---",
        "",
        f"# Fine-tuned {base}",
        "",
        f"Exported by rayft from `{resolved.checkpoint_dir}` ({form}).",
        "",
        "## Lineage",
        "",
        "| | |",
        "|---|---|",
        f"| base model | `{base}` |",
        f"| method | {resolved.lineage.get('method', resolved.kind)} |",
        f"| step | {resolved.step if resolved.step is not None else 'unknown'} |",
        f"| data fingerprint | `{resolved.lineage.get('data_key', 'unknown')}` |",
        f"| workers | {resolved.lineage.get('world_size', 'unknown')} |",
        f"| rayft version | {resolved.lineage.get('rayft_version', 'unknown')} |",
    ]
    lines += [f"| {name} | {value:.4f} |" for name, value in sorted(resolved.metrics.items()) if name != "step"]
    lines += _evidence(gates)
    lines += ["", "## Verification", "", "```json", json.dumps(verification, indent=2), "```", "", "## Usage", ""]
    seq2seq = resolve_architecture(resolved.model) == "seq2seq"
    lines += _usage(base, merged=merged, lora=resolved.kind == "lora", seq2seq=seq2seq)
    config = Path(resolved.checkpoint_dir or "") / layout.CHECKPOINT_CONFIG_FILE
    if config.is_file():
        lines += ["", "## Training config", "", "```yaml", config.read_text(encoding="utf-8").rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _evidence(gates: Sequence[GateResult]) -> list[str]:
    """The card's section on the promotion gates the export passed (none without gates)."""
    if not gates:
        return []
    intro = (
        "This model was exported after it passed these promotion gates: paired tests of the models on the same "
        "evaluation examples (the difference with its interval, the flips, then the deciding test)."
    )
    return ["", "## Evidence", "", intro, "", *(f"- `{g.gate}`: {g.evidence}" for g in gates)]


def _usage(base: str, *, merged: bool, lora: bool, seq2seq: bool = False) -> list[str]:
    if lora and not merged:
        peft_class = "AutoPeftModelForSeq2SeqLM" if seq2seq else "AutoPeftModelForCausalLM"
        return [
            "```python",
            f"from peft import {peft_class}",
            "from transformers import AutoTokenizer",
            "",
            f'model = {peft_class}.from_pretrained("path/to/this/directory")',
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/directory")',
            "```",
            "",
            f"The adapter applies to `{base}`.",
        ]
    if seq2seq:
        return [
            "```python",
            "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
            "",
            'model = AutoModelForSeq2SeqLM.from_pretrained("path/to/this/directory")',
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/directory")',
            'inputs = tokenizer("Which city hosted the 1998 final?", return_tensors="pt")',
            "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=64)[0], skip_special_tokens=True))",
            "```",
            "",
            "The encoder reads the source as training built it; the decoder writes the target.",
        ]
    return [
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'model = AutoModelForCausalLM.from_pretrained("path/to/this/directory")',
        'tokenizer = AutoTokenizer.from_pretrained("path/to/this/directory")',
        'messages = [{"role": "user", "content": "What is 12 + 7?"}]',
        "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors='pt')",
        "print(tokenizer.decode(model.generate(inputs, max_new_tokens=64)[0]))",
        "```",
        "",
        "generation_config.json holds the end-of-turn token as EOS, so generation stops where training taught it.",
    ]
