"""Which training step a worker runs: attention kernel, loss, compilation, precision (the autocast's and the
frozen base layers'), padding and CPU threads.

A pure planner: :func:`choose_step` takes the configured values (:class:`StepRequest`, where ``auto``
leaves the choice to it) and what the worker found out about its model, device and installed kernels
(:class:`StepFacts`, gathered by :mod:`rayft.training.modeling.step_facts`), and returns a
:class:`StepChoice` with one reason per decision. Explicit settings always win; each rule below names
the measurement it was written from (see docs/performance.md for the tables).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Method = Literal["lora", "full"]

# Bytes per (position x vocabulary entry) that the plain loss keeps alive at its peak: the logits, their
# float32 copy and the gradient of that copy (the float32 copy is the logits themselves without autocast,
# but log_softmax's output takes its place).
PLAIN_LOSS_BYTES = 12

# The plain loss is kept while its logits take at most this share of the device's free memory; above it
# the memory they take (and the activations they crowd out) matters more than the chunked loss's cost.
# On the H200 (bench_gpu_step.py) Qwen2.5-1.5B LoRA ran the plain loss at 4 x 2048 positions (13.9 GiB of
# logits at most, 10% of the card) 2.7x faster than the chunked one, and fitted with room to spare.
LOGITS_SHARE = 0.25

# Frozen base layers go bf16 on a CPU from this hidden size on: bench_frozen_bf16.py (2 threads, avx512_bf16) measured
# a frozen layer's forward and backward in bf16 (casts included) 1.7-2.4x faster than in float32 from width 256 up,
# 1.2-1.6x at 128 and 0.4-1.0x at 32 and 64, where the casts weigh more than the products.
FROZEN_BF16_MIN_HIDDEN = 256

# flex_attention's training kernel exists from this torch release on.
FLEX_TORCH = (2, 5)


@dataclass(frozen=True)
class StepRequest:
    """The configured values: ``auto`` (or None for threads) leaves the decision to :func:`choose_step`."""

    attn_implementation: str = "auto"
    fused_loss: str = "auto"
    compile: bool | Literal["auto"] = "auto"
    mixed_precision: str = "auto"
    cpu_threads: int | Literal["auto"] = "auto"
    padding_free: bool | Literal["auto"] = "auto"
    frozen_precision: str = "auto"


@dataclass(frozen=True)
class StepFacts:
    """What a worker knows about its step before it builds the model."""

    device_type: str
    method: Method
    hidden_size: int
    num_layers: int
    vocab_size: int
    seq_length: int  # the longest row (data.max_seq_length)
    micro_batch_size: int  # rows per forward pass
    packing: bool  # rows hold several examples (SFT with data.packing)
    free_memory_bytes: int | None  # the device's free memory (host memory on CPU); None: unknown
    cpus: int  # CPUs this worker may use
    cpu_bf16: bool = False  # the CPU has bf16 instructions (avx512_bf16 or amx_bf16)
    cpu_amx: bool = False  # ... and multiplies bf16 on AMX tiles (amx_tile and amx_bf16)
    torch_version: tuple[int, int] = (0, 0)
    installed: frozenset[str] = field(default_factory=frozenset)  # "flash_attn", "liger_kernel"
    special_attention: bool = False  # a sliding window or logit soft-capping: keep the configured kernel
    sft: bool = True  # the objective is next-token SFT, whose micro-batches may go padding-free
    strategy: str = "ddp"  # train.strategy: ddp (or one in-process worker), fsdp, deepspeed
    reference_copy: bool = False  # GRPO's KL term scores against a frozen copy of the model (train.rl.reference copy)
    dora: bool = False  # the LoRA adapter is DoRA (lora.use_dora)

    @property
    def plain_logits_bytes(self) -> int:
        """What the plain loss's logits take at their peak for a full micro-batch."""
        return PLAIN_LOSS_BYTES * self.micro_batch_size * self.seq_length * self.vocab_size


