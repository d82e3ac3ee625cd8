"""bench/heldout.py: a finished run's final networks scored on the test images its epochs
never saw (those after the first data.subset_test per class)."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from PIL import Image

from selcl import checkpoint
from selcl.augment import eval_view
from selcl.config import load_params
from selcl.data import load_dataset, save_arrays, sha256_file
from selcl.evaluate import embed
from selcl.train import make_model

ROOT = Path(__file__).resolve().parents[1]
MODEL = {"arch": "small", "width": 8, "blocks": [1, 1, 1, 1]}
FULL = {**MODEL, "proj_dim": 128, "seed": 1, "bn_replicas": 1}   # as resolve() fills it
PER_CLASS = {"train": 6, "test": 20}
SEEN = 5                                                          # data.subset_test


def _archive(root: Path, extra: bool = False) -> Path:
    """Three classes told apart by one bright channel, in noise (so that briefly trained
    networks differ); extra: one more test image, the archive another."""
    rng = np.random.default_rng(0)
    for split, n in PER_CLASS.items():
        for c, name in enumerate(("cat", "dog", "owl")):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(n + (extra and split == "test")):
                img = rng.integers(0, 160, (8, 8, 3), dtype=np.uint8)
                img[..., c] = np.clip(img[..., c].astype(int) + rng.integers(0, 120), 0, 255)
                Image.fromarray(img).save(root / split / name / f"{i:02d}.png")
    tar = root.with_suffix(".tar.gz")
    with tarfile.open(tar, "w:gz") as tf:
        for split in PER_CLASS:
            tf.add(root / split, arcname=split)
    return tar


def _hits(model, x, y, mean, std) -> np.ndarray:
    return (embed(model, torch.as_tensor(x), mean, std)[1].argmax(1) == torch.as_tensor(y)).numpy().astype(float)


def _setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A run dir as the pipeline leaves it (data.npz / data.json on the first SEEN test images
    per class, finetune.pt and pretrain.pt, histories ending at their network's accuracy),
    a CE checkpoint, and params.yaml with the setting `t`: three networks trained a few
    steps each, so that they hit different images."""
    tar = _archive(tmp_path / "imgs")
    params = load_params(ROOT / "params.yaml")
    params["settings"]["t"] = {"data": {"dataset": "imagefolder", "path": str(tar), "subset": PER_CLASS["train"],
                                        "subset_test": SEEN}, "model": MODEL}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    run = tmp_path / "runs" / "t"
    run.mkdir(parents=True)
    data = load_dataset("imagefolder", path=tar, subset=PER_CLASS["train"], subset_test=SEEN)
    save_arrays(data, run / "data.npz")
    (run / "data.json").write_text(json.dumps({"source_sha256": sha256_file(tar)}))
    x_tr = eval_view(torch.as_tensor(data.x_train), data.mean, data.std, None)
    y_tr = torch.as_tensor(data.y_train, dtype=torch.int64)
    for seed, steps, ckpt, history in ((1, 30, run / "finetune.pt", "finetune_history.csv"),
                                       (2, 3, run / "pretrain.pt", "pretrain_history.csv"),
                                       (3, 12, tmp_path / "ce.pt", "baseline_history.csv")):
        model = make_model({**FULL, "seed": seed}, 3, torch.device("cpu"))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(x_tr)[1], y_tr).backward()
            opt.step()
        checkpoint.save({"model": model.state_dict()}, ckpt)
        acc = 100 * _hits(model, data.x_test, data.y_test, data.mean, data.std).mean()
        (run / history).write_text(f"epoch,test_acc\n1,50.0\n2,{acc:.6g}\n")
    return run, tmp_path / "ce.pt", tar


def _heldout(tmp_path: Path, run: Path, ce: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "heldout.py"), "t", "--run-dir", str(run),
                           "--ce-checkpoint", str(ce), "--out", str(tmp_path / "heldout.md"), *extra],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def _table(md: str) -> dict[str, list[str]]:
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]]
            for line in md.splitlines() if line.startswith("| ") and not line.startswith("| final")}


def test_the_networks_are_scored_on_the_images_after_the_first_per_class(tmp_path):
    run, ce, tar = _setup(tmp_path)
    r = _heldout(tmp_path, run, ce)
    assert r.returncode == 0, r.stderr
    rows = _table((tmp_path / "heldout.md").read_text())
    assert "model.seed 1" in (tmp_path / "heldout.md").read_text()
    full = load_dataset("imagefolder", path=tar, subset=PER_CLASS["train"])
    arrays = np.load(run / "data.npz")
    mean, std = tuple(arrays["mean"]), tuple(arrays["std"])
    n = PER_CLASS["test"]
    held = np.array([i for i in range(3 * n) if i % n >= SEEN])        # files 05..19 of each class
    wrong = np.array([i for i in range(3 * n) if i % n < n - SEEN])     # a wrong split: the first 15
    hits, wrong_hits = {}, {}
    for name, path in (("Sel-CL+", run / "finetune.pt"), ("Sel-CL classifier", run / "pretrain.pt"), ("CE", ce)):
        model = make_model(FULL, 3, torch.device("cpu"))
        model.load_state_dict(checkpoint.load(path)["model"])
        hits[name] = _hits(model, full.x_test[held], full.y_test[held], mean, std)
        wrong_hits[name] = _hits(model, full.x_test[wrong], full.y_test[wrong], mean, std)
        assert float(rows[name][1]) == pytest.approx(100 * hits[name].mean(), abs=0.005)
    # the fixture can tell networks and splits apart
    assert len({h.tobytes() for h in hits.values()}) == 3
    assert any(abs(hits[k].mean() - wrong_hits[k].mean()) > 0.01 for k in hits)
    d = hits["Sel-CL+"] - hits["CE"]
    assert d.any()
    margin, se = (float(v) for v in rows["Sel-CL+ − CE (± paired s.e.)"][1].split("±"))
    assert margin == pytest.approx(100 * d.mean(), abs=0.005)
    assert se == pytest.approx(100 * d.std(ddof=1) / np.sqrt(len(d)), abs=0.005)
    assert f"({3 * SEEN})" in r.stdout and f"({len(held)})" in r.stdout and f"({3 * n})" in r.stdout


def test_a_network_that_is_not_the_runs_last_epoch_is_refused(tmp_path):
    run, ce, _ = _setup(tmp_path)
    hist = run / "baseline_history.csv"
    rows = hist.read_text().splitlines()
    last = float(rows[-1].split(",")[1])
    hist.write_text("\n".join(rows[:-1] + [f"2,{last + 10 if last < 50 else last - 10}"]) + "\n")
    r = _heldout(tmp_path, run, ce)
    assert r.returncode != 0 and "ce.pt" in r.stderr and "not that run's last epoch" in r.stderr
    assert not (tmp_path / "heldout.md").exists()


def test_another_archive_or_other_test_images_are_refused(tmp_path):
    run, ce, tar = _setup(tmp_path)
    other = _archive(tmp_path / "other", extra=True)       # the same first images, one more later
    r = _heldout(tmp_path, run, ce, "--data", str(other))
    assert r.returncode != 0 and "not the archive" in r.stderr and "data.json" in r.stderr
    # the run's data.npz on other test images (the first SEEN + 1 per class)
    save_arrays(load_dataset("imagefolder", path=tar, subset=PER_CLASS["train"], subset_test=SEEN + 1),
                run / "data.npz")
    r = _heldout(tmp_path, run, ce)
    assert r.returncode != 0 and "data.npz" in r.stderr and f"first {SEEN} per class" in r.stderr
    assert not (tmp_path / "heldout.md").exists()
