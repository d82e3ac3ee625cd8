"""Micro-benchmark: batched selcl.augment vs per-sample torchvision pipelines.

    python bench/augment.py [--batch 128] [--size 32] [--out-size S] [--iters 20] [--device cpu|cuda]
                            [--threads N] [--out FILE.json]   (no --out: print only)

Times one strong (pre-training) view and one weak (fine-tuning) view of a batch of
uint8 images [B, 3, S, S]:
  own      selcl.augment.strong_augment / weak_augment (whole batch, on --device)
  tv2      torchvision.transforms.v2 on uint8 tensors, one image at a time (CPU)
  pil      torchvision.transforms (v1) on PIL images, one at a time (CPU) — the
           authors' DataLoader path (ToPILImage → … → ToTensor → Normalize)
Reported: milliseconds per batch (median of --iters) and images/s. Per-sample
pipelines run in one process; a DataLoader with k workers divides them by ≈ k.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from selcl import augment as A  # noqa: E402
from selcl.device import describe, get_device, synchronize  # noqa: E402

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)


def timeit(fn, iters: int, device) -> float:
    fn()                                  # warm-up (kernel selection, allocator)
    synchronize(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=32, help="input images are size×size")
    ap.add_argument("--out-size", type=int, default=0, help="strong view size (0: = --size)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave)")
    ap.add_argument("--skip-per-sample", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also time strong_augment(compiled=True)")
    ap.add_argument("--views", type=int, default=0,
                    help="also time k strong views made in one call on the k×B batch")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = get_device(args.device)
    B, S = args.batch, args.size
    So = args.out_size or S
    x_cpu = torch.randint(0, 256, (B, 3, S, S), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(0))
    x = x_cpu.to(dev)
    g = torch.Generator(device=dev).manual_seed(0)

    res = {"batch": B, "size": S, "out_size": So, "threads": torch.get_num_threads(), **describe(dev), "ms_per_batch": {}}
    ms = res["ms_per_batch"]
    ms["own_strong"] = timeit(lambda: A.strong_augment(x, g, MEAN, STD, size=So), args.iters, dev)
    ms["own_weak"] = timeit(lambda: A.weak_augment(x, g, MEAN, STD), args.iters, dev)
    if args.views:
        xk = x.repeat(args.views, 1, 1, 1)
        ms[f"own_strong_{args.views}views_one_call"] = timeit(
            lambda: A.strong_augment(xk, g, MEAN, STD, size=So), args.iters, dev)
    if args.compile:
        t0 = time.perf_counter()
        A.strong_augment(x, g, MEAN, STD, size=So, compiled=True)
        res["compile_s"] = round(time.perf_counter() - t0, 1)
        ms["own_strong_compiled"] = timeit(
            lambda: A.strong_augment(x, g, MEAN, STD, size=So, compiled=True), args.iters, dev)
        if args.views:
            ms[f"own_strong_{args.views}views_one_call_compiled"] = timeit(
                lambda: A.strong_augment(xk, g, MEAN, STD, size=So, compiled=True), args.iters, dev)

    if not args.skip_per_sample:
        import torchvision.transforms as T
        import torchvision.transforms.v2 as T2

        tv2_strong = T2.Compose([
            T2.RandomResizedCrop(So, scale=(0.08, 1.0), antialias=True), T2.RandomHorizontalFlip(),
            T2.RandomApply([T2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T2.RandomGrayscale(0.2),
            T2.ToDtype(torch.float32, scale=True), T2.Normalize(MEAN, STD)])
        tv2_weak = T2.Compose([
            T2.RandomCrop(S, padding=4), T2.RandomHorizontalFlip(),
            T2.ToDtype(torch.float32, scale=True), T2.Normalize(MEAN, STD)])
        pil_strong = T.Compose([
            T.ToPILImage(), T.RandomResizedCrop(So, scale=(0.08, 1.0)), T.RandomHorizontalFlip(),
            T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T.RandomGrayscale(0.2),
            T.ToTensor(), T.Normalize(MEAN, STD)])
        pil_weak = T.Compose([
            T.ToPILImage(), T.RandomCrop(S, padding=4), T.RandomHorizontalFlip(),
            T.ToTensor(), T.Normalize(MEAN, STD)])
        it = max(3, args.iters // 4)
        for name, tf in [("tv2_strong", tv2_strong), ("tv2_weak", tv2_weak),
                         ("pil_strong", pil_strong), ("pil_weak", pil_weak)]:
            ms[name] = timeit(lambda tf=tf: torch.stack([tf(img) for img in x_cpu]), it, torch.device("cpu"))

    n_img = lambda k: B * args.views if "views" in k else B  # noqa: E731
    res["images_per_s"] = {k: round(n_img(k) / v * 1e3) for k, v in ms.items()}
    res["ms_per_batch"] = {k: round(v, 3) for k, v in ms.items()}
    print(json.dumps(res, indent=1))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
