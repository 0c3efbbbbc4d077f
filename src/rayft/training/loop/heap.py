"""How a worker's C heap hands freed memory back to the system (glibc's ``mallopt``).

torch allocates a CPU tensor's memory with ``malloc``. glibc maps blocks above its mmap threshold on
their own and unmaps them when they are freed, but it raises that threshold (up to 32 MiB) each time
such a block is freed: after a few steps, activations and gradients of up to 32 MiB come from the
heap's arenas, whose freed pages it keeps. A worker's resident set then stays at its largest step's
working set plus the arenas' fragmentation, several times the memory in use. A fixed threshold turns
the raising off, so the blocks of a step go back to the system when the step frees them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger("rayft.train")

# mallopt's parameter number for the mmap threshold (glibc's malloc.h).
M_MMAP_THRESHOLD = -3


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, or None where the C library is another one (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None


def set_mmap_threshold(threshold_bytes: int | None) -> bool:
    """Fix glibc's mmap threshold at ``threshold_bytes`` for this process; returns whether it was set.

    Nothing changes with None, without glibc, or when ``MALLOC_MMAP_THRESHOLD_`` is set in the
    environment (the user's own setting wins).
    """
    libc = _glibc()
    if threshold_bytes is None or libc is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    if libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(threshold_bytes)) != 1:
        log.warning("could not set the C heap's mmap threshold to %d bytes; memory freed by a step may stay "
                    "with the process", threshold_bytes)  # fmt: skip
        return False
    return True


def release_free_memory() -> bool:
    """Hand the memory glibc's heap keeps free back to the system now (``malloc_trim(0)``, which also
    releases whole free pages inside the heap); whether it could. For a process that goes on after a
    run (an in-process run, then its evaluation): what the run's steps freed would stay resident."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(ctypes.c_size_t(0))
    return True


# jemalloc's settings for a training process, as PyTorch's CPU launcher (torch.backends.xeon.run_cpu) sets
# them: freed pages stay with the process for reuse (no decay, so no step faults its blocks anew); blocks of
# any size come from dedicated extents (oversize_threshold:1) and one background thread does the purging.
# What they gave, by kind of run (lower in one process, mixed per worker, far higher for GRPO), is in
# docs/performance.md.
JEMALLOC_CONF = (
    "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"
)

# Where a system's package manager puts jemalloc (Debian/Ubuntu's libjemalloc2, Fedora's jemalloc, a
# conda environment's or a local build's).
JEMALLOC_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
JEMALLOC_NAMES = ("libjemalloc.so.2", "libjemalloc.so")
JEMALLOC_HINT = "install it (apt-get install libjemalloc2, dnf install jemalloc, conda install jemalloc)"


def find_jemalloc(prefixes: tuple[str, ...], exists: Callable[[str], bool] = os.path.isfile) -> str | None:
    """The path of jemalloc's shared library in an environment's ``lib`` (``prefixes``: sys.prefix, a
    conda prefix) or the system's library directories, or None."""
    dirs = [f"{p}/lib" for p in prefixes if p] + list(JEMALLOC_DIRS)
    return next((f"{d}/{n}" for d in dirs for n in JEMALLOC_NAMES if exists(f"{d}/{n}")), None)


@dataclass(frozen=True)
class AllocatorPlan:
    """The C allocator the training workers run with: the variables their processes start with, and the
    one line the console says about it."""

    name: str
    env_vars: dict[str, str]
    note: str


def plan_allocator(
    choice: str,
    threshold_bytes: int | None,
    environ: Mapping[str, str],
    jemalloc: str | None,
    *,
    local: bool = True,
    samples: bool = False,
) -> AllocatorPlan:
    """Which allocator the workers use for ``train.allocator`` = ``choice`` ('auto', 'glibc', 'jemalloc'),
    given ``train.malloc_mmap_threshold_bytes``, the launching environment, the jemalloc library found on
    this machine (:func:`find_jemalloc`, None when there is none), whether the workers run on a Ray this
    process started (``local``: on this machine, where that library is) and whether they run GRPO
    (``samples``). A preload or a ``MALLOC_CONF`` of the user's own wins. Raises ValueError when 'jemalloc' is
    asked for and not found."""
    own = [k for k in ("LD_PRELOAD", "MALLOC_CONF") if environ.get(k)]
    if own:
        return AllocatorPlan("the environment's", {}, f"workers' allocator: the environment's ({', '.join(own)} set)")
    if choice == "glibc" or (choice == "auto" and threshold_bytes is not None):
        return AllocatorPlan("glibc", {}, "workers' allocator: glibc's")
    if choice == "auto" and not local:
        # A joined cluster's nodes may not have the library where this machine has it.
        return AllocatorPlan("glibc", {}, "workers' allocator: glibc's (a joined cluster; train.allocator=jemalloc "
                             "where every node has jemalloc)")  # fmt: skip
    if choice == "auto" and samples:
        # Measured: GRPO workers on jemalloc (these settings keep every freed page) grew past 9 GiB within 7
        # steps where glibc's peaked at 3.3 GiB, in the training part of each step (docs/performance.md).
        return AllocatorPlan("glibc", {}, "workers' allocator: glibc's (GRPO's workers keep it)")
    if jemalloc is None:
        if choice == "jemalloc":
            raise ValueError(
                f"train.allocator=jemalloc, but no jemalloc library is in {', '.join(JEMALLOC_DIRS)} or the "
                f"environment's lib: {JEMALLOC_HINT}, or set train.allocator=auto"
            )
        return AllocatorPlan(
            "glibc", {},
            f"workers' allocator: glibc's (jemalloc not found; {JEMALLOC_HINT} to try it)",
        )  # fmt: skip
    return AllocatorPlan(
        "jemalloc", {"LD_PRELOAD": jemalloc, "MALLOC_CONF": JEMALLOC_CONF}, f"workers' allocator: jemalloc ({jemalloc})"
    )


def loaded_allocator(maps: str) -> str:
    """'jemalloc' when a process's memory map (``/proc/self/maps``) has jemalloc loaded, else 'the C library's'."""
    return "jemalloc" if "libjemalloc" in maps else "the C library's"


def process_allocator() -> str:
    """The allocator this process runs with, by its memory map (Linux; 'unknown' elsewhere)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return loaded_allocator(maps.read())
    except OSError:
        return "unknown"
