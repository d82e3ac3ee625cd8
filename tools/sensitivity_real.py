"""The supplement's α/β sensitivity (CIFAR-10: Sel-CL+ against one fractile, the other at
the paper's value) on real images, small: `bench/parity_runs.py` runs of a CPU preset that
differ only in `pretrain.alpha` or `pretrain.beta`. What made `sensitivity_asym40.*`:

    H=bench/results/cpu_real_histories
    for run in alpha:0.75:1 alpha:0.25:1 alpha:0.75:2 alpha:0.75:3 beta:0.5:1 beta:0:1 beta:0:2 beta:0:3; do  # fractile:value:seed
      IFS=: read k v s <<< "$run"
      python bench/parity_runs.py --setting cpu_cifar10_asym40 --path data/cifar10-jpeg.tar.gz \\
        --label $k$v-seed$s --set model.seed=$s --set pretrain.$k=$v --no-ce \\
        --history $H/${k}_sweep/$k$v-seed$s.json >> $H/${k}_sweep/results.jsonl
    done
    python tools/sensitivity_real.py $H/alpha_sweep/alpha*.json $H/beta_sweep/beta*.json \\
        $H/table4_shipped/selcl-seed1-xeon.json \\
        --reference 2=$H/cpu_cifar10_asym40-keeplast-seed2 --reference 3=$H/cpu_cifar10_asym40-keeplast-seed3 \\
        --out bench/results/sensitivity_asym40

(the rows at both paper values: seed 1 from the Table 4 rerun on the same host, seeds 2 and 3 the
preset's DVC runs.) `sensitivity_sym50.*` is the same for `cpu_cifar10_sym50` (α = 0.75
(seeds 2 and 3) and β = 0 (seeds 2 and 3): `alpha_sweep_sym50/sym50-alpha0.75-seed{2,3}.json`,
`beta_sweep_sym50/sym50-beta0-seed{2,3}.json`), with the preset's DVC runs of seeds 2 and 3 as
references; symmetric runs are set beside the supplement's sym20 curve.

Each positional file is one run's `--history` JSON (its resolved config, its per-epoch
pre-training and fine-tuning history); α and β are read from its config, not its name. Its
wall-clock minutes come from the line of the `results.jsonl` beside it whose label is the
file's name (or `table4-` + it), where there is one. `--reference SEED=DIR` adds a DVC run
of the preset (the paper's α and β) from its history CSVs. Writes <out>.md (one row per run,
beside the paper's Sel-CL+ at that fractile) and <out>.png (accuracy against the fractile;
|T| and the precision of T per epoch).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from crossover import _csv            # tools/: a history CSV's rows, numbers as floats
from table4_real import _mean_last   # the mean of a list's last n values (None skipped)

ROOT = Path(__file__).resolve().parents[1]
PAPER_DEFAULT = {"alpha": 0.5, "beta": 0.25}      # Table 1, CIFAR-10 sym and asym alike
# the supplement's curve for each kind of noise: asym40, and sym20 (its only symmetric rate)
PAPER_CURVE = {"asym": "asym40", "sym": "sym20"}
SYMBOL = {"alpha": "α", "beta": "β"}


def _minutes(path: Path) -> float | None:
    results = path.parent / "results.jsonl"
    if not results.exists():
        return None
    found = None
    for line in results.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if r.get("label") in (path.stem, f"table4-{path.stem}"):
                found = r                                     # the last line of a label wins
    return sum(found["seconds"].values()) / 60 if found else None


def _summary(pre: list[dict], ft: list[dict], last: int) -> dict:
    """The columns a pre-training history (its last epoch, its k-NN) and a fine-tuning
    history (Sel-CL+, mean of the last 5) give, for a parity_runs JSON or a DVC run's CSVs."""
    end = pre[-1]
    return {"n_per_class": end.get("n_per_class"), "n_T": end["n_selected"], "precision_T": end["precision_T"],
            "recall_T": end.get("recall_T"), "precision_G": end.get("precision_G"), "gamma": end.get("threshold"),
            "knn_last": end["knn_top1"], "knn_mean_last": _mean_last([e["knn_top1"] for e in pre], last),
            "selcl_plus": _mean_last([e["test_acc"] for e in ft], 5),
            "by_epoch": [(int(e["epoch"]), e["n_selected"], e["precision_T"]) for e in pre]}


