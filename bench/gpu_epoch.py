"""Seconds per CIFAR-10 Sel-CL pre-training epoch, eager and captured, side by side, and the
projected time of a whole setting from measured per-stage step times (issue 89).

Reads an image-folder copy of CIFAR-10 (a folder or .tar.gz with train/<class>/*.jpg and
test/<class>/*.jpg), puts it on the device as uint8 and runs a paper setting (default
cifar10_asym40: PreAct ResNet-18, batch 128, the authors' iteration) with the code of
`dvc repro`, in one process:

  1. the Uns-CL warm-up epoch (eager, as a full run's: 391 steps do not repay compiling);
  2. one pre-training epoch on the eager path (`device.eager_step` around every step);
  3. --epochs pre-training epochs from the same warm-up state on the captured path (the one
     the loops pick on CUDA: compiled graphs); its first epoch holds the compilation;
  4. --finetune-epochs Sel-CL+ epochs and --ce-epochs CE epochs (compiled), for their steps.

The setting's projection (bench/projection.py): each stage's steps in the full run times its
measured step time, plus its compilation and its fixed per-epoch costs (selection + k-NN,
test evaluation). Writes a markdown table (--out) and a JSON (--json, default
bench/results/gpu_epoch.json): device, images, eager_s, captured_s, setting_min, commit,
the stages, and on CUDA the host synchronisations per captured step (SyncCounter). --profile-steps N: torch.profiler over N captured steps (kernel time
counted once, bench/profile_steps.py). On the CPU (small, quick: --arch small --subset 20)
it runs the same code, the "captured" path being the eager one there (nothing compiles on
the CPU), so a test can check the JSON.

    python bench/gpu_epoch.py --data data/cifar10-jpeg.tar.gz --epochs 3 \\
        --out bench/results/gpu_epoch_h100.md --json bench/results/gpu_epoch.json
"""
from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from selcl import checkpoint, device as selcl_device, train  # noqa: E402
from selcl.config import load_params, resolve  # noqa: E402
from selcl.data import load_dataset  # noqa: E402
from selcl.device import compiles, describe, get_device, synchronize  # noqa: E402
from selcl.noise import labels_from_config  # noqa: E402
from selcl.train import TrainData, baseline, finetune, pretrain, steps_per_epoch, warmup  # noqa: E402
from gpu_real import shrink_to_subset  # noqa: E402  (bench/gpu_real.py)
from projection import Stage, setting_minutes, step_times, table  # noqa: E402  (bench/projection.py)
from tables import emit  # noqa: E402  (bench/tables.py)

FULL_N = 50_000
NEVER = 10 ** 12   # device.COMPILE_MIN_STEPS that no loop reaches: every step eager


