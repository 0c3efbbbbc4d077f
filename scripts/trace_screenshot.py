"""Screenshot a rayft profiler trace in the Catapult trace viewer (``chrome://tracing``'s), offline.

    python scripts/trace_screenshot.py docs/images/profile-trace.png     # trains a short run first
    python scripts/trace_screenshot.py out.png --trace runs/my-run/profile/trace-rank-0000.json

Without ``--trace`` it trains the quickstart model (SmolLM2-135M-Instruct, LoRA r 16) in this
process for 6 steps with ``train.profile`` recording its 4th and 5th steps
(``ProfilerStep#3`` and ``#4``), and shows rank 0's trace.

The viewer is ``trace_viewer_full.html`` from the ``torch-tb-profiler`` wheel (TensorBoard's PyTorch
plugin; its Trace view embeds it) and the ``webcomponents.js`` 0.7.24 polyfill from npm, which that
Trace view would load from a CDN: both are fetched once with ``pip download`` and ``npm pack`` into
``--cache`` and never installed, so neither is a dependency of rayft. The page, with the trace inlined,
is served on 127.0.0.1 (the polyfill loads the viewer with XHR) and shot by headless Chromium, driven
over the DevTools protocol so that the shot waits for the viewer to draw the trace.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import http.server
import itertools
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

VIEWER_WHEEL = "torch-tb-profiler==0.4.3"
POLYFILL = "webcomponents.js@0.7.24"
CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[1]

PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<script>window.__hideTraceViewerPolyfillWarning = true;</script>
<script src="webcomponents.min.js"></script>
<link rel="import" href="trace_viewer_full.html">
<style>html, body {{ margin: 0; width: 100%; height: 100%; overflow: hidden; }}
#viewer {{ width: 100%; height: 100%; }}</style>
<script id="trace-data" type="application/json">{trace}</script>
<script>
'use strict';
document.addEventListener('WebComponentsReady', () => {{
  const viewer = document.createElement('tr-ui-timeline-view');
  const container = document.createElement('track-view-container');
  container.id = 'track_view_container';
  viewer.track_view_container = container;
  Polymer.dom(viewer).appendChild(container);
  viewer.id = 'viewer';
  viewer.globalMode = true;
  Polymer.dom(document.body).appendChild(viewer);
  const model = new tr.Model();
  // importTraces runs the import synchronously, so the first frames already show the trace.
  new tr.importer.Import(model).importTraces([document.getElementById('trace-data').textContent]);
  viewer.model = model;
  viewer.viewTitle = {title_js};
  const focus = {focus_js};
  whenDrawn(viewer, () => {{
    if (focus) select(viewer, model, focus);
    requestAnimationFrame(() => requestAnimationFrame(() => {{ document.title = 'ready'; }}));
  }});
}});

// Call then() once the track view has the model and has set its first viewport (it polls for its size).
function whenDrawn(viewer, then) {{
  const track = viewer.trackView;
  if (track && track.model_ && track.pollIfViewportAttachedInterval_ === undefined) then();
  else setTimeout(() => whenDrawn(viewer, then), 50);
}}

// Select the first slice whose name starts with focus.name; zoom to it, with margins, if asked.
function select(viewer, model, focus) {{
  let found;
  for (const thread of model.getAllThreads()) {{
    for (const slice of thread.sliceGroup.slices) {{
      if (slice.title.startsWith(focus.name) && (!found || slice.start < found.start)) found = slice;
    }}
  }}
  if (!found) throw new Error('no slice named ' + focus.name);
  // The polyfill's wrapper of the track view hides its getters; its fields are what they read.
  const track = viewer.trackView;
  if (focus.zoom) {{
    const transform = new tr.ui.TimelineDisplayTransform();
    transform.set(track.viewport_.currentDisplayTransform);
    const [before, after] = focus.zoom;
    transform.xSetWorldBounds(found.start - before, found.end + after, track.modelTrackContainer_.canvas.width);
    track.viewport_.setDisplayTransformImmediately(transform);
  }}
  track.brushingStateController_.changeSelectionFromTimeline(new tr.model.EventSet([found]));
}}
</script></head><body></body></html>
"""


def fetch_viewer(cache: Path) -> Path:
    """The viewer's two files in ``cache/site`` (downloaded on the first call)."""
    site = cache / "site"
    if (site / "trace_viewer_full.html").is_file() and (site / "webcomponents.min.js").is_file():
        return site
    site.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", VIEWER_WHEEL, "-d", str(cache)]
    subprocess.run(pip, check=True)
    with zipfile.ZipFile(next(cache.glob("torch_tb_profiler-*.whl"))) as wheel:
        (site / "trace_viewer_full.html").write_bytes(wheel.read("torch_tb_profiler/static/trace_viewer_full.html"))
    subprocess.run(["npm", "pack", POLYFILL, "--pack-destination", str(cache)], check=True, capture_output=True)
    with tarfile.open(next(cache.glob("webcomponents.js-*.tgz"))) as package:
        member = package.extractfile("package/webcomponents.min.js")
        assert member is not None  # a regular file in every 0.7.x package
        (site / "webcomponents.min.js").write_bytes(member.read())
    return site


def write_page(site: Path, trace: Path, title: str, focus: dict[str, object] | None = None) -> Path:
    """The viewer's page with ``trace`` inlined (``</`` escaped so the JSON cannot close its script);
    ``focus`` selects a slice (``name``: the start of its name) and zooms to it (``zoom``: ms shown
    before and after it), when given."""
    text = trace.read_text().replace("</", "<\\/")
    page = site / "index.html"
    page.write_text(PAGE.format(title=title, title_js=json.dumps(title), focus_js=json.dumps(focus), trace=text))
    return page


