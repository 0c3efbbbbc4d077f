"""Memory per worker of full fine-tuning of a T5 under DDP and DeepSpeed ZeRO-3, with 1 and 2
workers, and ZeRO-3 with its optimizer state and parameters offloaded to the CPU.

ZeRO-3's claim is that sharding divides the model state (weights, gradients, AdamW state) by the
worker count. Each arm runs under ``torchrun --nproc_per_node N`` (gloo, one thread per rank),
builds a random-initialised T5 of a published architecture, prepares it with rayft's strategy
(``train.strategy: ddp`` or ``deepspeed``, the latter also at one worker), runs AdamW steps on
seeded source/target batches (``--steps``: the last one stops after its backward pass), and then
reports per rank:

- model state: the bytes of the tensors that hold the model's state on the rank after the last
  step's backward pass (its gradients are there; the moments of the steps before). Under ZeRO-3:
  each parameter's partition (``param.ds_tensor``), the fp32 partitions the optimizer steps
  (``fp32_partitioned_groups_flat``), the gradient partitions (``grad_partitions_flat_buffer``)
  and AdamW's two moments; under DDP: the whole weights, gradients and moments;
- all live tensors: every distinct storage the garbage collector reaches, which adds DeepSpeed's
  communication buckets (fixed sizes, not model state; DDP's C++ buckets are not reachable);
- peak RSS: the process's resident-set high-water mark (``ru_maxrss``): framework, activations
  and temporaries included.

The headline is the ratio of ZeRO-3's per-rank model state at 2 workers to 1 worker (ideal 0.5;
target <= 0.6). On a CPU machine, offloading to the "CPU" moves nothing off the device that holds
it already: that arm shows the offload path runs and what it costs in host memory here.

    .venv/bin/python benchmarks/bench_zero3_memory.py [--arch t5-small] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Published T5 v1.0 shapes (google-t5/t5-*): d_model, d_ff, d_kv, heads, layers per stack.
ARCHS = {
    "t5-tiny": (64, 256, 16, 4, 2),  # a smoke run of every arm in about a minute
    "t5-small": (512, 2048, 64, 8, 6),
    "t5-base": (768, 3072, 64, 12, 12),
    "t5-large": (1024, 4096, 64, 16, 24),
}

WORKER = """
import gc, json, resource, sys, torch, torch.distributed as dist
from transformers import T5Config, T5ForConditionalGeneration
from rayft.training.strategies.parallel import ParallelSetup
from rayft.training.strategies.table import parallelism
from rayft.training.modeling.precision import Precision
from rayft.training.strategies.zero3 import DeepSpeedZero3
d_model, d_ff, d_kv, heads, layers, steps = map(int, sys.argv[1:7])
strategy, offload, out = sys.argv[7], sys.argv[8] == "1", sys.argv[9]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
config = T5Config(vocab_size=32128, d_model=d_model, d_ff=d_ff, d_kv=d_kv, num_heads=heads, num_layers=layers,
                  decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
model = T5ForConditionalGeneration(config)
n_params = sum(p.numel() for p in model.parameters())
cpu = {"device": "cpu"}
extra = {"zero_optimization": {"offload_optimizer": cpu, "offload_param": cpu}} if offload else {}
setup = ParallelSetup(torch.device("cpu"), world, Precision(None, False), 2, 1.0, extra)
plan = DeepSpeedZero3() if strategy == "zero3" else parallelism("ddp", world)
net, optimizer = plan.prepare(model, lambda m: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad],
                                                                  lr=1e-4), setup)
gen = torch.Generator().manual_seed(rank)
losses = []
for step in range(steps):
    source = torch.randint(2, 32128, (2, 64), generator=gen)
    target = torch.randint(2, 32128, (2, 16), generator=gen)
    with plan.accumulating(net, last=True):
        loss = net(input_ids=source, labels=target).loss
        plan.backward(net, loss, None)
    if step == steps - 1:
        break  # measured with this step's gradients and the moments of the steps before
    plan.step(net, optimizer, None, 1.0)
    losses.append(float(loss))
