"""Live metrics against a real Prometheus (Debian's ``prometheus``) started here: a short training
run in-process (a prometheus_client endpoint) and one on Ray (Ray's metrics export), scraped every
half second; the test finds rayft's series with the run's labels over Prometheus' HTTP API, runs
every PromQL expression of deploy/monitoring/rayft-training.json against it, and renders their
results in headless Chromium."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.faults import ENV_FAULTS
from tests.support.pages import CHROMIUM, screenshot
from tests.support.servers import Server, free_port, have_prometheus, prometheus_server

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_prometheus(), reason="needs Debian's prometheus: apt-get install -y prometheus"),
]

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "monitoring" / "rayft-training.json"
OWN_GAUGES = ("step", "loss", "learning_rate", "tokens_per_second", "grad_norm")


def query_range(prom: Server, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    """The result of a range query (1 s resolution); fails when Prometheus refuses the expression."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1"})
    try:
        with urllib.request.urlopen(f"{prom.uri}/api/v1/query_range?{params}", timeout=30) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{expr}: {exc.read().decode()[:500]}") from None
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def raw_samples(prom: Server, expr: str, start: float, end: float) -> list[float]:
    """Every sample Prometheus scraped for ``expr`` (one series) between ``start`` and ``end``."""
    window = max(int(end - start) + 1, 1)
    params = urllib.parse.urlencode({"query": f"{expr}[{window}s]", "time": end})
    with urllib.request.urlopen(f"{prom.uri}/api/v1/query?{params}", timeout=30) as response:
        body = json.loads(response.read())
    assert body["status"] == "success" and len(body["data"]["result"]) == 1, body
    return [float(v) for _, v in body["data"]["result"][0]["values"]]


def instant_value(prom: Server, expr: str) -> float | None:
    """The value of an instant query that selects one series (None while it selects none)."""
    params = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{prom.uri}/api/v1/query?{params}", timeout=30) as response:
        result = json.loads(response.read())["data"]["result"]
    return float(result[0]["value"][1]) if len(result) == 1 else None


