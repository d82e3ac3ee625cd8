"""CIFAR-10 / CIFAR-100 as the JPEG image-folder archive the real-image CPU presets read.

The presets `cpu_cifar10_asym40` and `cpu_cifar10_sym50` (params.yaml) read
`data/cifar10-jpeg.tar.gz`: `train/<class>/NNNN.jpg` and `test/<class>/NNNN.jpg`, JPEG
quality 75, 32 px. This writes that archive from torchvision's CIFAR (downloaded into
`--root` when missing, as the paper suite's data stage does):

    python tools/cifar_imagefolder.py                   # → data/cifar10-jpeg.tar.gz
    python tools/cifar_imagefolder.py --dataset cifar100 --out data/cifar100-jpeg.tar.gz

Order: inside each class the files are numbered in the dataset's order (the order of the
pickled batches), so `data.subset: k` keeps the first k images of every class, as it does
on the pickles. Class folders are the dataset's class names when those sort in class-id
order (true for CIFAR-10 and CIFAR-100: the image-folder loader numbers classes by sorted
name, and the presets' `asym_map: cifar10` is by class id); otherwise each is prefixed
with its zero-padded id. Images are encoded with Pillow at `--quality` (default 75,
4:2:0 chroma subsampling, Pillow's defaults otherwise): the settings of the archive the
recorded CPU numbers used (docs/evidence.md), whose JPEG quantisation tables and
headers are Pillow's at quality 75. The tar is deterministic (sorted members, zero mtimes
and owners), written atomically: a failed run leaves no partial file and no older file
overwritten.
"""
from __future__ import annotations

import argparse
import gzip
import io
import sys
import tarfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from selcl.atomic import atomic_path  # noqa: E402
from selcl.errors import DataError  # noqa: E402


def folder_names(classes: list) -> list[str]:
    """One folder name per class id whose sorted order is the class-id order."""
    names = [str(c) for c in classes]
    if names == sorted(names) and len(set(names)) == len(names) and all("/" not in n for n in names):
        return names
    width = len(str(len(names) - 1))
    return [f"{i:0{width}d}_{n.replace('/', '_')}" for i, n in enumerate(names)]


def _jpeg(img_chw, quality: int) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(img_chw.transpose(1, 2, 0)).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes | None) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if data is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    else:
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))


def write_archive(x_train, y_train, x_test, y_test, classes, out, quality: int = 75,
                  progress: bool = True) -> dict:
    """Write the image-folder .tar.gz; x uint8 [N, 3, H, W], y int [N]. Returns counts."""
    from tqdm import tqdm
    names = folder_names(classes)
    total = len(y_train) + len(y_test)
    with atomic_path(out) as tmp, open(tmp, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tar, \
            tqdm(total=total, desc=f"writing {Path(out).name}", unit="img", disable=not progress) as bar:
        for split, x, y in (("test", x_test, y_test), ("train", x_train, y_train)):
            _add(tar, f"{split}/", None)
            per_class = [np.flatnonzero(np.asarray(y) == c) for c in range(len(names))]
            width = max(4, len(str(max(len(p) for p in per_class) - 1)))
            for c, idx in enumerate(per_class):
                _add(tar, f"{split}/{names[c]}/", None)
                for k, i in enumerate(idx):       # k-th image of class c in dataset order
                    _add(tar, f"{split}/{names[c]}/{k:0{width}d}.jpg", _jpeg(x[i], quality))
                    bar.update(1)
    return {"train": len(y_train), "test": len(y_test), "classes": len(names)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", choices=("cifar10", "cifar100"), default="cifar10")
    ap.add_argument("--root", default="data/raw", help="where CIFAR's python folder is, or is downloaded to")
    ap.add_argument("--out", default=None, help="the archive (default data/<dataset>-jpeg.tar.gz)")
    ap.add_argument("--quality", type=int, default=75, help="JPEG quality, 1-95 (default 75)")
    ap.add_argument("--no-download", action="store_true", help="fail instead of downloading a missing copy")
    args = ap.parse_args(argv)
    if not 1 <= args.quality <= 95:
        print(f"cifar_imagefolder: --quality {args.quality}: must be in 1..95", file=sys.stderr)
        return 2
    out = Path(args.out or f"data/{args.dataset}-jpeg.tar.gz")
    from selcl.data import load_dataset
    try:
        d = load_dataset(args.dataset, root=args.root, download=not args.no_download)
    except DataError as e:
        print(f"cifar_imagefolder: {e}", file=sys.stderr)
        return 2
    n = write_archive(d.x_train, d.y_train, d.x_test, d.y_test, d.classes, out, args.quality)
    print(f"{out}: {n['train']:,} training and {n['test']:,} test images, {n['classes']} classes, "
          f"JPEG quality {args.quality}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
