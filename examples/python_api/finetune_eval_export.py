"""Fine-tune, evaluate and export a model from Python with rayft's public API.

What it teaches: the four calls from a config to a shipped model -- ``rayft.load_config`` (a YAML
file or none, plus the same dotted overrides as the CLI), ``rayft.api.train``, ``rayft.api.compare`` (base
versus fine-tuned on held-out problems, with a paired test) and ``rayft.api.export`` (a verified Hugging
Face model directory) -- and the typed results each returns. The data is rayft's built-in
GSM8K-style arithmetic set, so it runs offline.

Run it (from the repository root):

    .venv/bin/python examples/python_api/finetune_eval_export.py --out /tmp/rayft-api
    .venv/bin/python examples/python_api/finetune_eval_export.py --size tiny --out /tmp/rayft-api-tiny

``--size small`` (the default) fine-tunes SmolLM2-135M-Instruct with LoRA on 2 Ray workers for 30
steps; ``--size tiny`` builds a tiny random model and trains it in-process without Ray for a few
steps, which is how the tests run it (seconds, and its scores mean nothing).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import rayft

SIZES: dict[str, list[str]] = {
    "small": [
        "scaling.num_workers=2",
        "train.max_steps=30",
        "data.datasets=[{path: 'builtin:arithmetic', max_rows: 400}]",
        "eval.datasets=[{path: 'builtin:arithmetic', split: test, max_rows: 40}]",
    ],
    "tiny": [
        "scaling.num_workers=0",  # in-process: no Ray
        "train.max_steps=3",
        "train.micro_batch_size=4",
        "lora.r=4",
        "logging.tensorboard=false",
        "data.datasets=[{path: 'builtin:arithmetic', max_rows: 24}]",
        "eval.datasets=[{path: 'builtin:arithmetic', split: test, max_rows: 4}]",
        "eval.generation.max_new_tokens=4",
        "eval.runtime=local",
        "eval.bootstrap_samples=200",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--out", type=Path, default=Path("runs/python-api"), help="where everything is written")
    args = parser.parse_args()

    model = "smollm2-135m-instruct"
    if args.size == "tiny":
        from rayft.testing import build_tiny_model

        model = str(build_tiny_model(args.out / "tiny-model"))

    cfg = rayft.load_config(None, [f"model.name={model}", f"storage_path={args.out}", "name=run", *SIZES[args.size]])
    trained = rayft.api.train(cfg)  # TrainResult: run_dir, final_dir, steps, train_loss, eval_loss
    print(f"trained {trained.steps} steps, train loss {trained.train_loss}: {trained.final_dir}")

    result = rayft.api.compare(cfg, {"base": model, "tuned": trained.run_dir})
    print(result.summary.headline())  # the paired comparison; compare.html holds the full report

    exported = rayft.api.export(cfg, trained.run_dir, args.out / "export")  # LoRA merged, then verified
    print(f"exported ({'merged' if exported.merged else 'adapter'}): {exported.output_dir}")


if __name__ == "__main__":
    main()