def unique_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total
module = getattr(net, "module", net)
moments = [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v) and v.dim()]
if strategy == "zero3":
    zero = net.optimizer
    parts = {"weights": unique_bytes(p.ds_tensor for p in module.parameters()),
             "fp32 partitions": unique_bytes(zero.fp32_partitioned_groups_flat),
             "gradients": unique_bytes([getattr(zero, "grad_partitions_flat_buffer", None)]),
             "AdamW moments": unique_bytes(moments)}
else:
    parts = {"weights": unique_bytes(module.parameters()),
             "gradients": unique_bytes(p.grad for p in module.parameters()), "AdamW moments": unique_bytes(moments)}
gc.collect()
every = unique_bytes(o for o in gc.get_objects() if isinstance(o, torch.Tensor))
held = sum(parts.values())
record = {"rank": rank, "params": n_params, "state_mb": held / 2**20, "losses": losses, "all_tensors_mb": every / 2**20,
          "parts_mb": {k: round(v / 2**20, 1) for k, v in parts.items()},
          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
with open(f"{out}.{rank}", "w") as handle:
    handle.write(json.dumps(record))
dist.destroy_process_group()
"""

ARMS = (("DDP", "ddp", 1, False), ("DDP", "ddp", 2, False), ("ZeRO-3", "zero3", 1, False),
        ("ZeRO-3", "zero3", 2, False), ("ZeRO-3 + CPU offload", "zero3", 2, True))  # fmt: skip


def run_arm(  # noqa: PLR0917
    arch: str, steps: int, strategy: str, workers: int, offload: bool, out: Path
) -> list[dict[str, float]]:
    """One torchrun of ``workers`` ranks; their records, by rank."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    torchrun = Path(sys.executable).parent / "torchrun"
    script = out.parent / "worker.py"
    script.write_text(WORKER)
    shape = [str(v) for v in (*ARCHS[arch], steps)]
    command = [str(torchrun), "--nproc_per_node", str(workers), str(script), *shape, strategy,
               "1" if offload else "0", str(out)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"torchrun failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(workers)]


def main() -> None:
    """Run every arm once and print per-rank model state, peak RSS and the sharding ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="t5-small", choices=sorted(ARCHS))
    parser.add_argument("--steps", type=int, default=2, help="at least 2: the moments exist after one step")
    args = parser.parse_args()
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    state: dict[tuple[str, int, bool], float] = {}
    with tempfile.TemporaryDirectory(prefix="rayft-bench-zero3-") as tmp:
        for label, strategy, workers, offload in ARMS:
            started = time.monotonic()
            records = run_arm(args.arch, args.steps, strategy, workers, offload, Path(tmp) / f"{strategy}-{workers}")
            held = max(r["state_mb"] for r in records)
            state[(strategy, workers, offload)] = held
            rss = max(r["peak_rss_mb"] for r in records)
            loss = " ".join(f"{v:.3f}" for v in records[0]["losses"])
            every = max(r["all_tensors_mb"] for r in records)
            print(f"{args.arch} ({records[0]['params'] / 1e6:.0f}M params) {label}, {workers} worker(s): model state "
                  f"{held:.0f} MB per rank {records[0]['parts_mb']}, all live tensors {every:.0f} MB, peak RSS "
                  f"{rss:.0f} MB; rank 0 losses {loss} ({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
    zero = state[("zero3", 2, False)] / state[("zero3", 1, False)]
    ddp = state[("ddp", 2, False)] / state[("ddp", 1, False)]
    print(f"[{args.arch}] per-rank model state, 2 workers / 1 worker: ZeRO-3 {zero:.3f} (target <= 0.6), DDP {ddp:.3f}")
    versus = state[("zero3", 2, False)] / state[("ddp", 2, False)]
    print(f"[{args.arch}] per-rank model state, ZeRO-3 at 2 workers / DDP at 2 workers: {versus:.3f}")


if __name__ == "__main__":
    main()
