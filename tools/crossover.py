"""Crossover study: Sel-CL+ and CE of one setting at several budgets, as queued DVC
experiments, then one table and one figure (accuracy against budget, both methods).

    python tools/crossover.py queue cpu_cifar10_asym40 --scales 0.25 0.5 1 2 [--ce-factor F] \\
        [-S 'params/cpu_cifar10_asym40.yaml:data.path=/path/to/cifar10-jpeg.tar.gz'] [--start]
    dvc queue status                       # they run in the background (`dvc queue start`)
    python tools/crossover.py collect cpu_cifar10_asym40 --out bench/results/crossover_asym40 \\
        [--also NAME=SCALE ...]          # other experiments of the setting (e.g. seeds of the preset)
        [--folders DIR=SCALE ...]        # runs of another clone, from the folders --histories wrote
        [--keep bench/results/crossover_asym40.json]   # rows of an earlier collect, markers only
        [--histories bench/results/cpu_real_histories]  # each experiment's CSVs into the tree

A budget is the setting's epochs times a scale: pre-training (after its warm-up),
fine-tuning and CE, with their lr decay epochs and the bootstrapping start scaled alike,
so CE keeps the setting's ratio of epochs to Sel-CL+. Experiment `<setting>-x<scale>`
runs the setting's whole pipeline (`run=[<setting>]`) in its own temporary workspace;
`collect` reads each one's metrics and histories from its experiment commit and DVC's
cache and writes <out>.md (a table) and <out>.png (the figure).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def scaled(cfg: dict, scale: float, ce_factor: float = 1.0) -> dict:
    """{"section.key": value} overrides that scale the setting's budget by `scale`; CE's
    epochs and lr decays by `scale * ce_factor` (ce_factor > 1: CE trained longer than
    the setting's ratio of CE to Sel-CL+ epochs, e.g. to keep an earlier study's ratio)."""
    w = cfg["warmup"]["epochs"]
    pre = max(1, round((cfg["pretrain"]["epochs"] - w) * scale))      # pre-training proper
    ft = max(1, round(cfg["finetune"]["epochs"] * scale))
    ce_scale = scale * ce_factor
    ce = max(1, round(cfg["baseline"]["epochs"] * ce_scale))

    def decays(epochs: list, by: float, new_total: int, offset: int = 0) -> list:
        out = sorted({offset + max(1, round((d - offset) * by)) for d in epochs})
        return [d for d in out if d < new_total]
    return {
        "pretrain.epochs": w + pre,
        "pretrain.lr_decay_epochs": decays(cfg["pretrain"]["lr_decay_epochs"], scale, w + pre, w),
        "finetune.epochs": ft,
        "finetune.bootstrap_start": max(1, min(ft, round(cfg["finetune"]["bootstrap_start"] * scale))),
        "finetune.eval_last": min(cfg["finetune"]["eval_last"], ft),
        "baseline.epochs": ce,
        "baseline.lr_decay_epochs": decays(cfg["baseline"]["lr_decay_epochs"], ce_scale, ce),
        "baseline.eval_last": min(cfg["baseline"]["eval_last"], ce),
    }


def exp_name(setting: str, scale: float, ce_factor: float = 1.0) -> str:
    """`<setting>-x<scale>`, and `-ce<factor>` when CE's budget is scaled apart."""
    return f"{setting}-x{scale:g}" + (f"-ce{ce_factor:g}" if ce_factor != 1.0 else "")


def name_scale(name: str) -> float:
    """The Sel-CL+ scale of an experiment named by `exp_name`."""
    return float(name.rsplit("-x", 1)[1].split("-ce")[0])


def queue(args, extra: list[str]) -> int:
    from selcl.config import load_params, resolve
    cfg = resolve(load_params(ROOT / "params.yaml"), args.setting)
    for scale in args.scales:
        sets = [f"run=[{args.setting}]"]
        for key, value in scaled(cfg, scale, args.ce_factor).items():
            sets.append(f"params/{args.setting}.yaml:{key}=" + json.dumps(value, separators=(",", ":")))
        cmd = ["dvc", "exp", "run", "--queue", "--name", exp_name(args.setting, scale, args.ce_factor)]
        for s in sets:
            cmd += ["-S", s]
        cmd += extra
        print("$ " + " ".join(cmd), flush=True)
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            return 1
    if args.start:
        return subprocess.run(["dvc", "queue", "start", "-j", str(args.jobs)], cwd=ROOT).returncode
    return 0


