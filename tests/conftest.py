"""Shared fixtures: a tiny model built once per run (pytest-xdist's workers share it), and one local Ray
for integration tests."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from tests.support.once import once_per_run
from tests.support.runs import RESUME_RUN, tiny_config, train_on

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# The tests' loop callbacks (tests.support.faults, in train.callbacks) are imported by Ray workers and by
# rayft subprocesses, which start in other directories: they find this checkout through PYTHONPATH.
if str(REPO) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
GSM8K_TRAIN = SHARED / "datasets" / "gsm8k" / "train.jsonl"

# Each fixture's set-up and each test phase timed into RAYFT_TEST_TIMINGS where it is set; the
# integration and chaos files handed to pytest-xdist's workers longest first.
pytest_plugins = ["tests.support.timings", "tests.support.ordering"]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokenized-data caches go to a per-session temp dir; converted built-in models are shared."""
    if "RAYFT_TEST_KEEP_CACHE" not in os.environ:
        monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path_factory.getbasetemp() / "data-cache"))


@pytest.fixture(scope="session")
def tiny_model_dir(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init 2-layer Llama with a tiny BPE tokenizer and a ChatML template."""
    from rayft.testing import build_tiny_model

    return once_per_run(pytestconfig, tmp_path_factory, "tiny-model", build_tiny_model, dump=str, load=Path)


@pytest.fixture(scope="session")
def tiny_t5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init 2-layer T5 v1.1 (gated feed-forward) with the tiny tokenizer, no chat template."""
    from rayft.testing import build_tiny_t5

    return build_tiny_t5(tmp_path_factory.mktemp("tiny-t5"))


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray (2 CPUs) shared by every integration test of this pytest process (each
    pytest-xdist worker has its own)."""
    import ray

    from rayft.testing.ray_cluster import start_local_ray

    start_local_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def qlora_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama at width 128: bitsandbytes' CPU 4-bit kernels take input widths in blocks of 64."""
    from rayft.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-128"), hidden_size=128)


@pytest.fixture(scope="session")
def qlora_units(qlora_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    """16 training units of arithmetic problems for the width-128 model."""
    from transformers import AutoTokenizer

    from rayft.testing.units import arithmetic_prepared

    tokenizer = AutoTokenizer.from_pretrained(qlora_model_dir)
    return arithmetic_prepared(tmp_path_factory.mktemp("units-128"), tokenizer, num_train=16)


@pytest.fixture(scope="session")
def arithmetic_units(
    pytestconfig: pytest.Config, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> PreparedData:
    """64 training and 8 validation units of arithmetic problems (sample ids 0..63 for training)."""
    from rayft.config import ModelConfig
    from rayft.models.loading import load_tokenizer
    from rayft.testing.units import arithmetic_prepared

    def build(root: Path) -> PreparedData:
        tokenizer = load_tokenizer(ModelConfig(name=str(tiny_model_dir)))
        return arithmetic_prepared(root, tokenizer, num_train=64, num_validation=8)

    return once_per_run(
        pytestconfig, tmp_path_factory, "units", build, dump=PreparedData.to_json, load=PreparedData.from_json
    )


@pytest.fixture(scope="session")
def uninterrupted_run(
    pytestconfig: pytest.Config,
    ray_session: None,
    tiny_model_dir: Path,
    arithmetic_units: PreparedData,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The run directory of :data:`RESUME_RUN` trained without interruption on 2 workers: the
    reference of every test that kills a run and resumes it (trained once per pytest run: the workers
    of pytest-xdist share it, as they share the model and units it is trained from)."""

    def build(storage: Path) -> Path:
        return train_on(tiny_config(tiny_model_dir, storage, *RESUME_RUN), arithmetic_units)

    return once_per_run(pytestconfig, tmp_path_factory, "uninterrupted", build, dump=str, load=Path)


# Skip reasons that name a test component CI installs (`.ci/run`, `make setup`). Where CI=true, a test
# skipped for one of them fails instead: a component that did not install must not pass silently.
CI_COMPONENTS = ("chromium", "prometheus", "promtool", "moto", "optuna", "rayft[tune]", "rayft[mlflow]",
                 "'mlflow'", "'mkdocs'", "'material'", "'nbformat'", "'nbclient'", "'openai'", "'trl'",
                 "'bitsandbytes'", "libjemalloc2", "'llguidance'", "'llama_cpp'")  # fmt: skip


def missing_ci_component(reason: str) -> str | None:
    """The CI component a skip reason names, if any (matched case-insensitively)."""
    lowered = reason.lower()
    return next((name for name in CI_COMPONENTS if name in lowered), None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI=true, turn a skip for a missing CI component into a failure that names it."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or os.environ.get("CI", "").lower() != "true" or not isinstance(report.longrepr, tuple):
        return
    reason = str(report.longrepr[2])
    component = missing_ci_component(reason)
    if component is not None:
        report.outcome = "failed"
        report.longrepr = f"CI=true and a test component is missing ({component}): {reason}"


@pytest.fixture(autouse=True)
def _no_placement_group_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test on the shared Ray, no placement group of its making may stay reserved: the
    tests after it on this Ray would find those CPUs held and fail to reserve their own workers, for
    a reason that is not theirs. A group first seen after a test is that test's (or its fixtures').

    A group made by this test process (an in-process run, sweep or probe that did not free its
    workers' reservation) fails the test. A group of another job, a driver process the test started
    and has seen end, is Ray's to remove when that job ends; where Ray has not within a grace, it is
    removed here and reported as a warning (drivers killed mid-run by the chaos tests are such jobs)."""
    yield
    if "ray_session" not in request.fixturenames:
        return
    import ray

    from tests.support.ray_state import live_placement_groups, remove_placement_groups

    if not ray.is_initialized():
        return
    new = {k: v for k, v in live_placement_groups().items() if k not in _KNOWN_GROUPS}
    _KNOWN_GROUPS.update(new)
    left = remove_placement_groups(new, grace_s=GROUP_GRACE_S) if new else {}
    ours = ray.get_runtime_context().get_job_id()
    of_others = {k: v for k, v in left.items() if v["job"] != ours}
    if of_others:
        warnings.warn(
            f"placement groups of an ended job left reserved {GROUP_GRACE_S} s after {request.node.nodeid} (removed): "
            f"{of_others}",
            stacklevel=1,
        )
    if len(left) > len(of_others):
        mine = {k: v for k, v in left.items() if k not in of_others}
        pytest.fail(f"{request.node.nodeid} left placement groups reserved on the shared Ray (removed): {mine}")


GROUP_GRACE_S = 30
"""How long Ray has to remove an ended job's placement groups before a test's guard does."""

_KNOWN_GROUPS: set[str] = set()
"""The placement groups of this process's shared Ray that a test has already been checked for."""
