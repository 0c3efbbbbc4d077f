"""Checkpoint directories on local (or mounted) storage: find the latest complete one, publish a
new one atomically, remove partial and surplus ones.

Decisions come from :mod:`rayft.runs.selection`; this module carries them out.
"""

from __future__ import annotations

import errno
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rayft.errors import CheckpointError, RayftError, StorageError
from rayft.files import replace_dir, temp_path
from rayft.runs import layout
from rayft.runs.layout import parse_step_dir_name
from rayft.runs.manifest import read_manifest, verify_checkpoint
from rayft.runs.selection import (
    CheckpointInfo,
    choose_checkpoint,
    choose_resume,
    plan_cleanup,
    plan_retention,
    set_aside_name,
)

log = logging.getLogger(__name__)


def scan_checkpoints(root: Path) -> list[CheckpointInfo]:
    """Every ``step-*`` directory under ``root``, with its completeness (manifest present) and
    validation loss. Sizes and checksums are checked only when a checkpoint is loaded."""
    if not root.is_dir():
        return []
    infos = []
    for path in root.iterdir():
        step = parse_step_dir_name(path.name)
        if step is None or not path.is_dir():
            continue
        manifest = read_manifest(path)
        loss = manifest.metrics.get("eval/loss") if manifest else None
        unreadable = manifest is None and (path / layout.MANIFEST_FILE).exists()
        infos.append(CheckpointInfo(path.name, step, manifest is not None, loss, unreadable=unreadable))
    return sorted(infos, key=lambda c: c.step)


def latest_valid_checkpoint(root: Path, *, below_step: int | None = None) -> Path | None:
    """The newest checkpoint under ``root`` whose files match their manifest.

    A corrupted or incomplete checkpoint is skipped with a warning that names it and what is
    wrong, so that a bad save costs the steps since the previous one, never the run.
    """
    for info in reversed(scan_checkpoints(root)):
        if below_step is not None and info.step >= below_step:
            continue
        path = root / info.name
        problems = verify_checkpoint(path)
        if not problems:
            return path
        log.warning("Skipping checkpoint %s: %s", path, "; ".join(problems))
    return None


def usable_checkpoint(candidate: Path | None, root: Path) -> Path | None:
    """``candidate`` if it verifies, else the newest valid checkpoint older than it on ``root``."""
    if candidate is None:
        return latest_valid_checkpoint(root)
    problems = verify_checkpoint(candidate)
    if not problems:
        return candidate
    manifest = read_manifest(candidate)
    log.warning("Checkpoint %s is unusable (%s); falling back to an earlier one", candidate, "; ".join(problems))
    below = manifest.step if manifest else parse_step_dir_name(candidate.name)
    return latest_valid_checkpoint(root, below_step=below)


def resume_checkpoint(candidate: Path | None, root: Path) -> Path | None:
    """The checkpoint a (re)started worker loads: :func:`usable_checkpoint`, except that when
    checkpoints exist but none verifies, the run stops with an error instead of silently
    restarting from step 0 and losing them."""
    found = usable_checkpoint(candidate, root)
    if found is not None:
        return found
    existing = [root / c.name for c in scan_checkpoints(root) if c.complete]
    if candidate is not None and candidate not in existing:
        existing.append(candidate)
    if existing:
        names = ", ".join(str(p) for p in existing)
        raise CheckpointError(
            f"no usable checkpoint to resume from: {names} failed verification (the warnings above name the "
            f"bad files); restarting from step 0 would discard them. Restore the files from a backup, or delete "
            f"{root} to start the run over."
        )
    return None


def publish_checkpoint(staging: Path, target: Path) -> None:
    """Commit a fully written checkpoint: rename ``staging`` to ``target``.

    ``staging`` is normally a directory beside ``target`` (same filesystem); one written elsewhere
    is first copied there. The rename is the commit point, so readers never see a half-written
    ``step-N/``. An older checkpoint of the same step (a step redone after a restart) is first
    moved aside, then deleted."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if staging.parent.resolve() != target.parent.resolve():
        # Written elsewhere (another filesystem, perhaps): copy beside the target first.
        beside = temp_path(target, "partial")
        shutil.rmtree(beside, ignore_errors=True)
        shutil.copytree(staging, beside)
        shutil.rmtree(staging, ignore_errors=True)
        staging = beside
    replace_dir(staging, target, sync=True)


LOW_SPACE_BYTES = 64 * 2**20
"""Free space under which a failed write is put down to a full disk even when the writer's error
does not say so (torch.save reports ``basic_ios::clear: iostream error`` or ``unexpected pos``)."""


@contextmanager
def full_disk_reported(staging: Path, root: Path) -> Iterator[None]:
    """Turn a checkpoint write into ``staging`` that failed for want of space into a StorageError that
    names the place and what was kept (the newest complete checkpoint under ``root``); the partial
    write is removed, so the space it took is given back."""
    try:
        yield
    except RayftError:
        raise
    except Exception as exc:
        if not _out_of_space(exc, staging):
            raise
        shutil.rmtree(staging, ignore_errors=True)
        kept = choose_resume(scan_checkpoints(root))
        what = (
            f"the newest complete checkpoint {root / kept.name}, which --resume continues from"
            if kept is not None
            else "no complete checkpoint yet"
        )
        raise StorageError(
            f"no space left on {_mount_point(staging)} while writing {staging.name} under {root} "
            f"({type(exc).__name__}: {exc}); kept: {what}; the partial write was removed. Free space there, "
            "lower checkpoint.num_to_keep, or set storage_path to a larger volume"
        ) from exc


def _out_of_space(exc: BaseException, where: Path) -> bool:
    """Whether a failed write ran out of space: ENOSPC or EDQUOT said, or almost nothing left there."""
    current: BaseException | None = exc
    while current is not None:
        if getattr(current, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(current):
            return True
        current = current.__cause__ or current.__context__
    existing = next((p for p in (where, *where.parents) if p.exists()), Path("/"))
    return shutil.disk_usage(existing).free < LOW_SPACE_BYTES


def _mount_point(path: Path) -> Path:
    """The mount point of the filesystem that holds ``path`` (what a user frees space on)."""
    current = next((p for p in (path, *path.parents) if p.exists()), Path("/")).resolve()
    while not current.is_mount() and current != current.parent:
        current = current.parent
    return current


def remove_incomplete(root: Path) -> list[Path]:
    """Delete step directories without a manifest and leftover staging directories; return them.

    A step directory whose manifest exists but cannot be read was committed: it is set aside
    (:func:`set_aside`), never deleted."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    plan = plan_cleanup(scan_checkpoints(root))
    for info in plan.set_aside:
        set_aside(root / info.name)
    removed += [root / info.name for info in plan.remove]
    removed += [p for p in root.glob(".step-*.partial-*") if p.is_dir()]
    removed += [p for p in root.glob(".step-*.old-*") if p.is_dir()]
    for path in removed:
        log.warning("Removing incomplete checkpoint %s (its save did not finish)", path)
        shutil.rmtree(path, ignore_errors=True)
    return removed


