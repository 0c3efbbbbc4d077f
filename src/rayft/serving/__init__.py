"""``rayft serve``: models behind an OpenAI-compatible HTTP API on Ray Serve.

:mod:`~rayft.serving.plan` decides which deployments serve which model ids (pure);
:mod:`~rayft.serving.protocol` parses requests and shapes responses the OpenAI way (pure);
:mod:`~rayft.serving.replica` and :mod:`~rayft.serving.router` are the Serve deployments;
:mod:`~rayft.serving.app` builds, starts and stops the application; :mod:`~rayft.serving.vllm`
builds the ``ray.serve.llm`` configs of the vLLM backend.
"""
