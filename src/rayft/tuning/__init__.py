"""Hyper-parameter search over fine-tuning runs (`rayft tune`): the search space, the concurrency
plan, and the sweep's results. Modules here import no Ray at import time."""
