"""Experiment tracking (MLflow, Weights & Biases) and live Prometheus metrics.

The trackers are fed from rank 0's metric stream (the same records as metrics.jsonl) through a
bounded queue and a sender thread each (:mod:`rayft.tracking.sender`); the driver opens the runs,
logs params, tags and artifacts (:mod:`rayft.tracking.driver`). Their ids live in the run
directory's ``tracking.json``, so a worker restart or ``--resume`` continues the same runs.
"""
