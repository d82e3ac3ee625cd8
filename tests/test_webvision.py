"""The WebVision-50 preset (SPEC §2, §6, §7, §10.4) and its imagefolder path, on a tiny folder.

Real WebVision images come in every size: the data stage resizes the shorter side to
`data.image_size` (256) and keeps the centre square; the network sees `data.crop`
(224) px views of it, as the authors' torchvision pipelines (Resize(256) then
RandomResizedCrop(224, scale 0.2–1) / RandomCrop(224) / CenterCrop(224)). The preset's
values are checked against SPEC and the authors' WebVision-50 scripts, the crops
against torchvision, then the whole chain (data → noise → warm-up → pre-training →
fine-tuning → evaluation) runs on a tiny folder of odd-sized images with the preset's
ResNet-18, only the sizes shrunk for a CPU (store 40, crop 32).
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import repo_params, run_stage_inprocess, write_params

from selcl import augment as A
from selcl.config import ConfigError, resolve, validate_setting
from selcl.data import ImageData, load_arrays, load_dataset, resize_center_crop, save_arrays
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


@pytest.fixture(scope="module")
def tiny_val(tmp_path_factory):
    """A second test set in the ILSVRC12 role: test/<class>/ only, two of the three
    classes, other sizes again."""
    root = tmp_path_factory.mktemp("ilsvrc_tiny")
    rng = np.random.default_rng(1)
    for c, name in ((2, "n03_shark"), (0, "n01_tench")):
        d = root / "test" / name
        d.mkdir(parents=True)
        for i in range(2):
            w, h = SIZES[(i + c + 1) % len(SIZES)]
            img = np.zeros((h, w, 3), np.uint8)
            img[..., c] = 200
            Image.fromarray(np.clip(img + rng.integers(0, 55, (h, w, 3)), 0, 255).astype(np.uint8)).save(d / f"v{i}.png")
    return root


def test_extra_test_set_is_labelled_by_the_training_classes(tiny_val, tmp_path):
    from selcl.data import DataError, load_extra_test
    classes = ["n01_tench", "n02_goldfish", "n03_shark"]
    x, y = load_extra_test(tiny_val, classes, image_size=40)
    assert x.shape == (4, 3, 40, 40) and y.tolist() == [0, 0, 2, 2]      # the training order
    assert (x.reshape(4, 3, -1).mean(2).argmax(1) == y).all()            # the class colours
    with pytest.raises(DataError, match=r"\['n03_shark'\] are not training classes"):
        load_extra_test(tiny_val, classes[:2], image_size=40)
    with pytest.raises(DataError, match="does not exist"):
        load_extra_test(tmp_path / "nowhere", classes)
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(DataError, match="test/<class>"):
        load_extra_test(tmp_path / "empty", classes)


def preset():
    """The setting as written (sparse: only what differs from defaults), every section present."""
    from selcl.config import SECTIONS
    p = copy.deepcopy(repo_params()["settings"]["webvision50"])
    return {s: p.get(s) or {} for s in SECTIONS}


def p_batch(cfg):
    assert cfg["pretrain"]["batch_size"] == cfg["finetune"]["batch_size"]
    return cfg["pretrain"]["batch_size"]


def test_preset_is_the_papers_webvision_setting():
    """Every value of the preset, as the authors' RunScripts_webvision_Sel-CL.sh
    (the `uns` run), RunScripts_webvision_Sel-CL_plus.sh, train_webvision_Sel-CL.py and
    train_webvision_Sel-CL_fine-tuning.py set them (SPEC §10.4)."""
    params = repo_params()
    validate_setting(params, "webvision50")
    cfg = resolve(params, "webvision50")
    d, m, w, p, f = (cfg[k] for k in ("data", "model", "warmup", "pretrain", "finetune"))
    assert "webvision50" in params["suites"]["webvision"]
    # data: Resize(256), 224 px crops; RandomResizedCrop scale 0.2–1
    assert d["dataset"] == "imagefolder" and d["image_size"] == 256 and d["crop"] == 224
    assert d["crop_scale"] == [0.2, 1.0]
    assert d["extra_test_path"] == "data/ilsvrc12_val50"          # tested on ILSVRC12 val too
    assert cfg["noise"]["kind"] == "none"                         # real label noise
    assert m["arch"] == "resnet18" and m["proj_dim"] == 128 and m["seed"] == 1
    # CUDA_VISIBLE_DEVICES=0,1,2,3 and nn.DataParallel around the online and EMA networks
    # (pre-training) and the network (fine-tuning): BatchNorm over shards of 64 / 4 = 16
    assert m["bn_replicas"] == 4 and p_batch(cfg) // m["bn_replicas"] == 16
    # Uns-CL warm-up: 5 epochs (--warmup-epoch 5, --warmup_way uns), 10k-key queue, τ 0.1
    assert (w["method"], w["epochs"]) == ("uns_cl", 5)     # on pre-training's loader: batch 64
    assert w["queue_size"] == 10000 and w["temperature"] == 0.1
    # pre-training: 130 epochs in all counting the warm-up (--epoch 130), step decay at
    # 80 and 105, 5 lr warm-up epochs from lr/100, batch 64, lr 0.1, wd 1e-4
    assert (p["epochs"], p["lr_decay_epochs"], p["lr_warmup_epochs"]) == (130, [80, 105], 5)
    assert (p["batch_size"], p["lr"], p["weight_decay"], p["lr_decay"]) == (64, 0.1, 1e-4, 0.1)
    # memory: 200 per class → 200·50·2 = 20,000 entries; α = 0.4, β = 0, K = 250
    assert p["queue_per_class"] == 200 and p["queue_per_class"] * 50 * 2 == 20_000
    assert (p["alpha"], p["beta"], p["k"]) == (0.4, 0.0, 250)
    assert (p["lambda_cls"], p["lambda_sim"], p["temperature"]) == (1.0, 0.01, 0.1)
    # fine-tuning (Sel-CL+): 50 epochs, lr 0.001 constant, batch 64, weak augmentation,
    # --startLabelCorrection 20: bootstrapping when epoch > 20, i.e. from epoch 21
    assert (f["epochs"], f["lr"], f["batch_size"], f["augment"]) == (50, 0.001, 64, "weak")
    assert (f["bootstrap"], f["bootstrap_start"], f["mixup_alpha"]) == (0.2, 20, 1.0)
    assert f["reinit_classifier"] is True and f["eval_last"] == 10
    assert cfg["baseline"]["enabled"] is False


def test_defaults_keep_cifar_views():
    """No crop by default: CIFAR's views and test images are the whole 32 px image."""
    d = repo_params()["defaults"]["data"]
    assert d["crop"] is None and d["crop_scale"] == [0.08, 1.0]
    from selcl.config import resolve
    params = repo_params()
    for name in params["settings"]:         # each writes every key (params/<name>.yaml)
        if name != "webvision50":
            data = resolve(params, name)["data"]
            assert data["crop"] is None and data["crop_scale"] == [0.08, 1.0], name


