"""Sel-CL+ against cross-entropy on real CIFAR-10 with a shortened schedule, on one GPU.

The full training set of an imagefolder copy of CIFAR-10 (a folder or .tar.gz with
train/<class>/*.jpg, test/<class>/*.jpg), the paper's network (PreAct ResNet-18) and the
paper's setting cifar10_asym40 (α = 0.5, β = 0.25, K = 250), with the schedules
shortened in proportion to the number of epochs:

  Sel-CL   --epochs in all (warm-up included); lr ramp over the first 2 epochs, ×0.1
           after 50 % and 80 % of them (the paper: 5 / 125 / 200 of 250)
  Sel-CL+  --finetune-epochs, bootstrapping after 3/7 of them (the paper: 30 of 70)
  CE       --ce-epochs (default: the same total as Sel-CL + Sel-CL+), lr 0.02,
           ×0.1 after 50 % and 75 % of them (the paper suite's baseline until 2026-12-05,
           100 / 150 of 200; kept so that runs compare with the recorded ones; the
           suite's baseline is now DivideMix's 300 epochs, ×0.1 after 150)

Run the two parts in two processes (they share the GPU) and read the markdown each writes:

    python bench/gpu_real.py --data c10.tar.gz --part selcl --out selcl.md &
    python bench/gpu_real.py --data c10.tar.gz --part ce --out ce.md
"""
from __future__ import annotations

import argparse
import csv
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
from selcl.noise import labels_from_config  # noqa: E402
from selcl.train import TrainData, baseline, finetune, pretrain, steps_per_epoch, summarise, warmup  # noqa: E402
from profile_steps import StepProfiler  # noqa: E402  (bench/profile_steps.py)
from tables import emit  # noqa: E402  (bench/tables.py)


