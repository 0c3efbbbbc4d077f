"""A URI as storage_path: planning the mirror, uploading checkpoints manifest last, resuming from the
remote run, refusals. Against real pyarrow filesystems: ``file://`` and a local S3 server (moto)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rayft.config import dump_config, load_config
from rayft.config.checks import is_remote
from rayft.errors import CheckpointError, RunStateError, StorageError
from rayft.pipeline.plan import check_remote_stages
from rayft.runs import layout
from rayft.runs.location import RunLocation, join_uri, mirror_dir, plan_run_location, worker_dir
from rayft.runs.manifest import verify_checkpoint, write_manifest
from rayft.runs.remote import RemoteRun, sync_checkpoint
from rayft.runs.store import open_store
from rayft.security import MASK, mask_uri, redact
from rayft.tracking.state import read_ids, write_ids
from rayft.training.driver.startup import claim_run_dir, run_location


@pytest.fixture(scope="module")
def s3_server() -> Iterator[Any]:
    pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra)")
    from tests.support.object_store import local_s3_server

    with local_s3_server() as server:
        yield server


@pytest.fixture(params=["file", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A storage_path URI: a ``file://`` directory, or a fresh bucket on the local S3 server."""
    monkeypatch.setenv("RAYFT_CACHE", str(tmp_path / "cache"))
    if request.param == "file":
        return (tmp_path / "remote").as_uri()
    server = request.getfixturevalue("s3_server")
    bucket = f"b-{abs(hash(str(tmp_path))) % 10**10}"
    return str(server.bucket_uri(bucket, "runs"))


def cfg(storage: str, *overrides: str):  # type: ignore[no-untyped-def]
    return load_config(None, [f"storage_path={storage}", "name=demo", *overrides])


def make_checkpoint(root: Path, step: int, loss: float | None = None) -> Path:
    """A small complete checkpoint folder (two files and a manifest)."""
    directory = root / layout.step_dir_name(step)
    (directory / layout.TRAINER_SUBDIR).mkdir(parents=True)
    (directory / "adapter_model.safetensors").write_bytes(bytes([step]) * 1000)
    (directory / layout.TRAINER_SUBDIR / layout.STATE_FILE).write_text(f'{{"step": {step}}}')
    write_manifest(directory, step, {"eval/loss": loss} if loss is not None else {})
    return directory


# --- planning ----------------------------------------------------------------------------------------------------


def test_a_uri_plans_a_mirror_under_the_cache_and_the_run_uri_before_the_query(tmp_path: Path) -> None:
    uri = "s3://bucket/runs?endpoint_override=127.0.0.1:9000&secret_key=abcdef123456"
    location = plan_run_location(uri, "demo", tmp_path)
    assert location.remote_uri == "s3://bucket/runs/demo?endpoint_override=127.0.0.1:9000&secret_key=abcdef123456"
    assert location.local_dir.parent.parent == tmp_path / "runs"
    assert location.local_dir.name == "demo"
    assert location.display == f"s3://bucket/runs/demo?endpoint_override=127.0.0.1:9000&secret_key={MASK}"
    # a rotated key keeps the mirror; another bucket gets its own
    assert mirror_dir(uri.replace("abcdef123456", "zzzzzz999999"), "demo", tmp_path) == location.local_dir
    assert mirror_dir("s3://other/runs", "demo", tmp_path) != location.local_dir
    assert plan_run_location("runs", "demo", tmp_path).remote_uri is None
    assert plan_run_location("runs", "demo", tmp_path).local_dir == Path("runs").resolve() / "demo"
    assert [is_remote(p) for p in ["gs://b/x", "file:///tmp/x", "hdfs://nn:8020/x", "/tmp/x", "C:\\runs"]] == [
        True, True, True, False, False,
    ]  # fmt: skip
    assert join_uri("gs://b/p/", "run", "train") == "gs://b/p/run/train"


def test_credentials_in_a_uri_are_masked_in_configs_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    uri = "s3://b/runs?access_key=AKIAEXAMPLE123&secret_key=s3cr3t-v4lue&session_token=tok-123456789&scheme=http"
    text = dump_config(cfg(uri))
    assert "s3cr3t-v4lue" not in text and "AKIAEXAMPLE123" not in text and "tok-123456789" not in text
    assert f"secret_key={MASK}" in text and "scheme=http" in text
    assert redact("hdfs://user:hunter2-pass@namenode:8020/runs") == f"hdfs://user:{MASK}@namenode:8020/runs"
    with pytest.raises(StorageError) as error:
        RemoteRun("nosuchscheme://b/runs?secret_key=s3cr3t-v4lue").probe()
    assert "s3cr3t-v4lue" not in str(error.value)


# --- uploads: the manifest last ----------------------------------------------------------------------------------


class _RecordingLocalFs:
    """An fsspec local filesystem that records the order files are written in."""

    def __new__(cls) -> Any:
        from fsspec.implementations.local import LocalFileSystem

        class Recording(LocalFileSystem):  # type: ignore[misc]
            cachable = False

            def __init__(self) -> None:
                super().__init__()
                self.written: list[str] = []

            def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
                if "w" in mode:
                    self.written.append(path)
                return super()._open(path, mode, **kwargs)

        return Recording()


def test_a_checkpoint_is_uploaded_file_by_file_with_its_manifest_last(tmp_path: Path) -> None:
    from pyarrow import fs

    recording = _RecordingLocalFs()
    remote = RemoteRun.on_filesystem(fs.PyFileSystem(fs.FSSpecHandler(recording)), str(tmp_path / "r"), "mem://r")
    local = make_checkpoint(tmp_path / "run" / "checkpoints", 4)
    (local / "zzz-last-by-name.json").write_text("{}")
    write_manifest(local, 4)
    remote.upload_checkpoint(local)
    names = [Path(p).name for p in recording.written]
    assert names[-1] == layout.MANIFEST_FILE
    assert set(names) == {"adapter_model.safetensors", "state.json", "zzz-last-by-name.json", layout.MANIFEST_FILE}


def test_a_remote_checkpoint_without_manifest_is_incomplete_and_removed(storage: str, tmp_path: Path) -> None:
    remote = RemoteRun(join_uri(storage, "demo"))
    remote.probe()
    remote.upload_checkpoint(make_checkpoint(tmp_path / "local", 2))
    partial = make_checkpoint(tmp_path / "local", 4)
    remote.upload_file(partial / "adapter_model.safetensors", "checkpoints/step-000004/adapter_model.safetensors")
    assert [(c.step, c.complete) for c in remote.scan_checkpoints()] == [(2, True), (4, False)]
    assert remote.run_state().steps == (2,)
    assert remote.download_latest_checkpoint(tmp_path / "mirror") == tmp_path / "mirror" / "step-000002"
    assert remote.remove_incomplete() == ["step-000004"]
    assert [c.step for c in remote.scan_checkpoints()] == [2]


