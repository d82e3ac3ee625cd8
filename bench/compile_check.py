"""Does the CUDA-graphed (torch.compile mode="reduce-overhead") pre-training step compute
what the eager step computes? And how much faster is it?

Runs the first pre-training steps of epoch 1 (the real lr ramp) three times from the
same initial weights and random streams: eager (SELCL_COMPILE=0), eager again with
the initial weights perturbed by 1e-6 (relative) — the floor: how fast any rounding
difference grows in this training — and compiled (the default on CUDA). Prints the
per-step losses side by side, relative differences, the final weights' relative
difference and the time per step. bf16 autocast and fused kernels round differently,
so compiled and eager should differ like the perturbed run does, no more.

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
from selcl.device import knn_index_for, describe, get_device, synchronize  # noqa: E402
from selcl.pairs import pair_rule  # noqa: E402
from selcl.selection import select  # noqa: E402
from selcl.train import lr_at, make_pretrainer, set_lr, steps_per_epoch  # noqa: E402
from step import fake_data  # noqa: E402
from tables import emit  # noqa: E402


def run(cfg, data, steps: int, compile_on: bool, device, n: int, B: int, perturb: float = 0.0):
    os.environ["SELCL_COMPILE"] = "1" if compile_on else "0"
    tr = make_pretrainer(cfg, 10, device)
    if perturb:
        gp = torch.Generator(device=device).manual_seed(7)
        with torch.no_grad():
            for p in tr.model.parameters():
                p.mul_(1 + perturb * torch.randn(p.shape, device=device, generator=gp))
    g0 = torch.Generator(device=device).manual_seed(0)
    z = F.normalize(torch.randn(n, 128, device=device, generator=g0), dim=1)
    sel = select(z, data.noisy, 10, k=50, alpha=0.5, beta=0.25, knn_index=knn_index_for(device))
    rule = pair_rule(sel, data.noisy, data.clean, selected_sets="T_G1_G2")
    T_idx = rule.examples.nonzero().squeeze(1)
    gen = torch.Generator(device=device).manual_seed(1)
    losses, times = [], []
    iters = steps_per_epoch(n, B)
    for it in range(steps):
        set_lr(tr.opt, lr_at(cfg["pretrain"], 1, it, iters))     # epoch 1's linear warm-up
        idx = torch.randperm(n, generator=gen, device=device)[:B]
        synchronize(device)
        t = time.perf_counter()
        out = tr.step(data, idx, rule, T_idx, read_memory=True)
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
    lp, _, pp = run(cfg, data, args.steps, False, device, args.n, args.batch, perturb=1e-6)
    lc, tc, pc = run(cfg, data, args.steps, True, device, args.n, args.batch)
    rel = [abs(a - b) / max(abs(a), 1e-8) for a, b in zip(le, lc)]
    relp = [abs(a - b) / max(abs(a), 1e-8) for a, b in zip(le, lp)]
    steady = slice(min(10, args.steps - 1), None)       # after compilation / graph recording
    t_e = sorted(te[steady])[len(te[steady]) // 2]
    t_c = sorted(tc[steady])[len(tc[steady]) // 2]
    info = describe(device)
    lines = [f"# Eager vs CUDA-graphed pre-training step ({info.get('gpu', info['device'])}, torch {info['torch']})",
             "", f"PreAct ResNet-18, batch {args.batch}, {args.steps} steps from the same weights and seeds.", "",
             "| step | loss eager | eager, weights ×(1+1e-6·ε) | rel. diff | compiled | rel. diff |",
             "|---|---|---|---|---|---|"]
    for i in sorted(set(list(range(min(5, args.steps))) + [args.steps // 2, args.steps - 1])):
        lines.append(f"| {i + 1} | {le[i]:.5f} | {lp[i]:.5f} | {relp[i]:.1e} | {lc[i]:.5f} | {rel[i]:.1e} |")
    wdiff = lambda w: float((w - pe).norm() / pe.norm())  # noqa: E731
    lines += ["", f"largest relative loss difference from eager: perturbed eager {max(relp):.1e}, "
              f"compiled {max(rel):.1e}",
              f"final weights, ‖w − w_eager‖ / ‖w_eager‖: perturbed eager {wdiff(pp):.1e}, compiled {wdiff(pc):.1e}",
              f"median step time after step 10: eager {t_e * 1e3:.1f} ms, compiled {t_c * 1e3:.1f} ms "
              f"(**{t_e / t_c:.2f}×**); first compiled step (compilation) {tc[0]:.1f} s", ""]
    emit(lines, args.out)


if __name__ == "__main__":
    main()
