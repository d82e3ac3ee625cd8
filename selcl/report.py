"""The markdown report: our numbers beside the paper's, with figures.

Reads the per-setting outputs under runs/<setting>/ and the published numbers in
references/paper_tables.yaml; writes reports/README.md, reports/figures/*.png and
reports/metrics.json (headline metrics, which `dvc exp show` lists).
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import yaml

from .checkpoint import atomic_path, atomic_write_text, write_json

PAPER_SETTING_NAMES = {"sym": "sym", "asym": "asym"}


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    return [{k: _num(v) for k, v in r.items()} for r in rows]


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def _fmt(v, digits=2):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.{digits}f}"


def paper_numbers(tables: dict, cfg: dict) -> dict:
    """Published Sel-CL+ / CE test accuracy and Sel-CL kNN for a setting, when the paper has them."""
    ds, kind = cfg["data"]["dataset"], cfg["noise"]["kind"]
    rate = int(round(cfg["noise"]["rate"] * 100))
    out = {}
    if ds in ("cifar10", "cifar100") and kind in ("sym", "asym"):
        out["selcl_plus"] = tables["test_accuracy"]["Sel-CL+"].get(ds, {}).get(kind, {}).get(rate)
        out["ce"] = tables["test_accuracy"]["Cross-Entropy"].get(ds, {}).get(kind, {}).get(rate)
    if ds == "cifar100":
        knn = tables["knn_cifar100"]["Sel-CL"]
        out["knn"] = knn["clean"] if kind == "none" else knn.get(kind, {}).get(rate)
    return out


def _plot_learning(name: str, hist: list[dict], ft: list[dict], bl: list[dict], path: Path) -> None:
    """The paper's Fig. 3 learning-process panels for one setting."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ep = [h["epoch"] for h in hist]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
    panels = [("precision_T", "recall_T", "(a) confident examples T", "precision / recall"),
              ("n_selected", None, "(b) |T|", "examples"),
              ("precision_G", None, "(c) confident pairs G", "pair precision"),
              ("knn_top1", None, "(d) weighted k-NN test accuracy", "%")]
    for ax, (a, b, title, ylabel) in zip(axes, panels):
        if hist and a in hist[0]:
            ax.plot(ep, [h[a] for h in hist], label=a)
        if b and hist and b in hist[0]:
            ax.plot(ep, [h[b] for h in hist], label=b)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("pre-training epoch")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if b:
            ax.legend(fontsize=8)
    fig.suptitle(name, fontsize=11)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
    if ft or bl:
        fig, ax = plt.subplots(figsize=(5.5, 3.4))
        if ft:
            ax.plot([h["epoch"] for h in ft], [h["test_acc"] for h in ft], label="Sel-CL+ fine-tuning")
        if bl:
            ax.plot([h["epoch"] for h in bl], [h["test_acc"] for h in bl], label="CE baseline")
        ax.set_xlabel("epoch")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{name}: test accuracy", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        with atomic_path(path.with_name(path.stem.replace("learning", "accuracy") + ".png")) as tmp:
            fig.savefig(tmp, format="png", dpi=90)
        plt.close(fig)


