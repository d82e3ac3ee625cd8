"""Atomic files: every output is written to a hidden temporary name in the same
folder, fsync'ed, and renamed into place (`os.replace` is atomic on POSIX), so a
killed or failing writer never leaves a half-written file that a later stage or DVC
could take as valid. No torch here: the data module uses it too.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path


def _tmp_pattern(path: Path) -> re.Pattern:
    """Names `tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp")` gives for `path`."""
    return re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")


def _default_mode() -> int:
    """rw for whom the umask allows (0o644 under the usual 022), as `open()` would give."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (power loss); best effort where unsupported."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path next to `path`; rename it to `path` on success only.

    The destination always holds either its old or its new complete content: the
    data is fsync'ed before `os.replace`. On any failure (full disk, exception,
    Ctrl-C) the temp file is removed; one orphaned by kill -9 is hidden
    (`.<name>.XXXXXXXX.tmp`, never a DVC output) and removed by the next
    successful write of the same file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, _default_mode())   # mkstemp makes 0600; outputs get the usual mode
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        if exc.filename is None:          # e.g. ENOSPC from write/fsync: say which output
            exc.filename = str(path)
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    # Temp files of this destination orphaned by a killed writer.
    pattern = _tmp_pattern(path)
    for stale in path.parent.iterdir():
        if pattern.fullmatch(stale.name):
            try:
                stale.unlink()
            except OSError:
                pass


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