def test_a_remote_checkpoint_whose_manifest_cannot_be_read_is_set_aside_never_deleted(
    storage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    remote = RemoteRun(join_uri(storage, "demo"))
    remote.probe()
    for step in (2, 4):
        remote.upload_checkpoint(make_checkpoint(tmp_path / "local", step))
    remote.write_text(f"checkpoints/step-000004/{layout.MANIFEST_FILE}", "{garbage")
    assert [(c.step, c.complete, c.unreadable) for c in remote.scan_checkpoints()] == [
        (2, True, False),
        (4, False, True),
    ]
    assert remote.prune(1) == []
    with caplog.at_level(logging.WARNING):
        assert remote.remove_incomplete() == []
    assert remote.list_files("checkpoints/step-000004.unreadable") == [
        "adapter_model.safetensors",
        layout.MANIFEST_FILE,
        f"{layout.TRAINER_SUBDIR}/{layout.STATE_FILE}",
    ]
    assert "set aside as" in caplog.text and "step-000004.unreadable" in caplog.text
    assert [c.step for c in remote.scan_checkpoints()] == [2]
    assert remote.download_latest_checkpoint(tmp_path / "mirror") == tmp_path / "mirror" / "step-000002"


def test_resume_downloads_the_newest_complete_checkpoint_and_skips_a_corrupted_one(
    storage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    remote = RemoteRun(join_uri(storage, "demo"))
    for step in (2, 4, 6):
        remote.upload_checkpoint(make_checkpoint(tmp_path / "local", step))
    corrupt = tmp_path / "corrupt.bin"
    corrupt.write_bytes(b"\xff" * 1000)  # same size, other bytes
    remote.upload_file(corrupt, "checkpoints/step-000006/adapter_model.safetensors")
    with caplog.at_level(logging.WARNING):
        found = remote.download_latest_checkpoint(tmp_path / "mirror")
    assert found == tmp_path / "mirror" / "step-000004"
    assert (found / "adapter_model.safetensors").read_bytes() == bytes([4]) * 1000
    assert "Skipping checkpoint" in caplog.text and "step-000006" in caplog.text and "sha256" in caplog.text
    assert sorted(p.name for p in (tmp_path / "mirror").iterdir()) == ["step-000004"]  # no download leftovers
    for step in (2, 4):
        remote.upload_file(corrupt, f"checkpoints/{layout.step_dir_name(step)}/adapter_model.safetensors")
    with pytest.raises(CheckpointError, match="no usable checkpoint to resume from under .*failed verification"):
        remote.download_latest_checkpoint(tmp_path / "mirror2")


def test_remote_pruning_follows_num_to_keep(storage: str, tmp_path: Path) -> None:
    remote = RemoteRun(join_uri(storage, "demo"))
    run_dir = tmp_path / "run"
    (run_dir / layout.METRICS_FILE).parent.mkdir(parents=True)
    (run_dir / layout.METRICS_FILE).write_text('{"step": 1}\n')
    for step, loss in [(2, 1.0), (4, 0.5), (6, 0.9), (8, 0.7)]:
        sync_checkpoint(remote, make_checkpoint(run_dir / "checkpoints", step, loss), run_dir, num_to_keep=1)
    # the best by validation loss, and the latest
    assert [c.step for c in remote.scan_checkpoints()] == [4, 8]
    assert remote.read_text(layout.METRICS_FILE) == '{"step": 1}\n'


# --- starting and resuming a remote run --------------------------------------------------------------------------


def test_a_remote_run_is_claimed_refused_and_resumed_on_a_fresh_machine(storage: str, tmp_path: Path) -> None:
    mirror = claim_run_dir(cfg(storage), resume=False)
    location = run_location(cfg(storage))
    assert mirror == location.local_dir and mirror.is_relative_to(tmp_path / "cache" / "runs")
    remote = RemoteRun(location.remote_uri or "")
    assert remote.read_text(layout.CONFIG_FILE) == (mirror / layout.CONFIG_FILE).read_text()
    shown = re.escape(mask_uri(storage).partition("?")[0] + "/demo")
    assert claim_run_dir(cfg(storage), resume=False) == mirror  # it trained nothing yet: started again, not refused

    # the run saved two checkpoints and some metrics, then the machine went away
    (mirror / layout.METRICS_FILE).write_text('{"step": 2, "train/loss": 1.5}\n{"step": 4, "train/loss": 1.2}\n')
    write_ids(mirror, "mlflow", {"run_id": "0123abcd"})
    open_store(location).persist(layout.TRACKING_FILE)
    for step in (2, 4):
        sync_checkpoint(remote, make_checkpoint(mirror / "checkpoints", step), mirror, num_to_keep=None)
    remote.upload_file(make_checkpoint(tmp_path / "x", 6) / "adapter_model.safetensors",
                       "checkpoints/step-000006/adapter_model.safetensors")  # fmt: skip
    import shutil

    shutil.rmtree(tmp_path / "cache")
    with pytest.raises(RunStateError, match=rf"already exists at {shown} \(checkpoints up to step 4\)"):
        claim_run_dir(cfg(storage), resume=False)
    with pytest.raises(Exception, match=r"--resume with a different config: train.learning_rate"):
        claim_run_dir(cfg(storage, "train.learning_rate=1e-3"), resume=True)

    mirror = claim_run_dir(cfg(storage, "train.max_steps=50"), resume=True)
    assert not (mirror / "checkpoints").exists()  # the workers fetch it, each on its own node
    assert remote.download_latest_checkpoint(mirror / "checkpoints") == mirror / "checkpoints" / "step-000004"
    assert '"step": 4' in (mirror / layout.METRICS_FILE).read_text()
    assert read_ids(mirror) == {"mlflow": {"run_id": "0123abcd"}}  # the same tracker runs continue
    assert [c.step for c in remote.scan_checkpoints()] == [2, 4]  # the unfinished upload is gone
    assert "max_steps: 50" in (remote.read_text(layout.CONFIG_FILE) or "")

    remote.upload_tree(make_checkpoint(tmp_path / "final-src", 8), layout.FINAL_DIR)
    with pytest.raises(RunStateError, match=rf"run 'demo' already finished \({shown}/final exists\)"):
        claim_run_dir(cfg(storage), resume=True)


def test_resuming_a_remote_run_that_does_not_exist_is_refused(storage: str) -> None:
    with pytest.raises(RunStateError, match=r"--resume: there is no run at .*/demo to resume; drop --resume"):
        claim_run_dir(cfg(storage), resume=True)


def test_bad_uris_are_reported_before_training_with_the_fix(
    tmp_path: Path, s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYFT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(StorageError, match=r"nosuch://b/runs/demo: pyarrow cannot open this URI .*use a scheme"):
        claim_run_dir(cfg("nosuch://b/runs"), resume=False)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StorageError, match=r"file://.*/file/demo: cannot write there .*or use a local directory"):
        claim_run_dir(cfg(blocker.as_uri()), resume=False)
    missing = s3_server.bucket_uri("no-such-bucket", "runs", create=False)
    with pytest.raises(StorageError, match=r"s3://.*@no-such-bucket/runs/demo\?.*cannot write there .*bucket exists"):
        claim_run_dir(cfg(missing), resume=False)


def test_rayft_run_refuses_stages_that_cannot_write_to_a_uri() -> None:
    check_remote_stages(["train"], "s3://b/runs/p")
    with pytest.raises(
        StorageError, match=r"s3://b/runs/p: the sdg, eval stage\(s\) of `rayft run` write only to a local"
    ):
        check_remote_stages(["sdg", "train", "eval"], "s3://b/runs/p")


def test_rayft_run_with_a_uri_refuses_a_config_with_other_stages_before_starting(tmp_path: Path) -> None:
    from rayft.pipeline import runner as pipeline

    config = tmp_path / "pipeline.yaml"
    config.write_text(f"name: p\nstorage_path: {(tmp_path / 'remote').as_uri()}\ntrain: {{}}\neval: {{}}\n")
    with pytest.raises(StorageError, match=r"the eval stage\(s\) .* remove the `eval:` section\(s\), or use `rayft"):
        pipeline.run(load_config(str(config), []))
    assert not (tmp_path / "remote").exists()


def test_commands_that_write_only_locally_refuse_a_uri_and_name_the_fix(tmp_path: Path) -> None:
    from rayft.sdg.plan import resolve_output_dir

    uri = "gs://bucket/runs?secret_key=s3cr3t-v4lue"
    with pytest.raises(StorageError, match=rf"gs://bucket/runs\?secret_key={re.escape(MASK)}: `rayft sdg` writes only"):
        resolve_output_dir(cfg(uri), None)
    with pytest.raises(StorageError, match=r"set sdg.output_dir=/a/local/dir, or use a local storage_path"):
        resolve_output_dir(cfg(uri), None)
    assert resolve_output_dir(cfg(uri, f"sdg.output_dir={tmp_path}"), None) == tmp_path


def test_workers_of_a_remote_run_work_apart_from_the_drivers_mirror(tmp_path: Path) -> None:
    run_uri = "s3://bucket/runs/demo?endpoint_override=127.0.0.1:9000&secret_key=abcdef123456"
    node = worker_dir(run_uri, tmp_path / "node-cache")
    assert node.parent.parent == tmp_path / "node-cache" / "workers" and node.name == "demo"
    assert worker_dir(run_uri, tmp_path) != plan_run_location("s3://bucket/runs", "demo", tmp_path).local_dir
    assert worker_dir(run_uri.replace("abcdef123456", "zzz"), tmp_path / "node-cache") == node  # a rotated key
    assert worker_dir("s3://bucket/runs/other", tmp_path / "node-cache") != node


def test_a_stop_request_reaches_a_worker_through_the_uri_alone(storage: str, tmp_path: Path) -> None:
    from rayft.runs.stop import StopRequest, StopWatch

    run_uri = join_uri(storage, "demo")
    driver, node = tmp_path / "driver-mirror", tmp_path / "worker-dir"
    StopRequest(RunLocation(driver, run_uri)).send()  # as the SIGTERM handler does; the marker goes up in a thread
    watch = StopWatch(RunLocation(node, run_uri), poll_s=0.05)
    try:
        deadline = time.monotonic() + 10
        while not watch.requested() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.requested() and not (node / layout.STOP_REQUEST_FILE).exists()
    finally:
        watch.close()
    StopRequest(RunLocation(driver, run_uri)).clear()
    assert not RemoteRun(run_uri).is_file(layout.STOP_REQUEST_FILE) and not (driver / layout.STOP_REQUEST_FILE).exists()
    quiet = StopWatch(RunLocation(node, run_uri), poll_s=0.05)
    time.sleep(0.2)
    assert not quiet.requested()
    quiet.close()


def test_the_driver_fetches_what_rank_0_uploaded_from_another_node(storage: str, tmp_path: Path) -> None:
    remote = RemoteRun(join_uri(storage, "demo"))
    node, driver = tmp_path / "node", tmp_path / "driver"
    (node / layout.METRICS_FILE).parent.mkdir(parents=True)
    (node / layout.METRICS_FILE).write_text('{"step": 8}\n')
    (node / layout.TRACKING_UNSENT_FILE).write_text('{"mlflow": {"unsent_steps": [3]}}')
    (node / layout.FINAL_DIR).mkdir()
    make_checkpoint(tmp_path / "src", 8)
    (tmp_path / "src" / "step-000008").rename(node / layout.FINAL_DIR)
    remote.upload_final(node)

    remote.download_results(driver)
    assert (driver / layout.METRICS_FILE).read_text() == '{"step": 8}\n'
    assert (driver / layout.TRACKING_UNSENT_FILE).is_file()
    assert not verify_checkpoint(driver / layout.FINAL_DIR)
    kept = (driver / layout.FINAL_DIR / "adapter_model.safetensors").stat().st_ino
    remote.download_results(driver)  # the same final/ is already there: kept, not downloaded again
    assert (driver / layout.FINAL_DIR / "adapter_model.safetensors").stat().st_ino == kept


def test_a_checkpoint_already_on_the_node_is_not_downloaded_again(storage: str, tmp_path: Path) -> None:
    remote = RemoteRun(join_uri(storage, "demo"))
    remote.upload_checkpoint(make_checkpoint(tmp_path / "src", 4))
    first = remote.download_latest_checkpoint(tmp_path / "node")
    assert first == tmp_path / "node" / "step-000004"
    inode = (first / "adapter_model.safetensors").stat().st_ino
    assert remote.download_latest_checkpoint(tmp_path / "node") == first
    assert (first / "adapter_model.safetensors").stat().st_ino == inode


def test_tracker_run_ids_follow_a_remote_run_to_another_machine(storage: str, tmp_path: Path) -> None:
    location = plan_run_location(storage, "demo", tmp_path / "first-machine")
    write_ids(location.local_dir, "mlflow", {"run_id": "parent-run"})
    open_store(location).persist(layout.TRACKING_FILE)

    elsewhere = plan_run_location(storage, "demo", tmp_path / "second-machine")
    open_store(elsewhere).fetch(layout.TRACKING_FILE)
    assert read_ids(elsewhere.local_dir) == {"mlflow": {"run_id": "parent-run"}}
    write_ids(elsewhere.local_dir, "wandb", {"run_id": "w1"})
    open_store(elsewhere).fetch(layout.TRACKING_FILE)  # a local copy is newer: kept
    assert read_ids(elsewhere.local_dir)["wandb"] == {"run_id": "w1"}