def set_aside(checkpoint: Path) -> Path | None:
    """Rename a committed checkpoint whose manifest cannot be read to ``step-N.unreadable`` (out of
    every reader's sight, its files kept for a person to look at) and say so in one line. Returns the
    new path, or None when another process moved it first."""
    target = checkpoint.with_name(set_aside_name(checkpoint.name, {p.name for p in checkpoint.parent.iterdir()}))
    try:
        checkpoint.rename(target)
    except FileNotFoundError:  # another rank of the same run set it aside a moment before
        return None
    log.warning(
        "Checkpoint %s has a %s that cannot be read, so its save was committed but it cannot be verified; "
        "set aside as %s (kept, never deleted) and resuming from the checkpoint before it",
        checkpoint.name, layout.MANIFEST_FILE, target,
    )  # fmt: skip
    return target


def prune_checkpoints(root: Path, num_to_keep: int | None) -> list[Path]:
    """Delete the checkpoints :func:`plan_retention` marks as surplus; return them."""
    doomed = [root / c.name for c in plan_retention(scan_checkpoints(root), num_to_keep)]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def is_run_dir(path: Path) -> bool:
    """A training run directory (holds checkpoints/ or final/ and the run's config.yaml)."""
    return (path / layout.CHECKPOINTS_DIR).is_dir() or (
        (path / layout.FINAL_DIR).is_dir() and (path / layout.CONFIG_FILE).is_file()
    )


def is_pipeline_dir(path: Path) -> bool:
    """A pipeline run directory (``rayft run``): it holds the records of its stages (``rayft run`` makes
    their directory as it starts), or, stopped before it had one, its config and a training stage's run."""
    if is_run_dir(path):
        return False
    if (path / layout.STAGE_RECORDS_DIR).is_dir():
        return True
    return (path / layout.CONFIG_FILE).is_file() and any(is_run_dir(path / s) for s in layout.TRAINED_STAGES)


def unfinished_training_stage(path: Path) -> str | None:
    """The last training stage of a pipeline run directory that left a run directory but no record (it was
    stopped, or failed, before it finished); None when there is none."""
    for stage in layout.TRAINED_STAGES:
        if is_run_dir(path / stage) and not (path / layout.STAGE_RECORDS_DIR / f"{stage}.json").is_file():
            return stage
    return None


def trained_run_of_pipeline(path: Path) -> Path | None:
    """The training run of a pipeline run directory's final model: its last training stage that finished
    (rl, preference, else train) and left a run directory; None when no training stage did."""
    for stage in layout.TRAINED_STAGES:
        run = path / stage
        if (path / layout.STAGE_RECORDS_DIR / f"{stage}.json").is_file() and is_run_dir(run):
            return run
    return None


def final_info(run_dir: Path) -> CheckpointInfo | None:
    """What a planner needs to know of ``final/`` of a run (None when there is no final/)."""
    final = run_dir / layout.FINAL_DIR
    if not final.is_dir():
        return None
    manifest = read_manifest(final)
    loss = manifest.metrics.get("eval/loss") if manifest else None
    return CheckpointInfo(layout.FINAL_DIR, manifest.step if manifest else -1, manifest is not None, loss)


def checkpoint_of_run(run_dir: Path, selector: str) -> Path:
    """The checkpoint directory of ``run_dir`` chosen by ``selector``."""
    chosen = choose_checkpoint(scan_checkpoints(run_dir / layout.CHECKPOINTS_DIR), final_info(run_dir), selector)
    return run_dir / chosen


def keep_only_newest(staging: Path, target: Path) -> None:
    """Publish ``staging`` as ``target`` and delete the other checkpoints beside it: for a node's
    copy of a run whose durable checkpoints are elsewhere (a restart here needs no download)."""
    publish_checkpoint(staging, target)
    for info in scan_checkpoints(target.parent):
        if info.name != target.name:
            shutil.rmtree(target.parent / info.name, ignore_errors=True)
