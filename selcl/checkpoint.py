"""Atomic files and resumable checkpoints.

Every file a stage produces is written to a temporary name in the same folder and
renamed into place (`os.replace` is atomic on POSIX), so a killed stage never
leaves a half-written file that a later stage or DVC could take as valid, and a
full disk while writing a checkpoint leaves the previous checkpoint intact.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

import torch


class CheckpointError(RuntimeError):
    """A checkpoint or stage input that cannot be used; the message names the file."""


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


def _canonical(obj, strings: dict, seen: dict):
    """`obj` with every string replaced by one shared object per value (containers
    rebuilt, sharing kept, tensors untouched).

    pickle memoises by identity: a history row built in this process (keys are the
    code's interned literals) and one loaded from a checkpoint (fresh key objects)
    pickle to different bytes. With equal strings made one object, a resumed run's
    files are byte-identical to an uninterrupted run's, so DVC hashes and the
    fingerprints of later stages (`file_digest`) do not depend on a kill."""
    t = type(obj)
    if t is str:
        return strings.setdefault(obj, obj)
    if t not in (dict, OrderedDict, list, tuple):
        return obj
    if id(obj) in seen:
        return seen[id(obj)]
    if t is tuple:
        new = tuple(_canonical(v, strings, seen) for v in obj)
    elif t is list:
        new = []
        seen[id(obj)] = new
        new.extend(_canonical(v, strings, seen) for v in obj)
    else:
        new = t()
        seen[id(obj)] = new
        for k, v in obj.items():
            new[_canonical(k, strings, seen)] = _canonical(v, strings, seen)
        for k, v in getattr(obj, "__dict__", {}).items():     # state_dict()._metadata
            setattr(new, k, _canonical(v, strings, seen))
    seen[id(obj)] = new
    return new


def save(obj, path: str | Path) -> None:
    """torch.save, atomically. Serialise to memory first so a full disk fails
    before the old file is touched; equal content gives equal bytes (`_canonical`)."""
    buf = io.BytesIO()
    torch.save(_canonical(obj, {}, {}), buf)
    atomic_write_bytes(path, buf.getvalue())


def load(path: str | Path, *, what: str = "checkpoint") -> dict:
    """torch.load with a one-line error naming the file when it is missing or corrupt."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: {what} not found (run the stage that produces it first)")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means corrupt
        raise CheckpointError(f"{path}: corrupt {what} ({type(exc).__name__}); "
                              f"delete it and rerun the stage that produces it") from None


def fingerprint(*parts) -> str:
    """A stable hash of configs / input hashes: a checkpoint resumes only a run
    with the same fingerprint."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


class Checkpointer:
    """Save the complete training state every `every` epochs; resume it if it
    belongs to this run (same fingerprint)."""

    def __init__(self, path: str | Path, fingerprint: str, every: int):
        self.path, self.fp, self.every = Path(path), fingerprint, max(1, int(every))

    def load(self) -> dict | None:
        if not self.path.exists():
            return None
        state = load(self.path)
        if not isinstance(state, dict) or "fingerprint" not in state:
            raise CheckpointError(f"{self.path}: not a checkpoint of this pipeline; delete it to start fresh")
        if state["fingerprint"] != self.fp:
            print(f"[checkpoint] {self.path} belongs to other params/inputs: starting fresh")
            return None
        return state

    def maybe_save(self, epoch: int, total: int, state_fn) -> None:
        if epoch % self.every == 0 or epoch == total:
            state = state_fn()
            state["fingerprint"] = self.fp
            save(state, self.path)
