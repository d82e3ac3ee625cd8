"""Eager against torch.compile on the CPU: a CPU preset's Sel-CL pre-training step and CE
step, each built twice on the same data and selection (once eager, as the CPU loops run,
once with `device.compiled`'s graphs forced on, Inductor's C++ backend), timed in the same
process, interleaved.

The loops compile on CUDA only (`device.compiles`). This benchmark is why: it measures
what compilation would buy the CPU presets. A shared 2-core VM drifts by tens of percent
within minutes, so the two modes are not timed in separate runs: each round times
`--steps` steps eager, then as many compiled. Compilation happens before the rounds (the
steppers fill the memory first); its time is printed.

    python bench/cpu_compile.py                          # cpu_cifar10_asym40: one call per view
    python bench/cpu_compile.py --one-call               # the views of a step in one call
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import selcl.device as device_mod  # noqa: E402
import selcl.train as train_mod  # noqa: E402
from selcl.config import load_params, resolve  # noqa: E402
from selcl.device import cpu_id, cpu_name  # noqa: E402
from step import ce_stepper, fake_data, selcl_stepper  # noqa: E402  (bench/step.py)
from step import interleaved as interleave_steps  # noqa: E402
from tables import emit  # noqa: E402  (bench/tables.py)

MODES = ("eager", "compiled")
CPU = torch.device("cpu")
_compiling = [False]


def _compiles(_device) -> bool:
    return _compiling[0]


def force_compile(on: bool) -> None:
    """Whether `device.compiled` and the step's augmentation compile from now on (the
    loops' rule, `device.compiles`, says no on the CPU). Read when a stepper is built
    (its network wrappers) and at every step (the augmentation)."""
    _compiling[0] = on
    device_mod.compiles = train_mod.compiles = _compiles


def interleaved(steps_by_mode: dict, rounds: int, steps: int) -> dict[str, list[float]]:
    """Seconds per step of each mode's step, one entry per round, every round eager first;
    one untimed step of each mode before the first round."""
    return interleave_steps(steps_by_mode, rounds, steps, CPU, warmup=1,
                            enter=lambda mode: force_compile(mode == "compiled"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", default="cpu_cifar10_asym40")
    ap.add_argument("--n", type=int, default=2000, help="training-set size (memory and T drawn from it)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5, help="steps per mode per round")
    ap.add_argument("--one-call", action="store_true",
                    help="SELCL_SPLIT_VIEWS=0: the views of a step in one call, as on CUDA")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()
    if args.one_call:
        os.environ["SELCL_SPLIT_VIEWS"] = "0"
    device, classes = CPU, 10
    cfg = resolve(load_params(ROOT / "params.yaml"), args.setting)
    size, batch_size = 32, cfg["pretrain"]["batch_size"]
    data = fake_data(args.n, classes, size, device)

    sel, ce, build_s = {}, {}, {}
    for mode in MODES:                  # the same seeds: the same batches, views and selection
        force_compile(mode == "compiled")
        gen = torch.Generator().manual_seed(0)
        batch = lambda g=gen: torch.randperm(args.n, generator=g)[:batch_size]  # noqa: E731
        t0 = time.perf_counter()
        sel[mode], tr, T_idx = selcl_stepper(cfg, data, classes, device, batch, k=cfg["pretrain"]["k"])
        ce[mode] = ce_stepper(cfg, data, classes, device, batch, torch.Generator().manual_seed(1))
        ce[mode]()                      # its first step compiles it
        build_s[mode] = time.perf_counter() - t0
    try:                                # each block sets its mode (interleaved)
        times = {"Sel-CL pre-training step": interleaved(sel, args.rounds, args.steps),
                 "plain CE step": interleaved(ce, args.rounds, args.steps)}
    finally:
        force_compile(False)

    ms = lambda ts: " / ".join(f"{t * 1e3:.0f}" for t in ts)  # noqa: E731
    views = "the views of a step in one call" if args.one_call else "one call per view (the CPU default)"
    lines = [f"# Eager against torch.compile on the CPU ({cpu_name()}; {cpu_id()}; "
             f"{torch.get_num_threads()} threads, torch {torch.__version__})", "",
             f"`python bench/cpu_compile.py --setting {args.setting} --rounds {args.rounds} --steps {args.steps}"
             f"{' --one-call' if args.one_call else ''}`: {args.setting}'s network ({cfg['model']['arch']}, "
             f"width {cfg['model']['width']}), batch {batch_size}, memory {tr.memory.size}, |T| = {len(T_idx)} "
             f"of {args.n}, {size} px, {views}; each round {args.steps} steps eager, then {args.steps} compiled "
             f"(`device.compiled`, Inductor's default mode, static shapes). Building the steppers, the "
             f"memory's fill and the first CE step: {build_s['eager']:.0f} s eager, "
             f"{build_s['compiled']:.0f} s compiled (compilation included, warm Inductor cache or not).", "",
             "| step | eager, each round (ms) | compiled, each round (ms) | eager, median | compiled, median "
             "| compiled / eager |", "|---|---|---|---|---|---|"]
    for name, t in times.items():
        e, c = statistics.median(t["eager"]), statistics.median(t["compiled"])
        lines.append(f"| {name} | {ms(t['eager'])} | {ms(t['compiled'])} | {e * 1e3:.1f} | {c * 1e3:.1f} | "
                     f"**{c / e:.2f}×** |")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
