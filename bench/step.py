"""One Sel-CL pre-training step against one plain cross-entropy step (issue: target ≤ 6.5×).

Same network, batch size and device. The Sel-CL step (SPEC §10.2) does 8 view
forwards (online: view 1 and the two mixed views; EMA: view 2 and the two mixed views; the
L_CLS batch's two views), their backward, L_SIM's separate backward (through the two mixed
views' calls on the CPU, the three online views' one call on CUDA),
and the selective contrastive loss over batch + memory; the CE step does one weakly augmented
pass. Both include their augmentation and the optimiser step.

    python bench/step.py                 # PreAct ResNet-18, batch 128, CIFAR-sized data
    python bench/step.py --arch small --batch 64 --iters 5
    SELCL_CPU_BF16=1 python bench/step.py --arch small --batch 64   # bf16 autocast on the CPU too
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
import torch.nn.functional as F  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from selcl.config import load_params, resolve  # noqa: E402
from selcl.device import knn_index_for, autocast, describe, get_device, precision, synchronize  # noqa: E402
from selcl.pairs import pair_rule  # noqa: E402
from selcl.selection import select  # noqa: E402
from selcl.train import TrainData, _views, make_model, make_pretrainer, sgd, training_forward  # noqa: E402
from tables import emit  # noqa: E402  (bench/tables.py)


def fake_data(n: int, num_classes: int, size: int, device) -> TrainData:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
    y = torch.randint(0, num_classes, (n,), generator=g)
    noisy = torch.where(torch.rand(n, generator=g) < 0.2, torch.randint(0, num_classes, (n,), generator=g), y)
    return TrainData(x=x.to(device), noisy=noisy.to(device), clean=y.to(device), x_test=x[:256].to(device),
                     y_test=y[:256].to(device), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25),
                     num_classes=num_classes)


def realistic_selection(data: TrainData, num_classes: int, dim: int, device, k: int = 250):
    """The pair rule and T of a selection on embeddings that cluster by true class, as a
    trained encoder's do: T then has a realistic size (most correctly labelled examples)
    and every step runs its L_CLS batch. (Random embeddings gave an empty or tiny T, so
    the step timed until 2026-11-27 mostly skipped L_CLS: two views' forward and
    backward, a quarter of its arithmetic.)"""
    n = data.noisy.shape[0]
    zg = torch.Generator().manual_seed(1)
    centres = F.normalize(torch.randn(num_classes, dim, generator=zg), dim=1)
    z = F.normalize(centres[data.clean.cpu()] + 0.5 * torch.randn(n, dim, generator=zg), dim=1).to(device)
    sel = select(z, data.noisy, num_classes, k=min(k, n - 1), alpha=0.5, beta=0.25,
                 knn_index=knn_index_for(device))
    rule = pair_rule(sel, data.noisy, data.clean, selected_sets="T_G1_G2")
    T_idx = rule.examples.nonzero().squeeze(1)
    if len(T_idx) == 0:
        raise SystemExit("bench/step.py: the selection is empty, so the step would skip L_CLS")
    return rule, T_idx


def bench_config(arch: str, batch: int) -> dict:
    """The benchmarks' setting: cifar10_sym20 with `arch` ("small": width 16, one block per
    stage, the CPU presets' network) and pre-training batch `batch`."""
    cfg = resolve(load_params(ROOT / "params.yaml"), "cifar10_sym20")
    cfg["model"]["arch"] = arch
    if arch == "small":
        cfg["model"].update(width=16, blocks=[1, 1, 1, 1])
    cfg["pretrain"]["batch_size"] = batch
    return cfg


def selcl_stepper(cfg: dict, data: TrainData, num_classes: int, device, batch, k: int = 250):
    """One Sel-CL pre-training step as a call, in steady state: a real selection (k-NN of
    `k`) and the memory full (read from epoch 4 on). batch() → the indices of one batch.
    Returns (step, the pretrainer, T's indices)."""
    tr = make_pretrainer(cfg, num_classes, device)       # its forwards: CUDA graphs on CUDA
    rule, T_idx = realistic_selection(data, num_classes, cfg["model"]["proj_dim"], device, k=k)
    while len(tr.memory.ids) < tr.memory.size:          # fill the memory as in steady state
        tr.step(data, batch(), rule, T_idx, read_memory=True)
    return (lambda: tr.step(data, batch(), rule, T_idx, read_memory=True)), tr, T_idx


