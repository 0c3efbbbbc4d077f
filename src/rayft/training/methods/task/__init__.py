"""A custom task's training (``task.path``): its own model, batches, loss and metrics
(:mod:`rayft.training.methods.task.method`)."""
