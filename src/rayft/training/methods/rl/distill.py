"""On-policy distillation (``train.rl.distillation``): a teacher's log-probabilities of the student's own
sampled tokens as the training signal.

Each completion token ``y_t`` the student sampled gets the advantage ``log p_teacher(y_t) - log p_student(y_t)``
(minus the per-token reverse KL estimate, as in Thinking Machines' on-policy distillation), trained with the
clipped surrogate of ``train.rl.loss`` and summed into its loss terms. Its expected gradient over the
student's samples is the gradient of the reverse KL ``KL(p_student || p_teacher)`` at every sampled prefix:
``E_y[(log p_s(y) - log p_t(y)) grad log p_s(y)] = grad KL`` (the score function's expectation is 0), which a
direct loss ``log p_s(y) - log p_t(y)`` on sampled tokens would not give (its gradient averages to 0). The
per-token value of the term at the sampling policy is that token's reverse KL estimate, logged as
``rl/distill/reverse_kl``.

The teacher runs in process (:class:`LocalTeacher`, frozen, loaded on each worker) or behind an
OpenAI-compatible endpoint (:class:`EndpointTeacher`: ``/completions`` with the tokens as ids, ``echo``,
``logprobs`` 0 and ``max_tokens`` 0, which ``rayft serve`` and vLLM answer with each prompt token's
log-probability). Either way it must share the student's tokenizer: the ids are the student's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rayft.config.rl import DistillationConfig
from rayft.data.prepared import IGNORE_INDEX
from rayft.errors import ConfigError, EndpointError
from rayft.generation.openai_http import OpenAIBackend
from rayft.security import mask_uri, redact
from rayft.training.loop.batches import Unit
from rayft.training.methods.rl.losses import POLICY_LOSSES, PolicyLossSettings, clipped_surrogate, kept_positions

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from rayft.config.model import ModelConfig
    from rayft.data.collate import MicroBatch
    from rayft.training.methods.rl.sampling import Sampler
    from rayft.training.modeling.model import TransformersModel

WHERE = "train.rl.distillation"
PROMPTS_PER_REQUEST = 16  # completions scored by one echo request (rayft serve takes up to 256)
FIGURE_SUMS = ("distill/reverse_kl", "distill/tokens", "distill/teacher_s")
"""The sums behind the distillation figures, reduced over the ranks with the method's others."""


@dataclass(frozen=True)
class DistillLoss:
    """A micro-batch's distillation term: ``loss_sum`` (in the loss terms of ``train.rl.loss``) and the sum of
    the per-token reverse KL estimates ``log p_s - log p_t`` at the sampling policy over ``tokens`` tokens."""

    loss_sum: torch.Tensor
    reverse_kl_sum: float
    tokens: float


def distillation_loss(  # noqa: PLR0917 - the tensors of one formula, in its order
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    teacher_logps: torch.Tensor,
    mask: torch.Tensor,
    settings: PolicyLossSettings,
    coefficient: float,
    token_weights: torch.Tensor | None = None,
) -> DistillLoss:
    """The distillation term of a micro-batch: per completion token the clipped surrogate of the advantage
    ``coefficient x (teacher - old)`` (no gradient through it), with ``r = exp(logps - old_logps)``, summed into
    the loss terms of ``settings.loss``. Every tensor is ``(rows, positions)``; ``mask`` marks the trained
    tokens; ``token_weights`` are a stale rollout's importance weights."""
    import torch

    weights = mask.to(logps.dtype)
    with torch.no_grad():
        gap = (old_logps - teacher_logps) * weights  # log p_s - log p_t of each sampled token
    ratio = torch.exp(logps - old_logps.detach())
    per_token, _, _ = clipped_surrogate(ratio, -coefficient * gap, settings)
    if token_weights is not None:
        per_token = per_token * token_weights
    token_sums = (per_token * weights).sum(-1)
    loss_sum, _ = POLICY_LOSSES[settings.loss].terms(token_sums, weights, mask, settings)
    return DistillLoss(loss_sum, float(gap.sum()), float(weights.sum()))


class Teacher(Protocol):
    """The teacher's log-probabilities of training rows' completion tokens."""

    def logps(self, units: Sequence[Unit], rows: MicroBatch, device: torch.device) -> torch.Tensor:
        """``(rows, kept positions)`` float32 on ``device`` (the student's), laid out as
        :func:`~rayft.training.methods.rl.losses.completion_logps` lays out the student's (0 off the mask)."""
        ...

    def close(self) -> None:
        """Release what it holds (connections)."""
        ...


