"""The ``rayft run`` pipeline: one stage per recipe, run in order on one Ray, above the recipes it calls.

- :mod:`~rayft.pipeline.runner`: ``rayft run`` itself, read top to bottom (:func:`~rayft.pipeline.runner.run`).

- :mod:`~rayft.pipeline.plan`: which stages run, are skipped or reused (pure).
- :mod:`~rayft.pipeline.stages`: one object per stage: what its fingerprint covers, how it runs.
- :mod:`~rayft.pipeline.inputs`: the config pieces and file hashes a fingerprint covers.
- :mod:`~rayft.pipeline.fingerprint`: hashing of objects, files and directories.
- :mod:`~rayft.runs.records`: ``stages/<stage>.json``, written last by a finished stage.
- :mod:`~rayft.pipeline.outputs`: the pipeline's config, lineage and report files.
- :mod:`~rayft.pipeline.lineage`, :mod:`~rayft.pipeline.report`: their contents.
"""
