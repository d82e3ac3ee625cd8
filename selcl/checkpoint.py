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
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch


class CheckpointError(RuntimeError):
    """A checkpoint or stage input that cannot be used; the message names the file."""


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path next to `path`; rename it to `path` on success only."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save(obj, path: str | Path) -> None:
    """torch.save, atomically. Serialise to memory first so a full disk fails
    before the old file is touched."""
    buf = io.BytesIO()
    torch.save(obj, buf)
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
