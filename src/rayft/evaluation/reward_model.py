"""A reward model's score as a reward: a sequence classifier with one output (the final/ directory of a
``train.objective: reward_model`` run, another local classifier, or a Hub id) scores the conversation of a
row's prompt (the user turn) and a completion (the assistant turn), rendered with the classifier's own chat
template as its training pairs were, on the worker's CPU, in batches of ``batch_size``.

A LoRA run's directory holds the adapter and the trained score head (PEFT's SEQ_CLS adapter); it is loaded
on the base it names and merged once, so scoring costs what the full model's forward costs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.config.reward_model import RewardModelConfig
from rayft.errors import ConfigError
from rayft.models.hub import check_model_available
from rayft.models.resolve import classify_model_source

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

FIELD = "train.rl.rewards[].reward_model.path"
ADAPTER_CONFIG = "adapter_config.json"


def check_reward_model_path(path: str, field: str = FIELD) -> str:
    """``path`` where transformers can load it from: a local directory holding a model (config.json) or an
    adapter (adapter_config.json), or a Hub id this machine can reach; ConfigError (one line) otherwise."""
    fix = "give the final/ directory of a train.objective=reward_model run, a classifier's directory or a Hub id"
    source = classify_model_source(path)
    if source.kind == "hub":
        check_model_available(path, setting=field)
        return path
    directory = Path(source.location)
    if source.kind != "local" or not directory.is_dir():
        raise ConfigError(f"{field}={path!r}: no such directory; {fix}")
    if not (directory / "config.json").is_file() and not (directory / ADAPTER_CONFIG).is_file():
        raise ConfigError(f"{field}={path!r}: the directory holds neither a model (config.json) nor a LoRA adapter "
                          f"({ADAPTER_CONFIG}); {fix}")  # fmt: skip
    return str(directory)


def load_reward_model(path: str, dtype: str, field: str = FIELD) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The classifier at ``path`` (an adapter merged into the base it names) in eval mode, and its tokenizer
    with a pad token, right padding and left truncation (a long conversation keeps its end)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    location = check_reward_model_path(path, field)
    adapter = Path(location) / ADAPTER_CONFIG
    if not adapter.is_file():
        check_classifier(location, path, field)
    tokenizer = AutoTokenizer.from_pretrained(location)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    tokenizer.padding_side, tokenizer.truncation_side = "right", "left"
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    # The base of an adapter is a causal LM's directory: it loads with a one-output head that the adapter's
    # saved score head then replaces.
    base = json.loads(adapter.read_text())["base_model_name_or_path"] if adapter.is_file() else location
    model: Any = AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=1, pad_token_id=tokenizer.pad_token_id, dtype=torch_dtype
    )
    if adapter.is_file():
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, location).merge_and_unload()
    return model.eval(), tokenizer


def check_classifier(location: str, path: str, field: str) -> None:
    """ConfigError unless the model at ``location`` is saved as a sequence classifier with one output: a
    causal LM's directory would load with a fresh, random score head and give random rewards."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(location)
    architectures = list(getattr(config, "architectures", None) or [])
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        raise ConfigError(f"{field}={path!r}: the model there is {', '.join(architectures) or 'of no architecture'}, "
                          "not a sequence classifier, and would score with a random head; give the final/ directory "
                          "of a train.objective=reward_model run or a ...ForSequenceClassification model")  # fmt: skip
    if config.num_labels != 1:
        raise ConfigError(f"{field}={path!r}: the classifier has {config.num_labels} outputs, a reward model one; "
                          "give a model trained with train.objective=reward_model")  # fmt: skip


class RewardModelScorer:
    """Scores completions with a reward model loaded once, in batches; a reward function that also scores a
    whole batch at once (:meth:`many`)."""

    def __init__(self, cfg: RewardModelConfig) -> None:
        from rayft.data.tokenize import TextTokenizer

        self.cfg = cfg
        self.model, self.tokenizer = load_reward_model(cfg.path, cfg.dtype)
        self.text = TextTokenizer.from_hf(self.tokenizer)

    def conversation(self, completion: str, row: Mapping[str, Any]) -> str:
        """The text scored: the row's prompt as the user turn and ``completion`` as the assistant turn,
        rendered by the classifier's chat template (the prompt then the completion, without one)."""
        prompt = row[self.cfg.prompt_column]
        prompt = prompt if isinstance(prompt, str) else json.dumps(prompt, default=str)
        if self.text.chat_template is None:
            return prompt + completion
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
        return self.text.chat_text(messages, generation_prompt=False)

    def raw_scores(self, texts: Sequence[str]) -> list[float]:
        """The classifier's score of each text, ``batch_size`` texts per forward pass."""
        import torch

        scores: list[float] = []
        for start in range(0, len(texts), self.cfg.batch_size):
            chunk = list(texts[start : start + self.cfg.batch_size])
            inputs = self.tokenizer(chunk, return_tensors="pt", padding=True, truncation=True,
                                    max_length=self.cfg.max_length, add_special_tokens=False)  # fmt: skip
            with torch.no_grad():
                logits: torch.Tensor = self.model(**inputs).logits
            scores.extend(float(v) for v in logits.float().squeeze(-1))
        return scores

    def many(self, completions: Sequence[str], references: Sequence[str], rows: Sequence[Mapping[str, Any]]
             ) -> list[Any]:  # fmt: skip
        """Per completion, its reward, or the exception that kept it from being scored (a row without the
        prompt column): that sample is counted as a reward error, the others are scored."""
        results: list[Any] = []
        texts: list[str] = []
        for completion, row in zip(completions, rows, strict=True):
            try:
                texts.append(self.conversation(completion, row))
                results.append(None)
            except KeyError as exc:
                results.append(exc)
        scored = iter(normalized(self.raw_scores(texts), self.cfg.normalize))
        return [next(scored) if r is None else r for r in results]

    def __call__(self, completion: str, reference: str, row: Mapping[str, Any]) -> float:
        """One completion's reward ('batch' normalisation of a single score is 0)."""
        return float(self.many([completion], [reference], [row])[0])


def normalized(scores: list[float], how: str) -> list[float]:
    """``scores`` as rewards: as they are ('none'), through the logistic function ('sigmoid'), or
    standardised over the batch ('batch': zero mean, unit standard deviation; all 0 when they are equal)."""
    if how == "sigmoid":
        return [1.0 / (1.0 + math.exp(-s)) if s >= 0 else math.exp(s) / (1.0 + math.exp(s)) for s in scores]
    if how == "batch" and scores:
        mean = sum(scores) / len(scores)
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
        return [(s - mean) / std if std > 0 else 0.0 for s in scores]
    return scores
