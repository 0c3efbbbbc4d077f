"""Config sections for evaluating models (``rayft eval``, ``rayft compare``) and exporting them."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from rayft.config.base import Section
from rayft.config.data import DatasetConfig
from rayft.config.environment import EnvironmentConfig
from rayft.config.generation import EndpointConfig, GenerationConfig

GgufType = Literal["f16", "q8_0", "q4_0"]


def _all_gguf_types() -> list[GgufType]:
    return ["f16", "q8_0", "q4_0"]


EvalTask = Literal["gsm8k", "exact_match", "rouge", "bleu", "bertscore", "sql", "custom"]

_CHECKPOINT_SELECTOR = re.compile(r"^(latest|best|final|step-\d+)$")
# Fields of eval.generation that the eval section decides instead (the model is the one evaluated).
_DECIDED_BY_EVAL = {
    "model": "the model comes from the source being evaluated (--model / the run directory)",
    "adapter_path": "LoRA adapters are found in the checkpoint being evaluated",
    "backend": "set eval.backend",
    "batch_size": "set eval.batch_size",
    "concurrency": "set eval.num_workers",
    "endpoint": "set eval.endpoint",
}


def _default_eval_datasets() -> list[DatasetConfig]:
    return [DatasetConfig(path="builtin:arithmetic", split="test")]


def _default_eval_generation() -> GenerationConfig:
    return GenerationConfig(max_new_tokens=256, temperature=0.0)


class EvalConfig(Section):
    """What to evaluate on, how to score it, and how to generate the answers."""

    datasets: list[DatasetConfig] = Field(
        default_factory=_default_eval_datasets,
        min_length=1,
        description=(
            "Evaluation datasets (rows are concatenated in order). The default is the held-out "
            "test part of the built-in GSM8K-style arithmetic set, which needs no download."
        ),
    )
    task: EvalTask = Field(
        "gsm8k",
        description=(
            "How outputs are scored: 'gsm8k' (lm-evaluation-harness prompt and strict/flexible "
            "answer extraction), 'exact_match', 'rouge' (ROUGE-L F1), 'bleu' (corpus BLEU, sacrebleu's paired test), "
            "'bertscore' (needs rayft[bertscore] and a scoring model), 'sql' (execution accuracy "
            "on each example's table in SQLite, normalised exact match, invalid-SQL rate), or 'custom' "
            "(the function named by eval.metric)."
        ),
    )
    metric: str | None = Field(
        None,
        description=(
            "For task 'custom': import path 'package.module:function' of a function "
            "(output: str, reference: str) -> float | bool | dict[str, float]."
        ),
    )
    question_field: str = Field("question", description="Column holding the prompt / question.")
    answer_field: str = Field("answer", description="Column holding the reference answer.")
    table_field: str = Field(
        "table",
        description=(
            "For task 'sql': column holding each example's table as JSON (name, header, types, rows), which "
            "the predicted and reference queries run against in SQLite. Without it, only exact match is scored."
        ),
    )
    prompt_template: str | None = Field(
        None,
        description=(
            "Prompt text with {question}, e.g. the input_template the model was trained with. "
            "Unset: gsm8k uses lm-evaluation-harness's 'Question: ...\\nAnswer:', other tasks the "
            "question itself."
        ),
    )
    num_fewshot: int = Field(
        0,
        ge=0,
        description=(
            "Solved examples shown before each question. They are the first rows of "
            "fewshot_dataset, or, when that is unset, the first rows of the evaluation data "
            "(which are then not scored)."
        ),
    )
    fewshot_dataset: DatasetConfig | None = Field(
        None, description="Where few-shot examples come from (e.g. the train split of the same dataset)."
    )
    max_samples: int | None = Field(
        200, gt=0, description="Score at most this many rows (unset: every row). Intervals widen as it shrinks."
    )
    use_chat_template: bool = Field(
        True,
        description=(
            "Send prompts through the model's chat template (few-shot examples as earlier turns); "
            "false sends the raw prompt text, as base models expect."
        ),
    )
    system_prompt: str | None = Field(None, description="A system message put before every chat prompt.")
    generation: GenerationConfig = Field(
        default_factory=_default_eval_generation,
        description=(
            "Sampling: max_new_tokens, temperature (0 = greedy), top_p, stop sequences, seed. "
            "The task adds its own stop sequences (gsm8k: 'Question:')."
        ),
    )
    backend: Literal["hf", "vllm", "openai"] = Field(
        "hf",
        description=(
            "Generation backend: 'hf' (transformers batched generate), 'vllm' (GPU; rayft[vllm]), or 'openai' "
            "(score a served model: the OpenAI-compatible server at eval.endpoint, e.g. rayft serve, is asked "
            "for the model named by --model)."
        ),
    )
    endpoint: EndpointConfig = Field(
        default_factory=EndpointConfig,
        description=(
            "The OpenAI-compatible server (backend 'openai' only); its key is read from the environment "
            "variable named by api_key_env."
        ),
    )
    batch_size: int = Field(16, gt=0, description="Prompts per generate call (and per Ray Data batch).")
    num_workers: int = Field(1, gt=0, description="Generation actors (model replicas) in the Ray Data pool.")
    num_cpus_per_worker: float = Field(1.0, gt=0, description="CPUs reserved by each generation actor.")
    num_gpus_per_worker: float = Field(0.0, ge=0, description="GPUs reserved by each generation actor.")
    runtime: Literal["auto", "ray", "local"] = Field(
        "auto",
        description=(
            "Where generation runs: 'ray' (a Ray Data actor pool; joins scaling.address or starts "
            "a local Ray), 'local' (in this process, no Ray start-up: best for small evals), or "
            "'auto' (Ray when this process already runs Ray or scaling.address is set, else local)."
        ),
    )
    checkpoint: str = Field(
        "latest",
        description=(
            "Which checkpoint of a run directory to evaluate: 'latest' (final/ when the run "
            "finished, else the newest complete step), 'best' (lowest eval/loss), 'final', or 'step-N'."
        ),
    )
    confidence: float = Field(
        0.95,
        gt=0,
        lt=1,
        description=(
            "Confidence level of every metric's interval and of a bootstrap interval on a difference; "
            "the interval on an accuracy difference is at 1 - eval.significance, the level of the exact "
            "test beside it, so that the two always agree."
        ),
    )
    bootstrap_samples: int = Field(
        2000, ge=100, description="Resamples of bootstrap intervals and paired bootstrap tests."
    )
    significance: float = Field(0.05, gt=0, lt=1, description="A paired test is 'significant' below this p-value.")
    equivalence_margin: float = Field(
        0.02,
        gt=0,
        description=(
            "Margin of the equivalence test (TOST) `rayft compare` runs on every pair of models, in the "
            "metric's own units (0.02 = two points of accuracy; BLEU is on 0-100): two models are "
            "'equivalent' when their difference is shown, at eval.significance, to lie inside +-margin."
        ),
    )
    bertscore_model: str = Field(
        "roberta-large",
        description="Scoring model of task 'bertscore' (a Hub id or a local directory).",
    )
    seed: int = Field(0, ge=0, description="Seed of bootstrap resampling.")
    environment: EnvironmentConfig | None = Field(
        None,
        description=(
            "Run each example as a multi-turn episode of this environment (the section train.rl.environment "
            "takes: its tools and limits per episode): the model's tool calls are answered with the tools' "
            "results until it answers without a call, and that final answer is scored by eval.task. The "
            "episode's reward (a user environment's) is the metric 'reward'; turns, tool calls, tool errors "
            "and truncated episodes are in each example's row and in the summary. Backends 'hf' and 'openai'. "
            "Left out in rayft run, the eval stage takes the environment the model trained in (rl.environment, "
            "or a grpo train stage's train.rl.environment); null evaluates single-turn."
        ),
    )
    without_tools: list[str] = Field(
        default_factory=list,
        description=(
            "With eval.environment of type 'tools': labels of the models whose episodes run with the tools "
            "taken away (the same prompts without the tool list; a call is answered with an error). rayft eval's "
            "model is labelled 'model'; in rayft compare give one source twice (--model tools=SRC --model "
            "plain=SRC) and list 'plain' here for the paired test of what the tools are worth."
        ),
    )

    @model_validator(mode="after")
    def _check_environment(self) -> EvalConfig:
        env = self.environment
        if env is not None and self.backend == "vllm":
            raise ValueError("eval.environment runs with eval.backend 'hf' or 'openai'; vLLM's chat does not take "
                             "a conversation's tools from rayft yet")  # fmt: skip
        if self.without_tools and (env is None or env.type != "tools"):
            raise ValueError("eval.without_tools takes the tools of eval.environment of type 'tools' away; set that "
                             "environment, or remove eval.without_tools")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        if self.task == "custom" and not self.metric:
            raise ValueError("task 'custom' needs eval.metric='package.module:function'")
        if self.metric and ":" not in self.metric:
            raise ValueError(f"eval.metric {self.metric!r} must look like 'package.module:function'")
        if self.prompt_template is not None:
            try:
                self.prompt_template.format(question="")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"eval.prompt_template {self.prompt_template!r} cannot be filled ({exc!r}); use {{question}} "
                    "for the question and double braces {{{{ }}}} for literal ones"
                ) from None
        if not _CHECKPOINT_SELECTOR.match(self.checkpoint):
            raise ValueError(
                f"eval.checkpoint {self.checkpoint!r} must be latest, best, final, or step-N (e.g. step-100)"
            )
        # Compared with the defaults rather than model_fields_set, so that a dumped config reloads.
        default = GenerationConfig()
        clashes = [k for k in _DECIDED_BY_EVAL if getattr(self.generation, k) != getattr(default, k)]
        if clashes:
            reasons = "; ".join(f"eval.generation.{k}: {_DECIDED_BY_EVAL[k]}" for k in clashes)
            raise ValueError(f"these fields are decided elsewhere: {reasons}")
        return self


class ExportConfig(Section):
    """How ``rayft export`` turns a checkpoint into a standard Hugging Face model directory."""

    merge: bool = Field(
        True,
        description="Merge a LoRA adapter into the base weights (true) or export the adapter alone (false).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description=(
            "Dtype of the exported weights. Verification runs in verify_dtype; a smaller dtype "
            "halves the files and is checked by reload and generation."
        ),
    )
    verify: bool = Field(
        True,
        description=(
            "Check before the export succeeds: the adapter is non-empty with the configured shapes, "
            "merged logits equal base+adapter logits, and the export reloads and generates."
        ),
    )
    probe_tolerance: float = Field(
        1e-4,
        gt=0,
        description=(
            "Largest max-abs logit difference allowed between merged and base+adapter, and between the "
            "reloaded export and the checkpoint (float32/float64 exports)."
        ),
    )
    verify_dtype: Literal["float64", "float32"] = Field(
        "float64",
        description=(
            "Precision of the verification forwards. float64 makes merged vs base+adapter exact up to "
            "rounding (in float32, rounding alone reaches ~1e-4 on the logits of a 135M model); "
            "float32 halves the memory for large models (then raise probe_tolerance)."
        ),
    )
    probe_prompts: list[str] = Field(
        default_factory=lambda: ["What is 12 + 7?", "Write one sentence about the sea."],
        min_length=1,
        description="Prompts whose logits are compared, and which the exported model must generate for.",
    )
    max_shard_size: str = Field("5GB", description="Largest safetensors shard of the exported model.")
    gate: list[str] = Field(
        default_factory=list,
        description=(
            "Promotion gates the export must pass, in rayft compare --gate's grammar ('tuned > base', "
            "'tuned ~ base within 0.02', 'tuned >= base within 0.02', optionally '... on METRIC'). `rayft run` "
            "checks them against its eval stage's comparison and stops before the export stage when one fails; "
            "`rayft export` checks them against export.gate_report. The model card states the evidence."
        ),
    )
    gate_report: str | None = Field(
        None,
        description=(
            "The compare.json `rayft export` checks export.gate against (written by rayft compare with the same "
            "labels); `rayft run` uses its eval stage's and ignores this."
        ),
    )
    format: Literal["hf", "gguf"] = Field(
        "hf",
        description=(
            "hf: a Hugging Face model directory. gguf: the same directory plus one GGUF file per gguf_types "
            "entry (llama.cpp, Ollama) and an Ollama Modelfile; needs merged weights (Llama or Qwen2 architecture)."
        ),
    )
    gguf_types: list[GgufType] = Field(
        default_factory=_all_gguf_types,
        min_length=1,
        description=(
            "GGUF files written when format is gguf: f16, q8_0 (8-bit) and q4_0 (4-bit; the token embedding and "
            "an untied output head stay 8-bit). The Modelfile points at the first."
        ),
    )