@dataclass(frozen=True)
class StepChoice:
    """The step a worker runs, each decision with its reason."""

    attention: str
    loss: Literal["chunked", "liger", "none"]
    compile: bool
    mixed_precision: str  # 'no' or 'bf16' on CPU; the configured value (resolved by the GPU) on CUDA
    threads: int | None  # torch threads on CPU (None on GPUs: left as it is)
    padding_free: bool
    reasons: tuple[tuple[str, str], ...]
    frozen_precision: str = "fp32"  # 'bf16': a LoRA run's frozen base layers multiply in bf16

    def describe(self) -> str:
        """One line for the console: what was chosen and why."""
        return "; ".join(f"{what} ({why})" for what, why in self.reasons)


def choose_step(request: StepRequest, facts: StepFacts) -> StepChoice:
    """The step for ``facts`` with every ``auto`` in ``request`` decided."""
    attention, attention_why = _attention(request.attn_implementation, facts)
    loss, loss_why = _loss(request.fused_loss, facts)
    compiled, compile_why = _compile(request.compile, facts)
    precision, precision_why = _precision(request.mixed_precision, facts)
    threads, threads_why = _threads(request.cpu_threads, facts)
    padding_free, padding_why = _padding_free(request.padding_free, attention, facts)
    frozen, frozen_why = _frozen_precision(request.frozen_precision, precision, facts)
    reasons = [
        (f"attention {attention}", attention_why),
        (f"loss {'plain' if loss == 'none' else loss}", loss_why),
        (f"compile {'on' if compiled else 'off'}", compile_why),
        (f"precision {'fp32' if precision == 'no' else precision}", precision_why),
        (f"padding-free {'on' if padding_free else 'off'}", padding_why),
    ]
    if facts.method == "lora":
        reasons.insert(4, (f"frozen layers {frozen}", frozen_why))
    if facts.method == "lora" and facts.dora:
        # The lean dropout (lora_dropout.py) keeps the undropped input; DoRA's forward reads the dropped-out one.
        reasons.insert(5, ("LoRA dropout in PEFT's forward", "DoRA reads the dropped-out input itself"))
    if threads is not None:
        reasons.append((f"{threads} thread{'s' if threads > 1 else ''}", threads_why))
    if facts.device_type == "cpu":
        reasons.append((f"CPU {cpu_bf16_units(facts)}", "its bf16 instructions, read from /proc/cpuinfo"))
    return StepChoice(attention, loss, compiled, precision, threads, padding_free, tuple(reasons), frozen)


def cpu_bf16_units(facts: StepFacts) -> str:
    """What the CPU multiplies bf16 with, in the words of its /proc/cpuinfo flags."""
    if facts.cpu_amx:
        return "AMX (amx_bf16, amx_tile)"
    return "avx512_bf16, no AMX" if facts.cpu_bf16 else "without bf16 instructions"


def _attention(configured: str, facts: StepFacts) -> tuple[str, str]:
    if configured != "auto":
        return configured, "set in model.attn_implementation"
    if facts.special_attention:
        return "sdpa", "the model uses a sliding window or soft-capping, which the other kernels do not all take"
    if facts.device_type == "cpu":
        # bench_step.py on CPU (SmolLM2-135M LoRA, GSM8K rows): per-example SDPA (padding-free) against eager attention
        # over padded rows; docs/performance.md has the figures. flex_attention has no CPU backward (gpu tier).
        return "sdpa", "per example of a row on CPU, where flex_attention cannot train"
    if "flash_attn" in facts.installed:
        return "flash_attention_2", "flash-attn is installed: variable-length attention over the packed examples"
    if facts.packing and facts.torch_version >= FLEX_TORCH:
        # H200, bench_gpu_step.py, packed 2048-token rows: flex_attention was the fastest rayft arm in every row
        # (Qwen2.5-1.5B LoRA 30,104 tokens/s vs 10,187 with sdpa + chunked; full 30,594 vs 28,060).
        return "flex_attention", "packed rows on a GPU without flash-attn: the fastest kernel measured there"
    return "sdpa", "unpacked rows: no examples to keep apart"


