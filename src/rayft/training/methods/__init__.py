"""The training methods, one folder per family (``sft``, ``preference``, ``rl``, and ``task`` for a custom
task), above the shared loop, which never imports them; a method never imports another. Each folder
declares its :class:`~rayft.training.methods.unit.MethodUnit`; :mod:`rayft.training.methods.registry`
maps ``train.objective`` to them.
"""
