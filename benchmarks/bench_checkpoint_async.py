"""Checkpoint blocking: how long the training loop stops for a save, synchronous vs asynchronous.

One in-process worker (``scaling.num_workers: 0``, the same loop and checkpoint code as every Ray
Train worker) does full fine-tuning of a random-init decoder (~21M parameters: a save writes
~85 MB of weights and ~170 MB of optimizer state, with sha256 of every file) and saves every
``--save-steps`` steps. The blocked time is what the loop spends inside ``save_checkpoint``
(TrainerState.checkpoint_blocked_s): the whole write when synchronous; the CPU snapshot (plus any
wait for a previous save still in flight) when asynchronous. Runs alternate sync and async after
one warm-up run of each; medians with min-max.

    .venv/bin/python benchmarks/bench_checkpoint_async.py [--repeats 3] [--steps 12] [--save-steps 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def build_inputs(root: Path, hidden: int, layers: int) -> tuple[Path, Any]:
    """A random decoder and 256 prepared training units for it."""
    from rayft.config import ModelConfig
    from rayft.models.loading import load_tokenizer
    from rayft.testing import build_tiny_model
    from rayft.testing.units import arithmetic_prepared

    model_dir = build_tiny_model(root / "model", hidden_size=hidden, num_layers=layers)
    tokenizer = load_tokenizer(ModelConfig(name=str(model_dir)))
    return model_dir, arithmetic_prepared(root / "units", tokenizer, num_train=256)


def run_once(model_dir: Path, prepared: Any, storage: Path, *, background: bool, steps: int, save_steps: int) -> dict:
    """Train ``steps`` steps in-process; return the loop's blocked seconds and the wall time."""
    from rayft.config import load_config
    from rayft.runs.location import RunLocation
    from rayft.training.driver.launcher import split_files
    from rayft.training.driver.startup import build_worker_plan, claim_run_dir
    from rayft.training.loop.session import LocalSession
    from rayft.training.loop.worker import run_worker
    from rayft.training.methods.registry import REGISTERED

    cfg = load_config(None, [
        f"model.name={model_dir}", f"storage_path={storage}", "name=run", "scaling.num_workers=0",
        "train.method=full", "train.micro_batch_size=4", f"train.max_steps={steps}", f"train.save_steps={save_steps}",
        "train.eval_steps=null", "logging.tensorboard=false", "logging.console=false", "checkpoint.num_to_keep=1",
        f"checkpoint.async_upload={str(background).lower()}",
    ])  # fmt: skip
    run_dir = claim_run_dir(cfg, resume=False)
    plan = build_worker_plan(cfg, prepared, RunLocation(run_dir))
    started = time.monotonic()
    state = run_worker(plan, LocalSession(split_files(prepared), plan.location, num_to_keep=1), REGISTERED)
    return {"blocked_s": state.checkpoint_blocked_s, "wall_s": time.monotonic() - started, "saves": steps // save_steps}


def main() -> None:
    """Alternate sync and async runs and print the blocked-time ratio."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-steps", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # the same thread count in both arms (a Ray worker with 1 CPU gets 1)
    with tempfile.TemporaryDirectory(prefix="rayft-bench-ckpt-") as tmp:
        root = Path(tmp)
        model_dir, prepared = build_inputs(root, args.hidden, args.layers)
        results: dict[str, list[dict]] = {"sync": [], "async": []}
        for index in range(args.repeats + 1):  # the first pair is a warm-up
            for arm in ("sync", "async"):
                out = run_once(model_dir, prepared, root / f"{arm}-{index}", background=arm == "async",
                               steps=args.steps, save_steps=args.save_steps)  # fmt: skip
                print(f"{'warm-up' if index == 0 else f'run {index}'} {arm:5s}: blocked {out['blocked_s']:.3f} s "
                      f"over {out['saves']} saves, wall {out['wall_s']:.1f} s", flush=True)  # fmt: skip
                if index > 0:
                    results[arm].append(out)
    per_save = {arm: [r["blocked_s"] / r["saves"] for r in rows] for arm, rows in results.items()}
    ratios = [a / s for a, s in zip(per_save["async"], per_save["sync"], strict=True)]
    for arm in ("sync", "async"):
        values = per_save[arm]
        print(f"{arm:5s} blocked per save: median {statistics.median(values):.3f} s "
              f"(min {min(values):.3f}, max {max(values):.3f})")  # fmt: skip
    walls = {arm: statistics.median(r["wall_s"] for r in rows) for arm, rows in results.items()}
    print(f"async / sync blocked time: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
          f"max {max(ratios):.3f}); target <= 0.10")  # fmt: skip
    print(f"wall time per run: sync {walls['sync']:.1f} s, async {walls['async']:.1f} s")
    print(f"command: .venv/bin/python benchmarks/bench_checkpoint_async.py --repeats {args.repeats} --steps "
          f"{args.steps} --save-steps {args.save_steps} --hidden {args.hidden} --layers {args.layers}")  # fmt: skip


if __name__ == "__main__":
    main()
