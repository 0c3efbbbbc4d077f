"""Training input on Ray Train: each worker reads its own rows of the prepared files, so the
driver process reads none of the split (measured by the kernel's count of the bytes it reads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData, PreparedSplit
from tests.support.runs import tiny_config

pytestmark = pytest.mark.integration

ROWS = 16_384
SEQ = 256


def _bytes_read() -> int:
    """The bytes this process has read so far, through any system call (``rchar``, all threads)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def _large_split(root: Path) -> PreparedData:
    """A prepared training split of ``ROWS`` random units of ``SEQ`` tokens, written uncompressed (so
    its bytes on disk are the bytes a reader must read), in row groups of 2,048 units as
    preparation writes them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    offsets = pa.array(np.arange(0, (ROWS + 1) * SEQ, SEQ, dtype=np.int32))

    def lists(values: object) -> pa.Array:
        return pa.ListArray.from_arrays(offsets, pa.array(values, type=pa.int32()))

    tokens = rng.integers(3, 100, size=ROWS * SEQ, dtype=np.int32)
    table = pa.table({
        "input_ids": lists(tokens), "labels": lists(tokens), "position_ids": lists(np.tile(np.arange(SEQ), ROWS)),
        "sample_ids": pa.array([[i] for i in range(ROWS)], type=pa.list_(pa.int64())),
        "num_tokens": pa.array(np.full(ROWS, SEQ, dtype=np.int32)),
        "num_label_tokens": pa.array(np.full(ROWS, SEQ, dtype=np.int32)),
    })  # fmt: skip
    (root / "train").mkdir(parents=True)
    path = root / "train" / "part-00000.parquet"
    pq.write_table(table, path, row_group_size=2048, compression="none", use_dictionary=False)
    split = PreparedSplit((str(path),), ROWS, ROWS, ROWS * SEQ, ROWS * SEQ)
    return PreparedData("test-large", str(root), split, None, packed=False, max_seq_length=SEQ)


def test_the_driver_reads_none_of_the_training_split(ray_session: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    import ray.train.torch  # noqa: F401 - its modules' first import would count as bytes read

    from rayft.runs.location import RunLocation
    from rayft.runs.manifest import read_manifest
    from rayft.training.driver.run import default_launcher
    from rayft.training.driver.startup import build_worker_plan, claim_run_dir

    prepared = _large_split(tmp_path / "units")
    split_bytes = Path(prepared.train.files[0]).stat().st_size
    assert split_bytes > 40 * 2**20
    cfg = tiny_config(tiny_model_dir, tmp_path / "runs", "train.max_steps=2", "train.eval_steps=null",
                      "train.save_steps=100", "data.shuffle_buffer_size=64", "scaling.num_workers=1")  # fmt: skip
    run_dir = claim_run_dir(cfg, resume=False)
    plan = build_worker_plan(cfg, prepared, RunLocation(run_dir))
    before = _bytes_read()
    default_launcher(cfg).launch(plan, prepared)
    read = _bytes_read() - before
    manifest = read_manifest(run_dir / "final")
    assert manifest is not None and manifest.step == 2  # the workers did read their rows and train
    assert read < split_bytes / 8, f"the driver read {read / 2**20:.1f} MiB of a {split_bytes / 2**20:.1f} MiB split"


def test_a_worker_that_cannot_read_the_prepared_files_fails_at_once_naming_them(
    ray_session: None, tiny_model_dir: Path, arithmetic_units: PreparedData, tmp_path: Path
) -> None:
    import dataclasses

    from rayft.errors import DataError
    from rayft.runs.location import RunLocation
    from rayft.training.driver.run import default_launcher
    from rayft.training.driver.startup import build_worker_plan, claim_run_dir

    # As on a node that does not mount the data cache: the files the driver names are not there.
    elsewhere = str(tmp_path / "not-mounted" / "part-00000.parquet")
    prepared = dataclasses.replace(
        arithmetic_units, train=dataclasses.replace(arithmetic_units.train, files=(elsewhere,))
    )
    cfg = tiny_config(tiny_model_dir, tmp_path / "runs", "failure.max_failures=0", "scaling.num_workers=1")
    run_dir = claim_run_dir(cfg, resume=False)
    with pytest.raises(
        DataError, match=rf"rank \d on node .* cannot read the prepared file {elsewhere};.*data\.cache_dir"
    ):
        default_launcher(cfg).launch(build_worker_plan(cfg, prepared, RunLocation(run_dir)), prepared)
