"""Dataset loading (SPEC §1): digits, CIFAR pickles (generated), imagefolder dir / tar.gz."""
import hashlib
import os
import pickle
import tarfile

import numpy as np
import pytest
from PIL import Image

from selcl import data as D
from selcl.data import (DATASETS, DataError, ImageData, load_arrays, load_dataset,
                        read_cifar_batches, save_arrays, sha256_file)


# ----------------------------------------------------------------------------- digits

def _bilinear_up2(img):
    """Brute-force 8×8 → 16×16 bilinear (half-pixel centres, edge clamp), float64."""
    out = np.zeros((16, 16))
    for i in range(16):
        for j in range(16):
            sy, sx = max((i + 0.5) / 2 - 0.5, 0.0), max((j + 0.5) / 2 - 0.5, 0.0)
            y0, x0 = int(sy), int(sx)
            y1, x1 = min(y0 + 1, 7), min(x0 + 1, 7)
            wy, wx = sy - y0, sx - x0
            out[i, j] = ((1 - wy) * (1 - wx) * img[y0, x0] + (1 - wy) * wx * img[y0, x1]
                         + wy * (1 - wx) * img[y1, x0] + wy * wx * img[y1, x1])
    return out


def test_digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_dataset("digits", seed=42)
    assert d.name == "digits" and d.classes == [str(c) for c in range(10)]
    assert d.x_train.shape == (1347, 3, 16, 16) and d.x_test.shape == (450, 3, 16, 16)
    assert d.x_train.dtype == np.uint8 and d.y_train.dtype == np.int64 and d.y_test.dtype == np.int64
    assert d.coarse_train is None
    assert np.all(d.x_train[:, 0] == d.x_train[:, 1]) and np.all(d.x_train[:, 0] == d.x_train[:, 2])
    # stratified split: every class 74–75 % in train
    for c in range(10):
        n_tr, n_te = np.sum(d.y_train == c), np.sum(d.y_test == c)
        assert abs(n_tr / (n_tr + n_te) - 0.75) < 0.02
    # pixels: documented recipe, brute force, on the documented split
    raw = load_digits()
    i_tr, i_te = train_test_split(np.arange(1797), test_size=0.25, stratify=raw.target, random_state=42)
    for k in (0, 1, 500, 1346):
        x8 = np.rint(raw.images[i_tr[k]] * 255 / 16)
        ref = np.clip(np.rint(_bilinear_up2(x8)), 0, 255)
        assert np.array_equal(d.x_train[k, 0], ref)
        assert d.y_train[k] == raw.target[i_tr[k]]
    assert np.array_equal(d.y_test, raw.target[i_te])
    # mean/std per channel from the training images, [0, 1] units
    xf = d.x_train.astype(np.float64) / 255
    assert np.allclose(d.mean, xf.mean(axis=(0, 2, 3)), atol=1e-12)
    assert np.allclose(d.std, xf.std(axis=(0, 2, 3)), atol=1e-12)


def test_upsample_matches_brute_force_and_torch():
    import torch
    x = np.random.default_rng(0).uniform(0, 255, size=(3, 8, 8))
    up = D.upsample2_bilinear(x)
    assert up.shape == (3, 16, 16)
    assert np.allclose(up[1], _bilinear_up2(x[1]), rtol=0, atol=1e-12)
    ref = torch.nn.functional.interpolate(torch.from_numpy(x)[:, None], size=(16, 16), mode="bilinear",
                                          align_corners=False)[:, 0].numpy()
    assert np.allclose(up, ref, rtol=0, atol=1e-9)


def test_digits_split_determinism_and_subset():
    a, b, c = load_dataset("digits", seed=42), load_dataset("digits", seed=42), load_dataset("digits", seed=1)
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.y_train, c.y_train)
    s = load_dataset("digits", seed=42, subset=3)
    assert s.x_train.shape[0] == 30 and np.array_equal(np.bincount(s.y_train), np.full(10, 3))
    keep = np.concatenate([np.flatnonzero(a.y_train == k)[:3] for k in range(10)])
    assert np.array_equal(s.x_train, a.x_train[np.sort(keep)])
    assert s.x_test.shape == a.x_test.shape                       # test set stays full
    assert np.allclose(s.mean, (s.x_train / 255).mean(axis=(0, 2, 3)))


def test_unknown_dataset():
    with pytest.raises(DataError, match=r"`dataset`.*digits, cifar10, cifar100, imagefolder"):
        load_dataset("mnist")
    assert DATASETS == ("digits", "cifar10", "cifar100", "imagefolder")


