"""rayft's Python API: the functions the package root exports (``rayft.train``, ``rayft.compare`` ...).

Each function runs one recipe, exactly as the matching CLI command does, and returns its typed
result. Importing this module is light (no torch, no ray): every function imports its recipe when
it is called.

    import rayft

    cfg = rayft.load_config("configs/quickstart.yaml", ["train.max_steps=20"])
    result = rayft.train(cfg)
    print(result.final_dir, result.train_loss)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from rayft.config import RayftConfig
from rayft.runs.location import local_run_dir
from rayft.security import install_redaction

if TYPE_CHECKING:
    from rayft.data.prepare import PrepareOutcome
    from rayft.inference.chat import ChatIO
    from rayft.pipeline.plan import StageDecision
    from rayft.pipeline.runner import PipelineResult
    from rayft.recipes.compare import CompareResult
    from rayft.recipes.evaluate import EvalResult
    from rayft.recipes.export import ExportResult
    from rayft.recipes.generate import GenerateResult
    from rayft.recipes.sdg import SdgResult
    from rayft.recipes.tune import TuneResult
    from rayft.sdg.pair_maker import PairsOutput
    from rayft.serving.handle import ServeHandle
    from rayft.training.driver.run import TrainResult

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _redacted(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """``function``, run with credentials masked in everything the process logs and prints (as
    every CLI command is)."""

    @functools.wraps(function)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        install_redaction()
        return function(*args, **kwargs)

    return call


def default_model(cfg: RayftConfig, *, command: str, fix: str) -> str:
    """The model ``rayft eval`` scores when none is named: the config's run directory if it
    exists, else ``model.name``. ``command`` and ``fix`` word the error for a URI storage_path."""
    run_dir = local_run_dir(cfg.storage_path, cfg.name, command=command, fix=fix)
    return str(run_dir) if run_dir.is_dir() else cfg.model.name


def default_report_dir(cfg: RayftConfig, kind: str, *, command: str, fix: str) -> Path:
    """Where a report of ``kind`` (``eval``, ``compare``) goes when no directory is named:
    ``<storage_path>/<name>/<kind>``. ``command`` and ``fix`` word the error for a URI storage_path."""
    return local_run_dir(cfg.storage_path, cfg.name, command=command, fix=fix) / kind


def default_data_report_dir(cfg: RayftConfig) -> Path:
    """Where ``rayft data prepare`` reports rejected rows and statistics when no directory is named:
    the run's data directory (``<storage_path>/<name>/data``), where ``rayft train`` reports them too."""
    from rayft.runs import layout

    return default_report_dir(cfg, layout.DATA_DIR, command="rayft data", fix="pass --report-dir /a/local/dir")


@_redacted
def train(cfg: RayftConfig, resume: bool = False) -> TrainResult:
    """Fine-tune ``cfg.model`` on ``cfg.data`` into ``<storage_path>/<name>/`` (``rayft train``).

    Args:
        cfg: A config from :func:`rayft.load_config` (or built with :class:`rayft.RayftConfig`).
        resume: Continue the run of the same name from its newest complete checkpoint.
    """
    from rayft.recipes import train as recipe

    return recipe.run(cfg, resume=resume)


@_redacted
def prepare_data(cfg: RayftConfig, report_dir: str | Path | None = None, *, in_process: bool = False) -> PrepareOutcome:
    """Tokenize and cache the training data of ``cfg`` as ``rayft train`` would (``rayft data
    prepare``): a run of the same config then reuses it without tokenizing, and for DPO with full
    fine-tuning without computing the reference log-probabilities again.

    Args:
        cfg: The config.
        report_dir: Where rejected.jsonl and stats.json go (default: ``<storage_path>/<name>/data``).
        in_process: Tokenize in this process instead of a Ray Data job (the same output).
    """
    from rayft.training.driver.startup import prepare_for_training

    reports = Path(report_dir) if report_dir is not None else default_data_report_dir(cfg)
    use_ray = not in_process and cfg.scaling.num_workers > 0
    return prepare_for_training(cfg, reports, use_ray=use_ray, ray_address=cfg.scaling.address)