def dashboard_exprs(run: str) -> list[tuple[str, str]]:
    """(panel title, PromQL with the run variable set) of every panel."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"].replace("$run", run)) for p in panels for t in p["targets"]]


def train_command(
    tmp_path: Path, model_dir: Path, name: str, *, workers: int, steps: int, extra: list[str]
) -> list[str]:
    config = tmp_path / f"{name}.yaml"
    config.write_text(f"name: {name}\n")
    return [
        sys.executable, "-m", "rayft", "train", str(config), f"storage_path={tmp_path / 'runs'}",
        f"model.name={model_dir}", f"scaling.num_workers={workers}", f"train.max_steps={steps}",
        "train.save_steps=4", "train.eval_steps=4", "train.micro_batch_size=2", "lora.r=4",
        "data.datasets=[{path: 'builtin:arithmetic', max_rows: 64}]", "data.validation_fraction=0.1",
        "data.max_seq_length=128", "logging.tensorboard=false", ENV_FAULTS, *extra,
    ]  # fmt: skip


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "RAYFT_CACHE": str(tmp_path / "cache"), "RAYFT_FAULT_STEP_DELAY_S": "0.4", **extra}


def check_dashboard(prom: Server, run: str, start: float, end: float, out: Path) -> dict[str, int]:
    """Every dashboard query parses; those over rayft's own CPU metrics return this run's data.
    Writes an HTML page of the results; returns the series count per panel."""
    counts: dict[str, int] = {}
    sections = []
    for title, expr in dashboard_exprs(run):
        result = query_range(prom, expr, start, end)
        counts[title] = len(result)
        if "rayft_" in expr and "gpu" not in expr:
            assert result, f"{title}: {expr} returned no data"
        sections.append(render_panel(title, expr, result, start, end))
    out.write_text(
        "<html><head><style>body{font-family:sans-serif;margin:16px}div.p{display:inline-block;width:560px;"
        "margin:6px;vertical-align:top}code{font-size:10px;color:#555}</style></head><body>"
        f"<h2>rayft-training.json: query results for run {html.escape(run)}</h2>{''.join(sections)}</body></html>"
    )
    return counts


def render_panel(title: str, expr: str, result: list[dict[str, Any]], start: float, end: float) -> str:
    """One panel: a polyline per series (x: time, y: value), or 'no data'."""
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    points = [[(float(t), float(v)) for t, v in s["values"] if v not in ("NaN", "+Inf", "-Inf")] for s in result]
    values = [v for series in points for _, v in series] or [0.0]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    lines = []
    for i, series in enumerate(points):
        coords = " ".join(
            f"{(t - start) / (end - start) * 540:.1f},{150 - (v - low) / span * 140:.1f}" for t, v in series
        )
        lines.append(f'<polyline fill="none" stroke="{colors[i % 4]}" stroke-width="2" points="{coords}"/>')
    body = "".join(lines) or '<text x="220" y="80" fill="#999">no data</text>'
    labels = "; ".join(
        ",".join(f"{k}={v}" for k, v in s["metric"].items() if k in ("run", "rank", "stage")) for s in result
    )
    return (
        f'<div class="p"><b>{html.escape(title)}</b> ({len(result)} series, {low:.4g}..{high:.4g})<br>'
        f'<svg width="545" height="155" style="border:1px solid #ccc">{body}</svg><br>'
        f"<code>{html.escape(expr)}</code><br><code>{html.escape(labels)}</code></div>"
    )


def test_in_process_training_metrics_reach_prometheus(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    with prometheus_server(tmp_path / "prometheus", [f"127.0.0.1:{port}"], scrape_interval_s=0.5) as prom:
        start = time.time()
        extra = [f"logging.prometheus={{enabled: true, host: 127.0.0.1, port: {port}}}"]
        # Held before step 7 until Prometheus has scraped step 6 of the live run: the scrape is seen
        # mid-run whatever the speed of the steps and of the scrapes here.
        release = tmp_path / "step-6-scraped"
        hold = {"RAYFT_FAULT_HOLD": f"7:{release}"}
        process = subprocess.Popen(
            train_command(tmp_path, tiny_model_dir, "live", workers=0, steps=12, extra=extra), cwd=REPO,
            env={**env(tmp_path), **hold}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        while process.poll() is None and not release.exists():
            if instant_value(prom, 'rayft_train_step{run="live"}') == 6.0:
                release.touch()
            time.sleep(0.1)
        _, stderr = process.communicate(timeout=300)  # a backstop against a hang
        assert process.returncode == 0 and release.exists(), stderr[-4000:]
        end = time.time()
        for gauge in OWN_GAUGES:
            series = query_range(prom, f'rayft_train_{gauge}{{run="live", rank="0", stage="train"}}', start, end)
            assert len(series) == 1 and series[0]["values"], gauge
        steps = raw_samples(prom, 'rayft_train_step{run="live"}', start, end)
        # Step 6 was scraped while the run was held (every scraped sample, not a range query's 1 s
        # resolution, which can step over a value that lived for less than a second); the last steps
        # may end with the run, unscraped.
        assert steps == sorted(steps) and 6.0 in steps
        assert query_range(prom, 'rayft_checkpoint_save_seconds{run="live"}', start, end)
        restarts = query_range(prom, 'rayft_worker_restarts{run="live"}', start, end)[0]["values"]
        assert {float(v) for _, v in restarts} == {0.0}
        page = tmp_path / "dashboard.html"
        counts = check_dashboard(prom, "live", start, end, page)
    assert counts["Training loss (rank 0)"] == 1
    if Path(CHROMIUM).is_file():
        png = Path(os.environ.get("RAYFT_SCREENSHOT_DIR", tmp_path)) / "rayft-dashboard-queries.png"
        screenshot(page, png, size=(1200, 1500))
        assert png.stat().st_size > 10_000


def test_ray_training_metrics_reach_prometheus_through_ray(tiny_model_dir: Path, tmp_path: Path) -> None:
    """On Ray, the gauges go through Ray's metrics agent (prefixed ray_), with the run's labels and
    one tokens/s series per worker."""
    import tempfile

    ray_tmp = Path(tempfile.mkdtemp(prefix="rp", dir="/tmp"))  # Ray's socket paths have a length limit
    command = train_command(
        tmp_path, tiny_model_dir, "live-ray", workers=2, steps=16, extra=["logging.prometheus=true"]
    )
    # Ray's processes export their gauges to its metrics agent every 10 s by default: once a second,
    # 16 steps of ~0.5 s give Prometheus several exports to scrape instead of one or two.
    ray_env = env(
        tmp_path, RAY_TMPDIR=str(ray_tmp), RAYFT_FAULT_STEP_DELAY_S="0.5", RAY_metrics_report_interval_ms="1000"
    )
    process = subprocess.Popen(
        command, cwd=REPO, env=ray_env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    output: list[str] = []
    assert process.stdout is not None
    endpoint = None
    for line in process.stdout:
        output.append(line)
        found = re.search(r"Ray exports metrics \(rayft's among them\) at http://(\S+)/metrics", line)
        if found:
            endpoint = found.group(1)
            break
    assert endpoint, "".join(output)[-3000:]
    try:
        with prometheus_server(tmp_path / "prometheus", [endpoint], scrape_interval_s=0.5) as prom:
            start = time.time()
            output += list(process.stdout)
            assert process.wait(timeout=300) == 0, "".join(output)[-4000:]
            end = time.time()
            loss = query_range(prom, 'ray_rayft_train_loss{run="live-ray", rank="0", stage="train"}', start, end)
            assert loss and loss[0]["values"], "".join(output)[-3000:]
            per_worker = query_range(prom, 'ray_rayft_train_tokens_per_second{run="live-ray"}', start, end)
            assert {s["metric"]["rank"] for s in per_worker} == {"0", "1"}
            check_dashboard(prom, "live-ray", start, end, tmp_path / "dashboard-ray.html")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        process.stdout.close()
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)
