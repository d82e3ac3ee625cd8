"""Datasets as uint8 arrays (SPEC §1).

Every loader returns an `ImageData`: images uint8 [N, 3, H, W] (numpy, CHW like
torch), labels int64, class names, and the per-channel normalisation mean/std in
[0, 1] units. Augmentation (SPEC §3) runs later on tensors; this module only reads.

Datasets (`load_dataset(name, ...)`):

* ``digits``      scikit-learn's bundled 8×8 digits (1797 images, offline). Values
                  0–16 are scaled to uint8 (×255/16, rounded) and upsampled once to
                  16×16 with bilinear interpolation (half-pixel centres as torch's
                  align_corners=False, edge clamp, rounded half-to-even), so
                  that crop augmentations have pixels to work with; grey → 3 equal
                  channels. Stratified 75/25 train/test split with
                  ``random_state=seed``. mean/std from the training images.
* ``cifar10`` / ``cifar100``  the python-version pickles under ``root``
                  (``cifar-10-batches-py`` / ``cifar-100-python``), checked with
                  torchvision's md5 integrity check and downloaded by torchvision when
                  missing and ``download=True``. mean/std are SPEC §1's constants.
                  CIFAR-100 also gives the 20 superclass ids (``coarse_train``).
* ``imagefolder`` ``path`` is a folder ``train/<class>/<file>``, ``test/<class>/<file>``
                  or a ``.tar.gz`` / ``.tgz`` / ``.tar`` of one (with or without one
                  top-level folder). mean/std from the training images. Images must
                  share one size unless ``image_size=S`` is given: then each image's
                  shorter side is resized to S (PIL bilinear, antialiased) and the
                  central S×S square kept (WebVision-50 at 224 px: the usual
                  Resize + CenterCrop, done once at decode time).

**Dataset order** (the order noisy-label files follow, SPEC §1 "file" noise):
digits — the order of sklearn's split; CIFAR — the order of the pickled batches;
imagefolder — classes sorted by folder name (class id = rank of the name), and
within a split, class 0's files first, then class 1's, …; inside a class, files
sorted by file name (Python string order, so number them with zero padding:
``0000.jpg``, ``0001.jpg``, …).

``subset=k`` (any dataset) keeps the first k training images of every class in
dataset order (deterministic, no RNG), preserving that order; the test set stays
complete unless ``subset_test=k`` asks for the same there. Normalisation mean/std of
digits / imagefolder are computed from the kept training images.
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import tarfile
import zipfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .atomic import atomic_path

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder")

# SPEC §1 normalisation constants (the authors' values).
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)

DEFAULT_CROP_SCALE = (0.08, 1.0)   # SPEC §3 RandomResizedCrop scale (CIFAR)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


from .errors import DataError  # noqa: F401 - raised here, defined with the other stage errors


@dataclass
class ImageData:
    """A dataset in memory.

    x_train  uint8 [N, 3, H, W]     y_train  int64 [N]
    x_test   uint8 [M, 3, H, W]     y_test   int64 [M]
    classes  C class names (class id = position)
    mean/std per-channel normalisation, [0, 1] units
    coarse_train int64 [N] CIFAR-100 superclass ids, else None
    x_test2 / y_test2  a second test set of the same classes (`data.extra_test_path`;
             WebVision-50: the ILSVRC12 validation images of its 50 classes), else None
    crop / crop_scale  the network's input geometry for these images (params
             `data.crop`, `data.crop_scale`; see selcl.augment): recorded by the data
             stage in data.npz so that every training stage augments alike. crop None
             (the default, CIFAR): the whole image; crop_scale: RandomResizedCrop's
             area range of the strong views.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: list
    mean: tuple
    std: tuple
    coarse_train: np.ndarray | None = None
    name: str = ""
    crop: int | None = None
    crop_scale: tuple = DEFAULT_CROP_SCALE
    x_test2: np.ndarray | None = None
    y_test2: np.ndarray | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)


# ----------------------------------------------------------------------------- helpers