# ----------------------------------------------------------------------------- CIFAR pickles

def _pkl(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _fake_cifar10(folder, per_batch=4):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    xs, ys = {}, {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        y = rng.integers(0, 10, size=per_batch).tolist()
        _pkl(folder / name, {"batch_label": name, "data": x, "labels": y, "filenames": ["f"] * per_batch})
        xs[name], ys[name] = x, y
    _pkl(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)], "num_vis": 3072})
    return xs, ys


def _fake_cifar100(folder, n=6):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    out = {}
    for name in ("train", "test"):
        x = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        fine = rng.integers(0, 100, size=n).tolist()
        coarse = [f // 5 for f in fine]
        _pkl(folder / name, {"data": x, "fine_labels": fine, "coarse_labels": coarse})
        out[name] = (x, fine, coarse)
    _pkl(folder / "meta", {"fine_label_names": [f"f{i}" for i in range(100)],
                           "coarse_label_names": [f"s{i}" for i in range(20)]})
    return out


def test_read_cifar10_batches(tmp_path):
    xs, ys = _fake_cifar10(tmp_path / "cifar-10-batches-py")
    x, y, coarse, classes = read_cifar_batches(tmp_path / "cifar-10-batches-py", "train")
    assert x.shape == (20, 3, 32, 32) and x.dtype == np.uint8 and y.dtype == np.int64
    assert coarse is None and classes == [f"c{i}" for i in range(10)]
    # row layout: 1024 red, 1024 green, 1024 blue, each row-major 32×32
    r = xs["data_batch_2"][1]
    k = 4 + 1
    assert x[k, 0, 0, 0] == r[0] and x[k, 0, 0, 1] == r[1] and x[k, 0, 1, 0] == r[32]
    assert x[k, 1, 0, 0] == r[1024] and x[k, 2, 31, 31] == r[3071]
    assert y.tolist() == sum((ys[f"data_batch_{i}"] for i in range(1, 6)), [])
    xt, yt, _, _ = read_cifar_batches(tmp_path / "cifar-10-batches-py", "test")
    assert np.array_equal(xt.reshape(4, -1), xs["test_batch"]) and yt.tolist() == ys["test_batch"]


def test_read_cifar100_batches(tmp_path):
    ref = _fake_cifar100(tmp_path / "cifar-100-python")
    x, y, coarse, classes = read_cifar_batches(tmp_path / "cifar-100-python", "train")
    assert np.array_equal(x.reshape(6, -1), ref["train"][0])
    assert y.tolist() == ref["train"][1] and coarse.tolist() == ref["train"][2]
    assert classes[:2] == ["f0", "f1"] and len(classes) == 100
    with pytest.raises(DataError, match="no CIFAR python batches"):
        read_cifar_batches(tmp_path, "train")


def test_cifar_offline_errors(tmp_path, monkeypatch):
    with pytest.raises(DataError, match=r"CIFAR-10 not found under .*cifar-10-batches-py.*imagefolder"):
        load_dataset("cifar10", root=tmp_path, download=False)

    def no_network(name, root):
        raise OSError("Temporary failure in name resolution")
    monkeypatch.setattr(D, "_download_cifar", no_network)
    with pytest.raises(DataError, match=r"CIFAR-100 not found under .*cifar-100-python and download failed \(offline\?\)"):
        load_dataset("cifar100", root=tmp_path, download=True)
    # present but not the real files: torchvision's md5 check rejects them
    _fake_cifar10(tmp_path / "cifar-10-batches-py")
    with pytest.raises(DataError, match="integrity check"):
        load_dataset("cifar10", root=tmp_path, download=False)


def test_cifar_load_path(tmp_path, monkeypatch):
    ref = _fake_cifar100(tmp_path / "cifar-100-python")
    monkeypatch.setattr(D, "_cifar_intact", lambda name, root: True)   # stands in for the md5 check
    d = load_dataset("cifar100", root=tmp_path)
    assert d.name == "cifar100" and d.mean == D.CIFAR100_MEAN and d.std == D.CIFAR100_STD
    assert d.coarse_train.tolist() == ref["train"][2] and d.y_test.tolist() == ref["test"][1]
    assert d.mean == (0.5071, 0.4867, 0.4408) and d.std == (0.2675, 0.2565, 0.2761)
    _fake_cifar10(tmp_path / "cifar-10-batches-py")
    d10 = load_dataset("cifar10", root=tmp_path, subset=1)
    assert d10.mean == (0.4914, 0.4822, 0.4465) and d10.std == (0.2023, 0.1994, 0.2010)
    assert d10.coarse_train is None
    assert np.all(np.bincount(d10.y_train) <= 1) and len(d10.y_test) == 4


# ----------------------------------------------------------------------------- imagefolder

# classes created out of order; file names whose string order ≠ creation order
_CLASSES = ["b_cls", "a_cls", "c"]
_FILES = ["1", "0", "10", "2"]


def _pixel(split, ci, fi):
    """A value identifying (split, class, file): checks the decoded order exactly."""
    return 10 + 100 * (split == "test") + 20 * ci + fi


def _make_tree(root, size=(6, 5), fmt="png", odd=None):
    for split in ("train", "test"):
        for cname in _CLASSES:
            (root / split / cname).mkdir(parents=True)
            ci = sorted(_CLASSES).index(cname)
            for f in _FILES:
                fi = sorted(_FILES).index(f)
                sz = (9, 9) if (split, cname, f) == odd else size
                arr = np.full((sz[1], sz[0], 3), _pixel(split, ci, fi), dtype=np.uint8)
                arr[0, 0] = (ci, fi, 7)
                Image.fromarray(arr).save(root / split / cname / f"{f}.{fmt}")
    (root / "train" / "a_cls" / ".DS_Store").write_bytes(b"junk")     # skipped
    (root / "train" / "notes.txt").write_text("not an image")           # skipped


def _make_tar(src, tar_path, top=None):
    with tarfile.open(tar_path, "w:gz") as tf:
        for split in ("train", "test"):
            arc = f"{top}/{split}" if top else split
            tf.add(src / split, arcname=arc)


def _check_order(d, subset=None, subset_test=None):
    assert d.classes == ["a_cls", "b_cls", "c"]
    for split, x, y, k in (("train", d.x_train, d.y_train, subset), ("test", d.x_test, d.y_test, subset_test)):
        n = k or len(_FILES)
        assert y.tolist() == [c for c in range(3) for _ in range(n)]
        for i in range(len(y)):
            ci, fi = i // n, i % n          # file rank in sorted order: '0' '1' '10' '2'
            assert x[i, 0, 1, 1] == _pixel(split, ci, fi)
            assert tuple(x[i, :, 0, 0]) == (ci, fi, 7)


def test_imagefolder_dir_and_tar(tmp_path):
    src = tmp_path / "tree"
    _make_tree(src)
    d = load_dataset("imagefolder", path=src)
    assert d.x_train.shape == (12, 3, 5, 6) and d.x_train.dtype == np.uint8 and d.y_train.dtype == np.int64
    assert d.x_train.flags["C_CONTIGUOUS"] and d.name == "imagefolder"
    _check_order(d)
    xf = d.x_train.astype(np.float64) / 255
    assert np.allclose(d.mean, xf.mean(axis=(0, 2, 3)), atol=1e-12)
    assert np.allclose(d.std, xf.std(axis=(0, 2, 3)), atol=1e-12)
    for top in (None, "cifar10-jpeg", "."):
        tar = tmp_path / f"t_{top}.tar.gz"
        _make_tar(src, tar, top)
        t = load_dataset("imagefolder", path=tar)
        assert np.array_equal(t.x_train, d.x_train) and np.array_equal(t.x_test, d.x_test)
        assert np.array_equal(t.y_train, d.y_train) and t.classes == d.classes and t.mean == d.mean
    # a folder holding one top-level folder (an unpacked archive)
    wrap = tmp_path / "wrap"
    wrap.mkdir()
    os.rename(src, wrap / "inner")
    assert np.array_equal(load_dataset("imagefolder", path=wrap).x_test, d.x_test)


def test_imagefolder_jpeg_matches_pil(tmp_path, monkeypatch):
    src = tmp_path / "tree"
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in ("x", "y"):
            (src / split / c).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(
                    src / split / c / f"{i}.jpg", quality=75)
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(src / "train" / "y" / "3.png")  # grey PNG
    calls, real = [], D._jpeg_batch_decode
    monkeypatch.setattr(D, "_jpeg_batch_decode", lambda blobs: calls.append(len(blobs)) or real(blobs))
    d = load_dataset("imagefolder", path=src)
    assert calls == [6, 6]                  # the JPEGs of each split went through the fast path
    files = [src / "train" / c / f for c, f in [("x", "0.jpg"), ("x", "1.jpg"), ("x", "2.jpg"),
                                                 ("y", "0.jpg"), ("y", "1.jpg"), ("y", "2.jpg"), ("y", "3.png")]]
    ref = np.stack([np.asarray(Image.open(f).convert("RGB")).transpose(2, 0, 1) for f in files])
    assert np.array_equal(d.x_train, ref)   # the batched JPEG decoder gives PIL's pixels


def test_imagefolder_subset(tmp_path):
    src = tmp_path / "tree"
    _make_tree(src)
    d = load_dataset("imagefolder", path=src, subset=2)
    assert len(d.y_train) == 6 and len(d.y_test) == 12        # test stays full by default
    _check_order(d, subset=2)
    d = load_dataset("imagefolder", path=src, subset=3, subset_test=1)
    _check_order(d, subset=3, subset_test=1)
    xf = d.x_train.astype(np.float64) / 255
    assert np.allclose(d.mean, xf.mean(axis=(0, 2, 3)))      # mean/std of the kept images
    with pytest.raises(DataError, match="subset"):
        load_dataset("imagefolder", path=src, subset=0)


def test_imagefolder_errors(tmp_path):
    with pytest.raises(DataError, match=r"nowhere\.tar\.gz does not exist"):
        load_dataset("imagefolder", path=tmp_path / "nowhere.tar.gz")
    with pytest.raises(DataError, match="needs `path`"):
        load_dataset("imagefolder")
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(os.urandom(2000))
    with pytest.raises(DataError, match=r"bad\.tar\.gz \(corrupt"):
        load_dataset("imagefolder", path=bad)
    src = tmp_path / "tree"
    _make_tree(src)
    good = tmp_path / "good.tar.gz"
    _make_tar(src, good)
    trunc = tmp_path / "trunc.tar.gz"
    trunc.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(DataError, match=r"trunc\.tar\.gz"):
        load_dataset("imagefolder", path=trunc)
    two = tmp_path / "two.tar.gz"
    with tarfile.open(two, "w:gz") as tf:
        for top in ("one", "other"):
            for split in ("train", "test"):
                tf.add(src / split, arcname=f"{top}/{split}")
    with pytest.raises(DataError, match="two top-level folders"):
        load_dataset("imagefolder", path=two)
    odd = tmp_path / "odd"
    _make_tree(odd, odd=("train", "b_cls", "10"))
    with pytest.raises(DataError, match=r"b_cls/10\.png is 9×9 but the first image .*a_cls/0\.png is 6×5"):
        load_dataset("imagefolder", path=odd)
    notest = tmp_path / "notest"
    (notest / "train" / "k").mkdir(parents=True)
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(notest / "train" / "k" / "0.png")
    with pytest.raises(DataError, match="test/<class>"):
        load_dataset("imagefolder", path=notest)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="train/<class>"):
        load_dataset("imagefolder", path=empty)
    broken = tmp_path / "broken"
    _make_tree(broken)
    (broken / "test" / "c" / "2.png").write_bytes(b"\x89PNG garbage")
    with pytest.raises(DataError, match=r"cannot decode image .*c/2\.png"):
        load_dataset("imagefolder", path=broken)


