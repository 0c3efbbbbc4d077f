"""Deployment files rendered from the config: Kubernetes manifests for KubeRay and Kubeflow.

:mod:`rayft.deploy.pods` and :mod:`rayft.deploy.manifests` decide (config in, plain dicts out);
:mod:`rayft.deploy.writer` writes them as YAML. Nothing here talks to a cluster.
"""
