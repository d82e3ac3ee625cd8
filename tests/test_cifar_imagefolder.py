"""tools/cifar_imagefolder.py: CIFAR's pickles → the image-folder archive the CPU presets read.
The archive read back with the pipeline's own loader gives the same classes, labels and
per-class order, and images within JPEG error; a subset keeps the same images."""
import gzip
import hashlib
import io
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import cifar_imagefolder as T  # noqa: E402
import selcl.data as D  # noqa: E402
from selcl.data import load_dataset  # noqa: E402

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _smooth_images(rng, n):
    """Smooth 32×32 images (JPEG keeps them within a few levels, unlike white noise)."""
    yy, xx = np.mgrid[0:32, 0:32] / 31.0
    out = np.empty((n, 3, 32, 32), np.uint8)
    for i in range(n):
        a, b, c = rng.uniform(20, 235, size=(3, 3))
        for ch in range(3):
            out[i, ch] = np.clip(a[ch] + (b[ch] - a[ch]) * xx * 0.5 + (c[ch] - a[ch]) * yy * 0.5, 0, 255)
    return out


def _fake_cifar10(folder, rng, per_batch=12):
    import pickle
    folder.mkdir(parents=True)
    xs, ys = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = _smooth_images(rng, per_batch)
        y = rng.integers(0, 10, size=per_batch).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({"data": x.reshape(per_batch, -1), "labels": y}, f)
        xs.append(x), ys.append(y)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": CIFAR10_NAMES}, f)
    return np.concatenate(xs[:5]), np.concatenate(ys[:5]), xs[5], np.array(ys[5])


@pytest.fixture
def cifar(tmp_path, monkeypatch):
    x, y, xt, yt = _fake_cifar10(tmp_path / "raw" / "cifar-10-batches-py", np.random.default_rng(0))
    monkeypatch.setattr(D, "_cifar_intact", lambda name, root: True)   # stands in for the md5 check
    return tmp_path, x, y, xt, yt


def test_archive_reads_back_as_the_same_dataset(cifar):
    tmp, x, y, xt, yt = cifar
    out = tmp / "c10.tar.gz"
    assert T.main(["--root", str(tmp / "raw"), "--out", str(out), "--no-download"]) == 0
    d = load_dataset("imagefolder", path=out)
    assert d.classes == CIFAR10_NAMES                      # class ids unchanged: asym_map cifar10 holds
    for xs, ys, xr, yr in ((x, y, d.x_train, d.y_train), (xt, yt, d.x_test, d.y_test)):
        # the loader orders by class, then file name; the archive numbers each class in dataset order
        order = np.argsort(ys, kind="stable")
        assert yr.tolist() == ys[order].tolist()
        err = np.abs(xr.astype(int) - xs[order].astype(int))
        assert err.mean() < 2.0 and err.max() < 40        # JPEG quality 75 on smooth images
    names = tarfile.open(out).getnames()
    assert "train/cat/0000.jpg" in names and names.index("test") < names.index("train")
    # a subset keeps the first k of each class, the same images as on the pickles
    sub = load_dataset("imagefolder", path=out, subset=2)
    ref = D._apply_subset(load_dataset("cifar10", root=tmp / "raw", download=False), 2, None)
    assert sub.y_train.tolist() == sorted(ref.y_train.tolist())
    order = np.argsort(ref.y_train, kind="stable")
    assert np.abs(sub.x_train.astype(int) - ref.x_train[order].astype(int)).mean() < 2.0


def test_archive_is_deterministic_and_jpeg_quality_75(cifar):
    from PIL import Image
    tmp, x, y, xt, yt = cifar
    a, b = tmp / "a.tar.gz", tmp / "b.tar.gz"
    for p in (a, b):
        T.write_archive(x, y, xt, yt, CIFAR10_NAMES, p, progress=False)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    with tarfile.open(a) as tar:
        m = next(n for n in tar.getmembers() if n.isfile())
        assert m.mtime == 0 and m.uid == 0
        im = Image.open(tar.extractfile(m))
        im.load()
    ref = Image.new("RGB", (32, 32))
    buf = io.BytesIO()
    ref.save(buf, "JPEG", quality=75)
    assert im.quantization == Image.open(io.BytesIO(buf.getvalue())).quantization
    assert gzip.open(a).read(1)                            # a valid gzip stream
    c = tmp / "c.tar.gz"
    T.write_archive(x, y, xt, yt, CIFAR10_NAMES, c, quality=95, progress=False)
    assert c.stat().st_size > a.stat().st_size


def test_class_names_out_of_order_get_their_id_as_prefix():
    assert T.folder_names(CIFAR10_NAMES) == CIFAR10_NAMES
    assert T.folder_names(["b", "a", "c"]) == ["0_b", "1_a", "2_c"]
    names = T.folder_names([f"n{i}" for i in range(12)])   # "n10" sorts before "n2"
    assert names[:3] == ["00_n0", "01_n1", "02_n2"] and names == sorted(names)


def test_missing_cifar_offline_is_one_error_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "c10.tar.gz"
    out.write_bytes(b"an older archive")
    assert T.main(["--root", str(tmp_path / "nothing"), "--out", str(out), "--no-download"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cifar_imagefolder: CIFAR-10 not found under") and err.count("\n") == 1
    assert out.read_bytes() == b"an older archive"          # nothing produced is lost
    assert T.main(["--quality", "0", "--out", str(out)]) == 2
    assert "--quality 0" in capsys.readouterr().err


def test_a_failed_write_leaves_the_older_archive(cifar, monkeypatch):
    tmp, x, y, xt, yt = cifar
    out = tmp / "c10.tar.gz"
    out.write_bytes(b"an older archive")

    def boom(img, quality):
        raise OSError("disk full")
    monkeypatch.setattr(T, "_jpeg", boom)
    with pytest.raises(OSError):
        T.write_archive(x, y, xt, yt, CIFAR10_NAMES, out, progress=False)
    assert out.read_bytes() == b"an older archive"
    assert [p.name for p in tmp.iterdir() if p.name.startswith(".c10")] == []
