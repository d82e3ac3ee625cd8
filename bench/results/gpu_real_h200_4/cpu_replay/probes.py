"""Eval-mode k-NN of the paper's network on bench/gpu_real.py's `--subset 500` split: freshly
initialised, after the CPU replay's warm-up, and after that warm-up network has made five
train-mode calls (a step's: query, two mixed views, two L_CLS views; no gradient, no
optimiser step) on 8 mixed strong views (an epoch's last batch here: 5,000 = 39 × 128 + 8)
or on 128. Does the last batch spoil BatchNorm's running statistics?

    python bench/results/gpu_real_h200_4/cpu_replay/probes.py /tmp/r4/w/selcl/warmup.pt

(from the repository root, data/cifar10-jpeg.tar.gz in place; the checkpoint is the one
bench/gpu_real.py leaves in its --workdir)."""
import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]   # the repository
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from selcl import augment  # noqa: E402
from selcl.config import load_params, resolve  # noqa: E402
from selcl.data import load_dataset  # noqa: E402
from selcl.noise import labels_from_config  # noqa: E402
from selcl.train import TrainData, knn_report, make_model  # noqa: E402

cfg = resolve(load_params(ROOT / "params.yaml"), "cifar10_asym40")
ds = load_dataset("imagefolder", path=str(ROOT / "data/cifar10-jpeg.tar.gz"), subset=500)
C = len(ds.classes)
noisy, _ = labels_from_config(ds.y_train, C, dict(cfg["noise"], asym_map="cifar10"), "imagefolder")
dev = torch.device("cpu")
data = TrainData.build({"x_train": ds.x_train, "y_train": ds.y_train, "x_test": ds.x_test, "y_test": ds.y_test,
                        "mean": ds.mean, "std": ds.std}, {"noisy": noisy, "clean": ds.y_train, "num_classes": C}, dev)
cfg["model"]["arch"] = "preact_resnet18"
cfg["evaluate"]["k"] = max(5, round(cfg["evaluate"]["k"] * data.n / 50_000))   # gpu_real.py's subset k (20)


def score(state: dict, tag: str) -> None:
    out, _ = knn_report(state, cfg, data, dev)
    print(f"{tag}: k-NN {out['knn_clean_top1']:.2f} %, classifier {out['selcl_test_top1']:.2f} %", flush=True)


score(make_model(cfg["model"], C, dev).state_dict(), "freshly initialised (model.seed)")
warm = torch.load(sys.argv[1], map_location="cpu", weights_only=False)["model"]
score(warm, "after the warm-up")
g = torch.Generator().manual_seed(0)
for b in (8, 128):
    m = make_model(cfg["model"], C, dev)
    m.load_state_dict(copy.deepcopy(warm))
    m.train()
    with torch.no_grad():
        for _ in range(5):
            idx = torch.randint(0, data.n, (b,), generator=g)
            x = augment.strong_augment(data.x[idx], g, data.mean, data.std)
            lam, perm = 0.7, torch.randperm(b, generator=g)
            m(lam * x + (1 - lam) * x[perm])
    score(m.state_dict(), f"then 5 train-mode calls of {b} mixed strong views")
