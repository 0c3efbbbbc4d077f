"""The worker's C heap setting: a fixed mmap threshold hands the blocks a step frees back to the system."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rayft.training.loop.heap import _glibc, find_jemalloc, set_mmap_threshold

# A fresh process: frees an 8 MiB block (which raises glibc's own threshold to 8 MiB), then allocates fifty
# 2 MiB blocks, each pinned in place by a 256 KiB block after it, frees them, and reports the heap's free bytes.
HEAP = """
import ctypes, json, sys
from rayft.training.loop.heap import set_mmap_threshold
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
threshold = json.loads(sys.argv[1])
applied = set_mmap_threshold(threshold)
libc.free(libc.malloc(8 << 20))
blocks = [(libc.malloc(2 << 20), libc.malloc(256 << 10)) for _ in range(50)]
for block, _ in blocks:
    libc.free(block)
print(json.dumps({"applied": applied, "kept_free": libc.mallinfo2().fordblks}))
"""

needs_glibc = pytest.mark.skipif(_glibc() is None, reason="glibc's mallopt: Linux with glibc only")


def fresh_process(script: str, *args: str, **env: str) -> dict[str, int]:
    """What ``script`` reports (one JSON line) in a fresh process, without the caller's MALLOC_ settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=True,
                          env={**clean, **env}, timeout=60)  # fmt: skip
    return dict(json.loads(done.stdout))


def freed_and_kept(threshold: int | None, **env: str) -> dict[str, int]:
    """What the fresh process reports with ``threshold`` (and extra environment variables)."""
    return fresh_process(HEAP, json.dumps(threshold), **env)


@needs_glibc
def test_a_fixed_threshold_returns_freed_blocks_that_glibc_keeps_by_default() -> None:
    default, fixed = freed_and_kept(None), freed_and_kept(1 << 20)
    assert not default["applied"] and fixed["applied"]
    assert default["kept_free"] >= 90 << 20  # the fifty 2 MiB blocks stay in the heap
    assert fixed["kept_free"] < 4 << 20  # mapped on their own, unmapped when freed


@needs_glibc
def test_the_users_environment_setting_wins() -> None:
    assert not freed_and_kept(1 << 20, MALLOC_MMAP_THRESHOLD_="16777216")["applied"]


def test_none_leaves_the_heap_as_it_is() -> None:
    assert set_mmap_threshold(None) is False


# A fresh process: 100 MiB of touched 2 MiB blocks freed into the heap (after glibc raised its threshold),
# its resident set then, and after release_free_memory.
RELEASE = """
import ctypes, json, psutil
from rayft.training.loop.heap import release_free_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
libc.free(libc.malloc(8 << 20))
blocks = [(libc.malloc(2 << 20), libc.malloc(256 << 10)) for _ in range(50)]
for block, _ in blocks:
    libc.memset(block, 1, 2 << 20)
    libc.free(block)
kept = psutil.Process().memory_info().rss
released = release_free_memory()
print(json.dumps({"released": released, "dropped_mib": (kept - psutil.Process().memory_info().rss) >> 20}))
"""


@needs_glibc
def test_what_the_heap_keeps_goes_back_to_the_system_when_released() -> None:
    report = fresh_process(RELEASE)
    assert report["released"] and report["dropped_mib"] >= 90, report


JE = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"  # a library path for the pure plans below


@pytest.mark.parametrize(
    ("choice", "threshold", "environ", "found", "name"),
    [
        ("auto", None, {}, JE, "jemalloc"),
        ("jemalloc", None, {}, JE, "jemalloc"),
        ("auto", None, {}, None, "glibc"),
        ("glibc", None, {}, JE, "glibc"),
        ("auto", 1 << 20, {}, JE, "glibc"),  # the threshold is glibc's: asking for it asks for glibc
        ("auto", None, {"LD_PRELOAD": "/opt/libtcmalloc.so"}, JE, "the environment's"),
        ("jemalloc", None, {"MALLOC_CONF": "narenas:1"}, JE, "the environment's"),
    ],
)
def test_the_workers_allocator_plan(
    choice: str, threshold: int | None, environ: dict[str, str], found: str | None, name: str
) -> None:
    from rayft.training.loop.heap import JEMALLOC_CONF, plan_allocator

    plan = plan_allocator(choice, threshold, environ, found)
    assert plan.name == name
    assert plan.env_vars == ({"LD_PRELOAD": JE, "MALLOC_CONF": JEMALLOC_CONF} if name == "jemalloc" else {})
    assert plan.note.startswith("workers' allocator: ")
    if name == "glibc" and found is None:
        assert "apt-get install libjemalloc2" in plan.note


def test_asking_for_jemalloc_where_there_is_none_says_how_to_install_it() -> None:
    from rayft.training.loop.heap import plan_allocator

    with pytest.raises(ValueError, match=r"train.allocator=jemalloc.*apt-get install libjemalloc2.*allocator=auto"):
        plan_allocator("jemalloc", None, {}, None)


def test_jemalloc_is_found_in_the_environment_before_the_system() -> None:
    from rayft.training.loop.heap import find_jemalloc

    present = {"/env/lib/libjemalloc.so", JE}
    assert find_jemalloc(("/env",), present.__contains__) == "/env/lib/libjemalloc.so"
    assert find_jemalloc(("/other", ""), present.__contains__) == JE
    assert find_jemalloc(("/other",), lambda _: False) is None


def test_a_process_map_tells_which_allocator_is_loaded() -> None:
    from rayft.training.loop.heap import loaded_allocator, process_allocator

    assert loaded_allocator(f"7f00-7f10 r-xp 00000000 08:01 12 {JE}\n") == "jemalloc"
    assert loaded_allocator("7f00-7f10 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6\n") != "jemalloc"
    assert process_allocator() == "the C library's"  # the tests run on the C library's own


@pytest.mark.skipif(find_jemalloc((sys.prefix,)) is None, reason="needs libjemalloc2 (apt-get install libjemalloc2)")
def test_a_process_started_with_the_plans_variables_runs_on_jemalloc() -> None:
    from rayft.training.loop.heap import plan_allocator

    plan = plan_allocator("auto", None, {}, find_jemalloc((sys.prefix,)))
    code = "from rayft.training.loop.heap import process_allocator; print(process_allocator())"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **plan.env_vars}, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "jemalloc"
    assert out.stderr == ""


def test_a_glibc_threshold_with_jemalloc_is_refused() -> None:
    from pydantic import ValidationError

    from rayft.config.train import TrainConfig

    with pytest.raises(ValidationError, match="is glibc's setting, but train.allocator is 'jemalloc'"):
        TrainConfig(allocator="jemalloc", malloc_mmap_threshold_bytes=1 << 20)


def test_workers_that_sample_keep_glibc_unless_jemalloc_is_named() -> None:
    from rayft.training.loop.heap import plan_allocator

    assert plan_allocator("auto", None, {}, JE, samples=True).name == "glibc"
    assert plan_allocator("jemalloc", None, {}, JE, samples=True).name == "jemalloc"


def test_a_joined_cluster_takes_jemalloc_only_when_it_is_named() -> None:
    from rayft.training.loop.heap import plan_allocator

    joined = plan_allocator("auto", None, {}, JE, local=False)
    assert (joined.name, joined.env_vars) == ("glibc", {})
    assert "train.allocator=jemalloc" in joined.note
    assert plan_allocator("jemalloc", None, {}, JE, local=False).name == "jemalloc"
