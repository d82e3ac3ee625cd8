"""Paper Table 4 on real images, small: which examples and pairs Sel-CL learns from, on the
CPU preset `cpu_cifar10_asym40` (2,000 CIFAR-10 images, 40 % asymmetric noise), one
`bench/parity_runs.py` process per `pretrain.selected_sets` variant:

    for v in all clean_clean T_G1 clean_assoc clean_all_pairs T_G1_G2; do
      python bench/parity_runs.py --setting cpu_cifar10_asym40 --path data/cifar10-jpeg.tar.gz \\
        --label table4-$v --set pretrain.selected_sets=$v --no-ce \\
        --history bench/results/cpu_real_histories/table4/$v.json \\
        >> bench/results/cpu_real_histories/table4/results.jsonl
    done
    python tools/table4_real.py bench/results/cpu_real_histories/table4 --out bench/results/table4_asym40 \\
        [--reference 1=bench/results/cpu_real_histories/cpu_cifar10_asym40-preset4x-split ...]

writes <out>.md (one row per run beside the paper's CIFAR-10 column) and <out>.png (the
encoder's weighted k-NN accuracy per epoch, one line per run). A label `table4-<variant>-seedN`
is a run with `--set model.seed=N`; `--reference SEED=DIR` adds a Sel-CL run (T_G1_G2) of the
DVC pipeline from its history CSVs (pretrain_history.csv, finetune_history.csv), dashed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# What each variant trains on (selcl/pairs.py): the L_CLS / fine-tuning examples, the pairs.
VARIANTS = {
    "all": ("every example, its noisy label", "all same-noisy-label pairs"),
    "T_G1": ("T (selected)", "G′: same-label pairs within T"),
    "T_G1_G2": ("T (selected)", "G′ ∪ G″ (Sel-CL, the default)"),
    "clean_assoc": ("the truly clean examples (oracle)", "same-label pairs among them"),
    "clean_all_pairs": ("the truly clean examples (oracle)", "all same-noisy-label pairs"),
    "clean_clean": ("every example, its noisy label", "same-clean-label pairs (oracle)"),
}


def _mean_last(values: list, n: int) -> float | None:
    tail = [v for v in values if v is not None][-n:]
    return sum(tail) / len(tail) if tail else None


def load(folder: Path) -> dict[str, dict]:
    """{name: {"result": its results.jsonl line, "history": its per-epoch history}}, name
    `<variant>` or `<variant>-seedN`; the last line of a name wins (a rerun replaces it)."""
    runs = {}
    for line in (folder / "results.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            runs[r["label"].removeprefix("table4-")] = {"result": r}
    for v, run in runs.items():
        path = folder / f"{v}.json"
        run["history"] = json.loads(path.read_text()) if path.exists() else None
    return runs


def reference_row(seed: str, folder: Path, last: int = 5) -> dict:
    """A Sel-CL (T_G1_G2) run of the DVC pipeline, from its history CSVs."""
    from crossover import _csv          # tools/crossover.py: a history CSV's rows, numbers as floats
    pre, ft = _csv((folder / "pretrain_history.csv").read_text()), _csv((folder / "finetune_history.csv").read_text())
    knn = [(int(e["epoch"]), e["knn_top1"]) for e in pre]
    end = pre[-1]
    return {"variant": f"T_G1_G2, DVC preset (model.seed {seed})", "examples": VARIANTS["T_G1_G2"][0],
            "pairs": VARIANTS["T_G1_G2"][1], "pairs_right": end["precision_G"], "knn_last": end["knn_top1"],
            "knn_mean_last": _mean_last([k for _, k in knn], last),
            "selcl_plus": _mean_last([e["test_acc"] for e in ft], 5), "n_examples": end["n_selected"],
            "examples_clean": end["precision_T"], "paper": None, "minutes": None, "knn_by_epoch": knn,
            "reference": True}


def same_label_pair_precision(run: dict) -> float | None:
    """Precision (y_i = y_j) of all ordered same-noisy-label pairs i ≠ j: the positives of
    `all` and `clean_all_pairs`. Rebuilt from the run's config: an image-folder subset loads
    class by class with `subset` images each; trusted only if the rebuilt labels give the
    run's logged realised noise."""
    import numpy as np

    from selcl.noise import labels_from_config
    cfg, r = (run["history"] or {}).get("cfg"), run["result"]
    if not cfg or not cfg["data"].get("subset"):
        return None
    nc, C = cfg["noise"], 10
    y = np.repeat(np.arange(C), cfg["data"]["subset"])
    # runs logged before `noise.generator` existed drew with pcg64
    noisy, _ = labels_from_config(y, C, {"generator": "pcg64", "file": None, "file_key": None, **nc},
                                  cfg["data"]["dataset"])
    if len(y) != r["n_train"] or abs(float(np.mean(noisy != y)) - r["realised_noise"]) > 1e-9:
        return None
    right = total = 0
    for c in range(C):
        counts = np.bincount(y[noisy == c], minlength=C)
        right += int((counts * (counts - 1)).sum())
        total += int(counts.sum() * (counts.sum() - 1))
    return right / total