def _experiments(listing: str | None = None, head: str | None = None) -> dict[str, str]:
    """experiment name → commit, over every baseline (refs/exps/<ab>/<cd…>/<name>). DVC keeps
    a name unique per baseline only: the same name on several baselines takes the current
    commit's, and is refused if that has none (which run is meant is not known)."""
    if listing is None:
        listing = subprocess.run(["git", "for-each-ref", "--format=%(refname) %(objectname)", "refs/exps"],
                                 cwd=ROOT, capture_output=True, text=True, check=True).stdout
    if head is None:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    by_name: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        ref, sha = line.split()
        parts = ref.split("/")                    # refs, exps, ab, cd…, name
        by_name.setdefault(parts[-1], {})["".join(parts[2:-1])] = sha
    found = {}
    for name, on in by_name.items():
        if len(on) == 1:
            found[name] = next(iter(on.values()))
        elif head in on:
            found[name] = on[head]
        else:
            raise SystemExit(f"error: experiment {name} exists on {len(on)} baselines, none of them HEAD: "
                             f"check out the one meant, or `dvc exp remove` the others")
    return found


def _f(x, fmt: str) -> str:
    """A table cell: — for a value the run does not have (a disabled baseline, --no-ce; NaN:
    the precision of an empty T)."""
    return "—" if x is None or x != x else format(x, fmt)


def _read(path: str, rev: str) -> str:
    """A file of experiment `rev`: from git, or from DVC's cache for a cached output."""
    proc = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 0:
        return proc.stdout
    import dvc.api
    return dvc.api.read(path, repo=str(ROOT), rev=rev)


def _csv(text: str) -> list[dict]:
    return [{k: float(v) if v not in ("", None) else None for k, v in row.items()}
            for row in csv.DictReader(io.StringIO(text))]


def keep_earlier(rows: list[dict], earlier: list[dict]) -> list[dict]:
    """`rows` plus the rows of an earlier `collect` (its .json) that no row of this one
    replaces (same name): experiments are git refs of the clone that ran them, so a
    budget measured in another clone survives in the table only through its JSON."""
    names = {r["name"] for r in rows}
    return rows + [dict(r, kept=True) for r in earlier if r["name"] not in names]


_FILES = ("reports/metrics/{s}.json", "runs/{s}/pretrain_history.csv", "runs/{s}/finetune_history.csv",
          "runs/{s}/baseline_history.csv", "runs/{s}/pretrain_timing.csv")


def _experiment_row(s: str, name: str, rev: str, scale: float, source: str, histories: str | None) -> dict:
    """One table row from experiment `name` (commit `rev`) of setting `s`."""
    files = {f: _read(f, rev) for f in (f.format(s=s) for f in _FILES)}
    if histories:            # experiments live in this clone only: keep their numbers in the tree
        keep = Path(histories) / name
        keep.mkdir(parents=True, exist_ok=True)
        for f, text in files.items():
            (keep / Path(f).name).write_text(text)
    return _row(s, name, scale, source, files)


def _folder_row(s: str, folder: str, scale: float) -> dict:
    """One table row from a folder that `--histories` wrote (a run of another clone)."""
    files = {f: (Path(folder) / Path(f).name).read_text() for f in (f.format(s=s) for f in _FILES)}
    return _row(s, Path(folder).name, scale, str(folder), files)


def _row(s: str, name: str, scale: float, source: str, files: dict) -> dict:
    """The row of one run; its epochs are counted from its own histories (warm-up = the
    epochs before pre-training's first row), so no params file is needed."""
    metrics = json.loads(files[f"reports/metrics/{s}.json"])
    pre_hist = _csv(files[f"runs/{s}/pretrain_history.csv"])
    ft_hist = _csv(files[f"runs/{s}/finetune_history.csv"])
    ce_hist = _csv(files[f"runs/{s}/baseline_history.csv"])
    timing = _csv(files[f"runs/{s}/pretrain_timing.csv"])
    warm, last = int(pre_hist[0]["epoch"]) - 1, int(pre_hist[-1]["epoch"])
    return {
        "name": name, "scale": scale, "source": source,
        "epochs": f"{warm} + {last - warm} + {len(ft_hist)} / {len(ce_hist)}",
        "selcl_epochs": last + len(ft_hist),
        "pretrain_min": sum((t.get(k) or 0) for t in timing for k in ("train_s", "select_s", "knn_s")) / 60,
        "selcl_plus": metrics.get("selcl_plus"), "ce": metrics.get("ce"),
        "ce_final": ce_hist[-1]["test_acc"] if ce_hist else None,      # a disabled baseline: no rows
        "ce_best": max(h["test_acc"] for h in ce_hist) if ce_hist else None,
        "precision_T": metrics.get("precision_T"), "recall_T": metrics.get("recall_T"),
        "knn": metrics.get("knn_clean"),
        "precision_T_by_epoch": [round(h["precision_T"], 3) for h in pre_hist if h.get("precision_T") is not None],
    }


