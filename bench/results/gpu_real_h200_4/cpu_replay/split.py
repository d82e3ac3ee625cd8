"""The data of bench/gpu_real.py's `--subset 500` split (5,000 CIFAR-10 training images, the
paper's asymmetric flips at 40 %, 10,000 test images) and the configuration it trains, for
the probe scripts of this folder. Run them from the repository root with
data/cifar10-jpeg.tar.gz in place."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]   # the repository
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

from selcl.config import load_params, resolve  # noqa: E402
from selcl.data import load_dataset  # noqa: E402
from selcl.noise import labels_from_config  # noqa: E402
from selcl.train import TrainData, knn_report  # noqa: E402
from gpu_real import shrink_to_subset  # noqa: E402  (bench/gpu_real.py)

cfg = resolve(load_params(ROOT / "params.yaml"), "cifar10_asym40")
ds = load_dataset("imagefolder", path=str(ROOT / "data/cifar10-jpeg.tar.gz"), subset=500)
C = len(ds.classes)
noisy, _ = labels_from_config(ds.y_train, C, dict(cfg["noise"], asym_map="cifar10"), "imagefolder")
dev = torch.device("cpu")
data = TrainData.build({"x_train": ds.x_train, "y_train": ds.y_train, "x_test": ds.x_test, "y_test": ds.y_test,
                        "mean": ds.mean, "std": ds.std}, {"noisy": noisy, "clean": ds.y_train, "num_classes": C}, dev)
cfg["model"]["arch"] = "preact_resnet18"
shrink_to_subset(cfg, data.n, C)     # gpu_real.py --subset: memory, queue, k (selection 25, k-NN 20), drop_last


def score(state: dict, tag: str, indent: str = "") -> None:
    """Print the eval-mode k-NN of `state`'s encoder (clean labels) and its classifier's test accuracy."""
    out, _ = knn_report(state, cfg, data, dev)
    print(f"{indent}{tag}: k-NN {out['knn_clean_top1']:.2f} %, classifier {out['selcl_test_top1']:.2f} %", flush=True)