def rows(runs: dict, paper: dict, last: int = 5) -> list[dict]:
    out = []
    order = {v: i for i, v in enumerate(VARIANTS)}
    names = sorted((n for n in runs if n.split("-seed")[0] in VARIANTS),
                   key=lambda n: (order[n.split("-seed")[0]], n))
    for name in names:
        v = name.split("-seed")[0]
        r, h = runs[name]["result"], runs[name]["history"]
        epochs = [(e["epoch"], e.get("knn_top1")) for e in h["pretrain"]] if h else []
        knn = [k for _, k in epochs]
        n, noise = r["n_train"], r["realised_noise"]
        if v in ("all", "clean_all_pairs"):           # every same-noisy-label pair
            pairs = same_label_pair_precision(runs[name])
        else:
            pairs = {"clean_assoc": 1.0, "clean_clean": 1.0, "T_G1_G2": r.get("precision_G")}.get(v)
        if v in ("T_G1", "T_G1_G2"):
            size, clean = r["n_T"], r["precision_T"]
        elif v.startswith("clean_") and v != "clean_clean":
            size, clean = round(n * (1 - noise)), 1.0
        else:
            size, clean = n, 1 - noise
        seed = name.partition("-seed")[2]
        out.append({"variant": v + (f" (model.seed {seed})" if seed else ""), "examples": VARIANTS[v][0],
                    "pairs": VARIANTS[v][1],
                    "knn_last": r["knn_top1"], "knn_mean_last": _mean_last(knn, last) if knn else None,
                    "selcl_plus": r["selcl_plus_mean_last"], "n_examples": size, "examples_clean": clean,
                    "pairs_right": pairs,
                    "paper": paper.get(v) if not seed else None, "minutes": sum(r["seconds"].values()) / 60,
                    "knn_by_epoch": epochs})
    return out


def markdown(table: list[dict], last: int) -> str:
    head = ["| variant (`pretrain.selected_sets`) | examples (L_CLS, Sel-CL+) | positive pairs | "
            "pairs right (last epoch) | "
            f"encoder k-NN, last epoch | k-NN, mean of last {last} | Sel-CL+ (mean of last 5) | "
            "examples used / right labels | paper (CIFAR-10, k-NN) | minutes |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x, f="{:.2f}": "—" if x is None else f.format(x)  # noqa: E731
    return "\n".join(head + [
        f"| {r['variant']} | {r['examples']} | {r['pairs']} | {fmt(r['pairs_right'], '{:.3f}')} | "
        f"{fmt(r['knn_last'])} | {fmt(r['knn_mean_last'])} | "
        f"{fmt(r['selcl_plus'])} | {int(r['n_examples']):,} / {r['examples_clean']:.3f} | {fmt(r['paper'])} | "
        f"{fmt(r['minutes'], '{:.1f}')} |" for r in table]) + "\n"


def figure(table: list[dict], path: Path, title: str = "Table 4, small") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in table:
        ep, ks = zip(*r["knn_by_epoch"]) if r["knn_by_epoch"] else ((), ())
        ax.plot(ep, ks, label=r["variant"], lw=1.0 if r.get("reference") else 1.4,
                ls="--" if r.get("reference") else "-")
    ax.set_xlabel("global epoch (1 = Uns-CL warm-up)")
    ax.set_ylabel("weighted k-NN top-1 of the encoder (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="results.jsonl and <variant>.json histories")
    ap.add_argument("--out", type=Path, required=True, help="<out>.md and <out>.png")
    ap.add_argument("--last", type=int, default=5, help="epochs averaged for the k-NN column")
    ap.add_argument("--reference", action="append", default=[], metavar="SEED=DIR",
                    help="a DVC run of the preset (T_G1_G2): its history CSVs' folder")
    args = ap.parse_args(argv)
    tables = yaml.safe_load((ROOT / "references" / "paper_tables.yaml").read_text())
    paper = tables["selected_sets_knn"]["cifar10"]
    runs = load(args.folder)
    table = rows(runs, paper, args.last)
    results = [v["result"] for v in runs.values() if v.get("result")]
    what = sorted({f"{r['setting']} ({r['n_train']:,} images)" for r in results if "setting" in r and "n_train" in r})
    title = "Table 4, small" + (": " + ", ".join(what) if what else "")   # from the runs, not assumed
    for i, ref in enumerate(args.reference):
        seed, _, folder = ref.partition("=")
        table.append({**reference_row(seed, Path(folder), args.last), "paper": paper["T_G1_G2"] if i == 0 else None})
    order = list(VARIANTS)
    table.sort(key=lambda r: order.index(r["variant"].split(" ")[0].rstrip(",")))    # stable: runs, then references
    if not table:
        print(f"no runs in {args.folder}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(markdown(table, args.last))
    figure(table, args.out.with_suffix(".png"), title)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
