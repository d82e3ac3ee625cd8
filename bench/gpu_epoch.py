"""Time the real CIFAR-10 path: warm-up, Sel-CL pre-training epochs, selection, k-NN.

Reads an imagefolder copy of CIFAR-10 (a folder or .tar.gz with train/<class>/*.jpg),
puts it on the device as uint8, and runs the paper's cifar10_sym20 setting (PreAct
ResNet-18, batch 128, K = 250) for a few epochs with the same code as `dvc repro`.
Writes a markdown table (issue target on one H100: ≤ 8 s per pre-training epoch,
≤ 0.5 s per selection, so 250 (warm-up included) + 70 epochs run in under 45 minutes).

    python bench/gpu_epoch.py --data path/to/cifar10-jpeg.tar.gz --epochs 3 --out gpu.md
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from selcl import checkpoint, device as selcl_device  # noqa: E402
from selcl.config import load_params, resolve  # noqa: E402
from selcl.data import load_dataset  # noqa: E402
from selcl.device import describe, get_device, synchronize  # noqa: E402
from selcl.evaluate import embed, weighted_knn_accuracy  # noqa: E402
from selcl.noise import make_noisy_labels  # noqa: E402
from selcl.train import TrainData, finetune, pretrain, run_selection, warmup  # noqa: E402
from tables import emit  # noqa: E402  (bench/tables.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--finetune-epochs", type=int, default=1)
    ap.add_argument("--subset", type=int, default=None)
    ap.add_argument("--workdir", default="/tmp/selcl_gpu_bench")
    ap.add_argument("--out", default=None)
    ap.add_argument("--arch", default="preact_resnet18", help="'small' for a quick CPU smoke run")
    args = ap.parse_args()

    device = get_device()
    torch.backends.cudnn.benchmark = True   # fixed shapes: let cuDNN pick the fastest kernels
    t = time.perf_counter()
    ds = load_dataset("imagefolder", path=args.data, subset=args.subset)
    t_decode = time.perf_counter() - t
    noisy = make_noisy_labels(ds.y_train, len(ds.classes), "sym", 0.2, 42)
    arrays = {"x_train": ds.x_train, "y_train": ds.y_train, "x_test": ds.x_test, "y_test": ds.y_test,
              "mean": ds.mean, "std": ds.std}
    labels = {"noisy": noisy, "clean": ds.y_train, "num_classes": len(ds.classes)}
    data = TrainData.build(arrays, labels, device)

    cfg = resolve(load_params(ROOT / "params.yaml"), "cifar10_sym20")
    cfg["pretrain"]["epochs"] = cfg["warmup"]["epochs"] + args.epochs   # epochs in all (SPEC §10.3)
    cfg["model"]["arch"] = args.arch
    # a few epochs, compiled as the full run's 249 (device.worth_compiling would run them
    # eagerly): the table projects the full run from them
    selcl_device.COMPILE_MIN_STEPS = 0
    if args.arch == "small":
        cfg["model"].update(width=16, blocks=[1, 1, 1, 1])
    cfg["finetune"]["epochs"] = args.finetune_epochs
    work = Path(args.workdir)
    ck = lambda name: checkpoint.Checkpointer(work / f"{name}.pt", f"bench-{time.time()}", 10_000)  # noqa: E731

    synchronize(device); t = time.perf_counter()
    warm = warmup(cfg, data, device, ck("warmup"))
    synchronize(device); t_warm = time.perf_counter() - t

    t = time.perf_counter()
    pre = pretrain(cfg, data, warm, device, ck("pretrain"))
    synchronize(device); t_pre = time.perf_counter() - t
    timing = pre["timing"]

    # selection and k-NN on their own, repeated, on the final encoder
    from selcl.train import make_model
    model = make_model(cfg["model"], data.num_classes, device)
    model.load_state_dict(pre["model"])
    z, _ = embed(model, data.x, data.mean, data.std)
    z_te, _ = embed(model, data.x_test, data.mean, data.std)
    sel_times, knn_times, embed_times = [], [], []
    for rep in range(3):
        synchronize(device); t = time.perf_counter()
        z, _ = embed(model, data.x, data.mean, data.std)
        synchronize(device); embed_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        sel = run_selection(model, data, cfg["pretrain"], epoch=rep, z=z)
        synchronize(device); sel_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        knn = weighted_knn_accuracy(z, data.clean, z_te, data.y_test, data.num_classes, k=200, sigma=0.1)
        synchronize(device); knn_times.append(time.perf_counter() - t)

    t = time.perf_counter()
    ft = finetune(cfg, data, pre, device, ck("finetune"))
    synchronize(device); t_ft = (time.perf_counter() - t) / args.finetune_epochs

    info = describe(device)
    train_s = [r["train_s"] for r in timing]
    steady = float(np.median(train_s[1:])) if len(train_s) > 1 else train_s[0]
    epoch_total = steady + float(np.median(sel_times)) + float(np.median(embed_times))
    full_run_min = (t_warm + 249 * epoch_total + 70 * t_ft) / 60      # 1 + 249 = 250 in all
    last = pre["history"][-1]
    lines = [
        f"# CIFAR-10 on {info.get('gpu', info['device'])} (torch {info['torch']}, CUDA {info['cuda']}, "
        f"faiss {info['faiss']})", "",
        f"{len(ds.y_train)} training images ({args.data}), sym 20 % noise, PreAct ResNet-18, batch 128, K = 250.",
        "", "| what | seconds | target |", "|---|---|---|",
        f"| decode imagefolder archive | {t_decode:.1f} | |",
        f"| Uns-CL warm-up epoch | {t_warm:.2f} | |",
        *[f"| pre-training epoch {r['epoch']} (training only) | {r['train_s']:.2f} | ≤ 8 |" for r in timing],
        f"| embed train set (un-augmented) | {np.median(embed_times):.3f} | |",
        f"| selection (k-NN + §5), median of 3 | {np.median(sel_times):.3f} | ≤ 0.5 |",
        f"| weighted k-NN eval (50k → 10k), median of 3 | {np.median(knn_times):.3f} | |",
        f"| fine-tuning epoch | {t_ft:.2f} | |",
        f"| **projected full run (1 + 249 + 70 epochs)** | **{full_run_min:.1f} min** | ≤ 45 min |", "",
        f"After {args.epochs} pre-training epochs: |T| = {int(last.get('n_selected', 0))}, precision of T = "
        f"{last.get('precision_T', float('nan')):.3f}, weighted k-NN top-1 = {knn['top1']:.2f} %; "
        f"fine-tuned test accuracy after {args.finetune_epochs} epoch(s) = {ft['history'][-1]['test_acc']:.2f} %.", ""]
    emit(lines, args.out)
    print(f"total pre-training wall time {t_pre:.1f} s")


if __name__ == "__main__":
    main()
