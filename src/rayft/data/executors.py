"""Running preparation's window tasks (see :mod:`rayft.data.windows`): in this process, or as a Ray
Data job across the cluster's CPUs. Both give the same bytes, and both yield the windows' one-row
summaries in window order, one at a time, so the caller can add them up and stop early."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rayft.data.tokenize import job_key
from rayft.data.windows import WindowSettings, prepare_window, run_window_block
from rayft.runtime import ray_runtime

if TYPE_CHECKING:
    import pyarrow as pa

    from rayft.data.tokenize import TokenizeJob


def windows_in_process(
    job: TokenizeJob, settings: WindowSettings, blocks: Sequence[pa.Table]
) -> Iterator[dict[str, Any]]:
    """Prepare the windows one after the other in this process."""
    for block in blocks:
        yield prepare_window(job, settings, block).to_pylist()[0]


def windows_on_ray(
    job: TokenizeJob, settings: WindowSettings, blocks: Sequence[pa.Table], address: str | None = None
) -> Iterator[dict[str, Any]]:
    """Prepare the windows as a Ray Data job, one ``map_batches`` task of 1 CPU per window (a block).

    Uses the Ray already initialised in this process, else joins ``address`` or starts a local one.
    Tasks run in Ray's pooled worker processes; each process deserialises the job (the tokenizer)
    once per job content and keeps it for later windows (see :func:`rayft.data.tokenize.load_job`).
    """
    with ray_runtime(address):
        yield from _windows_on_ray(job, settings, blocks)


def _windows_on_ray(job: TokenizeJob, settings: WindowSettings, blocks: Sequence[pa.Table]) -> Iterator[dict[str, Any]]:
    """The Ray Data job: every window is one block, handed whole to one task (``batch_size=None``, so
    no batch spans two windows or splits one), and the summaries come back in window order.

    Ray Data's operator resource reservation is off for this dataset: with it (Ray 2.60) the
    executor gave the operator a budget of 0 CPUs until its first task's output size was known,
    then handed a freed CPU over one executor tick (~0.1-0.2 s) late; measured on 2 CPUs, the CPUs
    were busy 71-74% of the job with it and 94-96% without it.
    """
    import ray

    source = ray.data.from_arrow(list(blocks))
    source.context.op_resource_reservation_enabled = False  # this dataset's copy of the context only
    source.context.execution_options.preserve_order = True
    # The job's ref goes in a list so that Ray passes the ref, not the job: a worker that already
    # holds this job (same content key) skips fetching it.
    dataset = source.map_batches(
        run_window_block,
        fn_kwargs={"job_key": job_key(job), "job_ref": [ray.put(job)], "settings": settings},
        batch_size=None,
        batch_format="pyarrow",
        num_cpus=1,
    )
    yield from dataset.iter_rows()
