"""Config sections for the model to fine-tune and its LoRA adapter."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rayft.config.base import Section

_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
_HUB_KERNEL = re.compile(r"^[\w.-]+/[\w.-]+(@[\w.-]+)?(:[\w.-]+)?$")

ATTENTION_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Architecture = Literal["auto", "causal", "seq2seq"]


class ModelConfig(Section):
    """Which model to load (a causal LM or an encoder-decoder), and how."""

    name: str = Field(
        "smollm2-135m-instruct",
        description=(
            "The model: a built-in offline name (smollm2-135m-instruct), a Hugging Face Hub id "
            "(Qwen/Qwen2.5-0.5B-Instruct), a local model directory, or a path to a .gguf file."
        ),
    )
    architecture: Architecture = Field(
        "auto",
        description=(
            "'causal' (decoder-only, AutoModelForCausalLM) or 'seq2seq' (encoder-decoder such as T5, Flan-T5, "
            "mT5 or BART, AutoModelForSeq2SeqLM). 'auto' reads is_encoder_decoder from the model's config. An "
            "encoder-decoder model is trained on source/target pairs: the prompt feeds the encoder, the loss is "
            "on the target tokens the decoder predicts, and packing is not available."
        ),
    )
    revision: str | None = Field(
        None,
        description="Hub revision (branch, tag or commit). A commit hash pins the exact weights.",
    )
    gguf_file: str | None = Field(
        None,
        description=(
            "Name of a GGUF file inside the Hub repo or local directory; its weights are dequantized on load."
        ),
    )
    dtype: Dtype = Field(
        "auto",
        description=(
            "Dtype of the loaded weights. 'auto' loads float32 on CPU and bfloat16 on GPUs that "
            "support it (float16 otherwise)."
        ),
    )
    attn_implementation: str = Field(
        "auto",
        description=(
            "Attention kernel passed to transformers: auto, sdpa, eager, flex_attention, flash_attention_2, "
            "flash_attention_3, or a Hub kernel repo (kernels-community/flash-attn, needs the kernels package). "
            "'auto' lets training pick from what was measured (see the performance page): per-example sdpa on CPU; "
            "on GPUs flash_attention_2 when flash-attn is installed, flex_attention for packed rows otherwise, "
            "sdpa for unpacked rows; loading for evaluation, generation and serving takes sdpa. Training on CPU "
            "with 'sdpa' runs it once per example of a packed row instead of over a block-diagonal mask; the "
            "flash kernels get each packed example's bounds (cu_seq_lens) and need a GPU."
        ),
    )
    trust_remote_code: bool = Field(
        False,
        description=(
            "Run modelling code shipped with the model. Only with a pinned commit in 'revision', "
            "since that code runs with your permissions."
        ),
    )
    chat_template: str | None = Field(
        None,
        description=(
            "A Jinja chat template that replaces the tokenizer's own; it is saved with every "
            "checkpoint and export so that serving renders prompts as training did."
        ),
    )

    @field_validator("chat_template")
    @classmethod
    def _chat_template_parses(cls, value: str | None) -> str | None:
        if value is not None:
            problem = jinja_syntax_error(value)
            if problem is not None:
                raise ValueError(f"not a Jinja template ({problem}); fix it")
        return value

    @field_validator("attn_implementation")
    @classmethod
    def _known_attention(cls, value: str) -> str:
        if value in ATTENTION_IMPLEMENTATIONS or _HUB_KERNEL.match(value):
            return value
        raise ValueError(
            f"model.attn_implementation={value!r} is neither one of {', '.join(ATTENTION_IMPLEMENTATIONS)} nor a Hub "
            "kernel repo (owner/name, e.g. kernels-community/flash-attn); pick one of those"
        )

    @model_validator(mode="after")
    def _remote_code_needs_pinned_revision(self) -> ModelConfig:
        if self.trust_remote_code and not (self.revision and _COMMIT_SHA.match(self.revision)):
            raise ValueError(
                "trust_remote_code=true needs 'revision' pinned to a 40-character commit hash "
                f"(got {self.revision!r}); set model.revision=<commit> or model.trust_remote_code=false"
            )
        return self


class LoraConfig(Section):
    """The LoRA adapter trained when ``train.method`` is ``lora`` (through PEFT)."""

    r: int = Field(16, gt=0, description="Rank of the LoRA update matrices.")
    alpha: float = Field(32, gt=0, description="Scaling numerator: the update is scaled by alpha / r.")
    dropout: float = Field(
        0.05,
        ge=0,
        lt=1,
        description=(
            "Dropout on the LoRA input. On CPU the mask is drawn from 16 random bits per element, so the "
            "probability is used to the nearest multiple of 2^-16 (0.05 as 0.0500031) and kept values are "
            "scaled by the inverse of the probability used; on GPU, torch's dropout kernel draws it."
        ),
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description=(
            "Module names (or suffixes) that receive adapters; 'all-linear' adapts every linear "
            "layer but the output head (for T5 and BART these are named explicitly in the adapter: "
            "q, k, v, o, wi (or wi_0, wi_1), wo; q_proj, k_proj, v_proj, out_proj, fc1, fc2)."
        ),
    )
    modules_to_save: list[str] = Field(
        default_factory=list,
        description="Modules trained in full and saved with the adapter (e.g. ['lm_head']).",
    )
    use_dora: bool = Field(
        False,
        description=(
            "DoRA (PEFT's use_dora): each adapted layer's weight is split into a trained magnitude per output "
            "row and a direction that LoRA updates. The lean LoRA dropout does not apply (DoRA reads the "
            "dropped-out input itself; the step line says so), and the frozen layers stay in their own precision "
            "(DoRA divides by the base weight's norm). Merged by export like plain LoRA."
        ),
    )
    use_rslora: bool = Field(
        False,
        description=(
            "rsLoRA (PEFT's use_rslora): the update is scaled by alpha / sqrt(r) instead of alpha / r, which keeps "
            "its size steady as the rank grows."
        ),
    )
    init: Literal["default", "pissa", "olora"] = Field(
        "default",
        description=(
            "How the adapter starts (PEFT's init_lora_weights): 'default' (B = 0, so training starts from the "
            "base model), 'pissa' (A and B from the base weight's top-r singular vectors, the base keeping the "
            "rest) or 'olora' (from a QR decomposition of the base weight). 'pissa' and 'olora' rewrite the base "
            "weights; the adapter records it and PEFT rewrites them again whenever the adapter is loaded onto the "
            "original base (resume, export, serve). Not with lora.quantize, nor with a reference that is the model "
            "with its adapter off (DPO without stored reference log-probabilities, GRPO's KL with "
            "train.rl.reference base)."
        ),
    )
    quantize: Literal["none", "nf4", "int8"] = Field(
        "none",
        description=(
            "QLoRA: load the frozen base weights quantized by bitsandbytes ('nf4': 4-bit NormalFloat, "
            "'int8': LLM.int8()) and train the adapter on top (pip install 'rayft[qlora]'). The base's "
            "linear layers need input widths that are multiples of 64. The adapter is saved as usual; a "
            "merged export merges it into the base loaded in its own dtype (dequantized). Only with "
            "train.method 'lora' and train.strategy 'ddp'."
        ),
    )
    quantize_embeddings: bool = Field(
        False,
        description=(
            "With lora.quantize: also store the frozen token embedding and output head in the same 4-bit or "
            "8-bit form (one table for both where the model ties them). Off by default because the head's "
            "rounding reaches every logit, which costs small models accuracy; on small models the embedding "
            "is a large share of the weights (a fifth of SmolLM2-135M's), so this is what brings them near "
            "the saving the linear layers get. An embedding or head in lora.modules_to_save is refused."
        ),
    )

    def applied_quantize(self, method: str) -> str:
        """How the base is quantized for a run of ``train.method`` ``method``: ``quantize`` for LoRA,
        'none' for full fine-tuning (which the config refuses with a quantized base)."""
        return self.quantize if method == "lora" else "none"


def jinja_syntax_error(template: str) -> str | None:
    """What makes ``template`` fail to parse as a chat template (None when it parses), with the tags
    transformers renders chat templates with: its loop controls, and ``{% generation %}`` blocks."""
    from jinja2 import TemplateSyntaxError, nodes
    from jinja2.ext import Extension
    from jinja2.parser import Parser
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}``, which transformers' own environment adds (to mark
        assistant tokens); jinja2 ships no such tag, and parsing is all that is asked of it here."""

        tags = {"generation"}  # noqa: RUF012 (jinja2's Extension declares it a class attribute)

        def parse(self, parser: Parser) -> list[nodes.Node]:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    environment = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols", GenerationBlock])
    try:
        environment.parse(template)
    except TemplateSyntaxError as exc:
        return f"{exc.message}, line {exc.lineno}"
    return None
