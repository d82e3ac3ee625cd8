"""Benchmark: one epoch's Sel-CL selection (selcl.selection.select) vs a bare faiss search.

    python bench/selection.py [--n 50000] [--d 128] [--classes 10] [--noise 0.4] [--k 250]
                              [--alpha 0.5] [--beta 0.25] [--repeats 3] [--threads 2]
                              [--quick] [--out bench/results/selection.txt]

Data: N L2-normalised d-dim features in `classes` Gaussian clusters (z = normalise(μ_c +
ε), |ε| ≈ 1.1·|μ_c|, so classes overlap a little), symmetric label noise at rate
`noise` (seeded) — a selection with realistic T and G, not a degenerate one.

Time: `select(z, ỹ, C, k=K, α, β)` — k-NN + both voting passes + T + γ + the |G| /
precision stats — against the bare exact search it is built on: faiss IndexFlatIP
built on the same N vectors and searched for all N queries with k = K+1 in one call
(faiss tiles the work itself). Both run in the same process with the same
faiss.omp_set_num_threads / torch.set_num_threads, alternating, `repeats` times each;
the minimum of each is reported (the least disturbed by other load on the machine).

Also timed: `Selection.pair_mask` for 256 anchors × 20,000 memory entries (the
per-training-step call).

Peak memory beyond the features: each measured call runs in a fresh child process
that loads the features (np.load → torch.from_numpy, no copy), imports everything,
reads its resident set size (RSS, /proc via psutil) and then runs the call once;
the peak is the kernel's high-water mark `resource.getrusage(RUSAGE_SELF).ru_maxrss`
after the call, minus the RSS before it. CPU torch and faiss allocations are all in
RSS, so this counts every extra byte (index copy of the keys, k-NN buffers, votes,
samples), not only Python objects.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from selcl.selection import select  # noqa: E402
from tables import emit, stats_line  # noqa: E402  (bench/tables.py)


def make_features(n: int, d: int, classes: int, noise: float, seed: int = 0,
                  spread: float = 1.1, intrinsic_dim: int | None = None):
    """Clustered unit features, clean labels y and symmetric noisy labels ỹ (numpy
    float32 / int64). z = normalise(μ_c + ε): μ_c a random unit vector per class, ε
    isotropic with |ε| ≈ spread; or, with intrinsic_dim = m, ε = spread·A_c u with u ~
    N(0, I_m/m) in a random m-dim subspace A_c per class plus 10% isotropic noise — the
    low intrinsic dimension of learned embeddings, which approximate search relies on.
    Generated in chunks: O(chunk·d) temporaries."""
    rng = np.random.default_rng(seed)
    mu = rng.standard_normal((classes, d)).astype(np.float32)
    mu /= np.linalg.norm(mu, axis=1, keepdims=True)
    if intrinsic_dim:
        basis = np.linalg.qr(rng.standard_normal((classes, d, intrinsic_dim)))[0].astype(np.float32)
    y = rng.integers(0, classes, n)
    z = np.empty((n, d), dtype=np.float32)
    for s in range(0, n, 1 << 16):
        yc = y[s:s + (1 << 16)]
        if intrinsic_dim:
            u = rng.standard_normal((len(yc), intrinsic_dim), dtype=np.float32) / np.sqrt(intrinsic_dim)
            e = np.einsum("bdm,bm->bd", basis[yc], u) \
                + 0.1 * rng.standard_normal((len(yc), d), dtype=np.float32) / np.sqrt(d)
        else:
            e = rng.standard_normal((len(yc), d), dtype=np.float32) / np.sqrt(d)
        x = mu[yc] + spread * e
        z[s:s + len(yc)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    noisy = y.copy()
    flip = rng.permutation(n)[:int(noise * n)]       # SPEC §1: ⌊r·N⌋ examples, any class
    noisy[flip] = rng.integers(0, classes, len(flip))
    return z, y.astype(np.int64), noisy.astype(np.int64)


def set_threads(t: int) -> None:
    import faiss
    faiss.omp_set_num_threads(t)
    torch.set_num_threads(t)


def rss_bytes() -> int:
    import psutil
    return psutil.Process().memory_info().rss


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB


def bare_search(z: np.ndarray, k: int):
    import faiss
    index = faiss.IndexFlatIP(z.shape[1])
    index.add(z)
    return index.search(z, k)


def run_select(z, noisy, y, args):
    return select(z, noisy, args.classes, k=args.k, alpha=args.alpha, beta=args.beta,
                  weighting=args.weighting, clean_labels=y, seed=0)


def child(args) -> None:
    """--child select|search: memory of one call; for 'select' then the timing loop."""
    set_threads(args.threads)
    data = np.load(args.data)
    z_np, y_np, noisy_np = data["z"], data["y"], data["noisy"]
    z, y, noisy = (torch.from_numpy(a) for a in (z_np, y_np, noisy_np))
    import faiss  # noqa: F401  (import before the baseline)
    out = {}
    base = rss_bytes()
    if args.child == "search":
        bare_search(z_np, args.k + 1)
        out["peak_extra"] = peak_bytes() - base
    else:
        sel = run_select(z, noisy, y, args)
        out["peak_extra"] = peak_bytes() - base
        out["stats"] = sel.stats
        t_search, t_select = [], []
        for _ in range(args.repeats):                     # alternate: same conditions
            t0 = time.perf_counter()
            bare_search(z_np, args.k + 1)
            t_search.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            run_select(z, noisy, y, args)
            t_select.append(time.perf_counter() - t0)
        out.update(t_search=t_search, t_select=t_select)
        # the per-step cost in training: 256 anchors against a 20,000-entry memory
        g = torch.Generator().manual_seed(0)
        i = torch.randint(0, len(z), (256,), generator=g)
        j = torch.randint(0, len(z), (20_000,), generator=g)
        t_mask = []
        for _ in range(20):
            t0 = time.perf_counter()
            sel.pair_mask(i, j)
            t_mask.append(time.perf_counter() - t0)
        out["t_pair_mask"] = sorted(t_mask)[len(t_mask) // 2]
    print("RESULT " + json.dumps(out))


def spawn(mode: str, path: str, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--data", path,
           "--n", str(args.n), "--d", str(args.d), "--classes", str(args.classes),
           "--k", str(args.k), "--alpha", str(args.alpha), "--beta", str(args.beta),
           "--repeats", str(args.repeats), "--threads", str(args.threads),
           "--weighting", args.weighting]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--noise", type=float, default=0.4)
    ap.add_argument("--k", type=int, default=250)
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--beta", type=float, default=0.25)
    ap.add_argument("--weighting", default="uniform")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="N=4000, K=50, 1 repeat, no file")
    ap.add_argument("--out", default=None, help="result file ('' = none)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.quick:
        args.n, args.k, args.repeats = 4000, 50, 1
    out = args.out if args.out is not None else ("" if args.quick else "bench/results/selection.txt")

    load0 = os.getloadavg()[0]
    z, y, noisy = make_features(args.n, args.d, args.classes, args.noise)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "features.npz")
        np.savez(path, z=z, y=y, noisy=noisy)
        mem_search = spawn("search", path, args)["peak_extra"]
        r = spawn("select", path, args)
    ts, tl = min(r["t_search"]), min(r["t_select"])
    st = r["stats"]
    import faiss
    mb = 1024 ** 2
    lines = [
        f"# selcl.selection.select vs bare faiss flat search — {time.strftime('%Y-%m-%d')}",
        f"N={args.n} d={args.d} classes={args.classes} noise={args.noise} K={args.k} "
        f"alpha={args.alpha} beta={args.beta} weighting={args.weighting}",
        f"threads={args.threads} (faiss.omp_set_num_threads + torch.set_num_threads), "
        f"cpus={os.cpu_count()}, torch {torch.__version__}, faiss {faiss.__version__}, "
        f"min of {args.repeats} alternating runs; features = {z.nbytes / mb:.1f} MB",
        f"machine load average (1 min) at start / end: {load0:.1f} / {os.getloadavg()[0]:.1f} "
        "(other jobs on the 2 cores slow both sides and make 2-thread runs noisy)",        "",
        "| measure | value | target |",
        "| --- | --- | --- |",
        f"| bare faiss IndexFlatIP search, k={args.k + 1} (s) | {ts:.2f} | |",
        f"| select (s) | {tl:.2f} | |",
        f"| ratio select / search | {tl / ts:.2f} | ≤ 1.5 |",
        f"| peak extra memory, select (MB) | {r['peak_extra'] / mb:.0f} | < 1024 |",
        f"| peak extra memory, bare search (MB) | {mem_search / mb:.0f} | |",
        f"| pair_mask, 256 anchors × 20,000 memory entries (ms, median of 20) | "
        f"{r['t_pair_mask'] * 1e3:.1f} | |",
        "",
        f"all runs (s): search {[round(t, 2) for t in r['t_search']]}, "
        f"select {[round(t, 2) for t in r['t_select']]}",
        "",
        stats_line(st),
    ]
    emit(lines, out)


if __name__ == "__main__":
    main()