def row(path: Path, last: int = 5) -> dict:
    """One run: which fractile it moves (None: both at the paper's values), its final
    selection, its encoder's k-NN and its Sel-CL+."""
    h = json.loads(path.read_text())
    pc = h["cfg"]["pretrain"]
    moved = [k for k in PAPER_DEFAULT if abs(pc[k] - PAPER_DEFAULT[k]) > 1e-12]
    if len(moved) > 1:
        raise SystemExit(f"sensitivity_real: {path}: α and β both differ from the paper's values")
    return {"name": path.stem, "moved": moved[0] if moved else None, "alpha": pc["alpha"], "beta": pc["beta"],
            "seed": h["cfg"]["model"]["seed"], "minutes": _minutes(path), "setting": h["cfg"].get("name"),
            "noise": h["cfg"].get("noise", {}).get("kind", "asym"), "rate": h["cfg"].get("noise", {}).get("rate"),
            **_summary(h["pretrain"], h.get("finetune") or [], last)}


def reference_row(seed: str, folder: Path, last: int = 5) -> dict:
    """A DVC run of the preset at the paper's fractiles, from its history CSVs."""
    pre, ft = _csv((folder / "pretrain_history.csv").read_text()), _csv((folder / "finetune_history.csv").read_text())
    return {"name": folder.name, "moved": None, **PAPER_DEFAULT, "seed": int(seed), "minutes": None,
            **_summary(pre, ft, last)}


def paper_value(r: dict, paper: dict, fractile: str) -> float | None:
    """The supplement's Sel-CL+ at this run's value of `fractile` (the other at default)."""
    if r["moved"] not in (None, fractile):
        return None
    values = paper["values"]
    v = r[fractile]
    hit = [i for i, x in enumerate(values) if abs(x - v) < 1e-9]
    return paper[fractile][hit[0]] if hit else None


