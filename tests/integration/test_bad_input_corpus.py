"""The bad inputs a new user meets, each run through the real command line in a process of its own:
every one ends with exit code 2 and exactly one ``Error:`` line that names what, where and the fix,
prints no traceback, and leaves no partial output behind (only a failed command's own log, and the config
of a run whose start failed, which the next start replaces).

A case timed as a whole (``within_s``: Python's start included) runs ``python -m rayft``; the others run
in a fork of one process that imported torch and transformers once (tests.support.cli_forks), the same
command line at a fraction of the cost. All fail before Ray starts, so none starts it. Add a case here
with every fix of a bad input.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import rayft
from rayft.runs import layout
from tests.support.checkpoints import build_run_dir
from tests.support.cli_forks import CliForks
from tests.support.mounts import tmpfs

pytestmark = pytest.mark.integration

DATA_ROWS = '{"prompt": "1 + 1 =", "completion": " 2"}\n{"prompt": "2 + 2 =", "completion": " 4"}\n'


@dataclass(frozen=True)
class Case:
    """One bad input: the command line (``{name}`` fields filled from the workspace) and the error it must get."""

    argv: str
    error: str  # a regular expression the one Error: line must match
    within_s: float | None = None  # the whole command, Python's start included
    report: bool = False  # it leaves the data report its error points to (rejected.jsonl, stats.json)


CASES = {
    # config files and overrides
    "missing config file": Case("config validate {ws}/nope.yaml", r"Config file '.*nope.yaml' does not exist; check"),
    "binary config file": Case(
        "config validate {ws}/binary.yaml", r"is not UTF-8 text \(byte 0xff at offset 0\); give"
    ),
    "empty config file": Case("config validate {ws}/empty.yaml", r"'.*empty.yaml' is empty \(line 1\); write the"),
    "duplicate key": Case("config validate {ws}/dup.yaml", r"key 'train' on line 4 repeats the one on line 1 .*keep"),
    "unknown key": Case(
        "config validate {cfg} train.lr=1e-4", r"train.lr: unknown key. Did you mean 'train.learning_rate'"
    ),
    "malformed override": Case("config validate {cfg} oops", r"Override 'oops' is not of the form section.key=value"),
    "mlflow file store": Case(
        "train {cfg} logging.mlflow.tracking_uri=file:/tmp/mlruns",
        r"tracking_uri = 'file:/tmp/mlruns': MLflow 3 refuses its file: store .*sqlite:////abs/path/mlflow.db",
    ),
    "mlflow garbage uri": Case(
        "train {cfg} logging.mlflow.tracking_uri=nonsense", r"'nonsense': not an MLflow tracking URI .*http://host:5000"
    ),
    "config fields given a file": Case(
        "config fields {cfg}", r"'.*ok.yaml' is a file, but the argument is a field prefix .*rayft config show"
    ),
    "config fields typo": Case("config fields trian", r"no field starts with 'trian'. Did you mean 'train'\?"),
    # models
    "model typo offline": Case(
        "chat smollm2-135m-instrukt", r"'smollm2-135m-instrukt' is not .*Did you mean 'smollm2-135m-instruct'\?", 3.0
    ),
    "train model typo offline": Case(
        "train {cfg} model.name=smollm2-135m-instrukt", r"model.name: .*Did you mean 'smollm2-135m-instruct'\?", 3.0
    ),
    "chat on a data file": Case("chat {ws}/data.jsonl", r"model source '.*data.jsonl' is a file, not a model; give"),
    "chat without a tokenizer": Case("chat {notok}", r"has no tokenizer \(none of tokenizer.json.*save the tokenizer"),
    "chat with an empty config.json": Case("chat {emptycfg}", r"config.json is not valid JSON .*restore it"),
    "train without a tokenizer": Case("train {cfg} model.name={notok}", r"model.name: .*has no tokenizer"),
    "train with an empty config.json": Case("train {cfg} model.name={emptycfg}", r"model.name: .*is not valid JSON"),
    # data
    # A bad row is rejected on its own (file, line, reason in rejected.jsonl); the run stops only
    # past data.max_rejected_fraction, which this config sets to 0.01.
    "data line not JSON": Case(
        "data prepare {cfg} data.datasets.0.path={ws}/not-json.jsonl",
        r"1 of 2 rows \(50.0%\) were rejected, more than data.max_rejected_fraction=0.01\. Top reasons: bad_json: 1 "
        r".*rejected.jsonl; fix the rows",
        report=True,
    ),
    "data column of mixed types": Case(
        "data prepare {cfg} data.datasets.0.path={ws}/mixed.jsonl",
        r"1 of 3 rows \(33.3%\) were rejected, more than .* Top reasons: wrong_type: 1 .*rejected.jsonl; fix the rows",
        report=True,
    ),
    "unknown data format": Case(
        "data prepare {cfg} data.datasets.0.format=nosuch", r"data.datasets.0.format = 'nosuch': Input should be"
    ),
    "missing data file": Case(
        "train {cfg} data.datasets.0.path={ws}/nope.jsonl", r"dataset path '.*nope.jsonl': no such file .*fix"
    ),
    "data path a symlink loop": Case(
        "train {cfg} data.datasets.0.path={ws}/loop.jsonl",
        r"dataset path '.*loop.jsonl': a symbolic link loop \(.*loop.jsonl leads back to itself\); fix data path",
    ),
    "data row larger than max_row_bytes": Case(
        "data prepare {cfg} data.datasets.0.path={ws}/huge-row.jsonl data.datasets.0.max_row_bytes=4096",
        r"1 of 3 rows \(33.3%\) were rejected, .* Top reasons: row_too_large: 1 .*rejected.jsonl; fix the rows",
        report=True,
    ),
    **{
        f"data {kind} row larger than max_row_bytes": Case(
            f"data prepare {{cfg}} data.datasets.0.path={{ws}}/huge-row.{suffix} data.datasets.0.max_row_bytes=4096",
            r"1 of 3 rows \(33.3%\) were rejected, .* Top reasons: row_too_large: 1 .*rejected.jsonl; fix the rows",
            report=True,
        )
        for kind, suffix in (("CSV", "csv"), ("Parquet", "parquet"), ("JSON list", "json"))
    },
    "data row with a repeated key": Case(
        "data prepare {cfg} data.datasets.0.path={ws}/dup-key.jsonl",
        r"1 of 3 rows \(33.3%\) were rejected, .* Top reasons: duplicate_key: 1 .*rejected.jsonl; fix the rows",
        report=True,
    ),
    "messages as a string": Case(
        "data prepare {cfg} data.datasets.0.path={ws}/messages-string.jsonl",
        r"1 of 2 rows \(50.0%\) were rejected, .* Top reasons: wrong_type: 1 .*rejected.jsonl; fix the rows",
        report=True,
    ),
    "DPO pair over max_seq_length with overlong error": Case(
        "data prepare {cfg} data.datasets.0.path={ws}/long-pair.jsonl train.objective=dpo data.overlong=error "
        "data.max_seq_length=64",
        r"^Error: dataset 'long-pair.jsonl' row 1: \d+ tokens > max_seq_length 64 \(.*"
        r"long-pair.jsonl line 2; data.overlong=error\); raise data.max_seq_length",
        report=True,
    ),
    "qlora on widths not multiples of 64": Case(
        "train {cfg} lora.quantize=nf4",
        r"lora.quantize='nf4': model.name='.*' has hidden_size=32, and bitsandbytes' quantized linear layers need "
        r"input widths that are multiples of 64; use a model whose widths are, or lora.quantize=none",
    ),
    # eval, compare, export: every source and output checked before a model loads
    "compare with a missing run": Case(
        "compare {cfg} --model base={tiny} --model tuned=runs/nope --output {ws}/cmp",
        r"model source 'runs/nope' does not exist; give",
        10.0,
    ),
    "eval into a read-only directory": Case(
        "eval {cfg} --model {tiny} --output {ro}/eval", r"--output: cannot write into .*; choose a writable", 10.0
    ),
    "export of a missing run": Case(
        "export runs/does-not-exist {ws}/exported", r"'runs/does-not-exist' does not exist or is not a directory"
    ),
    "export into a read-only directory": Case(
        "export {run} {ro}/exported", r"export: cannot write into .*; choose a writable output directory"
    ),
    "export onto a full disk": Case(
        "export {run} {full}/exported",
        r"^Error: export: .*full ran out of space while the export was written .*nothing was left there",
    ),
    "export of a pipeline without a trained model": Case(
        "export {ws}/sdg-pipeline {ws}/exported",
        r"sdg-pipeline is a pipeline run with no trained model \(finished "
        r"stages: sdg\); run its train stage",
    ),
    "chat on a pipeline without a trained model": Case(
        "chat {ws}/sdg-pipeline", r"sdg-pipeline is a pipeline run with no trained model"
    ),
    "export of a pipeline stopped in its train stage": Case(
        "export {ws}/stopped-pipeline {ws}/exported",
        r"stopped-pipeline is a pipeline run whose train stage did not finish; run the pipeline again \(rayft run "
        r"CONFIG\), or give its stage's run directory .*stopped-pipeline/train to use its checkpoints",
    ),
    "chat on a pipeline stopped in its train stage": Case(
        "chat {ws}/stopped-pipeline", r"stopped-pipeline is a pipeline run whose train stage did not finish"
    ),
    "serve keys file that is a directory, as an override": Case(
        "serve {tiny} serve.api_keys_file={ws}",
        r"serve.api_keys_file='.*' is a directory, not a file; give the file of keys",
        20.0,
    ),
    "serve override of an unknown setting": Case("serve {tiny} serve.prot=8001", r"serve.prot"),
    "profile given a file": Case(
        "profile {ws}/data.jsonl", r"'.*data.jsonl' is a file; rayft profile takes a training run's directory"
    ),
    # expressions a config holds: compiled when it is validated, by `config validate` and every command alike
    **{
        f"{what} ({command.split()[0]})": Case(f"{command} {{ws}}/{file}", rf"{path} = {value}: {problem}")
        for what, file, path, value, problem in (
            (
                "regex reward that does not compile",
                "regex.yaml",
                r"train\.rl\.rewards\.0\.pattern",
                r"'\(unclosed'",
                r"not a regular expression \(missing \), unterminated subpattern at position 0\)",
            ),
            (
                "data template with an unclosed brace",
                "template.yaml",
                r"data\.datasets\.0\.input_template",
                r"'Q: \{question'",
                r"not a template \(.*\); write \{column\} placeholders",
            ),
            (
                "chat template that does not parse",
                "jinja.yaml",
                r"model\.chat_template",
                r"'\{% for m in messages %\}.*'",
                r"not a Jinja template \(.*line 1\); fix it",
            ),
        )
        for command in ("config validate", "train", "data prepare")
    },
    # one validator: what `rayft run` refuses, `rayft config validate` refuses
    **{
        f"rl and preference sections ({command.split()[0]})": Case(
            f"{command} {{ws}}/rl-pref.yaml", r"both an rl and a preference section: rayft run trains one of them"
        )
        for command in ("config validate", "run")
    },
    **{
        f"rl stage with a bad train section ({command.split()[0]})": Case(
            f"{command} {{cfg}} rl.train.learning_rate=-1",
            r"rl\.train\.learning_rate: Input should be greater than 0",
        )
        for command in ("config validate", "run")
    },
    "rl stage setting in its old place": Case(
        "config validate {cfg} rl.train.rl.group_size=4",
        r"rl\.train\.rl\.group_size is no longer read: the stage's own settings sit directly under rl; "
        r"write rl\.group_size",
    ),
    "run config without a stage": Case(
        "config validate {ws}/no-stage.yaml --command run", r"the config names no pipeline stage; add at least one"
    ),
    # credentials in a path or URL, whatever normalised it before it is shown
    "model URL with a password": Case(
        "train {cfg} model.name=https://bob:SECRETPW0123@host/m", r"'https:/bob:\*\*\*REDACTED\*\*\*@host/m'"
    ),
    "model URL with a token in the query": Case(
        "train {cfg} model.name=https://host/m?access_token=SECRETPW0123", r"access_token=\*\*\*REDACTED\*\*\*"
    ),
    # what a GRPO run asks for against what the model and the machine have, before anything starts
    "rl max_new_tokens past the context": Case(
        "train {cfg} train.objective=grpo data.packing=false train.rl.max_new_tokens=4000",
        r"train\.rl\.max_new_tokens=4000 after prompts of up to data\.max_seq_length=1024 tokens makes sequences "
        r"of up to 5024 tokens, but model\.name=.* takes 2048 \(its context\); lower train\.rl\.max_new_tokens "
        r"to at most 1024",
        10.0,
    ),
    "rl max_new_tokens of a billion": Case(
        "train {cfg} train.objective=grpo data.packing=false train.rl.max_new_tokens=1000000000",
        r"sequences of up to 1000001024 tokens, but .* takes 2048",
        10.0,
    ),
    "rl group_size of ten thousand": Case(
        "config validate {cfg} train.rl.group_size=10000",
        r"train\.rl\.group_size = 10000: Input should be less than or equal to 1024",
    ),
    "rl step larger than the machine's memory": Case(
        "train {cfg} train.objective=grpo data.packing=false train.rl.group_size=1024 train.micro_batch_size=1024",
        r"train\.rl\.group_size=1024: a step samples train\.micro_batch_size=1024 prompts x 1024 = 1048576 "
        r"completions .* holds at least [\d.]+ GiB \(KV cache and logits\), more than a node's [\d.]+ GiB; lower",
        20.0,
    ),
    "export of a missing checkpoint": Case(
        "export {run} {ws}/exported --checkpoint step-9",
        r"^Error: checkpoint 'step-9': the run has no complete checkpoint step-9 \(it has: step-000001; final/\)",
    ),
}


@pytest.fixture(scope="module")
def workspace(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Files the cases name: configs good and bad, a data file, broken model directories, a finished
    run, and a read-only directory (a read-only tmpfs where this process may mount one)."""
    ws = tmp_path_factory.mktemp("corpus")
    (ws / "binary.yaml").write_bytes(b"\xff\xfe\x00binary")
    (ws / "empty.yaml").write_text("")
    (ws / "dup.yaml").write_text("train:\n  max_steps: 1\nname: x\ntrain:\n  max_steps: 2\n")
    (ws / "data.jsonl").write_text(DATA_ROWS)
    (ws / "not-json.jsonl").write_text(DATA_ROWS.splitlines()[0] + "\nnot json\n")
    (ws / "mixed.jsonl").write_text(DATA_ROWS + '{"prompt": 3, "completion": " 3"}\n')
    (ws / "loop.jsonl").symlink_to(ws / "loop.jsonl")
    lines = DATA_ROWS.splitlines()
    huge = json.dumps({"prompt": "x" * 10_000, "completion": " 2"})
    (ws / "huge-row.jsonl").write_text(f"{lines[0]}\n{huge}\n{lines[1]}\n")
    write_huge_row_tables(ws)
    (ws / "dup-key.jsonl").write_text(DATA_ROWS + '{"prompt": "3 + 3 =", "completion": " 6", "completion": " 7"}\n')
    (ws / "messages-string.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "1 + 1 ="}, {"role": "assistant", "content": "2"}]}\n'
        '{"messages": "a string"}\n'
    )
    (ws / "long-pair.jsonl").write_text(
        '{"prompt": "1 + 1 =", "chosen": " 2", "rejected": " 3"}\n'
        + json.dumps({"prompt": "add " * 200 + "=", "chosen": " 2", "rejected": " 3"})
        + "\n"
    )
    stopped = ws / "stopped-pipeline"  # `rayft run` stopped in its train stage, before any stage finished
    build_run_dir(stopped / "train", tiny_model_dir, eval_losses={1: None}, method="lora", final=False)
    (stopped / "config.yaml").write_text("name: stopped-pipeline\n")
    (ws / "sdg-pipeline" / "stages").mkdir(parents=True)
    (ws / "sdg-pipeline" / "stages" / "sdg.json").write_text("{}")
    config = ws / "ok.yaml"
    config.write_text(
        f"name: corpus\nstorage_path: {ws / 'runs'}\nmodel: {{name: {tiny_model_dir}}}\nscaling: {{num_workers: 0}}\n"
        f"data: {{datasets: [{{path: {ws / 'data.jsonl'}}}]}}\neval: {{max_samples: 2}}\n"
    )
    write_bad_expressions(ws, tiny_model_dir)
    notok, emptycfg = ws / "notok", ws / "emptycfg"
    for broken in (notok, emptycfg):
        broken.mkdir()
        for name in ("config.json", "model.safetensors"):
            (broken / name).write_bytes((tiny_model_dir / name).read_bytes())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (emptycfg / name).write_bytes((tiny_model_dir / name).read_bytes())
    (emptycfg / "config.json").write_text("")
    run = build_run_dir(ws / "finished", tiny_model_dir, eval_losses={1: None}, method="full")
    build_run_dir(ws / "quickstart" / "train", tiny_model_dir, eval_losses={1: None}, method="lora")
    (ws / "quickstart" / "stages").mkdir()
    (ws / "quickstart" / "stages" / "train.json").write_text("{}")
    with tmpfs(ws / "ro", size_kib=64, readonly=True) as ro, tmpfs(ws / "full", size_kib=64) as full:
        yield {"ws": str(ws), "cfg": str(config), "tiny": str(tiny_model_dir), "notok": str(notok),
               "emptycfg": str(emptycfg), "run": str(run), "ro": str(ro), "full": str(full)}  # fmt: skip


