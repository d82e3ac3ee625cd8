"""Does the CUDA-graphed (torch.compile mode="reduce-overhead") pre-training step compute
what the eager step computes? And how much faster is it?

Runs the same pre-training steps twice from the same initial weights and random
streams — eager (SELCL_COMPILE=0) and compiled (the default on CUDA) — and prints the
per-step losses side by side, the largest relative difference, the final weights'
relative difference, and the time per step of each. bf16 autocast and fused kernels
round differently, so the two agree to ~1e-3 at first and drift apart slowly, as two
eager runs on different GPUs would.

    python bench/compile_check.py --steps 30 --out compile_check.md
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from selcl.config import load_params, resolve  # noqa: E402
from selcl.device import describe, get_device, synchronize  # noqa: E402
from selcl.pairs import pair_rule  # noqa: E402
from selcl.selection import select  # noqa: E402
from selcl.train import make_pretrainer  # noqa: E402
from step import fake_data  # noqa: E402


def run(cfg, data, steps: int, compile_on: bool, device, n: int, B: int):
    os.environ["SELCL_COMPILE"] = "1" if compile_on else "0"
    tr = make_pretrainer(cfg, 10, device)
    g0 = torch.Generator(device=device).manual_seed(0)
    z = F.normalize(torch.randn(n, 128, device=device, generator=g0), dim=1)
    sel = select(z, data.noisy, 10, k=50, alpha=0.5, beta=0.25)
    rule = pair_rule(sel, data.noisy, data.clean, selected_sets="T_G1_G2")
    T_idx = rule.examples.nonzero().squeeze(1)
    gen = torch.Generator(device=device).manual_seed(1)
    losses, times = [], []
    for _ in range(steps):
        idx = torch.randint(0, n, (B,), generator=gen, device=device)
        synchronize(device)
        t = time.perf_counter()
        out = tr.step(data, idx, rule, T_idx, use_memory=True)
        synchronize(device)
        times.append(time.perf_counter() - t)
        losses.append(float(out["loss"]))
    flat = torch.cat([p.detach().float().flatten() for p in tr.model.parameters()])
    return losses, times, flat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = get_device()
    cfg = resolve(load_params(ROOT / "params.yaml"), "cifar10_sym20")
    cfg["pretrain"]["batch_size"] = args.batch
    cfg["pretrain"]["queue_per_class"] = 100
    data = fake_data(args.n, 10, 32, device)
    le, te, pe = run(cfg, data, args.steps, False, device, args.n, args.batch)
    lc, tc, pc = run(cfg, data, args.steps, True, device, args.n, args.batch)
    rel = [abs(a - b) / max(abs(a), 1e-8) for a, b in zip(le, lc)]
    steady = slice(min(10, args.steps - 1), None)       # after compilation / graph recording
    t_e = sorted(te[steady])[len(te[steady]) // 2]
    t_c = sorted(tc[steady])[len(tc[steady]) // 2]
    info = describe(device)
    lines = [f"# Eager vs CUDA-graphed pre-training step ({info.get('gpu', info['device'])}, torch {info['torch']})",
             "", f"PreAct ResNet-18, batch {args.batch}, {args.steps} steps from the same weights and seeds.", "",
             "| step | loss eager | loss compiled | rel. diff |", "|---|---|---|---|"]
    for i in sorted(set(list(range(min(5, args.steps))) + [args.steps - 1])):
        lines.append(f"| {i + 1} | {le[i]:.5f} | {lc[i]:.5f} | {rel[i]:.1e} |")
    lines += ["", f"largest relative loss difference, first 5 steps: {max(rel[:5]):.1e}; all steps: {max(rel):.1e}",
              f"final weights, ‖w_c − w_e‖ / ‖w_e‖ = {float((pc - pe).norm() / pe.norm()):.1e}",
              f"median step time after step 10: eager {t_e * 1e3:.1f} ms, compiled {t_c * 1e3:.1f} ms "
              f"(**{t_e / t_c:.2f}×**); first compiled step (compilation) {tc[0]:.1f} s", ""]
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table)


if __name__ == "__main__":
    main()
