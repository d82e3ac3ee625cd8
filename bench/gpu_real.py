"""Sel-CL+ against cross-entropy on real CIFAR-10 with a shortened schedule, on one GPU.

The full training set of an imagefolder copy of CIFAR-10 (a folder or .tar.gz with
train/<class>/*.jpg, test/<class>/*.jpg), the paper's network (PreAct ResNet-18) and the
paper's setting cifar10_asym40 (α = 0.5, β = 0.25, K = 250), with the schedules
shortened:

  Sel-CL   --epochs in all (warm-up included); the lr ramp over the authors' number of
           steps (5 epochs of 391: 1,955 steps, however few images), ×0.1 after 50 % and
           80 % of the epochs (the paper: 125 / 200 of 250)
  Sel-CL+  --finetune-epochs, bootstrapping after the steps the authors' run takes before
           it (30 epochs of the full set's T: |T|·50,000/n images an epoch), so a short run
           may never reach it
  CE       --ce-epochs (default: the same total as Sel-CL + Sel-CL+), lr 0.02,
           ×0.1 after 50 % and 75 % of them (the paper suite's baseline until 2026-12-05,
           100 / 150 of 200; kept so that runs compare with the recorded ones; the
           suite's baseline is now DivideMix's 300 epochs, ×0.1 after 150)

Counted in epochs instead, 5,000 images had an lr ramp of 78 steps and bootstrapping after
84 fine-tuning steps (H200 run 4, whose encoder learned nothing). The full run's time is
projected from the measured step time of each stage (bench/projection.py).

Run the two parts in two processes (they share the GPU) and read the markdown each writes:

    python bench/gpu_real.py --data c10.tar.gz --part selcl --out selcl.md &
    python bench/gpu_real.py --data c10.tar.gz --part ce --out ce.md
"""
from __future__ import annotations

