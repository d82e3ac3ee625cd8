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
from collections import OrderedDict
from pathlib import Path

import torch

from .atomic import atomic_path, atomic_write_bytes, atomic_write_text, write_json  # noqa: F401
from . import dist


from .errors import CheckpointError  # noqa: F401 - raised here, defined with the other stage errors


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


def saved_processes(rng: dict) -> int:
    """How many processes' random streams a saved state holds (one entry per rank under DDP)."""
    return len(rng["ranks"]) if "ranks" in rng else 1


def rerun_error(source, wrong: str) -> CheckpointError:
    """A stage output whose random streams the next stage cannot continue."""
    return CheckpointError(f"{source} {wrong}: its stage continues as one run, so run it again "
                           f"with the same SELCL_NPROC and device as this one")


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

    def discard(self) -> None:
        """The stage's outputs are written: the resume state has served its purpose.
        Removing it (and its folder, when empty) keeps every version of a long run's
        state out of the disk and out of DVC, whose run-cache needs no persistent outputs.
        SELCL_KEEP_CHECKPOINTS=1 keeps it (to inspect the saved state, as tests do)."""
        if os.environ.get("SELCL_KEEP_CHECKPOINTS") == "1":
            return
        self.path.unlink(missing_ok=True)
        for folder in (self.path.parent, self.path.parent.parent):
            try:
                folder.rmdir()
            except OSError:          # not empty (another stage's state) or already gone
                break

    def maybe_save(self, epoch: int, total: int, state_fn) -> None:
        if epoch % self.every == 0 or epoch == total:
            state = state_fn()          # every rank (under DDP it gathers RNG states) ...
            state["fingerprint"] = self.fp
            if dist.is_main():          # ... but only rank 0 writes
                save(state, self.path)