def write_bad_expressions(ws: Path, tiny_model_dir: Path) -> None:
    """Configs that hold an expression that does not compile, and sections that cannot run together."""
    head = f"name: corpus\nstorage_path: {ws / 'runs'}\nscaling: {{num_workers: 0}}\n"
    model = f"model: {{name: {tiny_model_dir}}}\n"
    dataset = f"path: {ws / 'data.jsonl'}"
    data = f"data: {{datasets: [{{{dataset}}}], packing: false}}\n"
    (ws / "regex.yaml").write_text(
        head + model + data + "train: {objective: grpo, rl: {rewards: [{function: regex, pattern: '(unclosed'}]}}\n"
    )
    template = "format: template, input_template: 'Q: {question', output_template: '{answer}'"
    (ws / "template.yaml").write_text(head + model + f"data: {{datasets: [{{{dataset}, {template}}}]}}\n")
    chat = "chat_template: '{% for m in messages %}{{ m.content }}'"
    (ws / "jinja.yaml").write_text(head + f"model: {{name: {tiny_model_dir}, {chat}}}\n" + data)
    (ws / "rl-pref.yaml").write_text(head + model + data + "train: {}\nrl: {}\npreference: {}\n")
    (ws / "no-stage.yaml").write_text(head + model + data)


def write_huge_row_tables(ws: Path) -> None:
    """huge-row.csv, .parquet and .json: two good rows around one with a 2 MiB prompt, a cell that a
    4 KiB max_row_bytes rejects before parsing it (larger than pyarrow's 1 MiB CSV read block, which
    could not hold it: the file must not be refused for it)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in DATA_ROWS.splitlines()]
    rows.insert(1, {"prompt": "x" * (2 << 20), "completion": " 2"})
    table = pa.Table.from_pylist(rows)
    pacsv.write_csv(table, ws / "huge-row.csv")
    pq.write_table(table, ws / "huge-row.parquet")
    (ws / "huge-row.json").write_text(json.dumps(rows, indent=1))


def cli_env() -> dict[str, str]:
    """The environment of every command: offline, this checkout's rayft."""
    return {**os.environ, "PYTHONPATH": str(Path(rayft.__file__).parents[1]), "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def forks() -> Iterator[CliForks]:
    """One process whose forks run the commands that are not timed as a whole."""
    with CliForks(cli_env()) as server:
        yield server


def rayft_cli(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``python -m rayft ARGV`` offline, as a user would; return the result and its wall time."""
    env = {**cli_env(), "RAYFT_CACHE": str(cwd / ".cache")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rayft", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    return done, time.monotonic() - started


def forked_cli(forks: CliForks, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``rayft ARGV`` as :func:`rayft_cli` does, in a fork of ``forks``."""
    return forks.run(argv, cwd, {"RAYFT_CACHE": str(cwd / ".cache")})


def files_under(root: Path) -> set[str]:
    """Every file under ``root``, relative, but a command's own log and the tmpfs."""
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and "logs" not in p.parts and ".cache" not in p.parts
    }


def assert_one_line_error(done: subprocess.CompletedProcess[str], error: str) -> None:
    """Exit code 2, one ``Error:`` line, no traceback; ``error`` matches the message (the Error: line
    and, for a config with several problems, the lines listing them)."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    lines = done.stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Error:")]
    assert len(starts) == 1, output
    message = "\n".join(lines[starts[0] :])
    assert re.search(error, message, re.MULTILINE), message


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_gets_one_line_that_names_it_and_the_fix(
    name: str, workspace: dict[str, str], forks: CliForks
) -> None:
    case = CASES[name]
    ws = Path(workspace["ws"])
    before = files_under(ws)
    argv = case.argv.format(**workspace).split()
    done, elapsed = rayft_cli(argv, cwd=ws) if case.within_s is not None else (forked_cli(forks, argv, ws), 0.0)
    assert_one_line_error(done, case.error)
    if case.within_s is not None:
        assert elapsed < case.within_s, f"{name}: {elapsed:.1f} s"
    left = files_under(ws) - before
    allowed = {f"runs/corpus/{layout.CONFIG_FILE}"}
    if case.report:
        allowed |= {f"runs/corpus/{layout.DATA_DIR}/rejected.jsonl", f"runs/corpus/{layout.DATA_DIR}/stats.json"}
    assert left <= allowed, f"{name} left {sorted(left)}"


def test_a_run_whose_start_failed_does_not_block_the_corrected_command(
    workspace: dict[str, str], forks: CliForks
) -> None:
    """A bad data path leaves the run's config behind: the next command (another mistake here, so that
    nothing trains) starts the run again, with or without --resume and with changed settings."""
    ws = Path(workspace["ws"])
    cfg = workspace["cfg"]
    bad_data = f"data.datasets.0.path={ws}/missing.jsonl"
    done = forked_cli(forks, ["train", cfg, "name=retry", bad_data], ws)
    assert_one_line_error(done, "missing.jsonl': no such file")
    assert (ws / "runs" / "retry" / layout.CONFIG_FILE).is_file()
    for resume in ([], ["--resume"]):
        done = forked_cli(forks, ["train", cfg, "name=retry", f"model.name={workspace['notok']}", *resume], ws)
        assert_one_line_error(done, "has no tokenizer")
        assert "starting again: the earlier start of this run stopped before it trained a step" in done.stderr


def test_a_pipeline_directory_is_exported_as_its_trained_model(workspace: dict[str, str], forks: CliForks) -> None:
    """`rayft export runs/quickstart` (the directory `make quickstart` names) exports the model its train
    stage made, and says which."""
    ws = Path(workspace["ws"])
    done = forked_cli(forks, ["export", str(ws / "quickstart"), str(ws / "exported-pipeline")], ws)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{ws / 'quickstart'} is a pipeline run; using its trained model in {ws / 'quickstart' / 'train'}" in (
        done.stdout + done.stderr
    )
    assert (ws / "exported-pipeline" / "config.json").is_file()
