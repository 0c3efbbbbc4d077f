"""The per-worker training loop: the session it runs in, its data order, steps, objectives, metrics, checkpoints
and stop requests.
"""
