"""Validating Kubernetes manifests against the real schemas, as `kubectl apply --validate=strict` would.

Custom resources are checked against the ``openAPIV3Schema`` of the CRDs vendored in
``tests/schemas/`` (see SOURCE.md there), made strict: an object schema that lists properties and
does not preserve unknown fields rejects any other key, as the API server's field validation does.
Core kinds (ConfigMap, PersistentVolumeClaim, Namespace, ResourceQuota, ServiceAccount) are checked
by ``kubernetes-validate`` against the Kubernetes OpenAPI schema it ships, in strict mode.
CEL rules (``x-kubernetes-validations``) are not evaluated: no API server runs here.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
CRDS = {
    ("ray.io/v1", "RayJob"): "ray.io_rayjobs.yaml",
    ("ray.io/v1", "RayCluster"): "ray.io_rayclusters.yaml",
    ("ray.io/v1", "RayService"): "ray.io_rayservices.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
}
CORE_KINDS = {"ConfigMap", "PersistentVolumeClaim", "Namespace", "ResourceQuota", "ServiceAccount"}
KUBERNETES_VERSION = "1.33.0"


def validate(manifest: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` (custom resources) or ``kubernetes_validate.ValidationError``
    (core kinds) when ``manifest`` does not validate strictly."""
    key = (manifest.get("apiVersion"), manifest.get("kind"))
    if key in CRDS:
        validator(*key).validate(manifest)  # type: ignore[arg-type]
    elif manifest.get("apiVersion") == "v1" and manifest.get("kind") in CORE_KINDS:
        import kubernetes_validate

        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    else:
        raise AssertionError(f"no schema for {key}: add it to tests/support/k8s_schemas.py")


@functools.cache
def validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    """A strict validator for one custom resource kind, from its vendored CRD."""
    crd = yaml.load((SCHEMAS / CRDS[(api_version, kind)]).read_text(), Loader=yaml.CSafeLoader)
    version = api_version.rpartition("/")[2]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    assert crd["spec"]["names"]["kind"] == kind
    schema = strict(served["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


def strict(schema: Any) -> Any:
    """The schema with the API server's structural rules spelled out for jsonschema."""
    schema = copy.deepcopy(schema)
    _strict(schema)
    return schema


def _strict(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _strict(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("x-kubernetes-int-or-string"):
        node.pop("type", None)
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable"):
        kind = node.get("type")
        if kind:
            node["type"] = [kind, "null"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in node and not preserve and "additionalProperties" not in node:
        node["additionalProperties"] = False
    for key, child in node.items():
        if key in ("properties", "patternProperties", "definitions"):
            for sub in child.values():
                _strict(sub)
        elif key in ("items", "additionalProperties", "allOf", "anyOf", "oneOf", "not"):
            _strict(child)


def validate_all(manifests: list[dict[str, Any]]) -> None:
    """Validate every manifest; a failure names the object."""
    for manifest in manifests:
        try:
            validate(manifest)
        except Exception as exc:
            where = f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')}"
            raise AssertionError(f"{where} does not validate: {exc}") from exc