def _loss(configured: str, facts: StepFacts) -> tuple[Literal["chunked", "liger", "none"], str]:
    if configured != "auto":
        kind = {"chunked": "chunked", "liger": "liger", "none": "none"}[configured]
        return kind, "set in train.fused_loss"  # type: ignore[return-value]
    if facts.device_type == "cpu":
        # bench_loss.py: at SmolLM2's head the chunked loss is 1.05x faster with 0.11x the memory of the plain one
        # (LoRA; 1.00x and 0.31x with the head trained); bench_step.py's sdpa-plain arm compares them in the whole step.
        return "chunked", "on CPU the chunked loss is as fast as the plain one at a fraction of its memory"
    logits, free = facts.plain_logits_bytes, facts.free_memory_bytes
    if free is not None and logits <= LOGITS_SHARE * free:
        # H200, bench_gpu_step.py: the plain loss ran packed Qwen2.5-1.5B LoRA at 27,397 tokens/s vs 10,187 chunked,
        # Llama-3.2-1B LoRA at 39,120 vs 21,055; full fine-tuning 28,999 vs 28,060 and 37,775 vs 36,118.
        return (
            "none",
            f"its logits ({_gib(logits)}) fit in {LOGITS_SHARE:.0%} of the {_gib(free)} free, and it was faster",
        )
    where = "unknown free memory" if free is None else f"{_gib(logits)} of logits against {_gib(free)} free"
    if "liger_kernel" in facts.installed:
        return "liger", f"{where}: Liger's fused loss keeps no full logits"
    return "chunked", f"{where}: the chunked loss keeps no full logits"


def _compile(configured: bool | Literal["auto"], facts: StepFacts) -> tuple[bool, str]:
    if configured != "auto":
        return configured, "set in train.compile"
    if facts.device_type == "cpu":
        # bench_compile.py: 0.47x the eager step's tokens/s on CPU (bench_step.py's sdpa-chunked-compile arm: SmolLM2).
        return False, "slower on CPU, where per-example attention runs outside the compiled code"
    # H100, bench_gpu_step.py --compile: 0.32x (LoRA) and 0.54x (full) of padded over 10 steps, recompiling for the
    # packed rows' varying lengths: it pays only in long runs, which the user turns on knowingly.
    return False, "measured slower over the first steps on a GPU (recompiles for varying row lengths)"


def _precision(configured: str, facts: StepFacts) -> tuple[str, str]:
    if configured != "auto":
        return configured, "set in train.mixed_precision"
    if facts.device_type != "cpu":
        return "auto", "bf16 where the GPU supports it, fp16 otherwise"
    if not facts.cpu_bf16:
        return "no", "fp32: this CPU has no bf16 instructions"
    # bench_step.py on a CPU with avx512_bf16 (SmolLM2-135M LoRA, padding-free, one thread): bf16 autocast ran the step
    # 1.41x faster, but its losses left fp32's after the first update (4% apart after three), and bench_sft_trl.py's
    # 40-step run ended 0.8% higher on held-out problems (0.9241 vs 0.9168); train.mixed_precision=bf16 turns it on.
    # AMX multiplies the same bf16-rounded values (accumulating in float32, as avx512_bf16 does): the higher loss
    # comes from bf16's rounding, which it shares, so AMX leaves this choice as it is.
    amx = "; AMX rounds to bf16 alike" if facts.cpu_amx else ""
    return "no", f"fp32: bf16 autocast was measured faster on CPUs with bf16 instructions, but to a higher loss{amx}"


