"""The run directory: what a run holds, where it lives, and which of its checkpoints to use.

Every command that writes or reads a run goes through this package, never through paths of its own:

- :mod:`~rayft.runs.layout`: the names of a run's files and checkpoint directories (no I/O).
- :mod:`~rayft.runs.manifest`: the completion marker of a checkpoint (every file's size and sha256).
- :mod:`~rayft.runs.selection`: which checkpoint to use (latest, best, final, step-N), to resume
  from and to delete: pure decisions.
- :mod:`~rayft.runs.checkpoints`: checkpoints on local (or mounted) storage: scan, verify, publish,
  clean.
- :mod:`~rayft.runs.location`: whether a run lives in a directory or at a URI with a local mirror.
- :mod:`~rayft.runs.defaults`: the model a command scores and where its report goes when not told.
- :mod:`~rayft.runs.remote`: a run at a URI (pyarrow filesystems), the manifest uploaded last.
- :mod:`~rayft.runs.store`: the ``RunStore`` protocol, a local store and a remote (URI + mirror) one,
  so that drivers do not branch on where a run lives.
- :mod:`~rayft.runs.planner`: start, resume, keep, replace or refuse a run: one pure decision for
  ``rayft train`` and the train stage of ``rayft run``.
- :mod:`~rayft.runs.lock`: one driver per run directory (host, pid and a heartbeat in a lock file).

Nothing here imports torch or ray.
"""
