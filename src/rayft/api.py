"""rayft's Python API: one function per command, each running it exactly as the CLI does and
returning its typed result.

One calling convention: the config comes first (a :class:`rayft.RayftConfig`, from
:func:`rayft.load_config` or built in Python); then the model, where the command takes one (``model``:
a run directory, checkpoint, export, Hub id, .gguf file or built-in name; ``models`` for several);
then the paths the command cannot do without; every option is a keyword. Importing this module is
light (no torch, no ray): every function imports its recipe when it is called.

    import rayft
    from rayft import api

    cfg = rayft.load_config("configs/quickstart.yaml", ["train.max_steps=20"])
    result = api.train(cfg)
    print(result.final_dir, result.train_loss)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from rayft.config import RayftConfig
from rayft.runs import layout
from rayft.runs.defaults import default_model, default_report_dir
from rayft.security import install_redaction

if TYPE_CHECKING:
    from rayft.data.prepare import PrepareResult
    from rayft.inference.chat import ChatIO
    from rayft.pipeline.plan import StageDecision
    from rayft.pipeline.runner import PipelineResult
    from rayft.recipes.chat import ChatResult
    from rayft.recipes.compare import CompareResult
    from rayft.recipes.evaluate import EvalResult
    from rayft.recipes.export import ExportResult
    from rayft.recipes.generate import GenerateResult
    from rayft.recipes.sdg import SdgResult
    from rayft.recipes.tune import TuneResult
    from rayft.sdg.pair_maker import PairsResult
    from rayft.serving.handle import ServeHandle
    from rayft.training.driver.run import TrainResult

__all__ = [
    "chat",
    "compare",
    "evaluate",
    "export",
    "generate",
    "pairs",
    "prepare_data",
    "render_manifests",
    "run_pipeline",
    "sdg",
    "serve",
    "train",
    "train_rank",
    "tune",
]

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


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value is not None else None


@_redacted
def train(cfg: RayftConfig, *, resume: bool = False) -> TrainResult:
    """Fine-tune ``cfg.model`` on ``cfg.data`` into ``<storage_path>/<name>/`` (``rayft train``).

    Args:
        cfg: The config.
        resume: Continue the run of the same name from its newest complete checkpoint.
    """
    from rayft.recipes import train as recipe

    return recipe.run(cfg, resume=resume)


@_redacted
def train_rank(cfg: RayftConfig, *, resume: bool = False) -> TrainResult | None:
    """Train as one rank of a torchrun job (``torchrun --no-python rayft train CONFIG``, or a script
    of yours that torchrun starts), without Ray: rank 0 drives the run and returns its result, the
    other ranks return None. The run directory must be on storage that every rank sees.

    Args:
        cfg: The config (``scaling.num_workers`` equal to torchrun's world size).
        resume: Continue the run of the same name from its newest complete checkpoint.
    """
    from rayft.training.driver import torchrun

    return torchrun.train(cfg, resume=resume)


@_redacted
def prepare_data(cfg: RayftConfig, *, report_dir: str | Path | None = None, in_process: bool = False) -> PrepareResult:
    """Tokenize and cache the training data of ``cfg`` as ``rayft train`` would (``rayft data
    prepare``): a run of the same config then reuses it without tokenizing, and for DPO with full
    fine-tuning without computing the reference log-probabilities again.

    Args:
        cfg: The config.
        report_dir: Where rejected.jsonl and stats.json go (default: ``<storage_path>/<name>/data``).
        in_process: Tokenize in this process instead of a Ray Data job (the same output).
    """
    from rayft.training.driver.startup import prepare_for_training

    where = {"command": "rayft.api.prepare_data", "fix": "pass report_dir="}
    reports = _path(report_dir) or default_report_dir(cfg, layout.DATA_DIR, **where)
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
def sdg(cfg: RayftConfig, *, output_dir: str | Path | None = None, test_mode: bool = False) -> SdgResult:
    """Generate synthetic training data from ``cfg.sdg`` (``rayft sdg``); an interrupted run resumes.

    Args:
        cfg: The config.
        output_dir: Where the data goes (default: ``sdg.output_dir``, else ``<storage_path>/<name>/sdg``).
        test_mode: A smoke run on the first few seeds (``rayft sdg --test-mode``).
    """
    from rayft.recipes import sdg as recipe

    return recipe.run(cfg, output_dir=_path(output_dir), test_mode=test_mode)


@_redacted
def pairs(cfg: RayftConfig, model: str | Path | None = None, *, output_dir: str | Path | None = None) -> PairsResult:
    """Preference pairs from ``model``'s verified answers to ``cfg.pairs``' problems (``rayft pairs``).

    Args:
        cfg: The config.
        model: The model that answers (default: ``pairs.model``, else ``model.name``).
        output_dir: Where the pairs go (default: ``pairs.output_dir``, else ``<storage_path>/<name>/pairs``).
    """
    from rayft.recipes import pairs as recipe

    return recipe.run(cfg, model=str(model) if model is not None else None, output_dir=_path(output_dir))


@_redacted
def evaluate(
    cfg: RayftConfig, model: str | Path | None = None, *, output_dir: str | Path | None = None, label: str = "model"
) -> EvalResult:
    """Score one model on ``cfg.eval`` and write ``eval.json`` and ``predictions.jsonl`` (``rayft eval``).

    Args:
        cfg: The config.
        model: The model (default: the config's run directory if it exists, else ``model.name``).
        output_dir: The report directory (default ``<storage_path>/<name>/eval``).
        label: The model's name in the report.
    """
    from rayft.recipes import evaluate as recipe

    where = {"command": "rayft.api.evaluate", "fix": "pass model= and output_dir="}
    source = str(model) if model is not None else default_model(cfg, **where)
    return recipe.run(cfg, source, _path(output_dir) or default_report_dir(cfg, "eval", **where), label=label)


@_redacted
def compare(
    cfg: RayftConfig,
    models: Mapping[str, str | Path],
    *,
    output_dir: str | Path | None = None,
    gates: Sequence[str] = (),
) -> CompareResult:
    """Evaluate two or more models on the same examples and test their differences (``rayft compare``).

    Args:
        cfg: The config.
        models: Label -> model, e.g. ``{"base": "smollm2-135m-instruct", "tuned": "runs/my-run"}``.
        output_dir: The report directory (default ``<storage_path>/<name>/compare``).
        gates: Promotion gates such as ``"tuned > base"`` or ``"q4 ~ tuned within 0.02"``; each is
            checked and its result is in ``result.summary.gates`` (a failed gate raises nothing here).
    """
    from rayft.recipes import compare as recipe

    where = {"command": "rayft.api.compare", "fix": "pass output_dir="}
    out = _path(output_dir) or default_report_dir(cfg, "compare", **where)
    return recipe.run(cfg, {label: str(model) for label, model in models.items()}, out, gates=gates)


@_redacted
def export(cfg: RayftConfig, model: str | Path, output_dir: str | Path, *, merge: bool | None = None) -> ExportResult:
    """Turn a checkpoint (or a run directory's chosen checkpoint) into a verified Hugging Face model
    directory (``rayft export``).

    Args:
        cfg: The config (its ``export`` section, and ``eval.checkpoint`` to pick a run's checkpoint).
        model: A run directory, a ``checkpoints/step-N`` directory or a ``final/`` directory.
        output_dir: The new model directory (must not exist, or be empty).
        merge: Merge the LoRA adapter into the weights (default: ``export.merge``).
    """
    from rayft.recipes import export as recipe

    return recipe.run(cfg, str(model), Path(output_dir), merge=merge)


@_redacted
def generate(
    cfg: RayftConfig,
    model: str | Path,
    input_path: str | Path,
    output_path: str | Path,
    *,
    prompt_field: str | None = None,
    rejects_path: str | Path | None = None,
) -> GenerateResult:
    """Generate a completion for every prompt of a JSON Lines file on Ray actors (``rayft generate``).

    Args:
        cfg: The config (its ``inference`` section, ``eval.checkpoint``, ``scaling.address``).
        model: The model (for ``inference.backend: openai``, the model name the server is asked for).
        input_path: One JSON object per line, with a ``prompt`` string or a ``messages`` list.
        output_path: The JSON Lines output: every usable row, in input order, with its generation.
        prompt_field: The column holding the prompt (default ``prompt``, else ``messages``).
        rejects_path: Where rejected lines are listed (default ``<output>.rejects.jsonl``).
    """
    from rayft.recipes import generate as recipe

    return recipe.run(
        cfg, str(model), Path(input_path), Path(output_path),
        prompt_field=prompt_field, rejects_path=_path(rejects_path),
    )  # fmt: skip


@_redacted
def chat(
    cfg: RayftConfig, model: str | Path, *, device: str | None = None, io: ChatIO | None = None,
    tools: Sequence[str] = (),
) -> ChatResult:  # fmt: skip
    """Chat with a model in this process until the user quits (``rayft chat``); no Ray is started.

    Args:
        cfg: The config (its ``inference`` section for sampling, ``eval.checkpoint`` for a run's checkpoint).
        model: The model.
        device: ``cpu`` or ``cuda`` (default: a GPU when there is one).
        io: Where lines are read and replies written (default: the terminal, or standard input and output).
        tools: Built-in tools the model may call (calculator, sql, python): a reply's calls are run, their
            results shown and given to the model, which replies again.

    Returns:
        The number of replies generated and the model that gave them.
    """
    from rayft.recipes import chat as recipe

    return recipe.run(cfg, str(model), device=device, io=io, tools=tools)


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
    cfg: RayftConfig,
    models: Sequence[str | Path] = (),
    *,
    host: str | None = None,
    port: int | None = None,
    address: str | None = None,
) -> ServeHandle:
    """Serve models behind an OpenAI-compatible API on Ray Serve (``rayft serve``) and return at once.

    LoRA adapters trained on one base share its replicas and are chosen per request by model id;
    each model answers with the chat template it was trained with.

        with api.serve(cfg, ["runs/my-run"], port=0) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="none")
            client.chat.completions.create(model=server.model_ids[0], messages=[...])

    Args:
        cfg: The config (its ``serve`` section; ``eval.checkpoint`` picks a run's checkpoint).
        models: The models (default: ``serve.sources``).
        host: The address to listen on (default ``serve.host``).
        port: The HTTP port, 0 for a free one (default ``serve.port``).
        address: Join this Ray cluster instead of starting a local one.
    """
    from rayft.recipes import serve as recipe

    host = host if host is not None else cfg.serve.host
    port = port if port is not None else cfg.serve.port
    return recipe.run(cfg, [str(m) for m in models], host=host, port=port, address=address)


def render_manifests(cfg: RayftConfig, target: str, *, with_namespace: bool = False) -> list[dict[str, Any]]:
    """The Kubernetes objects that run ``cfg`` (``rayft k8s render``), as plain dicts.

    Args:
        cfg: The config (its ``k8s`` section; the whole config goes into a ConfigMap).
        target: ``rayjob``, ``raycluster``, ``rayservice``, ``trainjob`` or ``pytorchjob``.
        with_namespace: Also the Namespace, its ResourceQuota and the ServiceAccount.
    """
    from rayft.deploy.manifests import render

    return render(cfg, target, with_namespace=with_namespace)
