"""The training images' file names in THE dataset order (selcl/data.py): the `file` column
of the label-issues tables, so a row can be traced back to its image."""
from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np

# the data module's own helpers, not a copy: the names cannot drift from the images' order
from .data import _class_ordered, _collect_dir, _split_member
from .errors import DataError


def train_files(data_cfg: dict, n: int) -> np.ndarray:
    """The `file` column: for an image folder (or .tar.gz), each training image's path in the
    dataset order of selcl/data.py (built by its own helpers, so the two cannot drift);
    empty for the built-in datasets, whose rows the index alone identifies."""
    if data_cfg["dataset"] != "imagefolder":
        return np.full(n, "", dtype=object)
    path = Path(data_cfg["path"])
    if path.is_dir():
        entries = _collect_dir(path)
    else:   # names only: no image is read or decoded
        entries = {}
        try:
            with tarfile.open(path, "r|*") as tf:
                for m in tf:
                    s = _split_member(tuple(p for p in m.name.split("/") if p not in ("", "."))) if m.isfile() else None
                    if s is not None:
                        entries[s[1:]] = (None, f"{path}:{m.name}")
        except (tarfile.TarError, OSError, EOFError) as e:
            raise DataError(f"data.path = {path}: cannot list the image archive ({e})") from None
    classes = sorted({c for s, c, _ in entries if s == "train"})
    items, _ = _class_ordered(entries, "train", classes, data_cfg["subset"])
    if len(items) != n:
        raise DataError(f"data.path = {path}: lists {len(items)} training images but data.npz holds {n}: "
                        f"the folder changed since the data stage ran; rerun `dvc repro`")
    return np.asarray([shown for _, shown in items], dtype=object)