import argparse
import csv
import math
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
from projection import Stage, step_times, setting_minutes, table  # noqa: E402  (bench/projection.py)
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
    (20,000, 10,000, 250 and 200 of 50,000). Every loop keeps its last, smaller batch, as
    the authors' loaders (drop_last False) and every setting of params.yaml do: 5,000 =
    39 × 128 + 8. (A step on that batch of 8 moved the network 60 times as far as one of
    128 at the full lr of run 4's 78-step ramp, results/gpu_real_h200_4/cpu_replay; with the
    ramp counted in the authors' 1,955 steps, 40 epochs of 40 steps stay inside it.)"""
    B = cfg["pretrain"]["batch_size"]       # the memory holds at least one step's 2B
    cfg["pretrain"]["queue_per_class"] = max(-(-B // num_classes),
                                             round(cfg["pretrain"]["queue_per_class"] * n / 50_000))
    cfg["warmup"]["queue_size"] = max(B, round(cfg["warmup"]["queue_size"] * n / 50_000))
    for section in ("pretrain", "evaluate"):
        cfg[section]["k"] = max(5, round(cfg[section]["k"] * n / 50_000))


FULL_N = 50_000   # CIFAR's training set: the authors' steps per epoch


def schedule_by_steps(cfg: dict, n: int, epochs: int) -> None:
    """Sel-CL's shortened schedule: `epochs` in all, the lr ramp over as many steps as the
    authors' full run has (lr_warmup_epochs · 391; lr_at counts W = lr_warmup_epochs · steps
    of this run's epochs, so a fraction of epochs gives those steps), ×0.1 after 50 % and
    80 % of the epochs."""
    pc = cfg["pretrain"]
    ramp = pc["lr_warmup_epochs"] * steps_per_epoch(FULL_N, pc["batch_size"])      # 1,955 on CIFAR
    pc.update(epochs=epochs, lr_warmup_epochs=ramp / steps_per_epoch(n, pc["batch_size"], pc["drop_last"]),
              lr_decay_epochs=[round(0.5 * epochs), round(0.8 * epochs)])


def bootstrap_start_by_steps(fc: dict, n_selected: int, n: int) -> int:
    """The fine-tuning epoch after which this run bootstraps: the first whose end has taken
    as many steps as the authors' run takes before it (bootstrap_start epochs over the full
    set's T, estimated as |T|·50,000/n images)."""
    if n_selected == 0:          # nothing to fine-tune on: finetune says so
        return fc["bootstrap_start"]
    full = fc["bootstrap_start"] * steps_per_epoch(round(n_selected * FULL_N / n), fc["batch_size"], fc["drop_last"])
    return math.ceil(full / steps_per_epoch(n_selected, min(fc["batch_size"], n_selected), fc["drop_last"]))


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
    full_P, full_F, warm_E = cfg["pretrain"]["epochs"], cfg["finetune"]["epochs"], cfg["warmup"]["epochs"]
    schedule_by_steps(cfg, n, P)
    cfg["pretrain"]["checkpoint_every"] = 10_000
    cfg["finetune"].update(epochs=F, eval_last=min(3, F), checkpoint_every=10_000)   # bootstrap_start: once T is known
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
    full_steps = steps_per_epoch(FULL_N, cfg["pretrain"]["batch_size"])
    last = pre["history"][-1]
    n_sel = int(pre["examples"].sum())
    cfg["finetune"]["bootstrap_start"] = bootstrap_start_by_steps(cfg["finetune"], n_sel, n)
    pre_rows = [
        "| what | value |", "|---|---|",
        f"| Uns-CL warm-up epoch (incl. compilation) | {t_warm:.1f} s |",
        f"| pre-training epoch, training only: first / median of the rest | {train_s[0]:.1f} / {steady:.2f} s |",
        f"| pre-training step ({steps} per epoch, median epoch / steps) | {1000 * steady / steps:.1f} ms |",
        f"| selection + k-NN eval per epoch (median) | {other:.2f} s |",
        f"| lr ramp / bootstrapping from (steps, as the authors' full run) | "
        f"{cfg['pretrain']['lr_warmup_epochs'] * steps:.0f} / after fine-tuning epoch "
        f"{cfg['finetune']['bootstrap_start']} |"]
    check = pre["encoder_check"]
    sel_rows = [
        f"| after {P} epochs: |T|, precision / recall of T | {n_sel}, "
        f"{last['precision_T']:.3f} / {last['recall_T']:.3f} |",
        f"| precision of G | {last.get('precision_G', float('nan')):.3f} |",
        f"| weighted k-NN top-1 (clean labels); a fresh network's | {last['knn_top1']:.2f} % ; "
        f"{check['knn_top1_init']:.2f} % |",
        f"| L_sel; if the encoder had learned nothing | {check['l_sel']:.2f} ; {check['l_sel_no_information']:.2f} |",
        f"| encoder learned anything | {'yes' if check['encoder_learned'] else '**no**: the accuracies below compare nothing'} |"]
    # written now, so a lease that ends during fine-tuning still brings back the step time
    emit(head + pre_rows + sel_rows + [f"| Sel-CL+ | fine-tuning {F} epochs: not finished |"], out)
    ft = finetune(cfg, data, pre, device, ck("finetune"), on_epoch=live(out.with_name(out.stem + "_finetune.csv")))
    write_csv(out.with_name(out.stem + "_finetune_timing.csv"), ft["timing"])
    s = summarise(ft["history"], cfg["finetune"]["eval_last"])
    # The full run from each stage's measured step time (bench/projection.py): the full
    # run's steps; compilation once; the per-epoch selection + k-NN scaled with the images
    # (linear: an underestimate for the selection's exact k-NN, O(N²)); test evaluation as is.
    pre_step, pre_compile, _ = step_times(pre["timing"])
    ft_step, ft_compile, ft_eval = step_times(ft["timing"])
    full_T = round(n_sel * FULL_N / n)
    stages = [
        Stage("Uns-CL warm-up", warm_E * full_steps, pre_step, note="at the Sel-CL step's time: an upper bound"),
        Stage("Sel-CL pre-training", (full_P - warm_E) * full_steps, pre_step, full_P - warm_E,
              other * FULL_N / n, pre_compile),
        Stage("Sel-CL+ fine-tuning", full_F * steps_per_epoch(full_T, cfg["finetune"]["batch_size"]), ft_step,
              full_F, ft_eval, ft_compile, note=f"on |T| ≈ {full_T:,}")]
    emit(head + pre_rows + [
        f"| fine-tuning step / test evaluation per epoch (on T, {ft['n_train']} images) | "
        f"{1000 * ft_step:.1f} ms / {ft_eval:.2f} s |",
        f"| projected full run ({full_P} + {full_F} epochs, 50,000 images, from step times) | "
        f"{setting_minutes(stages):.1f} min |"] + sel_rows + [
        f"| Sel-CL+ after {F} fine-tuning epochs: best / final / mean last {cfg['finetune']['eval_last']} | "
        f"{s['test_acc_best']:.2f} / {s['test_acc_last']:.2f} / {s['test_acc_mean_last']:.2f} % |", ""] + table(stages), out)


if __name__ == "__main__":
    main()
