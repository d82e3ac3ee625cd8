"""Does one last step of 8 images move BatchNorm's running statistics enough to wreck
(Run from the repository root with data/cifar10-jpeg.tar.gz in place; bn_probe.py takes the
warm-up checkpoint that bench/gpu_real.py leaves in its --workdir, selcl/warmup.pt.)
eval-mode features? The warm-up network of the CPU replay of run 4, evaluated as the
per-epoch k-NN is (eval mode), before and after train-mode forwards (no gradient, no
optimiser step) as a step makes them: 5 calls (query, 2 mixed views, 2 L_CLS views)."""
import sys, copy
from pathlib import Path
ROOT = Path(__file__).resolve().parents[4]; sys.path.insert(0, str(ROOT))  # the repository
import torch
from selcl.config import load_params, resolve
from selcl.data import load_dataset
from selcl.noise import labels_from_config
from selcl.train import TrainData, make_model
from selcl.evaluate import embed, weighted_knn_accuracy, argmax_accuracy
from selcl import augment
torch.set_num_threads(2)
cfg = resolve(load_params(ROOT / "params.yaml"), "cifar10_asym40")
ds = load_dataset("imagefolder", path=str(ROOT / "data/cifar10-jpeg.tar.gz"), subset=500)
noisy, _ = labels_from_config(ds.y_train, 10, dict(cfg["noise"], asym_map="cifar10"), "imagefolder")
dev = torch.device("cpu")
data = TrainData.build({"x_train": ds.x_train, "y_train": ds.y_train, "x_test": ds.x_test, "y_test": ds.y_test,
                        "mean": ds.mean, "std": ds.std}, {"noisy": noisy, "clean": ds.y_train, "num_classes": 10}, dev)
cfg["model"]["arch"] = "preact_resnet18"
base = make_model(cfg["model"], 10, dev)
base.load_state_dict(torch.load(sys.argv[1], map_location="cpu", weights_only=False)["model"])
def score(m, tag):
    with torch.no_grad():
        z_tr, _ = embed(m, data.x, data.mean, data.std)
        z_te, lo = embed(m, data.x_test, data.mean, data.std)
    a = weighted_knn_accuracy(z_tr, data.clean, z_te, data.y_test, 10, k=20, sigma=cfg["evaluate"]["sigma"])
    print(f"{tag}: k-NN {a['top1']:.2f} %, classifier {argmax_accuracy(lo, data.y_test):.2f} %", flush=True)
score(base, "after the warm-up (eval mode)")
g = torch.Generator().manual_seed(0)
for b in (8, 128):
    m = copy.deepcopy(base); m.train()
    with torch.no_grad():
        for call in range(5):
            idx = torch.randint(0, data.n, (b,), generator=g)
            x = augment.strong_augment(data.x[idx], g, data.mean, data.std)
            lam = 0.7; perm = torch.randperm(b, generator=g)
            m(lam * x + (1 - lam) * x[perm])
    score(m, f"then 5 train-mode calls of {b} mixed strong views")
