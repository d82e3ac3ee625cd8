"""The WebVision-50 preset (SPEC §2, §6, §7) and its imagefolder path, on a tiny folder.

Real WebVision images come in every size: the data stage resizes the shorter side to
`data.image_size` and keeps the centre square. The preset's values are checked
against SPEC, then the whole chain (data → noise → warm-up → pre-training →
fine-tuning → evaluation) runs on a tiny folder of odd-sized images with the preset's
ResNet-18, only the sizes shrunk for a CPU.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import repo_params, run_stage_inprocess, write_params

from selcl.data import load_dataset, resize_center_crop
from selcl.models import build_model

SIZES = [(40, 30), (23, 61), (64, 64), (50, 37)]     # (W, H): no two classes alike


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("webvision_tiny")
    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("test", 3)):
        for c, name in enumerate(("n01_tench", "n02_goldfish", "n03_shark")):
            d = root / split / name
            d.mkdir(parents=True)
            for i in range(n):
                w, h = SIZES[(i + c) % len(SIZES)]
                base = np.zeros((h, w, 3), np.uint8)
                base[..., c] = 200                         # class colour, plus noise
                img = np.clip(base + rng.integers(0, 55, (h, w, 3)), 0, 255).astype(np.uint8)
                ext = "jpg" if i % 2 else "png"
                Image.fromarray(img).save(d / f"{i:04d}.{ext}")
    return root


def preset():
    """The setting as written (sparse: only what differs from defaults), every section present."""
    from selcl.config import SECTIONS
    p = copy.deepcopy(repo_params()["settings"]["webvision50"])
    return {s: p.get(s) or {} for s in SECTIONS}


def test_preset_is_the_papers_webvision_setting():
    from selcl.config import resolve
    p = resolve(repo_params(), "webvision50")         # defaults + the setting's overrides
    assert p["model"]["arch"] == "resnet18" and p["data"]["image_size"] == 224
    assert p["data"]["dataset"] == "imagefolder"
    assert p["pretrain"]["batch_size"] == 64 and p["pretrain"]["epochs"] == 130
    assert p["pretrain"]["lr_decay_epochs"] == [80, 105] and p["pretrain"]["lr_warmup_epochs"] == 5
    assert (p["pretrain"]["alpha"], p["pretrain"]["beta"]) == (0.4, 0.0)
    assert p["finetune"]["epochs"] == 50
    assert "webvision50" in repo_params()["suites"]["webvision"]


def test_resnet18_stem_keeps_224px_resolution():
    model = build_model("resnet18", 50).eval()
    with torch.no_grad():
        stem = model.encoder.conv1(torch.zeros(1, 3, 224, 224))
        assert stem.shape == (1, 64, 224, 224)            # 3×3 stride-1 stem, no max-pool
        z, logits = model(torch.zeros(2, 3, 224, 224))
    assert z.shape == (2, 128) and logits.shape == (2, 50)


def test_resize_center_crop_keeps_the_centre():
    im = np.zeros((3, 40, 80), np.uint8)                  # H=40, W=80: a wide image
    im[:, :, 30:50] = 255                                 # a bright centre band
    out = resize_center_crop(im, 20)                      # → 20×40, then the central 20×20
    assert out.shape == (3, 20, 20)
    assert out[:, :, 6:14].min() > 200 and out[:, :, :3].max() < 40 and out[:, :, -3:].max() < 40


def test_odd_sizes_need_image_size(tiny_folder):
    from selcl.data import DataError
    with pytest.raises(DataError, match="image_size"):
        load_dataset("imagefolder", path=tiny_folder)
    data = load_dataset("imagefolder", path=tiny_folder, image_size=224)
    assert data.x_train.shape == (24, 3, 224, 224) and data.x_test.shape == (9, 3, 224, 224)
    assert data.classes == ["n01_tench", "n02_goldfish", "n03_shark"]
    # class colour survives the resize: channel c is the brightest for class c
    means = data.x_train.reshape(24, 3, -1).mean(2)
    assert (means.argmax(1) == data.y_train).all()


def test_image_size_on_a_fixed_size_dataset_is_a_config_error(tmp_path, monkeypatch):
    from conftest import tiny_params_dict
    params = tiny_params_dict(data={"image_size": 32})
    write_params(tmp_path, params)
    with pytest.raises(SystemExit) as e:
        run_stage_inprocess(monkeypatch, tmp_path, "data")
    assert e.value.code == 2


def test_preset_runs_end_to_end_on_a_tiny_folder(tmp_path, monkeypatch, tiny_folder):
    p = preset()
    p["data"].update(path=str(tiny_folder), image_size=32)          # CPU-sized images
    p["warmup"].update(batch_size=8, queue_size=32)
    p["pretrain"].update(epochs=2, batch_size=8, lr_warmup_epochs=1, lr_decay_epochs=[2], k=5,
                         queue_per_class=2, memory_start_epoch=2)
    p["finetune"].update(epochs=2, batch_size=8, bootstrap_start=1, eval_last=1)
    p["evaluate"].update(k=5, tsne_points=0)
    params = repo_params()
    params = {"run": ["webvision50"], "suites": {"webvision": ["webvision50"]},
              "defaults": params["defaults"], "settings": {"webvision50": p}}
    write_params(tmp_path, params)
    monkeypatch.setenv("SELCL_ALLOW_CPU", "1")                       # resnet18: the paper's network
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for stage in ("data", "noise", "warmup", "pretrain", "finetune", "evaluate"):
            run_stage_inprocess(monkeypatch, tmp_path, stage, setting="webvision50")
    finally:
        torch.set_num_threads(threads)
    run = tmp_path / "runs" / "webvision50"
    meta = json.loads((run / "data.json").read_text())
    assert meta["image_shape"] == [3, 32, 32] and meta["num_classes"] == 3
    ft = json.loads((run / "finetune.json").read_text())
    assert 0.0 <= ft["test_acc_last"] <= 100.0
    assert len((run / "pretrain_history.csv").read_text().splitlines()) == 3
