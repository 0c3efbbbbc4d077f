"""``rayft eval``, ``rayft compare`` and ``rayft export``: score models, compare them, ship them."""

from __future__ import annotations

from pathlib import Path

import click

from rayft import api
from rayft.cli.address_opt import address_option
from rayft.cli.common import config_argument, load_cli_config, open_run_log, overrides_argument
from rayft.cli.defaults import CHECKPOINT_HELP, config_default
from rayft.config import RayftConfig, load_config
from rayft.data.builtin import builtin_eval_note
from rayft.errors import ConfigError
from rayft.runs.defaults import default_model, default_report_dir


def _with_checkpoint(overrides: tuple[str, ...], checkpoint: str | None) -> tuple[str, ...]:
    return (*overrides, f"eval.checkpoint={checkpoint}") if checkpoint else overrides


def _default_output(cfg: RayftConfig, kind: str) -> Path:
    return default_report_dir(cfg, kind, command=f"rayft {kind}", fix="pass --output /a/local/dir")


@click.command("eval", epilog="Example: rayft eval cfg.yaml --model runs/my-run --checkpoint best eval.max_samples=100")
@config_argument
@overrides_argument
@click.option(
    "--model",
    "source",
    default=None,
    help="Model to evaluate: a run directory, a checkpoint or final/ directory, a model directory, a Hub id, "
    "a .gguf file or a built-in name. Default: the config's run directory if it exists, else model.name.",
)
@click.option("--checkpoint", default=None, help=CHECKPOINT_HELP)
@click.option("--output", type=click.Path(file_okay=False), default=None, help="Report directory [<run>/eval].")
@address_option("eval")
def eval_(
    config_path: str, overrides: tuple[str, ...], source: str | None, checkpoint: str | None, output: str | None
) -> None:
    """Score one model on the eval datasets of CONFIG; write eval.json and predictions.jsonl.

    Metrics come with their confidence intervals (Wilson for accuracies, bootstrap otherwise).
    """
    cfg = load_cli_config(config_path, _with_checkpoint(overrides, checkpoint))
    fix = "pass --model (a local run, checkpoint or model directory)"
    model = source or default_model(cfg, command="rayft eval", fix=fix)
    out = Path(output) if output else _default_output(cfg, "eval")
    open_run_log(cfg, out)
    result = api.evaluate(cfg, model, output_dir=out)
    click.echo(result.table)
    click.echo(f"\nReport: {result.json_path}\nPredictions: {result.predictions_path}")


def _parse_models(items: tuple[str, ...]) -> dict[str, str]:
    sources: dict[str, str] = {}
    for item in items:
        label, sep, src = item.partition("=")
        if not sep or not label or not src:
            raise ConfigError(f"--model {item!r}: expected LABEL=SOURCE, e.g. --model base=smollm2-135m-instruct")
        if label in sources:
            raise ConfigError(f"--model: the label {label!r} is used twice; give every model its own label")
        sources[label] = src
    return sources


@click.command(epilog="Example: rayft compare cfg.yaml --model base=smollm2-135m-instruct --model tuned=runs/my-run")
@config_argument
@overrides_argument
@click.option(
    "--model",
    "models",
    multiple=True,
    required=True,
    help="LABEL=SOURCE, at least twice (sources as for rayft eval).",
)
@click.option("--checkpoint", default=None, help=CHECKPOINT_HELP)
@click.option("--output", type=click.Path(file_okay=False), default=None, help="Report directory [<run>/compare].")
@click.option(
    "--gate",
    "gates",
    multiple=True,
    help="A promotion gate the evidence must support, or the command exits non-zero: 'tuned > base', "
    "'q4 ~ tuned within 0.02' (equivalent), 'q4 >= tuned within 0.02' (non-inferior), optionally '... on METRIC'.",
)
@address_option("compare")
def compare(
    config_path: str,
    overrides: tuple[str, ...],
    *,
    models: tuple[str, ...],
    checkpoint: str | None,
    output: str | None,
    gates: tuple[str, ...],
) -> None:
    """Evaluate two or more models on the same prompts and test their differences.

    Writes compare.json, compare.md, a self-contained compare.html and examples.jsonl; paired
    tests are McNemar (correct/incorrect) and paired bootstrap (continuous metrics), each with a
    TOST equivalence test at eval.equivalence_margin and, for correct/incorrect metrics, the flips.
    """
    from rayft.evaluation.gates import parse_gates, require_passed
    from rayft.evaluation.report import pair_lines

    sources = _parse_models(models)
    parse_gates(gates)  # a bad gate is one line before the config loads
    cfg = load_cli_config(config_path, _with_checkpoint(overrides, checkpoint))
    out = Path(output) if output else _default_output(cfg, "compare")
    open_run_log(cfg, out)
    result = api.compare(cfg, sources, output_dir=out, gates=gates)
    click.echo(result.table + "\n")
    for line in pair_lines(result.summary):
        click.echo(line)
    note = builtin_eval_note([ds.path for ds in cfg.eval.datasets])
    if note:
        click.echo(f"Note: {note}")
    click.echo(f"\nReport: {result.html_path}\nMarkdown: {result.markdown_path}\nJSON: {result.json_path}")
    require_passed(result.summary.gates, "promotion")


@click.command(
    epilog="Examples: rayft export runs/my-run exported/my-model --no-merge\n\n"
    "rayft export runs/my-run exported/my-model --format gguf --gguf-types f16,q4_0"
)
@click.argument("source")
@click.argument("output_dir", type=click.Path(file_okay=False))
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None, help="Config file (optional).")
@click.option("--merge/--no-merge", default=None, help=f"Merge the LoRA adapter [{config_default('export.merge')}].")
@click.option("--checkpoint", default=None, help=CHECKPOINT_HELP)
@click.option(
    "--format",
    "export_format",
    type=click.Choice(["hf", "gguf"]),
    default=None,
    help=f"hf, or gguf: also GGUF files and an Ollama Modelfile [{config_default('export.format')}].",
)
@click.option(
    "--gguf-types",
    default=None,
    metavar="TYPES",
    help="Comma-separated GGUF types among f16, q8_0, q4_0 (implies --format gguf) [all three].",
)
def export(
    source: str,
    output_dir: str,
    overrides: tuple[str, ...],
    *,
    config_path: str | None,
    merge: bool | None,
    checkpoint: str | None,
    export_format: str | None,
    gguf_types: str | None,
) -> None:
    """Turn a checkpoint (or a run directory's chosen checkpoint) into a Hugging Face model directory.

    The export is verified before it is published: the adapter's shapes, merged vs base+adapter
    logits, and a reload with from_pretrained that generates.
    """
    if gguf_types and not export_format:
        export_format = "gguf"  # asking for GGUF types is asking for GGUF
    extra = [f"export.format={export_format}"] if export_format else []
    if gguf_types:
        extra.append(f"export.gguf_types=[{','.join(t.strip() for t in gguf_types.split(','))}]")
    cfg = load_config(config_path, [*_with_checkpoint(overrides, checkpoint), *extra])
    result = api.export(cfg, source, output_dir, merge=merge)
    kind = "merged model" if result.merged else ("adapter" if result.verification.get("adapter") else "model")
    click.echo(f"Exported {kind} to {result.output_dir}")
    for key, value in result.verification.items():
        click.echo(f"  {key}: {value}")
