"""Host memory of loading the model on 2 workers: every worker reads the weights, or only rank 0
does and the other builds the model on the meta device and is filled from rank 0 (what rayft's
DDP and FSDP strategies do).

Each arm runs under ``torchrun --nproc_per_node 2`` (gloo) and builds the training model as a
rayft worker does (``build_training_model``, then the strategy's ``prepare``), then reports each
rank's peak resident memory (``ru_maxrss``) and that both ranks hold the same weights. Arms
alternate A B after a warm-up pair.

    .venv/bin/python benchmarks/bench_load_memory.py [--model smollm2-135m-instruct] [--strategy ddp] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WORKER = """
import json, resource, sys, torch, torch.distributed as dist
from rayft.config import LoraConfig, ModelConfig
from rayft.training.modeling.model import build_training_model
from rayft.training.strategies.parallel import ParallelSetup
from rayft.training.strategies.table import parallelism
from rayft.training.modeling.precision import Precision
model_name, strategy, method, from_rank0, out = sys.argv[1:6]
dist.init_process_group("gloo")
rank = dist.get_rank()
weights = rank == 0 or from_rank0 == "0"
net = build_training_model(ModelConfig(name=model_name), LoraConfig(r=8), method, "cpu",
                           gradient_checkpointing=False, restore_dir=None, weights=weights)
setup = ParallelSetup(torch.device("cpu"), 2, Precision(None, False), 1, 1.0)
net, _ = parallelism(strategy, 2).prepare(net, lambda m: torch.optim.AdamW(
    [p for p in m.parameters() if p.requires_grad]), setup)
checksum = float(sum(p.detach().double().sum() for p in net.parameters()).full_tensor()
                 if hasattr(next(net.parameters()), "full_tensor") else
                 sum(p.detach().double().sum() for p in net.parameters()))
record = {"rank": rank, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "checksum": checksum}
with open(f"{out}.{rank}", "w") as handle:
    handle.write(json.dumps(record))
dist.destroy_process_group()
"""


def run_arm(model: str, strategy: str, method: str, from_rank0: bool, out: Path) -> list[dict[str, float]]:
    """One torchrun of both ranks; their records."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).parent / "torchrun"
    script = out.parent / "worker.py"
    script.write_text(WORKER)
    command = [str(torchrun), "--nproc_per_node", "2", str(script), model, strategy, method,
               "1" if from_rank0 else "0", str(out)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"torchrun failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in (0, 1)]


def main() -> None:
    """Alternate the two arms and print each rank's peak memory and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp"])
    parser.add_argument("--method", default="full", choices=["full", "lora"])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    peaks: dict[str, list[list[float]]] = {"every rank loads": [], "rank 0 loads": []}
    with tempfile.TemporaryDirectory(prefix="rayft-bench-load-") as tmp:
        for round_index in range(args.repeats + 1):
            for arm, from_rank0 in (("every rank loads", False), ("rank 0 loads", True)):
                out = Path(tmp) / f"{arm}-{round_index}"
                records = run_arm(args.model, args.strategy, args.method, from_rank0, out)
                same = records[0]["checksum"] == records[1]["checksum"]
                rss = [r["peak_rss_mb"] for r in records]
                print(f"  round {round_index} {arm}: peak RSS rank 0 {rss[0]:.0f} MB, rank 1 {rss[1]:.0f} MB, "
                      f"same weights on both ranks: {same}", flush=True)  # fmt: skip
                if not same:
                    raise SystemExit("the ranks hold different weights")
                if round_index > 0:
                    peaks[arm].append(rss)
    for arm, runs in peaks.items():
        print(f"[{args.strategy} {args.method}] {arm}: peak RSS rank 0 {statistics.median(r[0] for r in runs):.0f} MB, "
              f"rank 1 {statistics.median(r[1] for r in runs):.0f} MB (medians of {len(runs)})")  # fmt: skip
    ratio = [b[1] / a[1] for a, b in zip(peaks["every rank loads"], peaks["rank 0 loads"], strict=True)]
    print(f"[{args.strategy} {args.method}] rank 1 peak RSS, rank 0 loads / every rank loads: "
          f"{statistics.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