@contextmanager
def serve(site: Path) -> Iterator[str]:
    """``site`` over HTTP on a free port of 127.0.0.1, for as long as the block runs; yields its URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the base class names it format
        """Keep the request log off the console."""


def screenshot(url: str, png: Path, size: tuple[int, int], profile_dir: Path, timeout_s: float = 180) -> None:
    """Render ``url`` in headless Chromium and write a PNG of it once the page's title says ``ready``
    (the viewer has drawn the trace), driving the browser over the DevTools protocol."""
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
        f"--user-data-dir={profile_dir}", "--remote-debugging-port=0", f"--window-size={size[0]},{size[1]}",
        "about:blank",
    ]  # fmt: skip
    browser = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port = _devtools_port(profile_dir, browser, timeout_s)
        png.write_bytes(asyncio.run(_capture(port, url, size, timeout_s)))
    finally:
        browser.terminate()
        browser.wait(timeout=30)


def _devtools_port(profile_dir: Path, browser: subprocess.Popen[bytes], timeout_s: float) -> int:
    """The DevTools port Chromium picked, from the file it writes into its profile."""
    active = profile_dir / "DevToolsActivePort"
    deadline = time.monotonic() + timeout_s
    while not (active.is_file() and active.read_text().strip()):
        if browser.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{CHROMIUM} did not open its DevTools port (exit status {browser.poll()})")
        time.sleep(0.1)
    return int(active.read_text().split()[0])


async def _capture(port: int, url: str, size: tuple[int, int], timeout_s: float) -> bytes:
    """Navigate the browser's page, sized ``size``, to ``url``, wait for the title ``ready`` and take the PNG."""
    import aiohttp  # Ray's dashboard brings it; only this tool needs it

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as reply:
            page = next(t for t in await reply.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as socket:
            calls = itertools.count(1)

            async def call(method: str, **params: object) -> dict[str, Any]:
                number = next(calls)
                await socket.send_json({"id": number, "method": method, "params": params})
                async for message in socket:  # events come in between; the answer has our id
                    answer = json.loads(message.data)
                    if answer.get("id") == number:
                        if "error" in answer:
                            raise RuntimeError(f"{method}: {answer['error']}")
                        return dict(answer["result"])
                raise RuntimeError(f"the browser closed the connection during {method}")

            width, height = size
            await call(
                "Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False
            )
            await call("Page.navigate", url=url)
            deadline = time.monotonic() + timeout_s
            while (await call("Runtime.evaluate", expression="document.title"))["result"].get("value") != "ready":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the trace viewer did not finish drawing {url} in {timeout_s:.0f} s")
                await asyncio.sleep(0.2)
            shot = await call("Page.captureScreenshot", format="png")
            return base64.b64decode(shot["data"])


def train_trace(root: Path, steps: int = 6) -> Path:
    """Train the quickstart model in this process with a trace window over its 4th and 5th steps; rank 0's trace."""
    sys.path.insert(0, str(REPO / "src"))
    from rayft.config import CheckpointConfig, ModelConfig, load_config
    from rayft.models.loading import load_tokenizer
    from rayft.runs import layout
    from rayft.runs.location import RunLocation
    from rayft.testing.units import arithmetic_prepared
    from rayft.training.driver.launcher import launch_local
    from rayft.training.driver.startup import build_worker_plan, claim_run_dir

    model = "smollm2-135m-instruct"
    cfg = load_config(None, [
        f"model.name={model}", f"storage_path={root}", "name=traced", "seed=0", f"train.max_steps={steps}",
        "train.micro_batch_size=2", "train.logging_steps=1", "train.save_steps=1000000", "train.eval_steps=null",
        "lora.r=16", "lora.alpha=32", "logging.tensorboard=false", "train.profile.wait_steps=2",
        "train.profile.warmup_steps=1", "train.profile.active_steps=2",
    ])  # fmt: skip
    prepared = arithmetic_prepared(root / "units", load_tokenizer(ModelConfig(name=model)), num_train=steps * 2)
    run_dir = claim_run_dir(cfg, resume=False)
    launch_local(build_worker_plan(cfg, prepared, RunLocation(run_dir)), prepared, CheckpointConfig())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for record in (r for r in records if "time/step" in r):  # the profiler's cost shows in steps 4 and 5
        print(f"step {record['step']}: {record['time/step']:.2f} s")
    return run_dir / layout.trace_file(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("png", type=Path, help="the screenshot to write")
    parser.add_argument("--trace", type=Path, help="a trace to show (default: train a short run and show its trace)")
    parser.add_argument("--keep", type=Path, help="copy the trace shown to this path")
    parser.add_argument("--select", default="ProfilerStep#", help="select the first slice whose name starts so")
    parser.add_argument("--zoom", help="BEFORE_MS,AFTER_MS: zoom to the selected slice with these margins")
    parser.add_argument("--size", default="1400x650", help="the browser window, WIDTHxHEIGHT pixels")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "rayft-trace-viewer")
    args = parser.parse_args()
    width, height = (int(x) for x in args.size.split("x"))
    zoom = [float(x) for x in args.zoom.split(",")] if args.zoom else None
    site = fetch_viewer(args.cache)
    with tempfile.TemporaryDirectory(prefix="trace-shot-") as tmp:
        trace = args.trace or train_trace(Path(tmp))
        if args.keep:
            shutil.copyfile(trace, args.keep)
        write_page(site, trace, trace.name, {"name": args.select, "zoom": zoom})
        with serve(site) as url:
            screenshot(f"{url}/index.html", args.png, (width, height), Path(tmp) / "chromium-profile")
    print(f"{args.png}: {args.png.stat().st_size} bytes, the trace of {trace.name}")


if __name__ == "__main__":
    main()
