"""float32 against bf16 autocast on the CPU (SELCL_CPU_BF16=1): a CPU preset's Sel-CL
pre-training step and CE step, timed in the same process, interleaved.

A shared 2-core VM's speed drifts by tens of percent within minutes (`bench/step.py` run
twice in a row gave 572 and 769 ms for the same step), so the two precisions are not timed
in separate runs: each round times `--steps` steps in float32, then as many under bf16
autocast, on the same network, memory and selection; the table gives each round and the
medians, and the ratio bf16 / float32 of the medians. On a CPU with AMX (Intel Sapphire
Rapids and later) oneDNN runs bf16 convolutions on its tile units.

    python bench/cpu_bf16.py                       # cpu_cifar10_asym40's network, batch, memory
    python bench/cpu_bf16.py --setting cpu_cifar10_sym50 --rounds 7
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from selcl.config import load_params, resolve  # noqa: E402
from selcl.device import cpu_name  # noqa: E402
from step import ce_stepper, fake_data, selcl_stepper  # noqa: E402  (bench/step.py)
from step import interleaved as interleave_steps  # noqa: E402
from tables import emit  # noqa: E402  (bench/tables.py)

FLAG = "SELCL_CPU_BF16"
PRECISIONS = ("float32", "bf16 autocast")   # as `selcl.device.precision` names them


def _set_bf16(on: bool) -> None:
    os.environ[FLAG] = "1" if on else "0"     # selcl.device.autocast reads it at every call


def interleaved(step, rounds: int, steps: int) -> dict[str, list[float]]:
    """Seconds per step of `step()` for each precision, one entry per round; every round
    runs float32 first, then bf16, after one untimed step of each (allocator, oneDNN
    primitive cache)."""
    before = os.environ.get(FLAG)
    try:
        return interleave_steps({p: step for p in PRECISIONS}, rounds, steps, torch.device("cpu"), warmup=1,
                                enter=lambda p: _set_bf16(p == PRECISIONS[1]))
    finally:                                  # SELCL_CPU_BF16 as it was found
        if before is None:
            os.environ.pop(FLAG, None)
        else:
            os.environ[FLAG] = before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", default="cpu_cifar10_asym40")
    ap.add_argument("--n", type=int, default=2000, help="training-set size (memory and T drawn from it)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8, help="steps per precision per round")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()
    device, classes = torch.device("cpu"), 10
    cfg = resolve(load_params(ROOT / "params.yaml"), args.setting)
    size, batch_size = 32, cfg["pretrain"]["batch_size"]
    data = fake_data(args.n, classes, size, device)
    gen = torch.Generator().manual_seed(0)
    batch = lambda: torch.randperm(args.n, generator=gen)[:batch_size]  # noqa: E731

    sel_step, tr, T_idx = selcl_stepper(cfg, data, classes, device, batch, k=cfg["pretrain"]["k"])
    sel = interleaved(sel_step, args.rounds, args.steps)
    ce = interleaved(ce_stepper(cfg, data, classes, device, batch, gen), args.rounds, args.steps)

    med = {name: {p: statistics.median(t) for p, t in times.items()} for name, times in
           (("Sel-CL pre-training step", sel), ("plain CE step", ce))}
    ms = lambda ts: " / ".join(f"{t * 1e3:.0f}" for t in ts)  # noqa: E731
    lines = [f"# float32 against bf16 autocast on the CPU ({cpu_name()}, {torch.get_num_threads()} threads, "
             f"torch {torch.__version__})", "",
             f"`python bench/cpu_bf16.py --setting {args.setting} --rounds {args.rounds} --steps {args.steps}`: "
             f"{args.setting}'s network ({cfg['model']['arch']}, width {cfg['model']['width']}), batch "
             f"{batch_size}, memory {tr.memory.size}, |T| = {len(T_idx)} of {args.n}, {size} px; each round "
             f"{args.steps} steps in float32 then {args.steps} under bf16 autocast, interleaved.", "",
             "| step | float32, each round (ms) | bf16, each round (ms) | float32, median | bf16, median "
             "| bf16 / float32 |", "|---|---|---|---|---|---|"]
    for name, times in (("Sel-CL pre-training step", sel), ("plain CE step", ce)):
        m = med[name]
        lines.append(f"| {name} | {ms(times['float32'])} | {ms(times['bf16 autocast'])} | "
                     f"{m['float32'] * 1e3:.1f} | {m['bf16 autocast'] * 1e3:.1f} | "
                     f"**{m['bf16 autocast'] / m['float32']:.2f}×** |")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