def ce_stepper(cfg: dict, data: TrainData, num_classes: int, device, batch, gen):
    """One plain CE step as a call: same network, batch, device; weak augmentation, one pass."""
    model = make_model(cfg["model"], num_classes, device)
    opt = sgd(model, cfg["baseline"])
    net = training_forward(model, device)               # the same forward path as the loops

    def ce_step():
        idx = batch()
        v = _views(data.x[idx], gen, data, strong=False)
        with autocast(device):
            _, logits = net(v)
        loss = F.cross_entropy(logits.float(), data.noisy[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.train()
    return ce_step


def timed(fn, iters: int, device, warmup: int = 3) -> float:
    for _ in range(warmup):               # warm-up (cuDNN autotune, allocator, compilation)
        fn()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    synchronize(device)
    return (time.perf_counter() - t0) / iters


def interleaved(steps: dict, rounds: int, iters: int, device, warmup: int = 3, enter=None) -> dict[str, list[float]]:
    """Seconds per call of each named step, one entry per round: every round times `iters`
    calls of each step in turn, `enter(name)` first if given (a mode switch: bench/cpu_bf16.py,
    bench/cpu_compile.py), after `warmup` untimed calls of each. A shared host's speed drifts
    by tens of percent within minutes; two blocks timed minutes apart measure the drift as
    much as the steps, so whatever is compared is compared within each round."""
    for name, fn in steps.items():
        if enter:
            enter(name)
        for _ in range(warmup):
            fn()
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            if enter:
                enter(name)
            times[name].append(timed(fn, iters, device, warmup=0))
    return times


def flops(fn) -> int:
    """Floating-point operations of one call of `fn` (convolutions and matrix products)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="preact_resnet18")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--iters", type=int, default=3, help="timed steps of each kind per round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of Sel-CL steps then CE steps; the ratio is the median of the rounds' ratios")
    ap.add_argument("--n", type=int, default=4096, help="training-set size (memory is filled from it)")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--out", default=None, help="also write the table to this file")
    ap.add_argument("--eager", action="store_true",
                    help="nothing compiled (SELCL_COMPILE=0): both steps call the plain modules, and the "
                         "augmentation runs eager too (before 2026-11-27 it stayed compiled on CUDA)")
    ap.add_argument("--sim-recompute", action="store_true",
                    help="SELCL_SIM_RECOMPUTE=1: L_SIM's gradient from its own forward, so that the online "
                         "network replays as CUDA graphs too (one extra forward of the mixed views)")
    ap.add_argument("--one-call", action="store_true",
                    help="SELCL_SPLIT_VIEWS=0: the views of a step in one concatenated call (the CUDA "
                         "default) also on the CPU, where the default is one call per view")
    args = ap.parse_args()

    if args.one_call:
        os.environ["SELCL_SPLIT_VIEWS"] = "0"
    if args.sim_recompute:
        os.environ["SELCL_SIM_RECOMPUTE"] = "1"
    if args.eager:
        os.environ["SELCL_COMPILE"] = "0"
    device = get_device()
    cfg = bench_config(args.arch, args.batch)
    data = fake_data(args.n, args.classes, args.size, device)

    gen = torch.Generator(device=device).manual_seed(0)
    batch = lambda: torch.randperm(args.n, generator=gen, device=device)[:args.batch]  # noqa: E731  (distinct, as an epoch)
    sel_step, tr, T_idx = selcl_stepper(cfg, data, args.classes, device, batch)
    ce_step = ce_stepper(cfg, data, args.classes, device, batch, gen)
    rounds = interleaved({"Sel-CL": sel_step, "CE": ce_step}, args.rounds, args.iters, device)
    sel_rounds, ce_rounds = rounds["Sel-CL"], rounds["CE"]
    t_sel, t_ce = statistics.median(sel_rounds), statistics.median(ce_rounds)
    ratios = [a / b for a, b in zip(sel_rounds, ce_rounds)]

    # The work floor: floating-point operations of one step each (convolutions and matrix
    # products, forward and backward, counted by torch's FlopCounterMode). Eager steps only:
    # the counter does not see inside CUDA graphs.
    work = None
    if args.eager or device.type != "cuda":
        work = (flops(sel_step), flops(ce_step))

    info = describe(device)
    ratio = statistics.median(ratios)
    recompute = ", L_SIM from its own forward (SELCL_SIM_RECOMPUTE=1)" if args.sim_recompute else ""
    if args.eager or device.type != "cuda":
        mode = "eager" + recompute + (", views in one call per step" if args.one_call or device.type == "cuda"
                                      else ", one call per view")
    else:
        mode = ("compiled: CE step and EMA as CUDA graphs (reduce-overhead); " +
                ("the Sel-CL online network too" + recompute if args.sim_recompute else
                 "the Sel-CL online network without graphs (its graph is back-propagated twice for "
                 "the clipped L_SIM gradient)"))
    emit([
        f"# Pre-training step vs cross-entropy step ({info.get('gpu', info['device'])}, torch {info['torch']})",
        "",
        f"arch {args.arch}, batch {args.batch}, images {args.size}px, memory {tr.memory.size}, "
        f"{args.rounds} rounds of {args.iters} timed Sel-CL steps then {args.iters} CE steps, after 3 warm-up "
        f"steps of each; times are the rounds' medians, the ratio the median of the rounds' ratios; "
        f"|T| = {len(T_idx)} of {args.n} (the L_CLS batch "
        f"drawn from it), "
        f"{mode}, network passes in {precision(device)}",
        "",
        "| step | time (ms) |", "|---|---|",
        f"| Sel-CL pre-training step | {t_sel * 1e3:.1f} |",
        f"| plain CE step | {t_ce * 1e3:.1f} |",
        f"| **ratio** | **{ratio:.2f}×** (target ≤ 6.5×) |",
        f"| ratio in each round | {' / '.join(f'{r:.2f}' for r in ratios)} |"]
        + ([f"| FLOPs per step, Sel-CL / CE (the work floor of the ratio) | {work[0] / 1e9:.2f} / "
            f"{work[1] / 1e9:.2f} G = **{work[0] / work[1]:.2f}×** |"] if work else []), args.out)


if __name__ == "__main__":
    main()
