"""The on-disk layout of a training run and of its checkpoints: names only, no I/O.

::

    <storage_path>/<name>/
        config.yaml                 resolved config of the run
        metrics.jsonl               one JSON object per logged step / evaluation
        tensorboard/                TensorBoard event files
        tracking.json               the MLflow / W&B run ids a restart or --resume continues
        tracking-unsent.json        metric records a tracker could not be sent (reported at the end)
        data/rejected.jsonl         rows the data plane rejected, with reasons
        logs/rayft.log              the full log of the command (Ray's loggers included)
        profile/                    step_times.jsonl (every rank's step breakdown per logging window),
                                    trace-rank-0000.json (torch.profiler), profile.html
        checkpoints/step-000100/    one directory per saved step (see below)
        final/                      the trained model, loadable with from_pretrained
                                    (full) or PeftModel.from_pretrained (LoRA)

    checkpoints/step-000100/ and final/ (same layout; final/ has no trainer/)
        adapter_model.safetensors + adapter_config.json     (LoRA)
        or model.safetensors + config.json                  (full fine-tuning)
        tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json
        rayft_config.yaml         resolved config of the run
        trainer/                  optimizer.pt, scheduler.json, state.json, rng-rank-0000.pt ...
        rayft_checkpoint.json     completion marker, written last: step, metrics, and every
                                  file's size and sha256 (see rayft.runs.manifest)

Every checkpoint directory, like final/, loads directly with ``from_pretrained`` (full) or
``PeftModel.from_pretrained`` (LoRA): no conversion step.
"""

from __future__ import annotations

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
REJECTED_FILE = "data/rejected.jsonl"
CHECKPOINTS_DIR = "checkpoints"
STAGE_RECORDS_DIR = "stages"  # a pipeline run's records of its finished stages (stages/<stage>.json)
TRAINED_STAGES = ("rl", "preference", "train")  # a pipeline's stages that train a model, the last first
FINAL_DIR = "final"
DATA_DIR = "data"
TRACKING_FILE = "tracking.json"
LOG_FILE = "logs/rayft.log"
TRACKING_UNSENT_FILE = "tracking-unsent.json"
STOP_REQUEST_FILE = ".rayft-stop-requested"
"""Written on SIGTERM into the run (its directory, or under its URI); the workers save and stop when they see it."""

CHECKPOINT_CONFIG_FILE = "rayft_config.yaml"
TRAINER_SUBDIR = "trainer"
MANIFEST_FILE = "rayft_checkpoint.json"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.json"
STATE_FILE = "state.json"

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
FULL_WEIGHTS = "model.safetensors"

_STEP_PREFIX = "step-"


def step_dir_name(step: int) -> str:
    """The checkpoint directory name of an optimizer step: ``step-000100``."""
    return f"{_STEP_PREFIX}{step:06d}"


def parse_step_dir_name(name: str) -> int | None:
    """The step of a checkpoint directory name, or None if it is not one."""
    if not name.startswith(_STEP_PREFIX):
        return None
    digits = name[len(_STEP_PREFIX) :]
    return int(digits) if digits.isdigit() else None


def rng_file(rank: int) -> str:
    """The file holding one worker's RNG states inside ``trainer/``."""
    return f"rng-rank-{rank:04d}.pt"


def rollouts_file(rank: int) -> str:
    """The file holding one worker's rollouts sampled ahead of its step (asynchronous GRPO) inside ``trainer/``."""
    return f"rollouts-rank-{rank:04d}.json"


PROFILE_DIR = "profile"
"""Step-time breakdowns and traces of the run (``rayft profile RUN`` reads them)."""
STEP_TIMES_FILE = f"{PROFILE_DIR}/step_times.jsonl"
"""One record per logging window: every rank's ``time/*`` breakdown, written by rank 0."""
PROFILE_PAGE = f"{PROFILE_DIR}/profile.html"
"""The breakdown, verdict and fix of ``rayft profile RUN`` as a page."""


def trace_file(rank: int) -> str:
    """One rank's torch.profiler trace (Chrome/Perfetto JSON) in the run directory."""
    return f"{PROFILE_DIR}/trace-rank-{rank:04d}.json"


def memory_snapshot_file(rank: int) -> str:
    """One rank's CUDA memory snapshot (pytorch.org/memory_viz) in the run directory."""
    return f"{PROFILE_DIR}/memory-rank-{rank:04d}.pickle"