def write_csv(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def shrink_to_subset(cfg: dict, n: int, num_classes: int) -> None:
    """A training subset of `n` images: the memory, the MoCo key queue and the k of the
    selection and of the k-NN evaluation take the paper's shares of the training set
    (20,000, 10,000, 250 and 200 of 50,000), and pre-training drops its last batch."""
    B = cfg["pretrain"]["batch_size"]       # the memory holds at least one step's 2B
    cfg["pretrain"]["queue_per_class"] = max(-(-B // num_classes),
                                             round(cfg["pretrain"]["queue_per_class"] * n / 50_000))
    cfg["warmup"]["queue_size"] = max(B, round(cfg["warmup"]["queue_size"] * n / 50_000))
    for section in ("pretrain", "evaluate"):
        cfg[section]["k"] = max(5, round(cfg[section]["k"] * n / 50_000))
    # A subset's pre-training drops its last, smaller batch. 5,000 = 39 × 128 + 8, and
    # that one step of 8 moved the paper's network 60 times as far as a step of 128 and
    # set off the collapse of the CPU replay of H200 run 4 at epoch 6
    # (results/gpu_real_h200_4/cpu_replay). The full set keeps the authors' last batch
    # (80 of 128), as every setting of params.yaml does.
    cfg["pretrain"]["drop_last"] = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--setting", default="cifar10_asym40")
    ap.add_argument("--part", choices=("selcl", "ce"), required=True)
    ap.add_argument("--epochs", type=int, default=25, help="Sel-CL epochs in all, warm-up included")
    ap.add_argument("--finetune-epochs", type=int, default=10)
    ap.add_argument("--ce-epochs", type=int, default=None)
    ap.add_argument("--subset", type=int, default=None,
                    help="the first N training images per class; the memory, the MoCo key queue and "
                         "the k of the selection and of the k-NN evaluation shrink with the training "
                         "set (the paper's 20,000, 10,000, 250 and 200 of 50,000)")
    ap.add_argument("--arch", default="preact_resnet18", help="'small' for a quick CPU smoke run")
    ap.add_argument("--workdir", default="/tmp/selcl_gpu_real")
    ap.add_argument("--out", required=True, help="markdown table; CSV histories go beside it")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="torch.profiler over this many Sel-CL steps from the 21st (at most) of the "
                         "second pre-training epoch (bench/profile_steps.py; <out>_profile.txt)")
    args = ap.parse_args()

    device = get_device()
    torch.backends.cudnn.benchmark = True
    cfg = resolve(load_params(ROOT / "params.yaml"), args.setting)
    ds = load_dataset("imagefolder", path=args.data, subset=args.subset)
    nc = cfg["noise"]
    # an image folder of CIFAR-10: the paper's CIFAR-10 flips, the image folder's generator
    noisy, _ = labels_from_config(ds.y_train, len(ds.classes), dict(nc, asym_map="cifar10"), "imagefolder")
    realised = float(np.mean(noisy != ds.y_train))
    data = TrainData.build({"x_train": ds.x_train, "y_train": ds.y_train, "x_test": ds.x_test,
                            "y_test": ds.y_test, "mean": ds.mean, "std": ds.std},
                           {"noisy": noisy, "clean": ds.y_train, "num_classes": len(ds.classes)}, device)
    cfg["model"]["arch"] = args.arch
    if args.arch == "small":
        cfg["model"].update(width=16, blocks=[1, 1, 1, 1])
    n = len(ds.y_train)
    if args.subset:
        shrink_to_subset(cfg, n, len(ds.classes))
        # every loop compiled, however few its steps: its step times project the full
        # run's, whose loops compile (device.worth_compiling)
        selcl_device.COMPILE_MIN_STEPS = 0
    steps = steps_per_epoch(n, cfg["pretrain"]["batch_size"], cfg["pretrain"]["drop_last"])   # Sel-CL steps per epoch
    P, F = args.epochs, args.finetune_epochs
    E = args.ce_epochs or P + F
    cfg["pretrain"].update(epochs=P, lr_warmup_epochs=min(2, P - 1),
                           lr_decay_epochs=[round(0.5 * P), round(0.8 * P)], checkpoint_every=10_000)
    cfg["finetune"].update(epochs=F, bootstrap_start=round(F * 30 / 70), eval_last=min(3, F),
                           checkpoint_every=10_000)
    cfg["baseline"].update(epochs=E, lr_decay_epochs=[round(0.5 * E), round(0.75 * E)], eval_last=min(3, E),
                           checkpoint_every=10_000)
    work = Path(args.workdir) / args.part
    ck = lambda name: checkpoint.Checkpointer(work / f"{name}.pt", f"bench-{time.time()}", 10_000)  # noqa: E731
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    info = describe(device)
    head = [f"# {args.setting} on {info.get('gpu', info['device'])} (torch {info['torch']}), "
            f"{n} training images, realised noise {realised:.3f}, memory {cfg['pretrain']['queue_per_class']} "
            f"per class, MoCo queue {cfg['warmup']['queue_size']}, K {cfg['pretrain']['k']}, "
            f"k-NN eval k {cfg['evaluate']['k']}", ""]
    if args.profile_steps and args.part == "selcl":
        StepProfiler(args.profile_steps, steps + min(20, steps // 4),
                     out.with_name(out.stem + "_profile.txt"), device).install()
    t0 = time.perf_counter()
    # Histories are rewritten after every epoch, so a run stopped at the GPU's time limit
    # still leaves what it measured.
    # t_s: seconds since the start of this part when the epoch's row was written.
    def live(path: Path):
        stamps: list[float] = []

        def write(history: list) -> None:
            stamps.append(time.perf_counter() - t0)
            # rows restored from a checkpoint were written before this process: no stamp
            ts = [None] * (len(history) - len(stamps)) + stamps[-len(history):]
            write_csv(path, [{**row, "t_s": t} for row, t in zip(history, ts)])
        return write
    if args.part == "ce":
        hist = baseline(cfg, data, device, ck("baseline"), on_epoch=live(out.with_suffix(".csv")))["history"]
        s = summarise(hist, cfg["baseline"]["eval_last"])
        emit(head + [f"CE baseline, {E} epochs (lr 0.02, ×0.1 after {cfg['baseline']['lr_decay_epochs']}), "
                     f"{time.perf_counter() - t0:.0f} s: best {s['test_acc_best']:.2f} %, "
                     f"final {s['test_acc_last']:.2f} %, mean of the last {cfg['baseline']['eval_last']} "
                     f"{s['test_acc_mean_last']:.2f} %."], out)
        return
    synchronize(device)
    warm = warmup(cfg, data, device, ck("warmup"))
    synchronize(device)
    t_warm = time.perf_counter() - t0
    pre = pretrain(cfg, data, warm, device, ck("pretrain"), on_epoch=live(out.with_name(out.stem + "_pretrain.csv")))
    write_csv(out.with_name(out.stem + "_timing.csv"), pre["timing"])
    train_s = [r["train_s"] for r in pre["timing"]]
    steady = float(np.median(train_s[1:])) if len(train_s) > 1 else train_s[0]
    other = float(np.median([r["select_s"] + r["knn_s"] for r in pre["timing"]]))
    # A subset's epochs are shorter; the full run is projected from the step (391 steps and
    # 50,000 images per epoch), selection and fine-tuning scaled by the images; the warm-up
    # epoch as measured (mostly compilation).
    full = 50_000 / n
    full_steps = steps_per_epoch(50_000, cfg["pretrain"]["batch_size"])
    last = pre["history"][-1]
    pre_rows = [
        "| what | value |", "|---|---|",
        f"| Uns-CL warm-up epoch (incl. compilation) | {t_warm:.1f} s |",
        f"| pre-training epoch, training only: first / median of the rest | {train_s[0]:.1f} / {steady:.2f} s |",
        f"| pre-training step ({steps} per epoch, median epoch / steps) | {1000 * steady / steps:.1f} ms |",
        f"| selection + k-NN eval per epoch (median) | {other:.2f} s |"]
    sel_rows = [
        f"| after {P} epochs: |T|, precision / recall of T | {int(last['n_selected'])}, "
        f"{last['precision_T']:.3f} / {last['recall_T']:.3f} |",
        f"| precision of G | {last.get('precision_G', float('nan')):.3f} |",
        f"| weighted k-NN top-1 (clean labels) | {last['knn_top1']:.2f} % |"]
    # written now, so a lease that ends during fine-tuning still brings back the step time
    emit(head + pre_rows + sel_rows + [f"| Sel-CL+ | fine-tuning {F} epochs: not finished |"], out)
    t1 = time.perf_counter()
    ft = finetune(cfg, data, pre, device, ck("finetune"), on_epoch=live(out.with_name(out.stem + "_finetune.csv")))
    t_ft = (time.perf_counter() - t1) / F
    s = summarise(ft["history"], cfg["finetune"]["eval_last"])
    projected = (t_warm + 249 * (steady * full_steps / steps + other * full) + 70 * t_ft * full) / 60
    emit(head + pre_rows + [
        f"| fine-tuning epoch (on T, {ft['n_train']} images) | {t_ft:.2f} s |",
        f"| projected full run (250 + 70 epochs, 50,000 images) | {projected:.1f} min |"] + sel_rows + [
        f"| Sel-CL+ after {F} fine-tuning epochs: best / final / mean last {cfg['finetune']['eval_last']} | "
        f"{s['test_acc_best']:.2f} / {s['test_acc_last']:.2f} / {s['test_acc_mean_last']:.2f} % |"], out)

if __name__ == "__main__":
    main()
