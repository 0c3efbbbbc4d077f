"""What rayft's tests share, one module per concern (what users testing their own setups need is in
:mod:`rayft.testing` instead):

- :mod:`~tests.support.runs`: configs of the tiny model, training on prepared units, reading a run's metrics.
- :mod:`~tests.support.ray_state`: the actors, processes and placement groups of the tests' Ray.
- :mod:`~tests.support.kills`: killing a Ray Train worker at a chosen step.
- :mod:`~tests.support.checkpoints`: checkpoints and run directories as training writes them, without training.
- :mod:`~tests.support.canaries`: credential canaries and a search for them in written files.
- :mod:`~tests.support.pages`: screenshots of HTML pages in headless Chromium.
- :mod:`~tests.support.generation`: prompts for comparing two generation paths.
- :mod:`~tests.support.servers`: MLflow and Prometheus servers, free ports.
- :mod:`~tests.support.object_store`: a local S3-compatible server (moto).
- :mod:`~tests.support.openai_server`: a local OpenAI-compatible server with injectable failures.
- :mod:`~tests.support.ray_head`: a real Ray head (``ray start --head``) on free ports.
- :mod:`~tests.support.mounts`: small tmpfs mounts (read-only, full disk).
- :mod:`~tests.support.wandb_files`: reading what W&B wrote in offline mode.
- :mod:`~tests.support.docsite`, :mod:`~tests.support.notebooks`, :mod:`~tests.support.k8s_schemas`: the
  documentation site, the example notebooks and the Kubernetes schemas the tests check.
"""
