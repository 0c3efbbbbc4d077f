"""What a Ray Train worker runs: the function the launcher hands Ray Train
(:func:`rayft.training.driver.launcher.launch_ray`), which sets the worker process up and runs the
training loop in it."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any

from rayft.cache import cache_root
from rayft.console import quiet_worker_console
from rayft.models.loading import hide_unused_bitsandbytes
from rayft.runs.store import open_store
from rayft.security import install_redaction
from rayft.training.loop.session import RaySession
from rayft.training.loop.worker import run_worker
from rayft.training.loop.worker_plan import WorkerPlan

log = logging.getLogger("rayft.train")


def ray_worker_entry(config: dict[str, Any]) -> None:
    """The function each Ray Train worker runs (in a thread of its own; the process's main thread
    runs Ray's task loop; ``config["methods"]``: the registry's catalog of training methods). For a run at
    a URI the worker works in a directory of its own node."""
    plan: WorkerPlan = config["plan"]
    install_redaction()  # also where Ray was started by the caller, without rayft's worker set-up hook
    quiet_worker_console()
    if config.get("idle_main_thread"):
        idle_main_thread()
    if plan.task is None:  # a custom task's own code may use bitsandbytes
        hide_unused_bitsandbytes(plan.model, plan.lora.applied_quantize(plan.train.method))
    plan = dataclasses.replace(plan, location=plan.location.on_node(cache_root()))
    session = RaySession(config["files"], plan.location, num_to_keep=plan.checkpoint.num_to_keep)
    run_worker(plan, session, config["methods"])
    open_store(plan.location).drop_local_copy()  # with a URI, nothing of a finished run needs to stay on this node


def idle_main_thread() -> bool:
    """Put this process's main thread under ``SCHED_IDLE``, from another thread; returns whether it
    changed (not on the main thread itself, nor off Linux, nor where the kernel refuses).

    In a Ray worker the main thread runs Ray core's task loop: it wakes every 10 ms to check for
    signals (taking the GIL from the training thread to do so) and answers the controller's health
    polls. At normal priority each wake-up preempts a training thread, of this worker or of the
    other, which the other then waits for at the next gradient all-reduce. Under ``SCHED_IDLE`` it
    runs when a core would otherwise idle, or at the end of a scheduler slice, and still makes
    progress. Threads start with the policy of the thread that starts them: the training thread,
    and the threads it starts later (checkpoint uploads, data prefetching), keep normal priority;
    Ray and gloo started theirs before the training function ran. An unprivileged process cannot
    set the policy back, so this is only for a Ray that ends with the command.
    """
    main = threading.main_thread()
    if threading.current_thread() is main or main.native_id is None or not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        os.sched_setscheduler(main.native_id, os.SCHED_IDLE, os.sched_param(0))
    except OSError:  # a kernel or sandbox that refuses: the main thread keeps its priority
        log.debug("could not put the Ray worker's main thread at idle priority", exc_info=True)
        return False
    return True
