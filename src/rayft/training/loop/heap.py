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
