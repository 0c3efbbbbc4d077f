"""deploy/monitoring/: the alert rules pass ``promtool check rules`` and their ``promtool test rules``
unit tests; the dashboard covers the training overview and follows the run picker (its queries are
run against a real Prometheus in tests/integration/test_monitoring_prometheus.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_promtool = pytest.mark.skipif(
    not Path(PROMTOOL).exists(), reason="needs promtool (Debian's prometheus): apt-get install -y prometheus"
)


@needs_promtool
def test_alert_rules_pass_promtool_check() -> None:
    result = subprocess.run([PROMTOOL, "check", "rules", "rayft-alerts.rules.yaml"], cwd=MONITORING,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 5 rules found" in result.stdout


@needs_promtool
def test_alert_rules_unit_tests_pass() -> None:
    result = subprocess.run([PROMTOOL, "test", "rules", "rayft-alerts.rules.test.yaml"], cwd=MONITORING,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    cases = yaml.safe_load((MONITORING / "rayft-alerts.rules.test.yaml").read_text())["tests"]
    groups = yaml.safe_load((MONITORING / "rayft-alerts.rules.yaml").read_text())["groups"]
    tested = {t["alertname"] for case in cases for t in case["alert_rule_test"]}
    alerts = {r["alert"] for g in groups for r in g["rules"]}
    assert tested == alerts, "every alert has a unit test"


def test_dashboard_panels_cover_the_training_overview() -> None:
    dashboard = json.loads((MONITORING / "rayft-training.json").read_text())
    exprs = {p["title"]: t["expr"] for p in dashboard["panels"] for t in p["targets"]}
    for metric in ("rayft_train_loss", "rayft_train_tokens_per_second", "rayft_checkpoint_save_seconds",
                   "rayft_worker_restarts", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"):  # fmt: skip
        assert any(metric in e for e in exprs.values()), metric
    own = [e for e in exprs.values() if "rayft_" in e]
    assert all('run=~"$run"' in e for e in own), "every rayft panel follows the run picker"
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "run"}


def test_serving_dashboard_covers_every_serving_metric_and_follows_the_pickers() -> None:
    """Every metric `rayft serve` exposes at /metrics has a panel; every panel follows the model picker, and those of
    per-adapter series the adapter picker (its queries run against a real Prometheus scraping a server in
    tests/integration/test_serve_ops.py)."""
    from rayft.serving.metrics import ServeMetrics

    dashboard = json.loads((MONITORING / "rayft-serving.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exposed = {m.name for m in ServeMetrics().registry.collect()}
    for name in exposed:
        assert any(name in e for e in exprs), f"no panel shows {name}"
    assert all('model=~"$model"' in e for e in exprs), "every panel follows the model picker"
    per_adapter = [e for e in exprs if "kv_cache" not in e and "adapters_loaded" not in e and "prefix_cache" not in e]
    assert all('adapter=~"$adapter"' in e for e in per_adapter), "every per-adapter panel follows the adapter picker"
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "model", "adapter"}
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
