"""The Ollama ``Modelfile`` written beside a GGUF export: which file, the chat template, stop tokens
and parameters. Written by hand: no Python library writes Modelfiles, and Ollama's templates are Go
templates, which cannot be derived from an arbitrary Jinja chat template; the ChatML layout that
rayft's models use is translated here, and any other template is left to Ollama (it reads
``tokenizer.chat_template`` from the GGUF file and matches the templates it knows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODELFILE = "Modelfile"

# ChatML in Ollama's Go template language: every message as <|im_start|>role\ncontent<|im_end|>\n,
# then the assistant header, which is what the Jinja ChatML template renders with add_generation_prompt.
CHATML_GO_TEMPLATE = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)


def _is_chatml(chat_template: str | None) -> bool:
    return bool(chat_template) and "<|im_start|>" in str(chat_template) and "<|im_end|>" in str(chat_template)


def stop_tokens(tokenizer: Any, eos_token_ids: list[int], chat_template: str | None) -> list[str]:
    """The strings that end a reply: the end-of-sequence tokens, and ChatML's end of turn."""
    stops = [str(tokenizer.convert_ids_to_tokens(i)) for i in eos_token_ids]
    if _is_chatml(chat_template) and "<|im_end|>" not in stops:
        stops.append("<|im_end|>")
    return list(dict.fromkeys(stops))


def render_modelfile(gguf_name: str, *, chat_template: str | None, stops: list[str], context_length: int) -> str:
    """The text of a Modelfile that runs ``gguf_name`` (a file in the same directory) in Ollama."""
    lines = [f"FROM ./{gguf_name}", ""]
    if _is_chatml(chat_template):
        lines += [f'TEMPLATE """{CHATML_GO_TEMPLATE}"""', ""]
    else:
        lines += ["# No TEMPLATE: Ollama uses the chat template stored in the GGUF file when it knows it.", ""]
    lines += [f"PARAMETER stop {json.dumps(s)}" for s in stops]
    lines.append(f"PARAMETER num_ctx {context_length}")
    return "\n".join(lines) + "\n"


def write_modelfile(model_dir: Path, gguf_name: str) -> Path:
    """Write ``Modelfile`` into ``model_dir`` (the exported Hugging Face directory holding ``gguf_name``)."""
    from transformers import AutoTokenizer

    from rayft.export import verify as v
    from rayft.files import write_text_atomic

    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    template = getattr(tokenizer, "chat_template", None)
    stops = stop_tokens(tokenizer, v.eos_ids(model_dir, tokenizer), template)
    text = render_modelfile(
        gguf_name, chat_template=template, stops=stops, context_length=int(config["max_position_embeddings"])
    )
    path = model_dir / MODELFILE
    write_text_atomic(path, text)
    return path
