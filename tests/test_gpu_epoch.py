"""bench/gpu_epoch.py and bench/gpu_real.py on the CPU (issue 89): the epoch benchmark's JSON,
the projection from per-stage step times, and short runs scheduled in the authors' steps."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_real  # noqa: E402
import projection  # noqa: E402
from selcl.config import load_params, resolve  # noqa: E402
from selcl.train import lr_at, steps_per_epoch  # noqa: E402

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _image_folder(root: Path, per_class: int, test_per_class: int) -> Path:
    """train/<class>/*.png and test/<class>/*.png, 32×32, each class its own colour with noise."""
    from PIL import Image
    rng = np.random.default_rng(0)
    for split, k in (("train", per_class), ("test", test_per_class)):
        for c, name in enumerate(CLASSES):
            (root / split / name).mkdir(parents=True)
            for i in range(k):
                base = np.array([25 * c, 255 - 25 * c, (80 * c) % 256], dtype=float)
                img = np.clip(base + rng.normal(0, 30, (32, 32, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(img).save(root / split / name / f"{i:04d}.png")
    return root


def test_the_epoch_benchmark_writes_its_json_on_the_cpu(tmp_path, monkeypatch):
    import gpu_epoch
    import torch
    torch.set_num_threads(2)
    monkeypatch.setenv("SELCL_DEVICE", "cpu")
    data = _image_folder(tmp_path / "c10", 14, 4)
    out = tmp_path / "res" / "gpu_epoch.json"
    res = gpu_epoch.main(["--data", str(data), "--arch", "small", "--epochs", "2", "--finetune-epochs", "2",
                          "--ce-epochs", "2", "--workdir", str(tmp_path / "w"), "--json", str(out),
                          "--out", str(tmp_path / "res" / "gpu_epoch.md")])
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(res))
    assert {"device", "images", "eager_s", "captured_s", "setting_min", "commit"} <= set(written)
    assert written["device"] == "cpu" and written["images"] == 140 and written["captured"] is False
    assert written["host_syncs_per_step"] is None              # counted on CUDA only
    assert written["eager_s"] > 0 and written["captured_s"] > 0
    assert [s["name"] for s in written["stages"]] == ["Uns-CL warm-up (eager)", "Sel-CL pre-training",
                                                      "Sel-CL+ fine-tuning", "CE baseline"]
    full = {s["name"]: s for s in written["stages"]}
    assert full["Sel-CL pre-training"]["steps"] == 249 * 391 and full["CE baseline"]["steps"] == 300 * 391
    assert written["setting_min"] == pytest.approx(sum(s["min"] for s in written["stages"]))
    assert "| **whole setting** |" in (tmp_path / "res" / "gpu_epoch.md").read_text()


def test_the_projection_counts_steps_and_fixed_costs_once():
    """H200 run 4's numbers (5,000 images): 47.8 ms a pre-training step, 97.4 s for its first
    epoch of 40 steps, 0.10 s of selection + k-NN per epoch: its own step time gives about
    85 minutes, where scaling whole epochs gave 101.7."""
    timing = [{"train_s": 97.4, "steps": 40, "select_s": 0.05, "knn_s": 0.05}] + \
             [{"train_s": 1.912, "steps": 40, "select_s": 0.05, "knn_s": 0.05}] * 5
    step_s, compile_s, fixed = projection.step_times(timing)
    assert step_s == pytest.approx(0.0478) and compile_s == pytest.approx(97.4 - 1.912)
    assert fixed == pytest.approx(0.10)
    stages = [projection.Stage("warm-up", 391, step_s),
              projection.Stage("pre-training", 249 * 391, step_s, 249, fixed * 10, compile_s),
              projection.Stage("fine-tuning", 70 * 133, 0.008, 70, 0.05, 30.0)]
    assert 84 < projection.setting_minutes(stages) < 87
    assert stages[1].seconds == pytest.approx(249 * 391 * 0.0478 + 249 * 1.0 + compile_s)


def test_short_runs_ramp_the_lr_over_the_authors_steps_and_keep_the_last_batch():
    """5,000 images, 40 epochs: the ramp spans the authors' 1,955 steps (5 epochs of 391),
    not 2 of this run's 40-step epochs (78 steps before); the last batch of 8 is kept."""
    cfg = resolve(load_params(ROOT / "params.yaml"), "cifar10_asym40")
    gpu_real.shrink_to_subset(cfg, 5000, 10)
    assert cfg["pretrain"]["drop_last"] is False
    gpu_real.schedule_by_steps(cfg, 5000, 40)
    pc, iters = cfg["pretrain"], steps_per_epoch(5000, 128)
    assert iters == 40
    lrs = [lr_at(pc, e, it, iters) for e in range(1, 41) for it in range(iters)]
    # 1,600 steps in all: the lr ramps through the whole run, linearly from lr/100
    assert all(b > a for a, b in zip(lrs, lrs[1:])) and lrs[-1] < pc["lr"]
    assert lrs[78] == pytest.approx(pc["lr"] / 100 * (99 * 78 / 1955 + 1))     # not the top, as before
    assert lr_at(pc, 49, 35, iters) == pytest.approx(pc["lr"])        # step 1,955: the top of the ramp
    full = resolve(load_params(ROOT / "params.yaml"), "cifar10_asym40")
    gpu_real.schedule_by_steps(full, 50_000, 250)      # the full set: the authors' own schedule
    assert full["pretrain"]["lr_warmup_epochs"] == pytest.approx(5)


def test_bootstrapping_starts_after_the_authors_steps():
    fc = resolve(load_params(ROOT / "params.yaml"), "cifar10_asym40")["finetune"]
    # the full set: its own bootstrap_start; 5,000 images with |T| 1,700: 30 epochs of a full
    # T of 17,000 (133 steps) = 3,990 steps, 14 steps an epoch here → after epoch 285
    assert gpu_real.bootstrap_start_by_steps(fc, 17_000, 50_000) == fc["bootstrap_start"]
    B = fc["batch_size"]
    expect = math.ceil(fc["bootstrap_start"] * steps_per_epoch(17_000, B) / steps_per_epoch(1700, B))
    assert gpu_real.bootstrap_start_by_steps(fc, 1700, 5000) == expect > 15