def _source(r: dict) -> str:
    """Where a row came from (rows of older collects carry no "source" key)."""
    src = r.get("source") or ("bench/parity_runs.py" if "parity_runs" in r["name"] else "DVC queue")
    return src + (", earlier clone" if r.get("kept") else "")


def collect(args) -> int:
    s = args.setting
    also = [item.partition("=")[::2] for item in args.also]   # other experiments of the setting
    every = _experiments()                                     # (e.g. the shipped preset) at a given scale
    for name, _ in also:
        if name not in every:
            print(f"error: --also {name}: no experiment of that name", file=sys.stderr)
            return 2
    rows = [_experiment_row(s, name, rev, name_scale(name), "DVC queue", args.histories)
            for name, rev in every.items() if name.startswith(s + "-x")]
    rows += [_experiment_row(s, name, every[name], float(scale), "DVC queue, " + name, args.histories)
             for name, scale in also if not name.startswith(s + "-x")]   # those are in already: once each
    for item in args.folders:
        folder, _, scale = item.rpartition("=")
        if not folder or not Path(folder).is_dir():
            print(f"error: --folders {item}: expected DIR=SCALE with an existing DIR", file=sys.stderr)
            return 2
        rows.append(_folder_row(s, folder, float(scale)))
    for path in args.extra:              # same setting run by bench/parity_runs.py (no DVC)
        for line in filter(str.strip, Path(path).read_text().splitlines()):
            r = json.loads(line)
            if r.get("setting") != s or r.get("from_run"):
                continue          # another setting, or a re-fine-tune of a finished run (no budget of its own)
            if r.get("overrides"):
                print(f"crossover: --extra {path}: {r['label']} skipped: it ran with {' '.join(r['overrides'])}, "
                      f"not the setting", file=sys.stderr)
                continue
            e = r["epochs"]
            rows.append({
                "name": f"{s} (parity_runs, {path})", "scale": float(r.get("scale", 1.0)),
                "source": "bench/parity_runs.py",
                "epochs": f"{e['warmup']} + {e['pretrain'] - e['warmup']} + {e['finetune']} / {e['ce']}",
                "selcl_epochs": e["pretrain"] + e["finetune"], "pretrain_min": r["seconds"]["warmup+pretrain"] / 60,
                "selcl_plus": r["selcl_plus_mean_last"], "ce": r["ce_mean_last"], "ce_final": r["ce_final"],
                "ce_best": r["ce_best"], "precision_T": r["precision_T"], "recall_T": r["recall_T"],
                "knn": r["knn_top1"], "precision_T_by_epoch": r.get("precision_T_by_epoch", []),
            })
    for path in args.keep:
        rows = keep_earlier(rows, json.loads(Path(path).read_text()))
    if not rows:
        print(f"error: no experiment named {s}-x<scale> (run `tools/crossover.py queue {s}` first)", file=sys.stderr)
        return 2
    rows.sort(key=lambda r: r["scale"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# Crossover: {s}", "",
             "Budget = the setting's epochs × scale (warm-up + pre-training + fine-tuning / CE), scaled from "
             "the setting as it was when the experiment was queued: the epochs column is what ran. "
             "Sel-CL+ = mean of the last fine-tuning epochs; CE = mean of its last epochs, its final and best epoch.",
             "", "| scale | epochs | pre-training (min) | Sel-CL+ | CE | CE final | CE best | Sel-CL+ − CE | "
             "precision of T | recall of T | k-NN | source |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        source = _source(r)
        gap = None if r["selcl_plus"] is None or r["ce"] is None else r["selcl_plus"] - r["ce"]
        lines.append(f"| {r['scale']:g} | {r['epochs']} | {r['pretrain_min']:.1f} | {_f(r['selcl_plus'], '.2f')} | "
                     f"{_f(r['ce'], '.2f')} | {_f(r['ce_final'], '.2f')} | {_f(r['ce_best'], '.2f')} | {_f(gap, '+.2f')} | "
                     f"{_f(r['precision_T'], '.3f')} | {_f(r['recall_T'], '.3f')} | {_f(r['knn'], '.2f')} | {source} |")
    lines += ["", "Precision of T by pre-training epoch (its first, every 10th, its last):", ""]
    for r in rows:
        p = r["precision_T_by_epoch"]
        shown = [p[i] for i in range(len(p)) if i == 0 or (i + 1) % 10 == 0 or i == len(p) - 1]
        lines.append(f"* ×{r['scale']:g} ({_source(r)}): {', '.join(map(str, shown))}")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    budgets, mean, others = figure_points(rows)
    ax.plot(budgets, mean["selcl_plus"], "o-", color="C0", label="Sel-CL+")
    ax.plot(budgets, mean["ce"], "s-", color="C1", label="CE (mean of last)")
    ax.plot(budgets, mean["ce_best"], "s:", color="C1", alpha=0.5, label="CE best epoch")
    if others["selcl_plus"]:
        ax.plot(*zip(*others["selcl_plus"]), "o", mfc="none", color="C0", alpha=0.6, label="single runs")
    if others["ce"]:
        ax.plot(*zip(*others["ce"]), "s", mfc="none", color="C1", alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("budget: Sel-CL+ epochs in all (CE epochs: the table)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{s}: accuracy against budget", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.png')}")
    return 0


def _ce_epochs(r: dict) -> int:
    return int(r["epochs"].rpartition("/")[2])


def figure_points(rows: list[dict]) -> tuple[list, dict, dict]:
    """The figure's lines and markers. Lines join each budget's mean over this collect's runs
    (experiments, --also, --folders, --extra); at a budget whose runs trained CE for
    different numbers of epochs (a `--ce-factor` queue beside the plain one), the CE line
    takes the CE epochs most of them ran (a tie: the longer CE) and the others are markers
    only, so no CE mean mixes two budgets. Every run is also a hollow marker where a budget
    has several, and rows kept from an earlier collect (--keep: other code, other clone) are
    markers only. Returns budgets (Sel-CL+ epochs), {key: mean per budget} and
    {"selcl_plus" / "ce": [(budget, value)] markers}; a missing value is left out."""
    fresh = [r for r in rows if not r.get("kept")] or rows
    budgets = sorted({r["selcl_epochs"] for r in fresh})
    at = {b: [r for r in fresh if r["selcl_epochs"] == b] for b in budgets}

    def _mean(vals):
        vals = [v for v in vals if v is not None]
        return sum(vals) / len(vals) if vals else float("nan")

    ce_line = {}                  # budget -> its runs of the CE epochs most of them ran
    for b in budgets:
        counts = Counter(_ce_epochs(r) for r in at[b])
        keep = max(counts, key=lambda e: (counts[e], e))
        ce_line[b] = [r for r in at[b] if _ce_epochs(r) == keep]

    mean = {"selcl_plus": [_mean(r["selcl_plus"] for r in at[b]) for b in budgets]}
    for k in ("ce", "ce_best"):
        mean[k] = [_mean(r[k] for r in ce_line[b]) for b in budgets]
    others = {"selcl_plus": [], "ce": []}
    for r in rows:
        several = r.get("kept") or len(at.get(r["selcl_epochs"], [])) > 1
        on_line = not r.get("kept") and any(r is x for x in ce_line[r["selcl_epochs"]])
        if several and r["selcl_plus"] is not None:
            others["selcl_plus"].append((r["selcl_epochs"], r["selcl_plus"]))
        if (several or not on_line) and r["ce"] is not None:
            others["ce"].append((r["selcl_epochs"], r["ce"]))
    return budgets, mean, others


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("queue", help="queue one experiment per scale (extra args go to `dvc exp run`)")
    q.add_argument("setting")
    q.add_argument("--scales", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0])
    q.add_argument("--ce-factor", type=float, default=1.0,
                   help="CE's epochs scale by scale × this (default 1: the setting's ratio to Sel-CL+)")
    q.add_argument("--start", action="store_true", help="then `dvc queue start`")
    q.add_argument("--jobs", type=int, default=1, help="workers for --start (default 1: 2 cores)")
    c = sub.add_parser("collect", help="table + figure from the finished experiments")
    c.add_argument("setting")
    c.add_argument("--out", required=True, help="path without suffix: writes .md, .json, .png")
    c.add_argument("--extra", nargs="*", default=[],
                   help="JSON-lines files of bench/parity_runs.py: their rows for this setting join the table")
    c.add_argument("--histories", help="folder: each experiment's metrics and per-epoch CSVs go to <folder>/<name>/")
    c.add_argument("--also", nargs="*", default=[], metavar="NAME=SCALE",
                   help="other experiments of the setting (any name), drawn as other runs at SCALE")
    c.add_argument("--folders", nargs="*", default=[], metavar="DIR=SCALE",
                   help="runs of another clone, from the folders --histories wrote, at SCALE")
    c.add_argument("--keep", nargs="*", default=[],
                   help="JSON of an earlier collect: its rows join the table unless an experiment replaces them")
    args, extra = ap.parse_known_args(argv)
    if args.cmd == "collect" and extra:
        ap.error(f"unknown arguments: {' '.join(extra)}")
    return queue(args, extra) if args.cmd == "queue" else collect(args)


if __name__ == "__main__":
    sys.exit(main())