@pytest.mark.parametrize("data,match", [
    ({"crop": 300}, "crop"),                                  # larger than image_size 256
    ({"crop_scale": [0.5, 0.2]}, "crop_scale"),
    ({"crop_scale": [0.0, 1.0]}, "crop_scale"),
    ({"crop_scale": [0.2]}, "crop_scale"),
    ({"crop": 0}, "crop"),
])
def test_crop_params_are_validated(data, match):
    params = repo_params()
    params["settings"]["webvision50"]["data"].update(data)
    with pytest.raises(ConfigError, match=match):
        validate_setting(params, "webvision50")


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
    data = load_dataset("imagefolder", path=tiny_folder, image_size=256)   # the preset's size
    assert data.x_train.shape == (24, 3, 256, 256) and data.x_test.shape == (9, 3, 256, 256)
    assert data.classes == ["n01_tench", "n02_goldfish", "n03_shark"]
    # class colour survives the resize: channel c is the brightest for class c
    means = data.x_train.reshape(24, 3, -1).mean(2)
    assert (means.argmax(1) == data.y_train).all()


def test_image_size_on_a_fixed_size_dataset_is_a_config_error(tmp_path, monkeypatch, capsys):
    from conftest import tiny_params_dict
    params = tiny_params_dict(data={"image_size": 32})
    write_params(tmp_path, params)
    with pytest.raises(SystemExit) as e:
        run_stage_inprocess(monkeypatch, tmp_path, "data")
    assert e.value.code == 2
    assert "data.image_size" in capsys.readouterr().err


