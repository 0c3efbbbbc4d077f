"""The per-worker training loop, shared by every training method: the session it runs in, its data order,
steps, the method protocol it calls (``method.py``) and the causal LM methods train (``objective.py``),
metrics, checkpoints and stop requests. It never imports a method (``rayft.training.methods``).
"""