class SyncCounter:
    """CUDA: the host synchronisations inside the captured Sel-CL steps after the first
    `skip` (compilation and recording done), counted with torch.cuda.set_sync_debug_mode
    ("warn": every synchronising call warns); the CPU's check is tests/test_step_graph.py.
    "warn", not "error": the measurement runs on and reports the count (0 is the aim)."""

    def __init__(self, skip: int):
        self.skip, self.calls, self.steps, self.syncs = skip, 0, 0, 0

    def install(self) -> None:
        import warnings
        real, me = train.Pretrainer.step, self

        def step(tr, *args, **kwargs):
            me.calls += 1
            if me.calls <= me.skip:
                return real(tr, *args, **kwargs)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    out = real(tr, *args, **kwargs)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            me.steps += 1
            me.syncs += sum("synchroniz" in str(w.message) for w in caught)
            return out
        train.Pretrainer.step = step


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--setting", default="cifar10_asym40")
    ap.add_argument("--epochs", type=int, default=3, help="captured pre-training epochs (≥ 2: the first compiles)")
    ap.add_argument("--finetune-epochs", type=int, default=2)
    ap.add_argument("--ce-epochs", type=int, default=2)
    ap.add_argument("--subset", type=int, default=None, help="the first N training images per class")
    ap.add_argument("--arch", default="preact_resnet18", help="'small' for a quick CPU run")
    ap.add_argument("--workdir", default="/tmp/selcl_gpu_epoch")
    ap.add_argument("--out", default=None, help="markdown table (default: stdout only)")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "gpu_epoch.json"))
    ap.add_argument("--profile-steps", type=int, default=0)
    args = ap.parse_args(argv)

    device = get_device()
    torch.backends.cudnn.benchmark = True   # fixed shapes: let cuDNN pick the fastest kernels
    cfg = resolve(load_params(ROOT / "params.yaml"), args.setting)
    ds = load_dataset("imagefolder", path=args.data, subset=args.subset)
    noisy, _ = labels_from_config(ds.y_train, len(ds.classes), dict(cfg["noise"], asym_map="cifar10"), "imagefolder")
    data = TrainData.build({"x_train": ds.x_train, "y_train": ds.y_train, "x_test": ds.x_test,
                            "y_test": ds.y_test, "mean": ds.mean, "std": ds.std},
                           {"noisy": noisy, "clean": ds.y_train, "num_classes": len(ds.classes)}, device)
    n = data.n
    if n < FULL_N:              # memory, key queue and the k's take the paper's shares of the set
        shrink_to_subset(cfg, n, len(ds.classes))
    cfg["model"]["arch"] = args.arch
    if args.arch == "small":
        cfg["model"].update(width=16, blocks=[1, 1, 1, 1])
    full = {"pretrain": cfg["pretrain"]["epochs"], "warmup": cfg["warmup"]["epochs"],
            "finetune": cfg["finetune"]["epochs"], "baseline": cfg["baseline"]["epochs"]}
    W = full["warmup"]
    for section in ("pretrain", "finetune", "baseline"):
        cfg[section]["checkpoint_every"] = 10 ** 6
    cfg["finetune"].update(epochs=args.finetune_epochs, eval_last=1)
    cfg["baseline"].update(epochs=args.ce_epochs, eval_last=1)
    B = cfg["pretrain"]["batch_size"]
    steps = steps_per_epoch(n, B, cfg["pretrain"]["drop_last"])
    full_steps = steps_per_epoch(FULL_N, B)
    work = Path(args.workdir)
    ck = lambda name: checkpoint.Checkpointer(work / f"{name}.pt", f"bench-{time.time()}", 10 ** 6)  # noqa: E731

    # 1. the warm-up epoch, eager as in a full run (device.worth_compiling)
    synchronize(device); t = time.perf_counter()
    warm = warmup(cfg, data, device, ck("warmup"))
    synchronize(device); t_warm = time.perf_counter() - t

    # 2. one eager pre-training epoch; 3. the captured epochs from the same warm-up state
    selcl_device.COMPILE_MIN_STEPS = NEVER
    eager = pretrain(dict(cfg, pretrain=dict(cfg["pretrain"], epochs=W + 1)), data, copy.deepcopy(warm),
                     device, ck("pretrain_eager"))
    selcl_device.COMPILE_MIN_STEPS = 0
    if args.profile_steps:
        from profile_steps import StepProfiler  # bench/profile_steps.py: kernel time counted once
        prof = Path(args.out).with_name(Path(args.out).stem + "_profile.txt") if args.out else work / "profile.txt"
        StepProfiler(args.profile_steps, steps + min(20, steps // 4), prof, device).install()
    syncs = SyncCounter(steps) if device.type == "cuda" else None     # from the second captured epoch
    if syncs:
        syncs.install()
    pre = pretrain(dict(cfg, pretrain=dict(cfg["pretrain"], epochs=W + args.epochs)), data, warm, device,
                   ck("pretrain"))
    # 4. fine-tuning on this run's T and the CE baseline, compiled as in a full run
    ft = finetune(cfg, data, pre, device, ck("finetune"))
    ce = baseline(cfg, data, device, ck("baseline"))

    eager_step, _, _ = step_times(eager["timing"])
    pre_step, pre_compile, pre_fixed = step_times(pre["timing"])
    ft_step, ft_compile, ft_eval = step_times(ft["timing"])
    ce_step, ce_compile, ce_eval = step_times(ce["timing"])
    scale = FULL_N / n          # a subset's per-epoch selection + k-NN, scaled to the full set
    full_T = round(ft["n_train"] * scale)
    stages = [
        Stage("Uns-CL warm-up (eager)", W * full_steps, t_warm / (W * steps)),
        Stage("Sel-CL pre-training", (full["pretrain"] - W) * full_steps, pre_step, full["pretrain"] - W,
              pre_fixed * scale, pre_compile),
        Stage("Sel-CL+ fine-tuning", full["finetune"] * steps_per_epoch(full_T, cfg["finetune"]["batch_size"]),
              ft_step, full["finetune"], ft_eval, ft_compile,
              note=f"on this run's |T|, {full_T:,} images; bootstrapping's extra forward not timed"),
        Stage("CE baseline", full["baseline"] * steps_per_epoch(FULL_N, cfg["baseline"]["batch_size"]), ce_step,
              full["baseline"], ce_eval, ce_compile)]
    info = describe(device)
    result = {"device": info.get("gpu", info["device"]), "images": n,
              "eager_s": eager_step * full_steps, "captured_s": pre_step * full_steps,
              "setting_min": setting_minutes(stages), "commit": commit(),
              "captured": compiles(device),      # False: nothing compiles here (the CPU), both paths eager
              "measured_epoch_s": {"eager": eager["timing"][0]["train_s"],
                                   "captured": [r["train_s"] for r in pre["timing"]]},
              "select_knn_s": pre_fixed, "setting": args.setting, "torch": info["torch"],
              "host_syncs_per_step": syncs.syncs / max(syncs.steps, 1) if syncs else None,
              "stages": [{"name": s.name, "steps": s.steps, "step_s": s.step_s, "epochs": s.epochs,
                          "epoch_s": s.epoch_s, "compile_s": s.compile_s, "min": s.seconds / 60} for s in stages]}
    lines = [f"# {args.setting} on {result['device']} (torch {info['torch']}, CUDA {info['cuda']}), "
             f"{n:,} training images, commit {result['commit']}", "",
             "| pre-training epoch (391 steps of the full set; training only) | eager | captured |",
             "|---|---|---|",
             f"| seconds, from the median step | {result['eager_s']:.2f} | {result['captured_s']:.2f} |",
             f"| step | {1000 * eager_step:.1f} ms | {1000 * pre_step:.1f} ms |",
             f"| selection + k-NN per epoch ({n:,} images) | | {pre_fixed:.3f} s |",
             f"| host synchronisations per captured step (CUDA) | | {result['host_syncs_per_step']} |", "",
             f"Projected whole setting ({full['pretrain']} Sel-CL epochs, warm-up included, + "
             f"{full['finetune']} fine-tuning; CE {full['baseline']}), compilation included:", "",
             *table(stages), ""]
    emit(lines, args.out)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"eager {result['eager_s']:.2f} s / captured {result['captured_s']:.2f} s per pre-training epoch; "
          f"setting {result['setting_min']:.1f} min → {args.json}")
    return result


if __name__ == "__main__":
    main()