def _plot_transition(name: str, T: np.ndarray, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    im = ax.imshow(T, vmin=0, vmax=1, cmap="viridis")
    ax.set_xlabel("noisy label")
    ax.set_ylabel("clean label")
    ax.set_title(f"{name}: noise transition", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)


def _plot_tsne(name: str, xy: np.ndarray, labels: np.ndarray, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(4.2, 4.0))
    ax.scatter(xy[:, 0], xy[:, 1], c=labels, s=4, cmap="tab10" if labels.max() < 10 else "nipy_spectral")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{name}: t-SNE of Sel-CL test embeddings", fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)


def build_report(run: list[str], configs: dict[str, dict], runs_dir: Path, tables: dict,
                 out_dir: Path) -> dict:
    """Write reports/README.md, figures and metrics.json; return the metrics."""
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    rows, knn_rows, sel_rows, figs, metrics, envs = [], [], [], [], {}, {}
    for name in run:
        cfg, d = configs[name], runs_dir / name
        ft, bl = _read_json(d / "finetune.json"), _read_json(d / "baseline.json")
        ev, pre, noise = _read_json(d / "evaluate.json"), _read_json(d / "pretrain.json"), _read_json(d / "noise.json")
        paper = paper_numbers(tables, cfg)
        ours = ft.get("test_acc_mean_last")
        ce = bl.get("test_acc_mean_last") if bl.get("enabled", True) else None
        diff = ours - paper["selcl_plus"] if ours is not None and paper.get("selcl_plus") is not None else None
        rows.append(f"| {name} | {cfg['data']['dataset']} | {cfg['noise']['kind']} {cfg['noise']['rate']:.2f} | "
                    f"{_fmt(noise.get('realised_noise_rate'), 3)} | **{_fmt(ours)}** | {_fmt(ft.get('test_acc_last'))} | "
                    f"{_fmt(ce)} | {_fmt(paper.get('selcl_plus'), 1)} | "
                    f"{'—' if diff is None else f'{diff:+.2f}'} | {_fmt(paper.get('ce'), 1)} |")
        knn_rows.append(f"| {name} | {_fmt(ev.get('knn_clean_top1'))} | {_fmt(ev.get('knn_clean_top5'))} | "
                        f"{_fmt(ev.get('knn_noisy_top1'))} | {_fmt(ev.get('knn_noisy_top5'))} | "
                        f"{_fmt(paper.get('knn'))} |")
        sel_rows.append(f"| {name} | {int(pre['n_selected']) if 'n_selected' in pre else '—'} | "
                        f"{_fmt(pre.get('precision_T'), 3)} | {_fmt(pre.get('recall_T'), 3)} | "
                        f"{_fmt(pre.get('precision_G'), 3)} | {_fmt(pre.get('threshold'), 3)} | "
                        f"{int(pre['n_per_class']) if 'n_per_class' in pre else '—'} |")
        if "env" in pre:
            envs[name] = pre["env"]
        hist = _read_csv(d / "pretrain_history.csv")
        ft_hist, bl_hist = _read_csv(d / "finetune_history.csv"), _read_csv(d / "baseline_history.csv")
        _plot_learning(name, hist, ft_hist, bl_hist, fig_dir / f"{name}_learning.png")
        section = [f"### {name}", "", f"![learning process]({'figures/' + name + '_learning.png'})", ""]
        if ft_hist or bl_hist:
            section += [f"![test accuracy](figures/{name}_accuracy.png)", ""]
        if (d / "labels.npz").exists():
            with np.load(d / "labels.npz") as f:
                _plot_transition(name, f["transition"], fig_dir / f"{name}_transition.png")
            section += [f"![noise transition](figures/{name}_transition.png)"]
        if (d / "tsne.npz").exists():
            with np.load(d / "tsne.npz") as f:
                if len(f["xy"]):
                    _plot_tsne(name, f["xy"], f["labels"], fig_dir / f"{name}_tsne.png")
                    section += [f"![t-SNE](figures/{name}_tsne.png)"]
        figs += section + [""]
        metrics[name] = {k: v for k, v in {
            "selcl_plus_test_acc": ours, "selcl_plus_test_acc_final": ft.get("test_acc_last"),
            "ce_test_acc": ce, "knn_clean_top1": ev.get("knn_clean_top1"),
            "knn_noisy_top1": ev.get("knn_noisy_top1"), "precision_T": pre.get("precision_T"),
            "realised_noise_rate": noise.get("realised_noise_rate")}.items() if v is not None}

    md = ["# Sel-CL / Sel-CL+ reproduction report", "",
          "Generated by `stages/report.py` from `runs/<setting>/`; published numbers from "
          "`references/paper_tables.yaml` (Li et al., CVPR 2022). Accuracies in percent.", "",
          "## Test accuracy (paper Table 3)", "",
          "Sel-CL+ = mean test accuracy over the last `finetune.eval_last` epochs, as the paper; "
          "*final* = last epoch. CE = our cross-entropy baseline on the same labels and network.", "",
          "| setting | dataset | noise | realised rate | Sel-CL+ | final | CE (ours) | Sel-CL+ (paper) | Δ vs paper | CE (paper) |",
          "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
          "## Weighted k-NN of the Sel-CL encoder (paper Table 2)", "",
          "K and σ from `evaluate`. *clean*: the paper's protocol (clean training labels); "
          "*noisy*: the noisy training labels a practitioner has.", "",
          "| setting | clean top-1 | clean top-5 | noisy top-1 | noisy top-5 | paper (clean) |",
          "|---|---|---|---|---|---|", *knn_rows, "",
          "## Final selection (last pre-training epoch)", "",
          "| setting | \\|T\\| | precision of T | recall of T | precision of G | γ | n_sel |",
          "|---|---|---|---|---|---|---|", *sel_rows, "",
          "## Learning process (paper Fig. 3), noise, embeddings", "", *figs]
    if envs:
        md += ["## Environment", "", "| setting | device | torch | CUDA | faiss |", "|---|---|---|---|---|"]
        md += [f"| {n} | {e.get('gpu', e.get('device'))} | {e.get('torch')} | {e.get('cuda')} | {e.get('faiss')} |"
               for n, e in envs.items()]
        md += [""]
    md += ["## Deviations from the paper", "",
           "See the README section *Faithfulness*: every place where this implementation decides "
           "something the paper leaves open, or differs from the authors' code, is listed there.", ""]
    atomic_write_text(out_dir / "README.md", "\n".join(md))
    write_json(out_dir / "metrics.json", metrics)
    return metrics


def load_tables(path: Path) -> dict:
    return yaml.safe_load(Path(path).read_text())
