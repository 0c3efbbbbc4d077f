"""Where a training step's time goes: the per-rank step breakdown, the straggler and bottleneck
planners, the torch.profiler trace window, and the summary ``rayft profile`` prints."""