# --------------------------------------------------------------------- the crops

def test_test_transform_matches_the_authors_resize_and_center_crop():
    """Stored Resize(256)-square + CenterCrop(224) = torchvision's Resize(256) →
    CenterCrop(224) on the original image (exact here: a 2:1 image, whose resized width
    is the same integer both ways; otherwise at most a one-pixel shift — the central
    square keeps everything CenterCrop(224) can see)."""
    tv = pytest.importorskip("torchvision.transforms")
    rng = np.random.default_rng(1)
    im = rng.integers(0, 256, (3, 150, 300), dtype=np.uint8)           # H=150, W=300
    ref = tv.Compose([tv.Resize(256), tv.CenterCrop(224)])(Image.fromarray(im.transpose(1, 2, 0)))
    stored = torch.from_numpy(resize_center_crop(im, 256).copy())[None]        # [1, 3, 256, 256]
    ours = A.center_crop(stored, 224)[0]
    assert ours.shape == (3, 224, 224)
    assert torch.equal(ours, torch.from_numpy(np.asarray(ref).transpose(2, 0, 1).copy()))


@pytest.mark.parametrize("hw", [(256, 256), (257, 259), (40, 40)])
def test_center_crop_matches_torchvision(hw):
    F2 = pytest.importorskip("torchvision.transforms.v2.functional")
    x = torch.randint(0, 256, (2, 3) + hw, dtype=torch.uint8)
    size = 32 if hw == (40, 40) else 224
    assert torch.equal(A.center_crop(x, size), F2.center_crop(x, [size, size]))
    assert A.center_crop(x, None) is x
    ev = A.eval_view(x, (0.5, 0.4, 0.3), (0.2, 0.2, 0.2), size)
    assert torch.equal(ev, A.normalize(F2.center_crop(x, [size, size]), (0.5, 0.4, 0.3), (0.2, 0.2, 0.2)))


def test_weak_crop_is_torchvisions_random_crop_without_padding():
    """crop = S: RandomCrop(S) (no padding: offsets uniform over 0 … H − S) → flip."""
    F2 = pytest.importorskip("torchvision.transforms.v2.functional")
    B, H, S = 400, 40, 32
    x = torch.randint(0, 256, (B, 3, H, H), dtype=torch.uint8)
    p = A.sample_weak_params(B, torch.Generator().manual_seed(3), 0, image_hw=(H, H), size=S)
    assert set(p["top"].tolist()) == set(range(H - S + 1)) == set(p["left"].tolist())
    out = A.weak_augment(x, torch.Generator().manual_seed(3), (0, 0, 0), (1, 1, 1), crop=S)
    assert out.shape == (B, 3, S, S)
    for b in range(0, B, 37):
        ref = F2.crop(x[b], int(p["top"][b]), int(p["left"][b]), S, S)
        if p["flip"][b]:
            ref = F2.horizontal_flip(ref)
        assert torch.equal(out[b], ref.float() / 255)
    # crop None is the CIFAR path, unchanged: RandomCrop(H, padding 4), offsets 0 … 8
    q = A.sample_weak_params(B, torch.Generator().manual_seed(3))
    assert set(q["top"].tolist()) == set(range(9))
    assert A.weak_augment(x, torch.Generator().manual_seed(3), (0, 0, 0), (1, 1, 1)).shape == (B, 3, H, H)


def test_strong_views_crop_to_size_with_the_scale():
    """RandomResizedCrop(S, scale 0.2–1): every box covers ≥ 0.2 of the stored image
    (up to the rounding of w and h), and the output is S×S."""
    B, H, S = 2000, 40, 32
    boxes = A.sample_resized_crop_params(B, H, H, torch.Generator().manual_seed(4), scale=(0.2, 1.0))
    frac = (boxes[:, 2] * boxes[:, 3]).double() / (H * H)
    assert frac.min() > 0.17 and frac.min() < 0.25 and frac.max() <= 1.0
    base = A.sample_resized_crop_params(B, H, H, torch.Generator().manual_seed(4))   # 0.08–1
    assert ((base[:, 2] * base[:, 3]).double() / (H * H)).min() < 0.12
    x = torch.randint(0, 256, (8, 3, H, H), dtype=torch.uint8)
    out = A.strong_augment(x, torch.Generator().manual_seed(5), (0, 0, 0), (1, 1, 1), S, scale=(0.2, 1.0))
    assert out.shape == (8, 3, S, S)