def markdown(table: list[dict], paper: dict, last: int, curve: str = "asym40") -> str:
    head = ["| α | β | seed | n_sel | T: size / right labels / recall of the clean | pairs G right | γ | "
            f"encoder k-NN, last / mean of last {last} | Sel-CL+ (mean of last 5) | "
            f"paper Sel-CL+, {curve} (α / β row) | "
            "minutes |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x, f="{:.2f}": "—" if x is None else f.format(x)  # noqa: E731
    out = []
    for r in table:
        pa, pb = paper_value(r, paper, "alpha"), paper_value(r, paper, "beta")
        ref = " / ".join(fmt(p, "{:.1f}") for p in (pa, pb) if p is not None) or "—"
        bold = lambda s, k: f"**{s}**" if r["moved"] == k else s  # noqa: E731
        out.append(f"| {bold(fmt(r['alpha']), 'alpha')} | {bold(fmt(r['beta']), 'beta')} | {r['seed']} | "
                   f"{fmt(r['n_per_class'], '{:.0f}')} | {int(r['n_T']):,} / {r['precision_T']:.3f} / "
                   f"{fmt(r['recall_T'], '{:.3f}')} | {fmt(r['precision_G'], '{:.3f}')} | "
                   f"{fmt(r['gamma'], '{:.3f}')} | {fmt(r['knn_last'])} / {fmt(r['knn_mean_last'])} | "
                   f"{fmt(r['selcl_plus'])} | {ref} | {fmt(r['minutes'], '{:.1f}')} |")
    return "\n".join(head + out) + "\n"


def figure(table: list[dict], paper: dict, path: Path, curve: str = "asym40", title: str = "") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax_n, ax_p) = plt.subplots(1, 3, figsize=(13, 4.8))
    ax_paper = ax.twinx()            # the paper's full-scale numbers on their own scale
    for k, marker in (("alpha", "o"), ("beta", "s")):
        runs = [r for r in table if r["moved"] in (None, k)]
        if not any(r["moved"] == k for r in runs):
            continue
        for key, ls, what in (("selcl_plus", "-", "Sel-CL+"), ("knn_last", ":", "encoder k-NN")):
            have = [r for r in runs if r[key] is not None]      # a run without fine-tuning: no Sel-CL+
            xs = sorted({r[k] for r in have})
            means = [sum(r[key] for r in have if r[k] == x) / sum(r[k] == x for r in have) for x in xs]
            line, = ax.plot(xs, means, marker=marker, ls=ls, label=f"{what} against {SYMBOL[k]} (ours, mean of seeds)")
            ax.scatter([r[k] for r in have], [r[key] for r in have], s=12, color=line.get_color(), alpha=0.6)
        ax_paper.plot(paper["values"], paper[k], marker=marker, ls="--", color="grey", alpha=0.7,
                      label=f"paper Sel-CL+ against {SYMBOL[k]} (full CIFAR-10 {curve}, right axis)")
    ax.set_xlabel("fractile (the other at the paper's value)")
    ax.set_ylabel("test accuracy, ours (%; dots: single seeds)")
    ax_paper.set_ylabel("paper's Sel-CL+ (%)", color="grey")
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()[0] + ax_paper.get_legend_handles_labels()[0]
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    for r in sorted(table, key=lambda r: (r["alpha"], r["beta"], r["seed"])):
        ep, n, prec = zip(*r["by_epoch"])
        label = f"α={r['alpha']:g} β={r['beta']:g} seed {r['seed']}"
        ax_n.plot(ep, n, label=label, lw=1.0)
        ax_p.plot(ep, prec, label=label, lw=1.0)
    ax_n.set_ylabel("|T|")
    ax_p.set_ylabel("precision of T (right labels)")
    for a in (ax_n, ax_p):
        a.set_xlabel("global epoch (1 = Uns-CL warm-up)")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle(f"Fractile sensitivity on real images, small: {title or 'CIFAR-10'}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("histories", type=Path, nargs="+", help="parity_runs --history files, one per run")
    ap.add_argument("--out", type=Path, required=True, help="<out>.md and <out>.png")
    ap.add_argument("--last", type=int, default=5, help="epochs averaged for the k-NN column")
    ap.add_argument("--reference", action="append", default=[], metavar="SEED=DIR",
                    help="a DVC run of the preset (the paper's α and β): its history CSVs' folder")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.histories if not p.is_file()]
    if missing:
        print(f"sensitivity_real: no such history file: {', '.join(missing)}", file=sys.stderr)
        return 1
    runs = [row(p, args.last) for p in args.histories]
    kinds = {(r["setting"], r["noise"], r["rate"]) for r in runs}
    if len(kinds) > 1:
        print(f"sensitivity_real: the runs are of different settings: {sorted(map(str, kinds))}", file=sys.stderr)
        return 1
    (setting, noise, rate), = kinds
    curve = PAPER_CURVE[noise]
    paper = yaml.safe_load((ROOT / "references" / "paper_tables.yaml").read_text())["sensitivity_cifar10"][curve]
    refs = []
    for ref in args.reference:
        seed, _, folder = ref.partition("=")
        refs.append(reference_row(seed, Path(folder), args.last))
    table = sorted(runs + refs,
                   key=lambda r: (r["moved"] or "", r["alpha"], r["beta"], r["seed"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(markdown(table, paper, args.last, curve))
    title = f"{setting}, {rate:.0%} {noise} noise" if setting and rate is not None else setting
    figure(table, paper, args.out.with_suffix(".png"), curve, title)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
