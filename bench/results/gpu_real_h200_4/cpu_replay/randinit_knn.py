"""k-NN (clean labels) of a freshly initialised PreAct ResNet-18 on gpu_real.py's --subset 500 split."""
# (Run from the repository root with data/cifar10-jpeg.tar.gz in place.)
import sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[4]; sys.path.insert(0, str(ROOT))  # the repository
import numpy as np, torch
from selcl.config import load_params, resolve
from selcl.data import load_dataset
from selcl.noise import labels_from_config
from selcl.train import TrainData, make_model
from selcl.evaluate import embed, weighted_knn_accuracy, argmax_accuracy
torch.set_num_threads(2)
cfg = resolve(load_params(ROOT / "params.yaml"), "cifar10_asym40")
ds = load_dataset("imagefolder", path=str(ROOT / "data/cifar10-jpeg.tar.gz"), subset=500)
noisy, _ = labels_from_config(ds.y_train, len(ds.classes), dict(cfg["noise"], asym_map="cifar10"), "imagefolder")
dev = torch.device("cpu")
data = TrainData.build({"x_train": ds.x_train, "y_train": ds.y_train, "x_test": ds.x_test, "y_test": ds.y_test,
                        "mean": ds.mean, "std": ds.std}, {"noisy": noisy, "clean": ds.y_train, "num_classes": 10}, dev)
cfg["model"]["arch"] = "preact_resnet18"
k = max(5, round(cfg["evaluate"]["k"] * len(ds.y_train) / 50_000))
for seed in (int(cfg["model"]["seed"]),):   # make_model seeds itself from model.seed
    torch.manual_seed(seed)
    model = make_model(cfg["model"], 10, dev)
    with torch.no_grad():
        z_tr, _ = embed(model, data.x, data.mean, data.std)
        z_te, lo = embed(model, data.x_test, data.mean, data.std)
    acc = weighted_knn_accuracy(z_tr, data.clean, z_te, data.y_test, 10, k=k, sigma=cfg["evaluate"]["sigma"])
    print(f"seed {seed}: random-init k-NN top-1 {acc['top1']:.2f} % (k {k}), classifier {argmax_accuracy(lo, data.y_test):.2f} %", flush=True)