# ----------------------------------------------------------------------------- arrays / checksums

def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    for coarse in (None, np.arange(4, dtype=np.int64)):
        d = ImageData(rng.integers(0, 256, (4, 3, 5, 5), dtype=np.uint8), np.arange(4, dtype=np.int64),
                      rng.integers(0, 256, (2, 3, 5, 5), dtype=np.uint8), np.array([1, 0], dtype=np.int64),
                      ["cat", "dög"], (0.1, 0.2, 0.3), (0.4, 0.5, 0.6), coarse, "imagefolder")
        p = tmp_path / "sub" / "arrays.npz"
        save_arrays(d, p)
        save_arrays(d, p)                                     # overwrite in place
        e = load_arrays(p)
        for k in ("x_train", "y_train", "x_test", "y_test"):
            assert np.array_equal(getattr(e, k), getattr(d, k)) and getattr(e, k).dtype == getattr(d, k).dtype
        assert e.classes == d.classes and e.mean == d.mean and e.std == d.std and e.name == d.name
        assert (e.coarse_train is None) == (coarse is None)
        if coarse is not None:
            assert np.array_equal(e.coarse_train, coarse)
        assert os.listdir(tmp_path / "sub") == ["arrays.npz"]   # no temp file left behind
    with pytest.raises(DataError, match="does not exist"):
        load_arrays(tmp_path / "none.npz")


def test_sha256_file(tmp_path):
    p = tmp_path / "f.bin"
    blob = os.urandom(3 << 20)
    p.write_bytes(blob)
    assert sha256_file(p) == hashlib.sha256(blob).hexdigest()
