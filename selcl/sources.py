"""Content digests of a setting's input files (`data.path`, `noise.file`).

DVC can only depend on paths written in dvc.yaml, and these paths are params. So the
`config` stage, which runs on every `dvc repro`, writes their digest into the data
and noise stages' dependency files: a replaced label file or an image added to a
folder reruns that stage (and what follows); an untouched one reruns nothing.

A file's sha256 is remembered by (size, mtime, inode), as DVC does, so a folder of
many images is read once and then only stat'ed. Imports nothing heavy.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .atomic import atomic_write_text

CACHE = Path("scratch") / "digests.json"     # the stages' stat-keyed sha256 cache (git/dvc-ignored)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class DigestCache:
    """sha256 by (size, mtime_ns, inode), kept in a JSON file under scratch/."""

    def __init__(self, path: Path | None):
        self.path = Path(path) if path else None
        self.entries: dict = {}
        self.dirty = False
        if self.path and self.path.exists():
            try:
                self.entries = json.loads(self.path.read_text())
            except (OSError, ValueError):     # a damaged cache is only slower, never wrong
                self.entries = {}

    def file(self, path: Path) -> str:
        st = path.stat()
        key = str(path.resolve())
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = self.entries.get(key)
        if hit and hit[:3] == stamp:
            return hit[3]
        digest = _sha256(path)
        self.entries[key] = stamp + [digest]
        self.dirty = True
        return digest

    def save(self) -> None:
        if self.path and self.dirty:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps(self.entries))


def digest(path: str | Path | None, cache: DigestCache) -> str | None:
    """sha256 of a file, or of a folder's (relative path, file sha256) list; None if
    there is nothing at `path` (the stage that reads it reports that, by key)."""
    if not path:
        return None
    path = Path(path)
    if path.is_file():
        return cache.file(path)
    if not path.is_dir():
        return None
    h = hashlib.sha256()
    seen = set()        # the data stage reads through symlinked folders, so the digest does too
    for folder, dirs, files in os.walk(path, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:                # a link back up the tree: read each real folder once
            dirs[:] = []
            continue
        seen.add(real)
        dirs.sort()
        for name in sorted(files):
            p = Path(folder) / name
            h.update(f"{p.relative_to(path).as_posix()}\0{cache.file(p)}\n".encode())
    return h.hexdigest()


def output_digest(path: Path, save: bool = True) -> str:
    """sha256 of a stage output (a run's data.npz: a resumed checkpoint must have trained on
    the same images), through the shared cache: hashed once, then only stat'ed. save=False
    reads the cache without writing it (every torchrun rank but rank 0: one writer)."""
    cache = DigestCache(CACHE)
    try:
        return cache.file(Path(path))
    finally:
        if save:
            cache.save()