def _train_data(x, crop=None, crop_scale=None):
    from selcl.train import TrainData
    n = x.shape[0]
    arrays = {"x_train": x, "y_train": np.zeros(n, np.int64), "x_test": x[:4], "y_test": np.zeros(4, np.int64),
              "mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25)}
    if crop is not None:
        arrays["crop"] = crop
    if crop_scale is not None:
        arrays["crop_scale"] = crop_scale
    labels = {"noisy": np.zeros(n, np.int64), "clean": np.zeros(n, np.int64), "num_classes": 3}
    return TrainData.build(arrays, labels, torch.device("cpu"))


def test_training_views_and_eval_inputs_follow_the_crop():
    from selcl.evaluate import embed
    from selcl.train import _views
    x = np.random.default_rng(2).integers(0, 256, (16, 3, 40, 40), dtype=np.uint8)
    data = _train_data(x, crop=32, crop_scale=(0.2, 1.0))
    assert data.crop == 32 and data.crop_scale == (0.2, 1.0)
    g = torch.Generator().manual_seed(0)
    v1, v2 = _views(data.x[:8], g, data, n=2)
    assert v1.shape == v2.shape == (8, 3, 32, 32)
    assert _views(data.x[:8], g, data, strong=False).shape == (8, 3, 32, 32)
    # the strong views are exactly strong_augment(size 32, scale 0.2–1) with that generator
    same = A.strong_augment(data.x[:8].repeat(2, 1, 1, 1), torch.Generator().manual_seed(0),
                            data.mean, data.std, 32, scale=(0.2, 1.0))
    assert torch.equal(torch.cat([v1, v2]), same)
    model = build_model("small", 3, width=8, blocks=(1,)).eval()
    z, logits = embed(model, data.x, data.mean, data.std, crop=32)
    z_ref, _ = embed(model, data.x[:, :, 4:36, 4:36].contiguous(), data.mean, data.std)
    assert z.shape == (16, 128) and torch.allclose(z, z_ref, atol=1e-6)
    # CIFAR (no crop): bit-identical to the plain calls, whole image
    plain = _train_data(x)
    assert plain.crop is None and plain.crop_scale == (0.08, 1.0)
    a = _views(plain.x[:8], torch.Generator().manual_seed(1), plain)
    b = A.strong_augment(plain.x[:8], torch.Generator().manual_seed(1), plain.mean, plain.std)
    assert a.shape == (8, 3, 40, 40) and torch.equal(a, b)
    a = _views(plain.x[:8], torch.Generator().manual_seed(1), plain, strong=False)
    b = A.weak_augment(plain.x[:8], torch.Generator().manual_seed(1), plain.mean, plain.std, 4)
    assert torch.equal(a, b)


def test_data_npz_records_the_crop_only_when_set(tmp_path):
    x = np.zeros((2, 3, 8, 8), np.uint8)
    d = ImageData(x, np.zeros(2, np.int64), x, np.zeros(2, np.int64), ["a"], (0.5,) * 3, (0.2,) * 3)
    save_arrays(d, tmp_path / "plain.npz")
    with np.load(tmp_path / "plain.npz") as z:
        assert "crop" not in z.files and "crop_scale" not in z.files     # CIFAR's file unchanged
    back = load_arrays(tmp_path / "plain.npz")
    assert back.crop is None and back.crop_scale == (0.08, 1.0)
    d.crop, d.crop_scale = 6, (0.2, 1.0)
    save_arrays(d, tmp_path / "crop.npz")
    back = load_arrays(tmp_path / "crop.npz")
    assert back.crop == 6 and back.crop_scale == (0.2, 1.0)


def test_crop_larger_than_the_stored_images_stops_the_data_stage(tmp_path, monkeypatch, capsys):
    from conftest import tiny_params_dict
    write_params(tmp_path, tiny_params_dict(data={"crop": 17}))      # digits: 16×16
    with pytest.raises(SystemExit) as e:
        run_stage_inprocess(monkeypatch, tmp_path, "data")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "data.crop = 17" in err and "larger than" in err


# --------------------------------------------------------------------- end to end

def test_preset_runs_end_to_end_on_a_tiny_folder(tmp_path, monkeypatch, tiny_folder, tiny_val):
    """data → … → evaluate with the preset, images stored at 40 px and 32 px crops: every
    input the network ever sees (warm-up and pre-training views, L_CLS views, selection
    and k-NN embeddings, fine-tuning views, bootstrapping targets, test images) is 32×32;
    bootstrapping starts after `bootstrap_start` epochs."""
    import selcl.losses
    import selcl.train
    p = preset()
    p["data"].update(path=str(tiny_folder), extra_test_path=str(tiny_val), image_size=40, crop=32)   # 256 / 224
    p["warmup"].update(epochs=1, queue_size=32)
    p["pretrain"].update(epochs=3, batch_size=8, lr_warmup_epochs=1, lr_decay_epochs=[2], k=5,
                         queue_per_class=3, memory_start_epoch=2)   # memory 18 ≥ 2 × batch
    p["finetune"].update(epochs=2, batch_size=8, bootstrap_start=1, eval_last=1)
    p["evaluate"].update(k=5, tsne_points=0)
    params = repo_params()
    params = {"run": ["webvision50"], "suites": {"webvision": ["webvision50"]},
              "defaults": params["defaults"], "settings": {"webvision50": p}}
    write_params(tmp_path, params)
    monkeypatch.setenv("SELCL_ALLOW_CPU", "1")                       # resnet18: the paper's network

    seen, built = set(), []                                          # (H, W) of every forward
    real_build = selcl.train.build_model

    def spying_build(*args, **kwargs):
        model = real_build(*args, **kwargs)
        built.append(model)
        model.register_forward_pre_hook(lambda mod, inp: seen.add(tuple(inp[0].shape[-2:])))
        return model
    monkeypatch.setattr(selcl.train, "build_model", spying_build)
    calls, now = {"mixup_cross_entropy": 0, "mixup_bootstrap_loss": 0}, {"stage": None}
    for name in calls:                                   # count the fine-tuning stage's losses
        real = getattr(selcl.losses, name)

        def spy(*a, _real=real, _name=name, **kw):
            calls[_name] += now["stage"] == "finetune"
            return _real(*a, **kw)
        monkeypatch.setattr(selcl.losses, name, spy)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for stage in ("data", "noise", "warmup", "pretrain", "finetune", "evaluate"):
            now["stage"] = stage
            run_stage_inprocess(monkeypatch, tmp_path, stage, setting="webvision50")
    finally:
        torch.set_num_threads(threads)
    run = tmp_path / "runs" / "webvision50"
    meta = json.loads((run / "data.json").read_text())
    assert meta["image_shape"] == [3, 40, 40] and meta["num_classes"] == 3
    assert meta["crop"] == 32 and meta["crop_scale"] == [0.2, 1.0]
    assert seen == {(32, 32)}
    # every network of every stage: BatchNorm over the four replicas' shards (batch 8: of 2)
    assert built and {m.replicas for net in built for m in net.modules() if hasattr(m, "replicas")} == {4}
    # fine-tuning: epoch 1 plain mixup CE, epoch 2 (> bootstrap_start = 1) bootstrapping
    assert calls["mixup_cross_entropy"] > 0
    assert calls["mixup_bootstrap_loss"] == calls["mixup_cross_entropy"]
    ft = json.loads((run / "finetune.json").read_text())
    assert 0.0 <= ft["test_acc_last"] <= 100.0
    # Table 5: top-1 and top-5 on the test set and on the second one (ILSVRC12 val's role)
    assert meta["n_test2"] == 4
    for key in ("test_top5_last", "test_top5_at_best", "test2_acc_last", "test2_acc_best", "test2_top5_last"):
        assert 0.0 <= ft[key] <= 100.0, key
    assert ft["test_top5_last"] == 100.0 and ft["test2_top5_last"] == 100.0     # 3 classes: top-5 = all
    header = (run / "finetune_history.csv").read_text().splitlines()[0].split(",")
    assert {"test_acc", "test_top5", "test2_acc", "test2_top5"} <= set(header)
    assert len((run / "pretrain_history.csv").read_text().splitlines()) == 3
    assert "knn_clean_top1" in json.loads((run / "evaluate.json").read_text())