def sha256_file(path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (for the data stage's checksums)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def channel_mean_std(x: np.ndarray, chunk: int = 4096) -> tuple[tuple, tuple]:
    """Per-channel mean and (population) std of uint8 images [N, 3, H, W] in [0, 1] units.

    Exact integer sums in chunks: no float64 copy of the whole set, same result on
    any machine.
    """
    if len(x) == 0:
        raise DataError("cannot compute mean/std of an empty training set")
    s = np.zeros(3, dtype=np.int64)
    s2 = np.zeros(3, dtype=np.int64)
    for i in range(0, len(x), chunk):
        b = x[i:i + chunk].astype(np.int64)
        s += b.sum(axis=(0, 2, 3))
        s2 += (b * b).sum(axis=(0, 2, 3))
    n = x.shape[0] * x.shape[2] * x.shape[3]
    mean = s / n
    var = np.maximum(s2 / n - mean * mean, 0.0)
    return tuple(float(v) for v in mean / 255.0), tuple(float(v) for v in np.sqrt(var) / 255.0)


def first_per_class(y: np.ndarray, k: int) -> np.ndarray:
    """Indices (ascending) of the first k examples of every class in order of y."""
    if int(k) < 1:
        raise DataError(f"subset must be a positive number of images per class, got {k!r}")
    keep = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        keep[np.flatnonzero(y == c)[:k]] = True
    return np.flatnonzero(keep)


def _apply_subset(d: ImageData, subset, subset_test) -> ImageData:
    if subset is not None:
        i = first_per_class(d.y_train, subset)
        d.x_train, d.y_train = d.x_train[i], d.y_train[i]
        if d.coarse_train is not None:
            d.coarse_train = d.coarse_train[i]
    if subset_test is not None:
        i = first_per_class(d.y_test, subset_test)
        d.x_test, d.y_test = d.x_test[i], d.y_test[i]
    return d


# ----------------------------------------------------------------------------- digits

def upsample2_bilinear(x: np.ndarray) -> np.ndarray:
    """2× bilinear upsampling of the last two axes, half-pixel centres and edge clamp
    (= torch's interpolate(mode='bilinear', align_corners=False)), float64.

    Output pixel 2k samples input position k − 1/4, 2k+1 samples k + 1/4, so each
    axis is out[2k] = ¼·in[k−1] + ¾·in[k], out[2k+1] = ¾·in[k] + ¼·in[k+1] (clamped).
    """
    def up(a, axis):
        a = np.moveaxis(a, axis, -1)
        prev = np.concatenate([a[..., :1], a[..., :-1]], axis=-1)
        nxt = np.concatenate([a[..., 1:], a[..., -1:]], axis=-1)
        out = np.stack([0.25 * prev + 0.75 * a, 0.75 * a + 0.25 * nxt], axis=-1)
        return np.moveaxis(out.reshape(*a.shape[:-1], -1), -1, axis)
    return up(up(np.asarray(x, dtype=np.float64), -1), -2)


def _load_digits(seed: int) -> ImageData:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x8 = np.rint(d.images * (255.0 / 16.0))                    # [1797, 8, 8], uint8 values
    # One bilinear 2× upsample to 16×16 (crop augmentations need some pixels); the
    # values are multiples of 1/16, exact in float64, rounded half-to-even (np.rint).
    x16 = np.clip(np.rint(upsample2_bilinear(x8)), 0, 255).astype(np.uint8)
    x = np.ascontiguousarray(np.repeat(x16[:, None], 3, axis=1))           # [1797, 3, 16, 16]
    y = d.target.astype(np.int64)
    i_tr, i_te = train_test_split(np.arange(len(y)), test_size=0.25, stratify=y, random_state=seed)
    mean, std = channel_mean_std(x[i_tr])
    return ImageData(x[i_tr], y[i_tr], x[i_te], y[i_te], [str(c) for c in range(10)],
                     mean, std, None, "digits")


# ----------------------------------------------------------------------------- CIFAR

_CIFAR = {
    "cifar10": dict(folder="cifar-10-batches-py", title="CIFAR-10", mean=CIFAR10_MEAN, std=CIFAR10_STD),
    "cifar100": dict(folder="cifar-100-python", title="CIFAR-100", mean=CIFAR100_MEAN, std=CIFAR100_STD),
}


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="latin1")  # the batches are python-2 pickles
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as e:
        raise DataError(f"cannot read CIFAR batch {path}: {e}") from e


def read_cifar_batches(folder, which: str):
    """Parse the python-version CIFAR pickles of one split.

    folder  ``cifar-10-batches-py`` (files data_batch_1..5, test_batch, batches.meta)
            or ``cifar-100-python`` (files train, test, meta); the layout is detected.
    which   'train' or 'test'
    Returns (x uint8 [N, 3, 32, 32], y int64 [N], coarse int64 [N] or None, class names).
    """
    folder = Path(folder)
    if which not in ("train", "test"):
        raise ValueError(f"which must be 'train' or 'test', got {which!r}")
    if (folder / "data_batch_1").exists() or (folder / "test_batch").exists():   # CIFAR-10
        files = [f"data_batch_{i}" for i in range(1, 6)] if which == "train" else ["test_batch"]
        meta_file, meta_key = "batches.meta", "label_names"
    elif (folder / "train").exists() or (folder / "test").exists():               # CIFAR-100
        files = [which]
        meta_file, meta_key = "meta", "fine_label_names"
    else:
        raise DataError(f"{folder} holds no CIFAR python batches (data_batch_1 or train)")
    xs, ys, cs = [], [], []
    for name in files:
        if not (folder / name).exists():
            raise DataError(f"CIFAR batch {folder / name} is missing")
        e = _unpickle(folder / name)
        xs.append(np.asarray(e["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))  # rows: R(1024) G B
        ys.append(np.asarray(e["labels"] if "labels" in e else e["fine_labels"], dtype=np.int64))
        if "coarse_labels" in e:
            cs.append(np.asarray(e["coarse_labels"], dtype=np.int64))
    classes = list(_unpickle(folder / meta_file)[meta_key]) if (folder / meta_file).exists() else None
    coarse = np.concatenate(cs) if cs else None
    return np.concatenate(xs), np.concatenate(ys), coarse, classes


def _cifar_tv_class(name: str):
    from torchvision.datasets import CIFAR10, CIFAR100
    return CIFAR10 if name == "cifar10" else CIFAR100


def _cifar_intact(name: str, root: Path) -> bool:
    """torchvision's md5 check of every batch file (and the meta file)."""
    from torchvision.datasets.utils import check_integrity
    cls = _cifar_tv_class(name)
    files = cls.train_list + cls.test_list + [[cls.meta["filename"], cls.meta["md5"]]]
    return all(check_integrity(str(root / cls.base_folder / f), md5) for f, md5 in files)


def _download_cifar(name: str, root: Path) -> None:
    """Fetch and extract the python-version archive with torchvision (needs network)."""
    _cifar_tv_class(name)(str(root), train=True, download=True)


def _load_cifar(name: str, root, download: bool) -> ImageData:
    info = _CIFAR[name]
    root = Path(root)
    folder = root / info["folder"]
    fix = (f"place the python-version archive's folder there (https://www.cs.toronto.edu/~kriz/"
           f"{info['folder'].replace('-batches-py', '').replace('-python', '')}-python.tar.gz), "
           f"or use dataset: imagefolder")
    if not _cifar_intact(name, root):
        state = "missing or fails the md5 integrity check" if folder.exists() else "not found"
        if not download:
            raise DataError(f"{info['title']} {state} under {folder} and download is off: {fix}")
        try:
            _download_cifar(name, root)
        except Exception as e:  # URLError, socket errors, md5 mismatch of the archive, ...
            raise DataError(f"{info['title']} {state} under {folder} and download failed "
                            f"(offline?) ({type(e).__name__}: {e}): {fix}") from e
        if not _cifar_intact(name, root):
            raise DataError(f"{info['title']} under {folder} still fails the integrity check after download: {fix}")
    x_tr, y_tr, c_tr, classes = read_cifar_batches(folder, "train")
    x_te, y_te, _, _ = read_cifar_batches(folder, "test")
    if classes is None:
        classes = [str(c) for c in range(int(y_tr.max()) + 1)]
    return ImageData(x_tr, y_tr, x_te, y_te, classes, info["mean"], info["std"],
                     c_tr if name == "cifar100" else None, name)


# ----------------------------------------------------------------------------- imagefolder

def _split_member(parts: tuple[str, ...]):
    """('…', 'train', cls, file) → (prefix, split, cls, file), else None."""
    if len(parts) < 3 or parts[-3] not in ("train", "test"):
        return None
    f = parts[-1]
    if f.startswith(".") or not f.lower().endswith(IMAGE_EXTENSIONS) or parts[-2].startswith("."):
        return None  # hidden files (macOS '._x', .DS_Store) and non-images are skipped
    return "/".join(parts[:-3]), parts[-3], parts[-2], f


def _collect_tar(path: Path) -> dict:
    """Stream the archive once (no extraction to disk): {(split, cls, file): (bytes, label)}."""
    entries, prefix = {}, None
    try:
        with tarfile.open(path, "r|*") as tf:   # '|' = sequential stream, no seeking
            for m in tf:
                if not m.isfile():
                    continue
                s = _split_member(tuple(p for p in m.name.split("/") if p not in ("", ".")))
                if s is None:
                    continue
                if prefix is None:
                    prefix = s[0]
                elif s[0] != prefix:
                    raise DataError(f"{path}: images under two top-level folders "
                                    f"({prefix!r} and {s[0]!r}); expected one train/ and test/")
                entries[s[1:]] = (tf.extractfile(m).read(), f"{path}:{m.name}")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DataError(f"cannot read image archive {path} (corrupt or not a tar/tar.gz): {e}") from e
    return entries


def _collect_dir(path: Path) -> dict:
    """{(split, cls, file): (file path, shown name)} for path/train|test/<cls>/<file>
    (or the same one folder down, as an unpacked archive with a top-level folder)."""
    if not (path / "train").is_dir():
        subs = [p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")]
        if len(subs) == 1 and (subs[0] / "train").is_dir():
            path = subs[0]   # one top-level folder, as in an unpacked archive
    entries = {}
    for split in ("train", "test"):
        d = path / split
        if not d.is_dir():
            continue
        for cdir in d.iterdir():
            if not cdir.is_dir():
                continue
            for f in cdir.iterdir():
                s = _split_member((split, cdir.name, f.name))
                if s is not None and f.is_file():
                    entries[s[1:]] = (f, str(f))
    return entries


def _pil_decode(data: bytes, shown: str) -> np.ndarray:
    from PIL import Image
    try:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB")).transpose(2, 0, 1)   # [3, H, W] uint8
    except Exception as e:
        raise DataError(f"cannot decode image {shown}: {e}") from e


def _jpeg_batch_decode(blobs: list) -> list | None:
    """torchvision's batched libjpeg-turbo decode, [3, H, W] uint8 each, or None on any failure.

    Buys ~4× over a PIL loop on 60k tiny JPEGs (one C++ loop, no per-image Python
    work); the pixels equal PIL's (both libjpeg-turbo, default islow IDCT; a test
    checks it). Any problem → None and the caller uses PIL, which names a bad file.
    """
    try:
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg
        with warnings.catch_warnings():   # torchvision ≥ 0.29 flags its image I/O as deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            out = decode_jpeg([torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs],
                              mode=ImageReadMode.RGB)
        return [t.numpy() for t in out]
    except Exception:
        return None


def resize_center_crop(im: np.ndarray, size: int) -> np.ndarray:
    """uint8 [3, H, W] → [3, size, size]: shorter side to `size` (bilinear, antialiased),
    then the central square."""
    from PIL import Image
    h, w = im.shape[1:]
    if (h, w) == (size, size):
        return im
    scale = size / min(h, w)
    nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
    pil = Image.fromarray(np.ascontiguousarray(im.transpose(1, 2, 0))).resize((nw, nh), Image.BILINEAR)
    top, left = (nh - size) // 2, (nw - size) // 2
    return np.asarray(pil.crop((left, top, left + size, top + size))).transpose(2, 0, 1)


def _decode_all(items: list, image_size: int | None = None) -> np.ndarray:
    """Decode (source, shown name) items, in order, into uint8 [N, 3, H, W].

    JPEGs go through `_jpeg_batch_decode`, everything else (and JPEGs it rejects)
    through PIL. With `image_size`, every image goes through `resize_center_crop`;
    without, all images must share one size (else DataError naming the first odd
    file in dataset order).
    """
    if not items:
        return np.zeros((0, 3, 0, 0), dtype=np.uint8)
    try:
        blobs = [src if isinstance(src, bytes) else Path(src).read_bytes() for src, _ in items]
    except OSError as e:
        raise DataError(f"cannot read image file: {e}") from e
    imgs: list = [None] * len(items)
    jpg = [i for i, b in enumerate(blobs) if b[:3] == b"\xff\xd8\xff"]
    dec = _jpeg_batch_decode([blobs[i] for i in jpg]) if jpg else None
    if dec is not None:
        for i, im in zip(jpg, dec):
            imgs[i] = im
    for i, im in enumerate(imgs):
        if im is None:
            imgs[i] = _pil_decode(blobs[i], items[i][1])
        if image_size is not None:
            imgs[i] = resize_center_crop(imgs[i], int(image_size))
    shape = imgs[0].shape
    x = np.empty((len(imgs),) + shape, dtype=np.uint8)   # C-contiguous [N, 3, H, W]
    for i, (im, (_, shown)) in enumerate(zip(imgs, items)):
        if im.shape != shape:
            raise DataError(f"image {shown} is {im.shape[2]}×{im.shape[1]} but the first image "
                            f"{items[0][1]} is {shape[2]}×{shape[1]}: all images must share one size "
                            f"(or set data.image_size to resize them)")
        x[i] = im
    return x


def _class_ordered(entries: dict, split: str, classes: list, k=None) -> tuple[list, np.ndarray]:
    """THE dataset order of one split: class by class in `classes` order (class id = its
    position), files by name within a class, the first `k` per class if given (no RNG).
    → (items for `_decode_all`, int64 labels)."""
    by_class: dict = {}
    for s, c, f in entries:
        if s == split:
            by_class.setdefault(c, []).append(f)
    items, labels = [], []
    for cid, c in enumerate(classes):
        files = sorted(by_class.get(c, []))
        if k is not None:
            files = files[:int(k)]
        items += [entries[(split, c, f)] for f in files]
        labels += [cid] * len(files)
    return items, np.asarray(labels, dtype=np.int64)


def _load_imagefolder(path, subset, subset_test, image_size=None) -> ImageData:
    if path is None:
        raise DataError("dataset imagefolder needs `path` (a folder with train/<class>/ and "
                        "test/<class>/, or a .tar.gz of one)")
    path = Path(path)
    if not path.exists():
        raise DataError(f"imagefolder path {path} does not exist")
    entries = _collect_dir(path) if path.is_dir() else _collect_tar(path)
    train_classes = sorted({c for s, c, _ in entries if s == "train"})
    test_classes = sorted({c for s, c, _ in entries if s == "test"})
    if not train_classes:
        raise DataError(f"{path}: no images found under train/<class>/ (expected "
                        f"train/<class>/<image> and test/<class>/<image>)")
    if not test_classes:
        raise DataError(f"{path}: no images found under test/<class>/")
    extra = sorted(set(test_classes) - set(train_classes))
    if extra:
        raise DataError(f"{path}: test classes {extra} have no training images")
    out = {}
    for split, k in (("train", subset), ("test", subset_test)):
        if k is not None and int(k) < 1:
            raise DataError(f"subset must be a positive number of images per class, got {k!r}")
        out[split] = _class_ordered(entries, split, train_classes, k)
    x_tr = _decode_all(out["train"][0], image_size)
    x_te = _decode_all(out["test"][0], image_size)
    if x_te.shape[1:] != x_tr.shape[1:]:
        raise DataError(f"{path}: test images {out['test'][0][0][1]} are {x_te.shape[3]}×{x_te.shape[2]} "
                        f"but training images are {x_tr.shape[3]}×{x_tr.shape[2]}")
    mean, std = channel_mean_std(x_tr)
    return ImageData(x_tr, out["train"][1], x_te, out["test"][1], train_classes, mean, std,
                     None, "imagefolder")


def load_extra_test(path, classes: list, image_size=None) -> tuple[np.ndarray, np.ndarray]:
    """A second test set (`data.extra_test_path`): the test/<class>/<image> images of a
    folder or archive laid out as an imagefolder (train/ is not read and may be absent),
    labelled by the training classes' names; every class it holds must be one of them.
    WebVision-50 (SPEC §10.4): the ILSVRC12 validation images of its 50 classes."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path} does not exist")
    entries = _collect_dir(path) if path.is_dir() else _collect_tar(path)
    found = sorted({c for s, c, _ in entries if s == "test"})
    if not found:
        raise DataError(f"{path}: no images found under test/<class>/")
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise DataError(f"{path}: classes {unknown[:5]}{' …' if len(unknown) > 5 else ''} are not "
                        f"training classes (name the folders as the training set's)")
    items, labels = _class_ordered(entries, "test", list(classes))   # the training order
    return _decode_all(items, image_size), labels


# ----------------------------------------------------------------------------- entry points

def load_dataset(name: str, *, root="data/raw", path=None, subset: int | None = None,
                 seed: int = 42, download: bool = True, subset_test: int | None = None,
                 image_size: int | None = None) -> ImageData:
    """Load one of DATASETS (see the module docstring for each one and for the order).

    root      where CIFAR's python folders live / are downloaded to
    path      imagefolder: the folder or archive
    subset    keep the first `subset` training images of every class (dataset order)
    seed      digits' train/test split
    download  CIFAR: allow torchvision to download a missing/corrupt copy
    subset_test  like subset, for the test set (default: full test set)
    image_size   imagefolder: resize + centre-crop every image to image_size² (None: keep)
    """
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r} (parameter `dataset`); valid names: {', '.join(DATASETS)}")
    if image_size is not None and name != "imagefolder":
        raise DataError(f"image_size applies to the imagefolder dataset only (dataset {name!r} "
                        f"has a fixed size): set it to null")
    if name == "digits":
        data = _load_digits(seed)
    elif name in _CIFAR:
        data = _load_cifar(name, root, download)
    else:
        # subsets are applied before decoding (and mean/std computed after) here
        return _load_imagefolder(path, subset, subset_test, image_size)
    data = _apply_subset(data, subset, subset_test)
    if name == "digits" and subset is not None:
        data.mean, data.std = channel_mean_std(data.x_train)
    return data


def save_arrays(data: ImageData, path) -> None:
    """Write `data` to an uncompressed .npz atomically (temp file in the same folder,
    then os.replace), so a crash never leaves a half-written file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = dict(x_train=data.x_train, y_train=data.y_train, x_test=data.x_test, y_test=data.y_test,
                  classes=np.asarray(list(data.classes), dtype=str),
                  mean=np.asarray(data.mean, dtype=np.float64), std=np.asarray(data.std, dtype=np.float64),
                  name=np.asarray(data.name, dtype=str))
    if data.coarse_train is not None:
        arrays["coarse_train"] = data.coarse_train
    # written only when not the defaults, so CIFAR's data.npz is unchanged by these keys
    if data.crop is not None:
        arrays["crop"] = np.asarray(int(data.crop), dtype=np.int64)
    if tuple(data.crop_scale) != DEFAULT_CROP_SCALE:
        arrays["crop_scale"] = np.asarray(data.crop_scale, dtype=np.float64)
    if data.x_test2 is not None:
        arrays["x_test2"], arrays["y_test2"] = data.x_test2, data.y_test2
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def load_arrays(path) -> ImageData:
    """Read an .npz written by save_arrays (a corrupt file → DataError naming it)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"array file {path} does not exist")
    try:
        return _load_arrays(path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: corrupt array file ({type(exc).__name__}); delete it and rerun "
                        f"the data stage") from None


def _load_arrays(path: Path) -> ImageData:
    with np.load(path, allow_pickle=False) as z:
        return ImageData(
            x_train=z["x_train"], y_train=z["y_train"].astype(np.int64),
            x_test=z["x_test"], y_test=z["y_test"].astype(np.int64),
            classes=[str(c) for c in z["classes"]],
            mean=tuple(float(v) for v in z["mean"]), std=tuple(float(v) for v in z["std"]),
            coarse_train=z["coarse_train"].astype(np.int64) if "coarse_train" in z.files else None,
            name=str(z["name"]),
            crop=int(z["crop"]) if "crop" in z.files else None,
            crop_scale=tuple(float(v) for v in z["crop_scale"]) if "crop_scale" in z.files
            else DEFAULT_CROP_SCALE,
            x_test2=z["x_test2"] if "x_test2" in z.files else None,
            y_test2=z["y_test2"].astype(np.int64) if "y_test2" in z.files else None)
