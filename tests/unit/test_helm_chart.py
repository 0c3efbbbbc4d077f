"""The Helm chart deploy/helm/rayft: linted and rendered by Helm's own engine, validated against the real
schemas, and equal to what `rayft k8s render --target rayjob` renders for the same config.

Helm's engine comes from the `helm-python-sdk` package (the Helm v4 Go SDK as a shared library; no
registry this project installs from ships the `helm` binary): `Chart.render` is what `helm template`
runs, `lint` is `helm lint`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from rayft.config import load_config
from rayft.deploy.manifests import namespace_manifests, render
from rayft.deploy.pods import plan_pods
from tests.support.k8s_schemas import validate_all

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "rayft"
GSM8K = REPO / "configs" / "gsm8k-qwen2.5-1.5b.yaml"
SETTINGS = {
    "secret_name": "rayft-credentials",
    "secret_env": ["HF_TOKEN", "AWS_ACCESS_KEY_ID"],
    "env": {"HF_HUB_OFFLINE": "0"},
    "service_account": "rayft",
    "active_deadline_s": 86400,
    "storage": {"claim_name": "shared-runs", "create": True, "storage_class": "nfs"},
}
# The same settings as dotted overrides, plus the defaults the chart's values.yaml sets.
OVERRIDES = [
    "k8s.secret_name=rayft-credentials", "k8s.secret_env=[HF_TOKEN,AWS_ACCESS_KEY_ID]", "k8s.env={HF_HUB_OFFLINE: '0'}",
    "k8s.service_account=rayft", "k8s.active_deadline_s=86400", "k8s.storage.claim_name=shared-runs",
    "k8s.storage.create=true", "k8s.storage.storage_class=nfs", "k8s.ray_version=2.60.0",
]  # fmt: skip


def helm_template(values: dict[str, Any], namespace: str = "rayft") -> list[dict[str, Any]]:
    """`helm template release CHART -f values --namespace NS`, parsed."""
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name="release", namespace=namespace)
    documents = [
        d for path, text in sorted(rendered.items()) if path.endswith(".yaml") for d in yaml.safe_load_all(text)
    ]
    return [d for d in documents if d]


def gsm8k_values(**k8s: Any) -> dict[str, Any]:
    values = yaml.safe_load(GSM8K.read_text())
    values["k8s"] = {**SETTINGS, **k8s}
    return values


def by_kind(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [m for m in manifests if m["kind"] == kind]
    return found


def test_the_chart_lints_clean() -> None:
    report = helm.lint(CHART, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    report = helm.lint(CHART, gsm8k_values(), strict=True)
    assert report["errors"] == [], report


def test_helm_template_validates_and_equals_rayft_k8s_render(tmp_path: Path) -> None:
    manifests = helm_template(gsm8k_values())
    assert sorted(m["kind"] for m in manifests) == [
        "ConfigMap", "PersistentVolumeClaim", "RayJob", "ServiceAccount",
    ]  # fmt: skip
    validate_all(manifests)
    saved = tmp_path / "config.yaml"
    saved.write_text(by_kind(manifests, "ConfigMap")["data"]["config.yaml"])
    cfg = load_config(saved)
    assert cfg == load_config(GSM8K, OVERRIDES)  # the ConfigMap holds the config, settings included
    expected = render(cfg, "rayjob")
    for kind in ("RayJob", "PersistentVolumeClaim"):
        assert by_kind(manifests, kind) == by_kind(expected, kind)
    account = by_kind(namespace_manifests(cfg, plan_pods(cfg, extra_pods=1)), "ServiceAccount")
    assert by_kind(manifests, "ServiceAccount") == account


def test_the_default_values_render_a_valid_rayjob() -> None:
    manifests = helm_template({}, namespace="team-a")
    validate_all(manifests)
    job = by_kind(manifests, "RayJob")
    assert job["metadata"]["namespace"] == "team-a"
    assert job["spec"]["entrypoint"] == "rayft run /etc/rayft/config.yaml"
    (group,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == 2


def test_sizes_follow_scaling_as_in_the_renderer() -> None:
    values = gsm8k_values(workers_per_pod=4)
    values["scaling"] = {"num_workers": 8, "use_gpu": True, "resources_per_worker": {"CPU": 6, "GPU": 1}}
    job = by_kind(helm_template(values), "RayJob")
    (group,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == 2
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "24", "memory": "64Gi", "nvidia.com/gpu": "4",
    }  # fmt: skip


def test_a_uri_storage_path_mounts_no_claim() -> None:
    values = gsm8k_values()
    values["storage_path"] = "s3://bucket/runs"
    manifests = helm_template(values)
    assert "PersistentVolumeClaim" not in [m["kind"] for m in manifests]
    assert "persistentVolumeClaim" not in yaml.safe_dump(by_kind(manifests, "RayJob"))
    validate_all(manifests)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"scaling": {"num_workers": 4, "resources_per_worker": {"GPU": 0.5}}},
            r"GPU=0.5 x k8s.workers_per_pod=1 is 0.5",
        ),
        ({"k8s": {"storage": {"claim_name": None}}}, r"is a local path, but the job runs 5 pods"),
        ({"storage_path": "runs"}, r'storage_path="runs" is relative'),
        ({"k8s": {"env": {"HF_TOKEN": "hf_abcdefgh"}}}, r"hold credentials.*k8s.secret_env=\[HF_TOKEN\]"),
        ({"k8s": {"workers_per_pod": 3}}, r"k8s.workers_per_pod=3 does not divide scaling.num_workers=4"),
    ],
)
def test_bad_values_fail_as_the_renderer_does(change: dict[str, Any], message: str) -> None:
    values = gsm8k_values()
    for key, value in change.items():
        values[key] = {**values[key], **value} if isinstance(value, dict) and key in values else value
    if "storage" in change.get("k8s", {}):
        values["k8s"]["storage"] = change["k8s"]["storage"]
    with pytest.raises(helm.HelmError, match=message):
        helm_template(values)
