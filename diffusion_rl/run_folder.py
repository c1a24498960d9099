"""One run per output folder: refuse to mix runs, a run id on everything written, and a lock.

A rerun into a folder that already holds a run would append to its metrics.jsonl and put new checkpoints
beside stale ones (and `resume_from=latest` would then pick the stale run). So a new run needs an empty
folder, or `log.overwrite=true` (which removes the earlier run's files, listed in RUN_ARTIFACTS), or
`log.new_run_suffix=true` (which writes to the first free `<output_dir>-N`). Resuming keeps the folder and
the checkpoint's run id. While a run trains, `.run.lock` holds its pid: a second run started on the same
folder is refused instead of interleaving its lines with the first's.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from mmreward.errors import ConfigError
from mmreward.safe_parse import safe_json

RUN_FILE = "run.json"
LOCK_FILE = ".run.lock"
# what a run writes into its folder (trackers' folders included): log.overwrite removes these, nothing else
RUN_ARTIFACTS = ("metrics.jsonl", "config.yaml", RUN_FILE, "checkpoints", "grids", "final", "reward_curve.png",
                 "tensorboard", "wandb", "eval_samples")
RUN_ARTIFACT_GLOBS = ("eval_grid*.png", "eval_samples*", ".final.tmp-*", ".metrics.jsonl.tmp-*")


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _entries(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name != LOCK_FILE] if folder.is_dir() else []


def choose_output_dir(folder: Path, *, resuming: bool, overwrite: bool, new_run_suffix: bool) -> Path:
    """The folder a run writes to; raises a ConfigError when a new run would mix with an earlier one."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"log.output_dir: {folder} is a file, not a folder; choose another log.output_dir")
    from mmreward.output_paths import check_output_folder

    check_output_folder(folder, "log.output_dir")  # under a file, or read-only: before any model is loaded
    if resuming or not _entries(folder):
        return folder
    if new_run_suffix:
        n = 2
        while _entries(folder.with_name(f"{folder.name}-{n}")) or folder.with_name(f"{folder.name}-{n}").is_file():
            n += 1
        return folder.with_name(f"{folder.name}-{n}")
    if overwrite:
        check_not_locked(folder)
        for name in RUN_ARTIFACTS:
            p = folder / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
        for pattern in RUN_ARTIFACT_GLOBS:
            for p in folder.glob(pattern):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        return folder
    shown = ", ".join(sorted(p.name + ("/" if p.is_dir() else "") for p in _entries(folder))[:6])
    raise ConfigError(
        f"log.output_dir {folder} already holds files ({shown}); a new run there would mix with them. Resume it "
        "with train.resume_from=latest, choose another log.output_dir, or set log.overwrite=true (removes the "
        "earlier run's files) or log.new_run_suffix=true (writes to the first free "
        f"{folder.name}-N)"
    )


def read_run_id(folder: Path) -> str | None:
    try:
        data = safe_json((folder / RUN_FILE).read_text())
    except (OSError, ValueError):  # UnsafeJSONError is a ValueError too
        return None
    run_id = data.get("run_id") if isinstance(data, dict) else None
    return run_id if isinstance(run_id, str) and run_id else None


def write_run_file(folder: Path, run_id: str, resumed_from: str | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{RUN_FILE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({"run_id": run_id, "resumed_from": resumed_from}, indent=1))
    os.replace(tmp, folder / RUN_FILE)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _lock_owner(folder: Path) -> int | None:
    try:
        pid = int((folder / LOCK_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid != os.getpid() and _pid_alive(pid) else None


def check_not_locked(folder: Path) -> None:
    pid = _lock_owner(folder)
    if pid is not None:
        raise ConfigError(f"log.output_dir {folder} is in use by another run (pid {pid}, {folder / LOCK_FILE}); "
                          "wait for it to finish or choose another log.output_dir")


def acquire_lock(folder: Path) -> Path:
    """Create `.run.lock` with our pid; a lock left by a process that no longer exists is taken over."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_FILE
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            check_not_locked(folder)
            lock.unlink(missing_ok=True)  # stale (its process is gone) or ours
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return lock
    raise ConfigError(f"log.output_dir {folder}: could not take {lock}; another run may be starting there")


def release_lock(folder: Path) -> None:
    lock = folder / LOCK_FILE
    try:
        if int(lock.read_text().strip() or 0) == os.getpid():
            lock.unlink()
    except (OSError, ValueError):
        pass
