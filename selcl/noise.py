"""Noisy training labels ỹ from clean labels y (SPEC §1).

Kinds (`make_noisy_labels(clean, C, kind, rate, seed, ...)`):

* ``none``  ỹ = y (a copy).
* ``sym``   exactly ⌊r·N⌋ examples, chosen by a seeded permutation, get a label drawn
            uniformly from all C classes — the true class included, as the authors'
            scripts do, so the realised rate is ≈ r·(C−1)/C. With
            ``include_true_class=False`` the label is drawn from the C−1 other
            classes (realised rate exactly ⌊r·N⌋/N).
* ``asym``  class c → `asymmetric_map(dataset, C)[c]`, each example of a class whose
            target differs from itself flips independently with probability r.
* ``file``  one label per training example, in dataset order (see selcl.data), read
            from .npy / .npz / .csv / .txt / .pt / .pth (e.g. CIFAR-10N / CIFAR-100N).

Generators (``noise.generator``; ``auto`` picks ``authors`` for torchvision's CIFAR-10 /
CIFAR-100, ``pcg64`` for everything else):

* ``authors``  numpy's legacy generator (``RandomState``, MT19937) drawn exactly as the
               authors' `random_in_noise` / `real_in_noise` draw it (see `_authors_noise`):
               for the whole CIFAR training set in torchvision's order (no `data.subset`)
               these are the noisy labels the authors' public code produces, bit for bit.
               numpy freezes the legacy streams, so they stay so.
* ``pcg64``    ``np.random.default_rng(seed)`` (PCG64 + numpy's documented permutation /
               integers / random algorithms): the project's own draws, used by the demo
               and the CPU presets; a test pins a sha256 of one case so any change of RNG
               usage is caught.

Either way the same (clean, C, kind, rate, seed, generator) gives bit-identical labels on
any machine and OS.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

NOISE_KINDS = ("none", "sym", "asym", "file")
GENERATORS = ("auto", "authors", "pcg64")


from .errors import NoiseError  # noqa: F401 - raised here, defined with the other stage errors


# CIFAR-100 fine id → coarse (superclass) id: a fixed fact of the dataset (the
# 'coarse_labels' of its pickles; fine ids are the alphabetical rank of the fine
# names, superclass ids that of the superclass names). Superclass 0, aquatic
# mammals = {4 beaver, 30 dolphin, 55 otter, 72 seal, 95 whale}.
CIFAR100_FINE_TO_COARSE = (
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3,
    3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15,
    0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10,
    16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19,
    2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19,
    18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
)

# CIFAR-10 asymmetric flips (SPEC §1): truck→automobile, bird→airplane, deer→horse, cat↔dog.
CIFAR10_ASYM = {9: 1, 2: 0, 4: 7, 3: 5, 5: 3}


def _norm_name(dataset: str) -> str:
    return str(dataset).lower().replace("-", "").replace("_", "")


def asymmetric_map(dataset: str, num_classes: int) -> np.ndarray:
    """Target class of every class, int64 [C] (t[c] == c: class c never flips).

    dataset 'cifar10'  : 9→1, 2→0, 4→7, 3→5, 5→3, others fixed (needs C = 10).
    dataset 'cifar100' : inside each of the 20 superclasses, fine ids sorted ascending,
                         each → the next, the largest → the smallest
                         (4→30→55→72→95→4) (needs C = 100).
    anything else (digits, imagefolder, …): the generic rule c → (c + 1) mod C for
                         every class. An imagefolder copy of CIFAR-10 opts into the
                         CIFAR-10 map by passing dataset='cifar10'.
    """
    C = int(num_classes)
    name = _norm_name(dataset)
    t = np.arange(C, dtype=np.int64)
    if name == "cifar10":
        if C != 10:
            raise NoiseError(f"the CIFAR-10 asymmetric map needs num_classes=10, got {C}")
        for src, dst in CIFAR10_ASYM.items():
            t[src] = dst
    elif name == "cifar100":
        if C != 100:
            raise NoiseError(f"the CIFAR-100 asymmetric map needs num_classes=100, got {C}")
        coarse = np.asarray(CIFAR100_FINE_TO_COARSE)
        for s in range(20):
            fine = np.flatnonzero(coarse == s)          # ascending
            t[fine] = np.roll(fine, -1)                 # each → next, largest → smallest
    else:
        t = (t + 1) % C
    return t


def floor_count(rate: float, n: int) -> int:
    """⌊r·N⌋, robust to binary floating point (0.29·100 = 28.999… → 29)."""
    return int(math.floor(round(float(rate) * int(n), 9)))


def symmetric_noise_indices(n: int, rate: float, seed: int) -> np.ndarray:
    """The ⌊r·N⌋ example indices `sym` noise re-draws: the first ⌊r·N⌋ entries of
    default_rng(seed).permutation(N) (the first use of that stream)."""
    rng = np.random.default_rng(seed)
    return rng.permutation(int(n))[:floor_count(rate, n)]


def resolve_generator(generator: str, dataset: str) -> str:
    """`noise.generator` → 'authors' or 'pcg64'. auto: 'authors' for the torchvision CIFAR
    datasets (the authors' example order, so their draws give their labels), 'pcg64' for the
    rest (digits, image folders: another order, where copying the authors' draws buys
    nothing, and every number this project has recorded on them)."""
    if generator not in GENERATORS:
        raise NoiseError(f"unknown noise generator {generator!r}; valid: {', '.join(GENERATORS)}")
    if generator != "auto":
        return generator
    return "authors" if _norm_name(dataset) in ("cifar10", "cifar100") else "pcg64"


def _authors_noise(y: np.ndarray, C: int, kind: str, r: float, seed: int, t: np.ndarray,
                   include_true_class: bool, cifar10: bool = False) -> np.ndarray:
    """Noisy labels with the authors' draws (public repository ShikunLi/Sel-CL,
    CIFAR/dataset/cifar_dataset.py): numpy's global legacy generator seeded with the
    dataset seed, one permutation of all N examples, then, in permutation order,

      sym   the first int(N·r) examples (int(): the authors' truncation, not `floor_count`)
            each get one int32 draw `randint(C)` — the true class included. Without it
            (`include_true_class=False`, their commented-out alternative) the draw is
            repeated while it equals the true class.
      asym  every example, whatever its class, takes one `choice(C, p=P[y])`, P the
            transition matrix (P[c,c] = 1 − r, P[c,t(c)] = r for a source class c, else
            P[c,c] = 1): one uniform u, label = #{k : cdf_c[k] ≤ u} with
            cdf_c = cumsum(P[c]) / its last entry — numpy's own reading of `choice`.
            Their CIFAR-10 class (`cifar10`) draws only when int(N·r) > 0 (so a tiny
            N·r leaves every label clean); their CIFAR-100 class always draws.

    Vectorised; `tests/test_noise.py` checks it against the one-draw-at-a-time loop."""
    N = len(y)
    rs = np.random.RandomState(seed)
    perm = rs.permutation(N)
    noisy = y.copy()
    if kind == "sym":
        idx = perm[:int(N * r)]
        if include_true_class:
            noisy[idx] = rs.randint(C, size=len(idx), dtype=np.int32)
            return noisy
        for i in idx:                                   # rejection: a data-dependent draw count
            label = rs.randint(C, dtype=np.int32)
            while label == y[i]:
                label = rs.randint(C, dtype=np.int32)
            noisy[i] = label
        return noisy
    if cifar10 and int(N * r) == 0:
        return noisy
    P = np.eye(C)
    src = np.flatnonzero(t != np.arange(C))
    P[src, src], P[src, t[src]] = 1.0 - r, r
    cdf = P.cumsum(axis=1)
    cdf /= cdf[:, -1:]
    u = rs.random_sample(N)                             # u[k] belongs to example perm[k]
    c = y[perm]
    noisy[perm] = np.sum(cdf[c] <= u[:, None], axis=1)
    return noisy


def _check_clean(clean, num_classes: int) -> np.ndarray:
    y = np.asarray(clean)
    if y.ndim != 1 or (y.size and not np.issubdtype(y.dtype, np.integer)):
        raise NoiseError(f"clean labels must be a 1-D integer array, got shape {y.shape} dtype {y.dtype}")
    y = y.astype(np.int64)
    if int(num_classes) < 1:
        raise NoiseError(f"num_classes must be ≥ 1, got {num_classes}")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise NoiseError(f"clean labels must lie in [0, {num_classes}), got [{y.min()}, {y.max()}]")
    return y


def labels_from_config(clean, num_classes: int, noise: dict, dataset: str) -> tuple[np.ndarray, str]:
    """A setting's `noise` section → (ỹ, the generator used), its two `auto`s resolved from
    `dataset`, the `data.dataset` the labels belong to (`asym_map: auto` → that dataset's
    map, `generator: auto` → `resolve_generator`): the noise stage's labels, for every
    script that needs them without running it."""
    asym = noise["asym_map"] if noise["asym_map"] != "auto" else dataset
    generator = resolve_generator(noise["generator"], dataset)
    noisy = make_noisy_labels(clean, num_classes, noise["kind"], noise["rate"], noise["seed"], dataset=asym,
                              include_true_class=noise["include_true_class"], file=noise["file"],
                              file_key=noise["file_key"], generator=generator)
    return noisy, generator


def make_noisy_labels(clean, num_classes: int, kind: str, rate: float, seed: int, *,
                      dataset: str = "generic", include_true_class: bool = True,
                      file=None, file_key: str | None = None, generator: str = "pcg64") -> np.ndarray:
    """Noisy labels ỹ, int64 [N], from clean labels y int [N] (see the module docstring).

    rate      r ∈ [0, 1] (sym: fraction re-drawn; asym: flip probability; ignored by none/file)
    seed      seeds the generator (sym, asym)
    dataset   picks the asymmetric map ('cifar10', 'cifar100', else generic)
    include_true_class  sym: draw from all C classes (True, the authors') or the C−1 others
    file, file_key      file noise: the label file and, for a dict-like file, its key
    generator 'pcg64' (default) or 'authors'; `resolve_generator` turns the parameter's
              'auto' into one of them from `data.dataset` (not from `dataset` here, which
              only names the asymmetric map: an image folder of CIFAR-10 uses its map)
    """
    if kind not in NOISE_KINDS:
        raise NoiseError(f"unknown noise kind {kind!r} (parameter `noise`); valid kinds: {', '.join(NOISE_KINDS)}")
    try:
        r = float(rate)
    except (TypeError, ValueError):
        raise NoiseError(f"noise `rate` must be a number in [0, 1], got {rate!r}") from None
    if not 0.0 <= r <= 1.0:   # also rejects NaN
        raise NoiseError(f"noise `rate` must lie in [0, 1], got {rate!r}")
    if generator not in ("pcg64", "authors"):
        raise NoiseError(f"noise generator must be 'pcg64' or 'authors' here, got {generator!r}")
    C = int(num_classes)
    y = _check_clean(clean, C)
    N = len(y)

    if kind == "none":
        return y.copy()

    if kind == "file":
        return read_label_file(file, N, C, file_key)

    if kind == "sym" and not include_true_class and C < 2:
        raise NoiseError("sym noise without the true class needs num_classes ≥ 2")
    t = asymmetric_map(dataset, C) if kind == "asym" else None
    if generator == "authors":
        return _authors_noise(y, C, kind, r, seed, t, include_true_class, cifar10=_norm_name(dataset) == "cifar10")
    rng = np.random.default_rng(seed)
    noisy = y.copy()
    if kind == "sym":
        idx = rng.permutation(N)[:floor_count(r, N)]          # exactly ⌊r·N⌋ examples
        if include_true_class:
            noisy[idx] = rng.integers(0, C, size=len(idx))     # uniform over all C classes
        else:
            d = rng.integers(0, C - 1, size=len(idx))          # uniform over the C−1 others:
            noisy[idx] = d + (d >= y[idx])                     # skip over the true class
        return noisy

    # asym: one uniform per example (all N, in order), flip where u < r and c is a source class
    flip = (rng.random(N) < r) & (t[y] != y)
    noisy[flip] = t[y[flip]]
    return noisy


# ----------------------------------------------------------------------------- label files

def _torch_load_arrays(path: Path):
    """torch.load with weights_only=True, allowing the numpy array globals that
    CIFAR-N's .pt files (dicts of numpy arrays) need — no arbitrary pickle code runs."""
    import torch
    try:
        from numpy._core import multiarray as ma          # numpy ≥ 2
    except ImportError:                                   # pragma: no cover - numpy 1
        from numpy.core import multiarray as ma
    dtype_classes = [type(np.dtype(t)) for t in
                     ("b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8")]
    allowed = [ma._reconstruct, (ma._reconstruct, "numpy.core.multiarray._reconstruct"),
               np.ndarray, np.dtype, *dtype_classes]
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location="cpu", weights_only=True)


def _read_csv(path: Path) -> np.ndarray:
    vals = []
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    lines = [ln for ln in lines if ln]
    for k, ln in enumerate(lines):
        try:
            vals.append(int(ln))
        except ValueError:
            if k == 0:
                continue   # a header line
            raise NoiseError(f"noisy-label file {path}: line {k + 1} {ln!r} is not one integer") from None
    return np.asarray(vals, dtype=np.int64)


def read_label_file(file, n: int, num_classes: int, key: str | None = None) -> np.ndarray:
    """One noisy label per training example (dataset order) from a file, int64 [n].

    .npy                 a 1-D integer array
    .csv / .txt          one integer per line, optional header line
    .npz / .pt / .pth    an array / tensor, or a dict of them (CIFAR-10N: 'aggre_label',
                         'worse_label', 'random_label1', …; CIFAR-100N: 'noisy_label'),
                         `key` choosing one
    """
    if file is None:
        raise NoiseError("noise kind 'file' needs `file` (a .npy/.csv/.pt label file)")
    path = Path(file)
    if not path.is_file():
        raise NoiseError(f"noisy-label file {path} does not exist")
    ext = path.suffix.lower()
    try:
        if ext == ".npy":
            obj = np.load(path, allow_pickle=False)
        elif ext in (".csv", ".txt"):
            obj = _read_csv(path)
        elif ext == ".npz":
            with np.load(path, allow_pickle=False) as z:
                obj = {k: z[k] for k in z.files}
        elif ext in (".pt", ".pth"):
            obj = _torch_load_arrays(path)
        else:
            raise NoiseError(f"noisy-label file {path}: unsupported extension {ext!r} "
                             f"(use .npy, .npz, .csv, .txt, .pt or .pth)")
    except NoiseError:
        raise
    except Exception as e:
        hint = (" (torch files are loaded with weights_only=True: tensors, numpy arrays and "
                "dicts of them only; re-save the labels as .npy)") if ext in (".pt", ".pth") else ""
        raise NoiseError(f"cannot read noisy-label file {path}{hint}: {type(e).__name__}: {str(e)[:300]}") from e

    if isinstance(obj, dict):
        if key is None or key not in obj:
            what = "needs `file_key`" if key is None else f"has no key {key!r}"
            raise NoiseError(f"noisy-label file {path} {what}; available keys: {', '.join(map(str, obj))}")
        obj = obj[key]
    elif key is not None:
        raise NoiseError(f"noisy-label file {path} holds one array, not a dict: drop file_key={key!r}")
    if hasattr(obj, "detach"):   # torch tensor
        obj = obj.detach().cpu().numpy()
    a = np.asarray(obj)
    if a.ndim != 1 or len(a) != n:
        raise NoiseError(f"noisy-label file {path}{f' [{key}]' if key else ''}: expected {n} labels "
                         f"(one per training example), got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        if np.issubdtype(a.dtype, np.floating) and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
            a = a.astype(np.int64)
        else:
            raise NoiseError(f"noisy-label file {path}{f' [{key}]' if key else ''}: "
                             f"labels must be integers, got {a.dtype}")
    a = a.astype(np.int64)
    if n and (a.min() < 0 or a.max() >= num_classes):
        raise NoiseError(f"noisy-label file {path}{f' [{key}]' if key else ''}: labels must lie in "
                         f"[0, {num_classes}), got [{a.min()}, {a.max()}]")
    return a


# ----------------------------------------------------------------------------- statistics

def transition_matrix(clean, noisy, num_classes: int) -> np.ndarray:
    """float64 [C, C]: row c = distribution of ỹ among the examples with y = c
    (T[c, k] = #{i: y_i = c, ỹ_i = k} / #{i: y_i = c}; a class with no examples gets a
    row of zeros)."""
    y, yn = np.asarray(clean, dtype=np.int64), np.asarray(noisy, dtype=np.int64)
    if y.shape != yn.shape:
        raise NoiseError(f"clean and noisy labels differ in shape: {y.shape} vs {yn.shape}")
    C = int(num_classes)
    if y.size and (min(y.min(), yn.min()) < 0 or max(y.max(), yn.max()) >= C):
        raise NoiseError(f"labels must lie in [0, {C}) for the transition matrix")
    counts = np.bincount(y * C + yn, minlength=C * C).reshape(C, C).astype(np.float64)
    rows = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, rows, out=np.zeros_like(counts), where=rows > 0)


def realised_noise_rate(clean, noisy) -> float:
    """Fraction of examples whose noisy label differs from the clean one."""
    y, yn = np.asarray(clean), np.asarray(noisy)
    if y.shape != yn.shape:
        raise NoiseError(f"clean and noisy labels differ in shape: {y.shape} vs {yn.shape}")
    return float(np.mean(y != yn)) if y.size else 0.0
