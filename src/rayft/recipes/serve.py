"""``rayft serve SOURCE...``: run directories, checkpoints, exports or model names behind an
OpenAI-compatible API on Ray Serve, until shut down.

    rayft serve runs/my-run runs/other-run --port 8000
"""

from __future__ import annotations

import contextlib
import logging

from rayft.config import RayftConfig
from rayft.runtime import ray_runtime
from rayft.serving import app
from rayft.serving.handle import ServeHandle
from rayft.serving.keys import load_key_digests
from rayft.serving.plan import plan_serving
from rayft.serving.vllm import start_vllm

log = logging.getLogger(__name__)


def run(cfg: RayftConfig, sources: list[str], *, host: str, port: int, address: str | None = None) -> ServeHandle:
    """Deploy ``sources`` (on the Ray at ``address``, else ``scaling.address``, else a local one) and
    return the handle; :meth:`ServeHandle.shutdown` drains the requests in flight and stops."""
    plan = plan_serving(sources or list(cfg.serve.sources), cfg.model, cfg.eval.checkpoint)
    load_key_digests(cfg.serve.api_keys_env, cfg.serve.api_keys_file)  # a wrong keys file is said before Ray starts
    resources = contextlib.ExitStack()
    try:
        resources.enter_context(ray_runtime(address or cfg.scaling.address))
        vllm = cfg.serve.backend == "vllm"
        base_url = (start_vllm if vllm else app.start)(plan, cfg.serve, host, port)
        drain_s = None if vllm else cfg.serve.graceful_shutdown_timeout_s  # vLLM's application has no rayft router
        resources.callback(app.stop, drain_s)  # closed first: drain and stop Serve, then the Ray started here
    except BaseException:
        resources.close()
        raise
    log.info("serving %s at %s", ", ".join(plan.model_ids), base_url)
    return ServeHandle(base_url, plan.model_ids, dict(plan.served_from), resources)
