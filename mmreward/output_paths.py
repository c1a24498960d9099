"""Output folders and files that cannot be written become one-line OutputErrors, not tracebacks.

Checked before any work (a file where a folder goes, a folder under a file, a read-only place) and
mapped when writing fails later (a full disk, a quota): every CLI reports these as usage errors.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from mmreward.errors import OutputError

# errors of writing that the user fixes (free space, pick another place), never a bug of ours
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR,
                          errno.EEXIST, errno.EISDIR, errno.EFBIG})
# the subset that can only come from writing, safe to map wherever an OSError surfaces
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def is_write_error(exc: BaseException, disk_only: bool = False) -> bool:
    return isinstance(exc, OSError) and exc.errno in (DISK_ERRNOS if disk_only else WRITE_ERRNOS)


def output_error(exc: OSError, what: str) -> OutputError:
    """The one-line error for a failed write under `what` (e.g. '--out runs/x')."""
    where = f" {exc.filename}" if exc.filename else ""
    fix = "free disk space" if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else "choose another place"
    return OutputError(f"{what}: cannot write{where} ({exc.strerror or exc}); {fix} and run again")


def check_output_folder(folder: str | os.PathLike, what: str) -> None:
    """Raise an OutputError now if `folder` could not be created or written to (nothing is created)."""
    p = Path(folder).expanduser()
    if p.exists() and not p.is_dir():
        raise OutputError(f"{what} {p} is a file, not a folder; choose another {what.split()[0]}")
    existing = p
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"{what} {p} would be inside {existing}, which is a file; choose another {what.split()[0]}")
    try:  # os.access is no answer for root or read-only mounts: write a probe file and delete it
        with tempfile.TemporaryFile(dir=existing) as probe:
            probe.write(b"x")
            probe.flush()
    except OSError as exc:
        raise output_error(exc, f"{what} {p}") from None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return pid > 0


def remove_dead_temporaries(folder: str | os.PathLike, name: str) -> list[Path]:
    """Remove the hidden temporaries of `name` (`.NAME.tmp-PID`, `.NAME.old-PID`, `.NAME.PID.*`) whose writer
    process no longer exists: what a SIGKILL or a SIGTERM left behind. A live writer's files are kept."""
    import re
    import shutil

    folder = Path(folder)
    if not folder.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(name)}\.(?:(?:tmp|old)-(\d+)|(\d+)\..*)$")
    removed = []
    for entry in folder.iterdir():
        m = pattern.match(entry.name)
        if not m:
            continue
        pid = int(m.group(1) or m.group(2))
        if pid == os.getpid() or _pid_alive(pid):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed
