"""Static against dynamic-shape compiled graphs (`device.compiled`: dynamic=False since
2026-11-27), in the order one real process calls the network: an Uns-CL warm-up step
(online B rows), then Sel-CL steps (online 3B and 2B rows, EMA 3B, BatchNorm groups).

Dynamo's default (dynamic=None, the code before) compiles the first size static and
recompiles later sizes as dynamic-shape graphs; dynamic=False compiles one static graph
per call site. Each mode runs in its own process with an empty Inductor cache, so the
compile times are cold; the printed ratios are static / dynamic, measured in this run.

On the CPU the training loops do not compile: here the compilation is forced (Inductor's
C++ backend), so the CPU numbers say what static graphs change in compile time and kernel
speed for this network, not what a GPU gains. On CUDA it compiles as the loops do.

    python bench/compile_static.py --arch small --batch 64 --out bench/results/compile_static_cpu.md
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tables import emit  # noqa: E402  (bench/tables.py)

MODES = ("dynamic", "static")


def worker(args) -> dict:
    """One mode in this process: the cold compile of the warm-up step and the first Sel-CL
    steps, then the mean Sel-CL step."""
    import selcl.device as device
    from selcl.train import make_pretrainer
    from step import bench_config, fake_data, realistic_selection, timed

    dev = device.get_device()
    if dev.type == "cpu":
        device.compiles = lambda d: True          # force compilation on the CPU (see above)
        torch.set_num_threads(args.threads)
    if args.worker == "dynamic":                  # the code before: Dynamo's default
        real = torch.compile
        torch.compile = lambda fn, dynamic=None, **kw: real(fn, **kw)
    os.environ["SELCL_SPLIT_VIEWS"] = "0"         # the CUDA path's one call per step
    cfg = bench_config(args.arch, args.batch)
    data = fake_data(args.n, 10, 32, dev)
    tr = make_pretrainer(cfg, 10, dev)
    rule, T_idx = realistic_selection(data, 10, cfg["model"]["proj_dim"], dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    batch = lambda: torch.randperm(args.n, generator=gen, device=dev)[:args.batch]  # noqa: E731
    t0 = time.perf_counter()
    tr.uns_step(data, batch())
    tr.uns_step(data, batch())
    device.synchronize(dev)
    t1 = time.perf_counter()
    for _ in range(2):
        tr.step(data, batch(), rule, T_idx, read_memory=True)
    device.synchronize(dev)
    t2 = time.perf_counter()
    step = timed(lambda: tr.step(data, batch(), rule, T_idx, read_memory=True), args.iters, dev)
    return {"warmup_compile_s": t1 - t0, "selcl_compile_s": t2 - t1, "step_ms": 1000 * step,
            "device": device.describe(dev)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="preact_resnet18")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each mode, alternating")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    runs = {m: [] for m in MODES}
    for r in range(args.repeats):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": cache}
                cmd = [sys.executable, __file__, "--worker", mode] + [
                    f"--{k}={getattr(args, k)}" for k in ("arch", "batch", "iters", "n", "threads")]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
                if out.returncode:
                    sys.exit(f"bench/compile_static.py: the {mode} run failed:\n{out.stderr[-3000:]}")
                runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    info = runs["static"][0]["device"]
    med = lambda mode, k: float(np.median([r[k] for r in runs[mode]]))  # noqa: E731
    each = lambda mode, k, fmt: " / ".join(fmt.format(r[k]) for r in runs[mode])  # noqa: E731
    rows = [("compile: 2 Uns-CL warm-up steps (s)", "warmup_compile_s", "{:.1f}"),
            ("compile: first 2 Sel-CL steps (s)", "selcl_compile_s", "{:.1f}"),
            (f"Sel-CL step, mean of {args.iters} (ms)", "step_ms", "{:.1f}")]
    emit([f"# Static against dynamic-shape compiled graphs ({info.get('gpu', info['device'])}, "
          f"torch {info['torch']})", "",
          f"`python bench/compile_static.py --arch {args.arch} --batch {args.batch} --iters {args.iters} "
          f"--repeats {args.repeats}`: each mode in its own process, cold Inductor cache, "
          f"each run, and the ratio of the medians.", "",
          "| | dynamic (Dynamo's default, before) | static (dynamic=False) | static / dynamic |",
          "|---|---|---|---|"] +
         [f"| {label} | {each('dynamic', k, fmt)} | {each('static', k, fmt)} | "
          f"{med('static', k) / med('dynamic', k):.2f} |" for label, k, fmt in rows], args.out)


if __name__ == "__main__":
    main()
