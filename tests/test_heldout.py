"""bench/heldout.py: a finished run's final networks scored on the test images its epochs
never saw (those after the first data.subset_test per class)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from selcl import checkpoint
from selcl.data import load_dataset, save_arrays
from selcl.evaluate import embed
from selcl.evaluate import test_accuracy as accuracy   # (not collected as a test)
from selcl.train import make_model

ROOT = Path(__file__).resolve().parents[1]
MODEL = {"arch": "small", "width": 8, "blocks": [1, 1, 1, 1]}
FULL = {**MODEL, "proj_dim": 128, "seed": 1, "bn_replicas": 1}   # as resolve() fills it


def _folder(root: Path, per_class: dict) -> None:
    rng = np.random.default_rng(0)
    for split, n in per_class.items():
        for c in ("cat", "dog", "owl"):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / split / c / f"{i:02d}.png")


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    """A run dir as the pipeline leaves it (data.npz on the first 2 test images per class,
    finetune.pt, pretrain.pt, histories ending at their network's accuracy) and a CE
    checkpoint; params.yaml with the setting `t` beside them."""
    _folder(tmp_path / "imgs", {"train": 4, "test": 7})
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["settings"]["t"] = {"data": {"dataset": "imagefolder", "path": str(tmp_path / "imgs"), "subset": 4,
                                        "subset_test": 2}, "model": MODEL}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    run = tmp_path / "runs" / "t"
    run.mkdir(parents=True)
    data = load_dataset("imagefolder", path=tmp_path / "imgs", subset=4, subset_test=2)
    save_arrays(data, run / "data.npz")
    x, y = torch.as_tensor(data.x_test), torch.as_tensor(data.y_test, dtype=torch.int64)
    for seed, ckpt, history in ((1, run / "finetune.pt", "finetune_history.csv"),
                                (2, run / "pretrain.pt", "pretrain_history.csv"),
                                (3, tmp_path / "ce.pt", "baseline_history.csv")):
        model = make_model({**FULL, "seed": seed}, 3, torch.device("cpu"))   # three different networks
        checkpoint.save({"model": model.state_dict()}, ckpt)
        acc = accuracy(model, x, y, data.mean, data.std)["top1"]
        (run / history).write_text(f"epoch,test_acc\n1,50.0\n2,{acc:.6g}\n")
    return run, tmp_path / "ce.pt"


def _heldout(tmp_path: Path, run: Path, ce: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "heldout.py"), "t", "--run-dir", str(run),
                           "--ce-checkpoint", str(ce), "--out", str(tmp_path / "heldout.md")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_the_networks_are_scored_on_the_images_after_the_first_per_class(tmp_path):
    run, ce = _setup(tmp_path)
    r = _heldout(tmp_path, run, ce)
    assert r.returncode == 0, r.stderr
    full = load_dataset("imagefolder", path=tmp_path / "imgs", subset=4)
    mean, std = tuple(np.load(run / "data.npz")["mean"]), tuple(np.load(run / "data.npz")["std"])
    held = np.array([i for i in range(21) if i % 7 >= 2])          # files 02..06 of each class
    rows = {line.split("|")[1].strip(): [float(v.split("±")[0]) for v in line.split("|")[2:5]]
            for line in (tmp_path / "heldout.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| final")}
    margin_line = next(line for line in (tmp_path / "heldout.md").read_text().splitlines() if "paired" in line)
    margin = rows.pop("Sel-CL+ − CE (± paired s.e.)")
    hits = {}
    for name, path in (("Sel-CL+", run / "finetune.pt"), ("Sel-CL classifier", run / "pretrain.pt"), ("CE", ce)):
        model = make_model(FULL, 3, torch.device("cpu"))
        model.load_state_dict(checkpoint.load(path)["model"])
        x, y = torch.as_tensor(full.x_test[held]), torch.as_tensor(full.y_test[held])
        assert rows[name][1] == pytest.approx(accuracy(model, x, y, mean, std)["top1"], abs=0.005)
        hits[name] = (embed(model, x, mean, std)[1].argmax(1) == y).numpy().astype(float)
    assert margin == pytest.approx([a - b for a, b in zip(rows["Sel-CL+"], rows["CE"])], abs=0.011)
    d = hits["Sel-CL+"] - hits["CE"]
    se = 100 * d.std(ddof=1) / np.sqrt(len(d))           # held out: the second cell's "± s.e."
    assert float(margin_line.split("|")[3].split("±")[1]) == pytest.approx(se, abs=0.005)
    assert "(6)" in r.stdout and "(15)" in r.stdout and "(21)" in r.stdout


def test_a_network_that_is_not_the_runs_last_epoch_is_refused(tmp_path):
    run, ce = _setup(tmp_path)
    hist = run / "baseline_history.csv"
    rows = hist.read_text().splitlines()
    last = float(rows[-1].split(",")[1])
    hist.write_text("\n".join(rows[:-1] + [f"2,{last + 10 if last < 50 else last - 10}"]) + "\n")
    r = _heldout(tmp_path, run, ce)
    assert r.returncode != 0 and "ce.pt" in r.stderr and "not that run's last epoch" in r.stderr
    assert not (tmp_path / "heldout.md").exists()