@_redacted
def tune(cfg: RayftConfig) -> TuneResult:
    """Search the hyper-parameters of ``cfg.tune`` with Ray Tune, each trial a full training run,
    into ``<storage_path>/<sweep name>/`` (``rayft tune``). A sweep of the same name and config
    that was interrupted continues: finished trials are kept, the others continue from their
    last checkpoint.

    Args:
        cfg: A config with a ``tune`` section (:class:`rayft.TuneConfig`).
    """
    from rayft.recipes import tune as recipe

    return recipe.run(cfg)


@_redacted
def sdg(cfg: RayftConfig, output_dir: str | Path | None = None, *, test_mode: bool = False) -> SdgResult:
    """Generate synthetic training data from ``cfg.sdg`` (``rayft sdg``); an interrupted run resumes.

    Args:
        cfg: The config.
        output_dir: Where the data goes (default: ``sdg.output_dir``, else ``<storage_path>/<name>/sdg``).
        test_mode: A smoke run on the first few seeds (``rayft sdg --test-mode``).
    """
    from rayft.recipes import sdg as recipe

    return recipe.run(cfg, output_dir=Path(output_dir) if output_dir is not None else None, test_mode=test_mode)


@_redacted
def pairs(cfg: RayftConfig, model: str | None = None, output_dir: str | Path | None = None) -> PairsOutput:
    """Preference pairs from ``model``'s verified answers to ``cfg.pairs``' problems (``rayft pairs``).

    Args:
        cfg: The config.
        model: The model source (default: ``pairs.model``, else ``model.name``).
        output_dir: Where the pairs go (default: ``pairs.output_dir``, else ``<storage_path>/<name>/pairs``).
    """
    from rayft.recipes import pairs as recipe

    return recipe.run(cfg, model=model, output_dir=Path(output_dir) if output_dir is not None else None)


@_redacted
def evaluate(
    cfg: RayftConfig, model: str | None = None, output_dir: str | Path | None = None, *, label: str = "model"
) -> EvalResult:
    """Score one model on ``cfg.eval`` and write ``eval.json`` and ``predictions.jsonl`` (``rayft eval``).

    Args:
        cfg: The config.
        model: A run directory, checkpoint, model directory, Hub id, .gguf file or built-in name
            (default: the config's run directory if it exists, else ``model.name``).
        output_dir: The report directory (default ``<storage_path>/<name>/eval``).
        label: The model's name in the report.
    """
    from rayft.recipes import evaluate as recipe

    where = {"command": "rayft.evaluate", "fix": "pass model= and output_dir="}
    model = model if model is not None else default_model(cfg, **where)
    output_dir = Path(output_dir) if output_dir is not None else default_report_dir(cfg, "eval", **where)
    return recipe.run(cfg, model, output_dir, label=label)


@_redacted
def compare(cfg: RayftConfig, models: Mapping[str, str], output_dir: str | Path | None = None) -> CompareResult:
    """Evaluate two or more models on the same examples and test their differences (``rayft compare``).

    Args:
        cfg: The config.
        models: Label -> model source, e.g. ``{"base": "smollm2-135m-instruct", "tuned": "runs/my-run"}``.
        output_dir: The report directory (default ``<storage_path>/<name>/compare``).
    """
    from rayft.recipes import compare as recipe

    if output_dir is None:
        output_dir = default_report_dir(cfg, "compare", command="rayft.compare", fix="pass output_dir=")
    return recipe.run(cfg, dict(models), Path(output_dir))


@_redacted
def export(
    src: str | Path, out: str | Path, cfg: RayftConfig | None = None, *, merge: bool | None = None
) -> ExportResult:
    """Turn a checkpoint (or a run directory's chosen checkpoint) into a verified Hugging Face model
    directory (``rayft export``).

    Args:
        src: A run directory, a ``checkpoints/step-N`` directory or a ``final/`` directory.
        out: The new model directory (must not exist, or be empty).
        cfg: The config (its ``export`` and ``eval.checkpoint`` sections); defaults when None.
        merge: Merge the LoRA adapter into the weights (default: ``export.merge``).
    """
    from rayft.recipes import export as recipe

    return recipe.run(cfg if cfg is not None else RayftConfig(), str(src), Path(out), merge=merge)


