"""Running a tokenize job over the input rows: in this process, or as a Ray Data job across the
cluster's CPUs. Both give the same bytes; the caller sorts the result by sample id."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayft.data.tokenize import as_table, job_key, tokenize_batch
from rayft.runtime import ray_runtime

if TYPE_CHECKING:
    import pyarrow as pa

    from rayft.data.tokenize import TokenizeJob


BATCH_ROWS = 256


def tokenize_in_process(job: TokenizeJob, inputs: pa.Table) -> pa.Table:
    """Tokenize in this process, batch by batch."""
    import pyarrow as pa

    parts = [
        as_table(job(inputs.slice(start, BATCH_ROWS).to_pydict())) for start in range(0, inputs.num_rows, BATCH_ROWS)
    ]
    return pa.concat_tables(parts)


def tokenize_on_ray(job: TokenizeJob, inputs: pa.Table, address: str | None = None) -> pa.Table:
    """Tokenize with Ray Data ``map_batches`` tasks across the cluster's CPUs, one block of rows each.

    Uses the Ray already initialised in this process, else joins ``address`` or starts a local one.
    Tasks run in Ray's pooled worker processes; each process deserialises the job (the tokenizer)
    once per job content and keeps it for later blocks (see :func:`rayft.data.tokenize.tokenize_batch`).
    """
    with ray_runtime(address):
        return _tokenize_on_ray(job, inputs)


def block_rows(num_rows: int, num_cpus: int, *, tasks_per_cpu: int = 4, smallest: int = BATCH_ROWS) -> int:
    """Rows per block (one tokenization task each): about ``tasks_per_cpu`` tasks per CPU, so every
    CPU stays busy until close to the end while each task stays long enough to amortise its fixed
    cost (a task and its arguments and result crossing the object store), and never under ``smallest``."""
    return max(smallest, -(-num_rows // max(1, num_cpus * tasks_per_cpu)))


def _tokenize_on_ray(job: TokenizeJob, inputs: pa.Table) -> pa.Table:
    """A Ray Data job: the rows in blocks of :func:`block_rows`, one ``map_batches`` task of 1 CPU each.

    Ray Data's operator resource reservation is off for this dataset: with it (Ray 2.60) the
    executor gave the tokenize operator a budget of 0 CPUs until its first task's output size was
    known, then handed a freed CPU over one executor tick (~0.1-0.2 s) late; measured on 2 CPUs, the
    CPUs were busy 71-74% of the job with it and 94-96% without it.
    """
    import pyarrow as pa
    import ray

    size = block_rows(inputs.num_rows, int(ray.cluster_resources().get("CPU", 1)))
    # Slices share the input's buffers; Ray's Arrow serializer sends each block's own rows only.
    blocks = [inputs.slice(start, size) for start in range(0, inputs.num_rows, size)]
    source = ray.data.from_arrow(blocks)
    source.context.op_resource_reservation_enabled = False  # this dataset's copy of the context only
    # The job's ref goes in a list so that Ray passes the ref, not the job: a worker that already
    # holds this job (same content key) skips fetching it.
    dataset = source.map_batches(
        tokenize_batch,
        fn_kwargs={"job_key": job_key(job), "job_ref": [ray.put(job)]},
        batch_size=size,
        batch_format="pyarrow",
        num_cpus=1,
    )
    return pa.concat_tables(ray.get(dataset.to_arrow_refs()))
