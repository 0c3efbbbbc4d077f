"""Credential canaries: values tests put in the credential variables, and a search for them in every
file a command wrote."""

from __future__ import annotations

from pathlib import Path

# Canary values for the credential variables: tests set them and check that no output holds one.
CANARIES = {
    "HF_TOKEN": "hf_canaryHF0a1b2c3d4e5f",
    "WANDB_API_KEY": "canary-wandb-5f4e3d2c1b0a",
    "MLFLOW_TRACKING_TOKEN": "canary-mlflow-token-9z8y7x6w",
    "MLFLOW_TRACKING_PASSWORD": "canary-mlflow-9z8y7x6w",
    "AWS_ACCESS_KEY_ID": "AKIACANARY1234567890",
    "AWS_SECRET_ACCESS_KEY": "canary/aws+secret/0123456789abcdefABCDEF",
    "AWS_SESSION_TOKEN": "canary-aws-session-token-0123456789",
    # an endpoint's key, in a variable whose name says nothing of a credential (api_key_env names it)
    "LLM_ACCESS": "hf_CANARYSECRET123",
}


def files_containing(root: Path, needles: dict[str, str]) -> list[str]:
    """``path: NAME`` for every file under ``root`` (or ``root`` itself, a file) that contains a needle."""
    hits = []
    for path in [root] if root.is_file() else root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            hits += [f"{path}: {name}" for name, value in needles.items() if value.encode() in data]
    return hits