@dataclass
class LocalTeacher:
    """A frozen teacher model in the training worker's process."""

    model: torch.nn.Module

    def logps(self, units: Sequence[Unit], rows: MicroBatch, device: torch.device) -> torch.Tensor:
        """One forward of the teacher over the rows on the student's ``device``, as the student's own
        log-probabilities are computed."""
        import torch

        from rayft.training.methods.rl.losses import completion_logps

        with torch.no_grad():
            return completion_logps(self.model.to(device), rows.to(device), None)[0].float()

    def close(self) -> None:
        """Nothing to release."""


@dataclass
class EndpointTeacher:
    """A teacher behind an OpenAI-compatible endpoint that returns prompt log-probabilities (``echo``)."""

    backend: OpenAIBackend
    tokenizer: PreTrainedTokenizerBase
    checked: bool = field(default=False)  # whether the endpoint's tokens were compared with the student's

    def logps(self, units: Sequence[Unit], rows: MicroBatch, device: torch.device) -> torch.Tensor:
        """Each row's token log-probabilities from the endpoint, placed at the student's target positions."""
        import torch

        sequences = [[int(i) for i in unit["input_ids"]] for unit in units]
        chunks = [sequences[i : i + PROMPTS_PER_REQUEST] for i in range(0, len(sequences), PROMPTS_PER_REQUEST)]
        workers = max(1, min(self.backend.endpoint.max_concurrency, len(chunks)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rayft-teacher") as pool:
            answers = [values for chunk in pool.map(self.request, chunks) for values in chunk]
        full = torch.zeros(rows.labels.shape[0], rows.labels.shape[1] - 1, dtype=torch.float32)
        for index, values in enumerate(answers):
            # Token p's log-probability (p >= 1) is target position p - 1; the first token has none.
            full[index, : len(values) - 1] = torch.tensor(values[1:], dtype=torch.float32)
        labels = rows.labels.cpu()
        keep = kept_positions(labels)
        return (full[:, keep] * (labels[:, 1:][:, keep] != IGNORE_INDEX)).to(device)

    def request(self, sequences: list[list[int]]) -> list[list[float]]:
        """One echo request scoring ``sequences``: each one's per-token log-probabilities (the first 0.0)."""
        body = {"model": self.backend.model, "prompt": sequences, "echo": True, "logprobs": 0, "max_tokens": 0,
                "temperature": 0}  # fmt: skip
        try:
            reply = self.backend.post("/completions", body)
        except Exception as exc:  # the teacher's signal cannot be made up: the run stops, in one line
            raise EndpointError(
                f"{WHERE}.endpoint: the teacher at {mask_uri(self.backend.base_url)} did not score the completions "
                f"({redact(str(exc))[:300]}); check that it serves {self.backend.model!r} and answers /completions "
                "with echo and logprobs (rayft serve and vLLM do)"
            ) from None
        choices = sorted(reply.get("choices") or [], key=lambda choice: int(choice.get("index", 0)))
        return [self.read(choice, ids) for choice, ids in zip_checked(choices, sequences)]

    def read(self, choice: dict[str, Any], ids: list[int]) -> list[float]:
        """A choice's prompt log-probabilities, checked to be one per token (and, once, the tokens' texts)."""
        logprobs = choice.get("logprobs") or {}
        values = logprobs.get("token_logprobs") or []
        if len(values) != len(ids) or any(v is None for v in values[1:]):
            raise EndpointError(
                f"{WHERE}.endpoint: the teacher returned {len(values)} prompt log-probabilities for {len(ids)} tokens; "
                "serve it with a server that answers echo with logprobs and max_tokens 0 (rayft serve, vLLM)"
            )
        if not self.checked:
            check_same_tokens(list(logprobs.get("tokens") or []), ids, self.tokenizer, self.backend.model)
            self.checked = True
        return [0.0, *(float(v) for v in values[1:])]

    def close(self) -> None:
        """Close the pooled connections."""
        self.backend.close()


def zip_checked(choices: list[dict[str, Any]], sequences: list[list[int]]) -> list[tuple[dict[str, Any], list[int]]]:
    """The choices paired with the sequences they score; EndpointError when the counts differ."""
    if len(choices) != len(sequences):
        raise EndpointError(
            f"{WHERE}.endpoint: the teacher answered {len(choices)} choices for {len(sequences)} prompts; serve it "
            "with a server that takes a batch of token-id prompts (rayft serve, vLLM)"
        )
    return list(zip(choices, sequences, strict=True))


def check_same_tokens(tokens: list[str], ids: list[int], tokenizer: PreTrainedTokenizerBase, teacher: str) -> None:
    """ConfigError unless the endpoint's text of each token is the student tokenizer's for the same id."""
    for token, token_id in zip(tokens, ids, strict=False):
        mine = tokenizer.decode([token_id])
        if token != mine:
            raise ConfigError(
                f"{WHERE}.teacher: {teacher!r} behind the endpoint has another tokenizer than the student (token id "
                f"{token_id} is {token!r} there, {mine!r} here); distil from a teacher that shares the student's "
                "tokenizer"
            )


def check_same_tokenizer(
    teacher: PreTrainedTokenizerBase, student: PreTrainedTokenizerBase, names: tuple[str, str]
) -> None:
    """ConfigError unless the two tokenizers map the same texts to the same ids, naming both models and a
    token on which they differ."""
    theirs, mine = teacher.get_vocab(), student.get_vocab()
    if theirs == mine:
        return
    differs = sorted(set(theirs.items()) ^ set(mine.items()), key=lambda item: item[1])[0]
    raise ConfigError(
        f"{WHERE}.teacher: {names[0]!r} has another tokenizer than model.name {names[1]!r} ({len(theirs)} and "
        f"{len(mine)} tokens; {differs[0]!r} is id {theirs.get(differs[0])} there, {mine.get(differs[0])} here); "
        "distil from a teacher that shares the student's tokenizer"
    )


def build_teacher(
    config: DistillationConfig, student: ModelConfig, tokenizer: PreTrainedTokenizerBase, device_type: str
) -> Teacher:
    """The configured teacher: reached and checked (its endpoint serves it), or loaded frozen on this worker
    with the student's model settings after its tokenizer was compared with the student's."""
    if config.endpoint is not None:
        backend = OpenAIBackend(config.teacher, config.endpoint)
        backend.check_serves_model(f"{WHERE}.endpoint")
        return EndpointTeacher(backend, tokenizer)
    from rayft.models.loading import load_causal_lm, load_tokenizer

    teacher = student.model_copy(update={"name": config.teacher})
    check_same_tokenizer(load_tokenizer(teacher), tokenizer, (config.teacher, student.name))
    model = load_causal_lm(teacher, device_type)
    model.requires_grad_(False).train(False)  # frozen, and no dropout: the teacher only scores
    return LocalTeacher(model)


@dataclass
class Distiller:
    """The worker's teacher and the running sums of its figures."""

    config: DistillationConfig
    teacher: Teacher

    def teacher_logps(
        self, units: Sequence[Unit], rows: MicroBatch, device: torch.device, sums: dict[str, float]
    ) -> torch.Tensor:
        """The teacher's log-probabilities of the rows (:meth:`Teacher.logps`), its seconds added to ``sums``."""
        started = time.perf_counter()
        values = self.teacher.logps(units, rows, device)
        sums["distill/teacher_s"] = sums.get("distill/teacher_s", 0.0) + time.perf_counter() - started
        return values


def distill_figures(total: dict[str, float], world_size: int) -> dict[str, float]:
    """``rl/distill/reverse_kl`` (mean per trained completion token of the step's samples) and
    ``rl/distill/teacher_s`` (the teacher's seconds per worker in the step)."""
    return {
        "rl/distill/reverse_kl": total["distill/reverse_kl"] / max(total["distill/tokens"], 1.0),
        "rl/distill/teacher_s": total["distill/teacher_s"] / max(world_size, 1),
    }


def sampled_reverse_kl(
    inner: TransformersModel, sampler: Sampler, teacher: Teacher, prompts: list[list[int]], seed: int
) -> tuple[float, float]:
    """The sum of ``log p_s(y) - log p_t(y)`` over the tokens of one completion per prompt that the student
    ``inner`` samples from ``seed``, and their count: a validation estimate of the per-token reverse KL to the
    teacher (a fixed seed, so checkpoints are compared on the same draws)."""
    import torch

    from rayft.data.collate import collate
    from rayft.training.methods.rl.losses import completion_logps
    from rayft.training.modeling.attention import row_multiple

    sampled = sampler.sample(inner, prompts, 1, seed=seed)
    units: list[Unit] = [completion_unit(p, c) for p, c in zip(prompts, sampled.token_ids, strict=True)]
    device = next(inner.parameters()).device
    rows = collate(units, sampler.pad_id, row_multiple(sampler.attn_implementation)).to(device)
    with torch.no_grad():
        student, _, mask = completion_logps(inner, rows, None)
        gap = (student - teacher.logps(units, rows, device)) * mask
    return float(gap.sum()), float(mask.sum())


def completion_unit(prompt: list[int], completion: list[int]) -> Unit:
    """A training row of a prompt and its completion, the completion labelled."""
    ids = prompt + completion
    return {"input_ids": ids, "labels": [IGNORE_INDEX] * len(prompt) + completion, "position_ids": range(len(ids)),
            "sample_ids": []}  # fmt: skip