def _frozen_precision(configured: str, precision: str, facts: StepFacts) -> tuple[str, str]:
    if configured != "auto":
        return configured, "set in train.frozen_precision"
    # The first condition that holds keeps the frozen layers in fp32, for its reason.
    keeps = [
        (facts.method != "lora", "no frozen layers: every weight trains"),
        (facts.device_type != "cpu" or precision != "no", "autocast runs their products in its dtype already"),
        (not facts.cpu_bf16, "this CPU has no bf16 instructions"),
        # DPO's reference (LoRA: the adapter switched off), GRPO's (the same, or none) and GRPO's generation actors
        # (built as the trainer's model) run the same products as the policy; a frozen copy of the model does not.
        (facts.reference_copy, "the KL term's reference is a frozen copy of the model, kept in fp32"),
        (facts.dora, "DoRA divides by the base weight's norm, which bf16 storage would change"),
        (facts.strategy != "ddp", f"{facts.strategy} shards the frozen weights in their own dtype"),
        (
            facts.hidden_size < FROZEN_BF16_MIN_HIDDEN,
            f"hidden size {facts.hidden_size} < {FROZEN_BF16_MIN_HIDDEN}: the casts cost more than bf16 saves",
        ),
    ]
    for holds, why in keeps:
        if holds:
            return "fp32", why
    # bench_sft_trl.py (SmolLM2-135M LoRA, 160 GSM8K rows, 2 threads, fp32 otherwise): training 134 s against 168 s
    # with the frozen layers in fp32 (1.25x), held-out loss 0.91647 against 0.91678. bench_rl.py's GRPO step (4 x 4
    # completions): 1.23-1.27x faster (rollouts 1.22-1.36x, updates 1.23-1.32x the tokens/s). DPO on GSM8K pairs:
    # 1.23-1.26x, held-out loss 0.2128 against 0.2110 after 20 steps, accuracy equal. docs/performance.md has the runs.
    # On AMX the bf16 products run on tiles, not measured here (no AMX CPU was at hand): the speed-up above was
    # measured with avx512_bf16. AMX is the faster bf16 unit by design and the casts cost what they cost there,
    # so the choice is kept; the width from which it pays (FROZEN_BF16_MIN_HIDDEN) may be lower, unmeasured.
    amx = " (measured with avx512_bf16; AMX not measured)" if facts.cpu_amx else ""
    return "bf16", f"bf16 products on a CPU with bf16 instructions{amx}; the adapter and the rest stay fp32"


def _threads(configured: int | Literal["auto"], facts: StepFacts) -> tuple[int | None, str]:
    if facts.device_type != "cpu":
        return None, "GPU worker"
    if configured != "auto":
        return configured, "set in train.cpu_threads"
    # bench_ddp_scaling.py: 2 workers x 1 thread reached 0.92 efficiency on 2 cores; more threads than a worker's
    # CPUs oversubscribe the cores its neighbours run on.
    return max(1, facts.cpus), "one per CPU this worker may use"


def _padding_free(configured: bool | Literal["auto"], attention: str, facts: StepFacts) -> tuple[bool, str]:
    if configured != "auto":
        return configured, "set in train.padding_free"
    if not facts.sft:
        # Off unless asked: the forward runs on the rows laid end to end, the losses read them back padded.
        return False, "preference and RL rows are padded unless train.padding_free is true"
    if facts.device_type == "cpu" and attention == "sdpa":
        # Per-example SDPA attends within each example whatever the row holds, so one long row costs attention what
        # the padded rows cost, and the linear layers stop computing padding; bench_step.py's padding-free arm and
        # bench_sft_trl.py (4,382 vs 8,479 MiB peak against TRL, 1.76x its tokens/s) measured it.
        return True, "per-example attention on CPU: the padding's computation is saved"
    if attention.startswith("flash_attention") or "/" in attention:
        return True, "variable-length attention takes the examples laid end to end"
    return False, "the attention would compute over the whole row"


def _gib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"
