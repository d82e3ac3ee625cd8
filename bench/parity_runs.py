"""One setting end to end in one process (warm-up, pre-training, Sel-CL+, CE baseline), one
JSON line of results: for before/after comparisons of the method code (bench/results/parity.md).

Uses only the library's stage functions, so the same file runs against an older checkout:

    python bench/parity_runs.py --root . --setting demo_sym40 >> results.jsonl
    python bench/parity_runs.py --root ../old --setting cpu_cifar10_sym40 --path c10.tar.gz
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=".", help="checkout whose selcl/ and params.yaml to use")
    ap.add_argument("--setting", required=True)
    ap.add_argument("--path", default=None, help="imagefolder path override (data.path)")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    root = Path(args.root).resolve()
    sys.path.insert(0, str(root))
    import numpy as np
    import torch

    from selcl import checkpoint
    from selcl.config import load_params, resolve
    from selcl.data import load_dataset
    from selcl.noise import make_noisy_labels
    from selcl.train import TrainData, baseline, finetune, pretrain, summarise, warmup

    torch.set_num_threads(int(__import__('os').environ.get('SELCL_THREADS', '2')))
    cfg = resolve(load_params(root / "params.yaml"), args.setting)
    d, nc = cfg["data"], cfg["noise"]
    kw = {"path": args.path or d.get("path"), "subset": d.get("subset")} if d["dataset"] == "imagefolder" else {}
    ds = load_dataset(d["dataset"], **kw)
    C = len(ds.classes)
    noisy = make_noisy_labels(ds.y_train, C, nc["kind"], nc["rate"], nc["seed"],
                              dataset="cifar10" if d["dataset"] == "imagefolder" else d["dataset"],
                              include_true_class=nc["include_true_class"])
    data = TrainData.build({"x_train": ds.x_train, "y_train": ds.y_train, "x_test": ds.x_test, "y_test": ds.y_test,
                            "mean": ds.mean, "std": ds.std},
                           {"noisy": noisy, "clean": ds.y_train, "num_classes": C}, torch.device("cpu"))
    tmp = Path("/tmp") / f"parity_{args.label}_{args.setting}_{time.time_ns()}"
    ck = lambda name: checkpoint.Checkpointer(tmp / f"{name}.pt", name, 10_000)  # noqa: E731
    dev = torch.device("cpu")
    t0 = time.perf_counter()
    warm = warmup(cfg, data, dev, ck("warmup"))
    pre = pretrain(cfg, data, warm, dev, ck("pretrain"))
    t_pre = time.perf_counter() - t0
    ft = finetune(cfg, data, pre, dev, ck("finetune"))
    t_ft = time.perf_counter() - t0 - t_pre
    t1 = time.perf_counter()
    ce = baseline(cfg, data, dev, ck("baseline"))
    t_ce = time.perf_counter() - t1
    last = pre["history"][-1]
    s_ft, s_ce = summarise(ft["history"], cfg["finetune"]["eval_last"]), summarise(ce["history"], cfg["baseline"]["eval_last"])
    print(json.dumps({
        "label": args.label, "setting": args.setting, "n_train": int(data.n),
        "realised_noise": float(np.mean(noisy != ds.y_train)),
        "epochs": {"warmup": cfg["warmup"]["epochs"], "pretrain": cfg["pretrain"]["epochs"],
                   "finetune": cfg["finetune"]["epochs"], "ce": cfg["baseline"]["epochs"]},
        "selcl_plus_mean_last": s_ft["test_acc_mean_last"], "selcl_plus_final": s_ft["test_acc_last"],
        "ce_mean_last": s_ce["test_acc_mean_last"], "ce_final": s_ce["test_acc_last"], "ce_best": s_ce["test_acc_best"],
        "n_T": last.get("n_selected"), "precision_T": last.get("precision_T"), "recall_T": last.get("recall_T"),
        "precision_G": last.get("precision_G"), "knn_top1": last.get("knn_top1"),
        "seconds": {"warmup+pretrain": round(t_pre), "finetune": round(t_ft), "ce": round(t_ce)}}), flush=True)


if __name__ == "__main__":
    main()