@_redacted
def generate(
    source: str | Path,
    input_path: str | Path,
    output_path: str | Path,
    cfg: RayftConfig | None = None,
    *,
    prompt_field: str | None = None,
    rejects_path: str | Path | None = None,
) -> GenerateResult:
    """Generate a completion for every prompt of a JSON Lines file on Ray actors (``rayft generate``).

    Args:
        source: A run directory, checkpoint, model directory, Hub id, .gguf file or built-in name
            (for ``inference.backend: openai``, the model name the server is asked for).
        input_path: One JSON object per line, with a ``prompt`` string or a ``messages`` list.
        output_path: The JSON Lines output: every usable row, in input order, with its generation.
        cfg: The config (its ``inference`` section, ``eval.checkpoint``, ``scaling.address``); defaults when None.
        prompt_field: The column holding the prompt (default ``prompt``, else ``messages``).
        rejects_path: Where rejected lines are listed (default ``<output>.rejects.jsonl``).
    """
    from rayft.recipes import generate as recipe

    return recipe.run(
        cfg if cfg is not None else RayftConfig(),
        str(source),
        Path(input_path),
        Path(output_path),
        prompt_field=prompt_field,
        rejects_path=Path(rejects_path) if rejects_path is not None else None,
    )


@_redacted
def chat(cfg: RayftConfig, source: str | Path, *, device: str | None = None, io: ChatIO | None = None) -> int:
    """Chat with a model in this process until the user quits (``rayft chat``); no Ray is started.

    Args:
        cfg: The config (its ``inference`` section for sampling, ``eval.checkpoint`` for a run's checkpoint).
        source: A run directory, checkpoint, model directory, Hub id, .gguf file or built-in name.
        device: ``cpu`` or ``cuda`` (default: a GPU when there is one).
        io: Where lines are read and replies written (default: the terminal, or standard input and output).

    Returns:
        The number of replies generated.
    """
    from rayft.recipes import chat as recipe

    return recipe.run(cfg, str(source), device=device, io=io)


@_redacted
def run_pipeline(
    cfg: RayftConfig,
    *,
    from_stage: str | None = None,
    only: str | None = None,
    force: bool = False,
    address: str | None = None,
    on_decision: Callable[[StageDecision], None] | None = None,
) -> PipelineResult:
    """Run the stages the config requests (sdg, train, eval, export) on one Ray (``rayft run``),
    skipping those whose inputs did not change.

    Args:
        cfg: The config; its ``sdg``, ``train``/``data``, ``eval`` and ``export`` sections pick the stages.
        from_stage: Rerun this stage and every later one.
        only: Rerun this stage alone.
        force: Rerun every selected stage even when its inputs did not change.
        address: Join this Ray cluster instead of starting a local one.
        on_decision: Called with each stage's decision (run, skip, reuse) before it runs.
    """
    from rayft.pipeline import runner

    return runner.run(cfg, from_stage=from_stage, only=only, force=force, address=address, on_decision=on_decision)


@_redacted
def serve(
    sources: list[str],
    *,
    config: RayftConfig | str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    address: str | None = None,
) -> ServeHandle:
    """Serve models behind an OpenAI-compatible API on Ray Serve (``rayft serve``) and return at once.

    LoRA adapters trained on one base share its replicas and are chosen per request by model id;
    each model answers with the chat template it was trained with.

        with rayft.serve(["runs/my-run"]) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="none")
            client.chat.completions.create(model=server.model_ids[0], messages=[...])

    Args:
        sources: Run directories, checkpoints, exports, Hub ids or built-in names.
        config: A config, or the path of one (its ``serve`` section; ``eval.checkpoint`` picks a run's checkpoint).
        host: The address to listen on.
        port: The HTTP port; 0 picks a free one.
        address: Join this Ray cluster instead of starting a local one.
    """
    from rayft.config.loader import load_config
    from rayft.recipes import serve as recipe

    cfg = load_config(config) if isinstance(config, str) else config if config is not None else RayftConfig()
    return recipe.run(cfg, [str(s) for s in sources], host=host, port=port, address=address)
