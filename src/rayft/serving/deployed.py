"""The Serve application builder of a deployed ``rayft serve`` (KubeRay's RayService, ``serve deploy``).

Serve imports :data:`IMPORT_PATH` and calls it with the application's ``args``; ``{"config": PATH}``
serves ``serve.sources`` of that config exactly as ``rayft serve --config PATH`` does.
"""

from __future__ import annotations

from typing import Any

IMPORT_PATH = "rayft.serving.deployed:build_app"
"""What a Serve config's ``import_path`` names."""


def build_app(args: dict[str, Any]) -> Any:
    """The application of the config at ``args["config"]``: its ``serve.sources`` on its ``serve`` settings."""
    from rayft.config import load_config
    from rayft.errors import ConfigError
    from rayft.security import install_redaction
    from rayft.serving.app import build_application
    from rayft.serving.keys import load_key_digests
    from rayft.serving.plan import plan_serving
    from rayft.serving.vllm import llm_configs, validate_llm_configs

    install_redaction()
    if "config" not in args:
        raise ConfigError(f"the Serve application's args need 'config' (the config file's path); got {sorted(args)}")
    cfg = load_config(str(args["config"]), [])
    plan = plan_serving(list(cfg.serve.sources), cfg.model, cfg.eval.checkpoint)
    if cfg.serve.backend == "hf":
        # The keys are read here, in the pod that builds the application (from the Secret of
        # serve.api_keys_secret); only their digests reach the router.
        digests = load_key_digests(cfg.serve.api_keys_env, cfg.serve.api_keys_file)
        return build_application(plan, cfg.serve, digests)
    from ray.serve.llm import build_openai_app

    return build_openai_app({"llm_configs": validate_llm_configs(llm_configs(plan, cfg.serve))})
