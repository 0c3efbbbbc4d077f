"""The Ollama ``Modelfile`` written beside a GGUF export: which file, the chat template, stop tokens
and parameters. Written by hand: no Python library writes Modelfiles, and Ollama's templates are Go
templates, which cannot be derived from an arbitrary Jinja chat template; the ChatML layout that
rayft's models use is translated here (with the system turn a template adds by default, as
SmolLM2's does), and any other template is left to Ollama (it reads
``tokenizer.chat_template`` from the GGUF file and matches the templates it knows)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODELFILE = "Modelfile"

# ChatML in Ollama's Go template language: every message as <|im_start|>role\ncontent<|im_end|>\n,
# then the assistant header, which is what the Jinja ChatML template renders with add_generation_prompt.
CHATML_GO_TEMPLATE = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)
_SYSTEM_PROBE = "rayft-probe"


def _is_chatml(chat_template: str | None) -> bool:
    return bool(chat_template) and "<|im_start|>" in str(chat_template) and "<|im_end|>" in str(chat_template)


def chatml_go_template(default_system: str | None) -> str:
    """The ChatML Go template, opening with ``default_system`` as a system turn when the conversation
    does not start with one of its own (as SmolLM2's Jinja template does). The text is printed as a Go
    string literal (JSON's escapes are Go's), so that braces in it are never read as template actions."""
    if not default_system:
        return CHATML_GO_TEMPLATE
    opening = (
        '{{- if not (and .Messages (eq (index .Messages 0).Role "system")) }}<|im_start|>system\n'
        f"{{{{ {json.dumps(default_system)} }}}}<|im_end|>\n{{{{ end }}}}"
    )
    return opening + CHATML_GO_TEMPLATE


def default_system_prompt(render: Callable[[list[dict[str, str]]], str]) -> str | None:
    """The system turn a ChatML template adds to a conversation that has none, read off what ``render``
    (the tokenizer's chat template, with the generation prompt) makes of a one-message conversation."""
    text = render([{"role": "user", "content": _SYSTEM_PROBE}])
    head = "<|im_start|>system\n"
    if not text.startswith(head) or "<|im_end|>" not in text:
        return None
    return text[len(head) : text.index("<|im_end|>")]


def stop_tokens(tokenizer: Any, eos_token_ids: list[int], chat_template: str | None) -> list[str]:
    """The strings that end a reply: the end-of-sequence tokens, and ChatML's end of turn."""
    stops = [str(tokenizer.convert_ids_to_tokens(i)) for i in eos_token_ids]
    if _is_chatml(chat_template) and "<|im_end|>" not in stops:
        stops.append("<|im_end|>")
    return list(dict.fromkeys(stops))


def render_modelfile(
    gguf_name: str,
    *,
    chat_template: str | None,
    stops: list[str],
    context_length: int,
    default_system: str | None = None,
) -> str:
    """The text of a Modelfile that runs ``gguf_name`` (a file in the same directory) in Ollama;
    ``default_system``: the system turn the chat template adds when a conversation has none."""
    lines = [f"FROM ./{gguf_name}", ""]
    if _is_chatml(chat_template):
        lines += [f'TEMPLATE """{chatml_go_template(default_system)}"""', ""]
    else:
        lines += ["# No TEMPLATE: Ollama uses the chat template stored in the GGUF file when it knows it.", ""]
    lines += [f"PARAMETER stop {json.dumps(s)}" for s in stops]
    lines.append(f"PARAMETER num_ctx {context_length}")
    return "\n".join(lines) + "\n"


def write_modelfile(model_dir: Path, gguf_name: str) -> Path:
    """Write ``Modelfile`` into ``model_dir`` (the exported Hugging Face directory holding ``gguf_name``)."""
    from transformers import AutoTokenizer

    from rayft.data.tokenize import render_chat
    from rayft.export import verify as v
    from rayft.files import write_text_atomic

    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    template = getattr(tokenizer, "chat_template", None)
    stops = stop_tokens(tokenizer, v.eos_ids(model_dir, tokenizer), template)
    system = None
    if template is not None and _is_chatml(template):
        chatml = str(template)
        system = default_system_prompt(
            lambda chat: render_chat(chatml, tokenizer.special_tokens_map, chat, generation_prompt=True)
        )
    text = render_modelfile(
        gguf_name,
        chat_template=template,
        stops=stops,
        context_length=int(config["max_position_embeddings"]),
        default_system=system,
    )
    path = model_dir / MODELFILE
    write_text_atomic(path, text)
    return path
