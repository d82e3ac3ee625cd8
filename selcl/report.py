"""The markdown report: our numbers beside the paper's, with figures.

Reads the per-setting outputs under runs/<setting>/ (the resolved params included:
runs/<setting>/config/params.json) and the published numbers in
references/paper_tables.yaml; writes reports/README.md, reports/figures/*.png, the
metrics `dvc exp show` lists (reports/metrics/<setting>.json, numbers only, and the
summary reports/metrics.json) and plots/accuracy/<setting>.csv (Sel-CL+ vs CE by
training epoch, a top-level DVC plot).

Every accuracy is printed with its budget (epochs of warm-up, pre-training and
fine-tuning; CE epochs), so a short run is never read as the paper's.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import yaml

from .atomic import atomic_path, atomic_write_text, write_json
from .label_issues import report_section as label_issues_section

PAPER_SETTING_NAMES = {"sym": "sym", "asym": "asym"}


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    return [{k: _num(v) for k, v in r.items()} for r in rows]


def best_knn_cell(hist: list[dict]) -> str:
    """The highest per-epoch weighted k-NN top-1 (clean labels) of a pre-training history
    and its epoch, "93.10 (epoch 187)"; "—" without one. A tie keeps the later epoch, as the
    authors' `if acc >= best_acc`."""
    rows = [r for r in hist if isinstance(r.get("knn_top1"), float) and math.isfinite(r["knn_top1"])]
    if not rows:
        return "—"
    best = max(reversed(rows), key=lambda r: r["knn_top1"])   # max keeps the first: reversed → latest
    return f"{_fmt(best['knn_top1'])} (epoch {int(best['epoch'])})"


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
        out["mixup"] = tables["test_accuracy"]["Mixup"].get(ds, {}).get(kind, {}).get(rate)
    if ds == "cifar100":
        knn = tables["knn_cifar100"]["Sel-CL"]
        out["knn"] = knn["clean"] if kind == "none" else knn.get(kind, {}).get(rate)
    return out


DPI = 150                      # every figure: readable when the report is viewed at full size

# what a figure's legend calls a history column (the column names stay the metric keys)
LABELS = {"precision_T": "precision of T (vs true labels)", "recall_T": "recall of T",
          "n_selected": "|T|", "precision_G": "precision of G (vs true labels)",
          "knn_top1": "weighted k-NN of the encoder (clean train labels)",
          "test_acc": "Sel-CL's classifier (L_CLS head)"}


def _integer_epochs(ax) -> None:
    """Epochs are whole numbers: no 2.5 or 7.5 on an epoch axis."""
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _plot_learning(name: str, hist: list[dict], ft: list[dict], bl: list[dict], budget: dict,
                   path: Path) -> None:
    """The paper's Fig. 3 learning-process panels for one setting (2 × 2, so no title is cut)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ep = [h["epoch"] for h in hist]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = [("precision_T", "recall_T", "(a) confident examples T: precision and recall", "fraction"),
              ("n_selected", None, "(b) size of T", "examples"),
              ("precision_G", None, "(c) confident pairs G: precision", "fraction of pairs"),
              ("knn_top1", "test_acc", "(d) test accuracy during pre-training", "test accuracy (%)")]
    for ax, (a, b, title, ylabel) in zip(axes.flat, panels):
        if hist and a in hist[0]:
            ax.plot(ep, [h[a] for h in hist], label=LABELS[a])
        if b and hist and b in hist[0]:
            ax.plot(ep, [h[b] for h in hist], label=LABELS[b])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("pre-training epoch")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        _integer_epochs(ax)
        if b and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"{name}: Sel-CL's learning process (paper Fig. 3)", fontsize=11)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    plt.close(fig)
    _plot_accuracy(name, ft, bl, budget, path.with_name(path.stem.replace("learning", "accuracy") + ".png"))


def _plot_accuracy(name: str, ft: list[dict], bl: list[dict], budget: dict, path: Path) -> None:
    """Sel-CL+ and CE on separate axes, each with its own epochs: Sel-CL+ fine-tuning
    starts from a pre-trained encoder, CE from scratch, so one x-axis would mislead."""
    if not (ft or bl):
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    w, p = budget["warmup"], budget["pretrain"]
    for ax, hist, label, xlabel in (
            (axes[0], ft, "Sel-CL+", f"fine-tuning epoch (after {w} warm-up + {p} pre-training epochs)"),
            (axes[1], bl, f"{budget.get('baseline', 'CE')} baseline", "baseline epoch (from scratch)")):
        if hist:
            ax.plot([h["epoch"] for h in hist], [h["test_acc"] for h in hist], label=label)
        ax.set_title(f"{label}: {len(hist)} epochs", fontsize=10)
        ax.set_xlabel(xlabel, fontsize=9)
        ax.grid(alpha=0.3)
        _integer_epochs(ax)
    axes[0].set_ylabel("test accuracy (%)")
    fig.suptitle(f"{name}: test accuracy by epoch", fontsize=11)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
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
        fig.savefig(tmp, format="png", dpi=DPI)
    plt.close(fig)


def _plot_tsne(name: str, xy: np.ndarray, labels: np.ndarray, classes: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    cmap = plt.get_cmap("tab10" if labels.max() < 10 else "nipy_spectral")
    present = sorted(set(int(v) for v in labels))
    for c in present:
        pick = labels == c
        ax.scatter(xy[pick, 0], xy[pick, 1], s=4, color=cmap(c / max(1, max(present)) if len(present) > 10 else c),
                   label=str(classes[c]) if c < len(classes) else str(c))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{name}: t-SNE of Sel-CL test embeddings (colour: true class)", fontsize=9)
    if len(present) <= 20:       # CIFAR-100's 100 classes: a legend would hide the plot
        ax.legend(fontsize=6, markerscale=3, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    plt.close(fig)


TABLE6_SWITCHES = {"mixup": "no_mixup", "memory": "no_memory_queue", "selection": "no_selection",
                   "classifier": "no_classifier", "sim_loss": "no_sim_loss"}

# The configuration behind the paper's CIFAR numbers (SPEC §1-§8 with §10; the authors' run
# scripts), in every key a run's numbers depend on. A run is compared with a published
# number only where it matches this; α and β come from Table 1 (`fractiles`), the memory
# size by dataset. tests/test_report.py checks that the paper suite of params.yaml resolves
# to it and that every param is either here or in PAPER_IGNORED.
PAPER_CIFAR = {
    "data": {"subset": None, "subset_test": None, "image_size": None, "crop": None, "crop_scale": [0.08, 1.0]},
    "noise": {"include_true_class": True, "asym_map": "auto"},
    "model": {"arch": "preact_resnet18", "proj_dim": 128, "bn_replicas": 1},   # one GPU
    "warmup": {"method": "uns_cl", "epochs": 1, "temperature": 0.1, "queue_size": 10000, "ema": 0.999},
    "pretrain": {"epochs": 250, "batch_size": 128, "lr": 0.1, "lr_warmup_epochs": 5, "lr_decay_epochs": [125, 200],
                 "lr_decay": 0.1, "momentum": 0.9, "weight_decay": 0.0001, "temperature": 0.1, "ema": 0.999,
                 "memory_start_epoch": 4, "lambda_cls": 1.0, "lambda_sim": 0.01, "k": 250,
                 "knn_weighting": "uniform", "knn_index": "flat", "pseudo_labels": True,
                 "selection_version": "v1", "mixup": True, "memory": True,
                 "selection": True, "classifier": True, "sim_loss": True, "sim_grad_clip": 0.25,
                 "grad_clip": None, "selected_sets": "T_G1_G2", "drop_last": False},
    "finetune": {"epochs": 70, "batch_size": 128, "lr": 0.001, "momentum": 0.9, "weight_decay": 0.0001,
                 "mixup_alpha": 1.0, "bootstrap": 0.2, "bootstrap_start": 30, "augment": "weak",
                 "reinit_classifier": True, "eval_last": 10, "drop_last": False},
    "evaluate": {"k": 200, "sigma": 0.1},
}
PAPER_QUEUE_PER_CLASS = {"cifar10": 1000, "cifar100": 100}
# WebVision-50 (paper Table 5): the CIFAR configuration with the changes of SPEC §10.4 and
# the authors' WebVision-50 scripts; α and β from Table 1. A run is read as WebVision-50
# when it trains on a 50-class image folder with its labels as given (noise kind none).
PAPER_WEBVISION_CHANGES = {
    "data": {"image_size": 256, "crop": 224, "crop_scale": [0.2, 1.0]},
    "model": {"arch": "resnet18", "bn_replicas": 4},   # nn.DataParallel over four GPUs
    "warmup": {"epochs": 5},
    "pretrain": {"epochs": 130, "batch_size": 64, "lr_decay_epochs": [80, 105], "queue_per_class": 200,
                 "sim_grad_clip": None, "grad_clip": 1.0},      # their WebVision step's one clip
    "finetune": {"epochs": 50, "batch_size": 64, "bootstrap_start": 20},
}
WEBVISION_CLASSES = 50
# Params that do not change what a paper number measures: the dataset and noise cell (the
# table lookup), seeds and the noise generator (another draw of the same protocol), where
# the data lives, bookkeeping, the small network's shape, and our CE baseline (the paper's
# CE numbers are other papers').
PAPER_IGNORED = {"data": {"dataset", "root", "path", "extra_test_path", "download", "seed"},
                 "noise": {"kind", "rate", "seed", "generator", "file", "file_key"},
                 "model": {"seed", "width", "blocks"}, "evaluate": {"tsne_points"},
                 "cleanlab": {"enabled", "folds", "seed", "filter_by"}}   # issue 87's detector baseline


def is_webvision(cfg: dict, num_classes: int | None) -> bool:
    """Read as WebVision-50: a 50-class image folder with its labels as given."""
    return (cfg["data"]["dataset"] == "imagefolder" and cfg["noise"]["kind"] == "none"
            and num_classes == WEBVISION_CLASSES)


def paper_config(tables: dict, cfg: dict, num_classes: int | None = None) -> dict | None:
    """The paper's configuration for `cfg`'s dataset and noise kind: CIFAR, or WebVision-50
    (`is_webvision`, given the run's class count); else None."""
    ds, kind = cfg["data"]["dataset"], cfg["noise"]["kind"]
    ref = {section: dict(values) for section, values in PAPER_CIFAR.items()}
    if is_webvision(cfg, num_classes):
        for section, values in PAPER_WEBVISION_CHANGES.items():
            ref[section].update(values)
        ab = tables["fractiles"]["webvision50"]
        ref["pretrain"].update(alpha=ab["alpha"], beta=ab["beta"])
        return ref
    if ds not in PAPER_QUEUE_PER_CLASS or kind not in ("sym", "asym", "none"):
        return None
    ab = tables["fractiles"][ds]["asym" if kind == "asym" else "sym"]   # clean: the sym row
    ref["pretrain"].update(alpha=ab["alpha"], beta=ab["beta"], queue_per_class=PAPER_QUEUE_PER_CLASS[ds])
    return ref


def deviations(tables: dict, cfg: dict, num_classes: int | None = None) -> dict[str, str] | None:
    """Every key in which `cfg` differs from the paper's configuration, {"section.key": "ours
    (paper: x)"}; None where the paper has no configuration for it (neither CIFAR nor
    WebVision-50). A noise rate between two table columns counts too: the lookup would
    round it to one of them."""
    ref = paper_config(tables, cfg, num_classes)
    if ref is None:
        return None
    out = {f"{section}.{key}": f"{cfg[section][key]!r} (paper: {want!r})"
           for section, values in ref.items() for key, want in values.items()
           if not _same(cfg[section][key], want)}
    rate = cfg["noise"]["rate"] * 100
    if cfg["noise"]["kind"] in ("sym", "asym") and abs(rate - round(rate)) > 1e-6:
        out["noise.rate"] = f"{cfg['noise']['rate']!r} (the paper's rates are whole percents)"
    return out


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _only(devs: dict[str, str] | None, keys: set[str]) -> bool:
    """True when `devs` (deviations) touch nothing outside `keys` ("section.key")."""
    return devs is not None and set(devs) <= keys


def _paper_fmt(v) -> str:
    """A published number as printed in the paper (its own decimals: 95.5, 90.64)."""
    if v is None:
        return "—"
    text = repr(float(v))
    return f"{v:.{max(1, len(text.split('.')[1]))}f}"


def baseline_name(cfg: dict) -> str:
    """Which baseline a setting trains: "CE", or "mixup α=…" (`baseline.mixup_alpha`)."""
    a = cfg["baseline"].get("mixup_alpha")
    return "CE" if a is None else f"mixup α={a:g}"


def budget_of(cfg: dict) -> dict:
    """Epochs each method trained: Sel-CL+ = warm-up + pre-training + fine-tuning; CE alone.
    `pretrain.epochs` counts the warm-up's (SPEC §10.3): pre-training proper is the rest."""
    return {"warmup": cfg["warmup"]["epochs"], "pretrain": cfg["pretrain"]["epochs"] - cfg["warmup"]["epochs"],
            "finetune": cfg["finetune"]["epochs"],
            "ce": cfg["baseline"]["epochs"] if cfg["baseline"]["enabled"] else None,
            "baseline": baseline_name(cfg)}


def _budget_text(b: dict) -> str:
    ce = "—" if b["ce"] is None else str(b["ce"])
    return f"{b['warmup']} + {b['pretrain']} + {b['finetune']} = {b['warmup'] + b['pretrain'] + b['finetune']} / {ce}"


def setting_text(cfg: dict, meta: dict) -> str:
    """What else a reader needs to weigh a setting's numbers: the network, the images, the
    selection's K, α, β, and the epochs each accuracy averages (a test image is 100/n_test
    points)."""
    m, p = cfg["model"], cfg["pretrain"]
    net = {"small": f"the small PreAct network (width {m.get('width')}, blocks {m.get('blocks')})",
           "preact_resnet18": "PreAct ResNet-18", "resnet18": "ResNet-18"}.get(m["arch"], m["arch"])
    images = ""
    if meta.get("n_train"):
        shape = meta.get("image_shape") or []
        px = f", {shape[-1]} px" if shape else ""
        images = (f"{meta['n_train']:,} training and {meta['n_test']:,} test images "
                  f"({meta.get('num_classes')} classes{px}; one test image = {100 / meta['n_test']:.2f} points); ")
    return (f"Network: {net}; {images}K = {p['k']}, α = {p['alpha']}, β = {p['beta']}. Sel-CL+ is the mean "
            f"of the last {cfg['finetune']['eval_last']} fine-tuning epochs, the baseline of its last "
            f"{cfg['baseline']['eval_last']} (the paper: 10).")


def _noise_key(cfg: dict) -> str | None:
    kind, rate = cfg["noise"]["kind"], int(round(cfg["noise"]["rate"] * 100))
    return f"{kind}{rate}" if kind in ("sym", "asym") else None


def reproduced(ours, paper) -> str:
    """Table 3's verdict for a paper setting: within ±1 point of the published number, on
    the difference as printed (two decimals), so Δ and the verdict never disagree."""
    if paper is None:
        return "—"
    if ours is None:
        return "not run"
    return "yes" if abs(round(ours - paper, 2)) <= 1.0 else "no"


def expected_noise_rate(cfg: dict, clean: np.ndarray | None, num_classes: int | None,
                        dataset: str | None) -> str:
    """What the realised rate should be, and why it differs from the requested one."""
    nc = cfg["noise"]
    if nc["kind"] == "sym" and nc["include_true_class"] and num_classes:
        return f"≈ r·(C−1)/C = {nc['rate'] * (num_classes - 1) / num_classes:.3f}"
    if nc["kind"] == "sym":
        return f"⌊r·N⌋/N ≈ {nc['rate']:.3f}"
    if nc["kind"] == "asym" and clean is not None and num_classes:
        from .noise import asymmetric_map
        t = asymmetric_map(nc["asym_map"] if nc["asym_map"] != "auto" else (dataset or ""), num_classes)
        moved = float(np.mean(t[clean] != clean))
        return f"≈ r × {moved:.2f} (share of examples whose class the map moves) = {nc['rate'] * moved:.3f}"
    return {"none": "0", "file": "the label file's own"}.get(nc["kind"], "—")


def _label_file(nc: dict) -> str:
    """"file: <name>[<key>]" of a label-file noise section."""
    return f"file: {Path(str(nc['file'])).name}" + (f"[{nc['file_key']}]" if nc.get("file_key") else "")


def noise_text(cfg: dict, realised: float | None = None) -> str:
    """How a setting's noise reads in the tables: "sym 0.40", "asym 0.40", "none", or for a
    label file its name (and dict key) with the realised rate ("file: labels.npy, realised
    0.41"): `noise.rate` means nothing for a file, so it is never printed as one. Given the
    realised rate, an injected noise shows it beside the requested one ("asym 0.40, realised
    0.20"): the paper names a column by r, but asymmetric noise flips only five classes'
    labels and symmetric noise keeps the true class among the draws, so r is not the share
    of wrong labels."""
    nc = cfg["noise"]
    if nc["kind"] == "file":
        return f"{_label_file(nc)}, realised {_fmt(realised, 2)}"
    if nc["kind"] == "none":
        return "none"
    text = f"{nc['kind']} {nc['rate']:.2f}"
    return text if realised is None else f"{text}, realised {_fmt(realised, 2)}"


# what the pipeline itself writes while an experiment runs: never "uncommitted changes"
PIPELINE_OUTPUTS = ("dvc.lock", "runs/", "reports/", "plots/", "demo/", "scratch/")


def _flat(d, prefix: str = "") -> dict:
    if not isinstance(d, dict):
        return {prefix: d}
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def params_changes(committed: dict | None, current: dict | None) -> list[str]:
    """The params keys (dotted) whose values differ between two params.yaml, `run` aside
    (the report names the settings it ran)."""
    a, b = _flat(committed or {}), _flat(current or {})
    return sorted(k for k in set(a) | set(b) if k.split(".")[0] != "run" and a.get(k) != b.get(k))


def git_commit(cwd: Path = Path(".")) -> str:
    """The commit the pipeline ran from (a DVC experiment: its baseline), the params keys
    changed against it (`dvc exp run -S`), and any other tracked file that differs. The
    pipeline's own outputs (dvc.lock, runs/, reports/, plots/) and the `run` list that every
    `dvc exp run -S 'run=[...]'` (`make demo` included) sets are not changes."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout
    try:
        sha = git("rev-parse", "--short=12", "HEAD").strip()
        changed = [ln[3:].strip() for ln in git("status", "--porcelain", "--untracked-files=no").splitlines()
                   if ln.strip()]
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    changed = [f.split(" -> ")[-1].strip('"') for f in changed]
    out = f"`{sha}`"
    if "params.yaml" in changed:
        try:
            keys = params_changes(yaml.safe_load(git("show", "HEAD:params.yaml")),
                                  yaml.safe_load((Path(cwd) / "params.yaml").read_text()))
        except (OSError, subprocess.CalledProcessError, yaml.YAMLError):
            keys = ["(unreadable)"]
        if keys:
            out += (", params changed from it (a `dvc exp run -S` experiment): "
                    + ", ".join(f"`{k}`" for k in keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else ""))
    others = [f for f in changed if f != "params.yaml" and not f.startswith(PIPELINE_OUTPUTS)]
    if others:
        out += (", with uncommitted changes to tracked files: "
                + ", ".join(f"`{f}`" for f in others[:8]) + (f" and {len(others) - 8} more" if len(others) > 8 else ""))
    return out


def params_hash(configs: dict[str, dict]) -> str:
    """sha256 of the resolved params of the settings in the report (order-independent)."""
    import hashlib
    blob = json.dumps(configs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def accuracy_plot_rows(ft: list[dict], bl: list[dict], budget: dict) -> list[dict]:
    """plots/accuracy/<setting>.csv: both methods on one truthful axis, the training
    epochs since the start of each method (Sel-CL+'s fine-tuning epoch e is epoch
    warm-up + pre-training + e); a blank where a method has no value."""
    offset = budget["warmup"] + budget["pretrain"]
    sel = {offset + int(h["epoch"]): h["test_acc"] for h in ft}
    ce = {int(h["epoch"]): h["test_acc"] for h in bl}
    epochs = sorted(set(sel) | set(ce))
    return [{"epoch": e, "Sel-CL+": sel.get(e, ""), "CE": ce.get(e, "")} for e in epochs]


def _variant_rows(name: str, cfg: dict, tables: dict, ours: dict, devs: dict[str, str] | None) -> dict[str, list[str]]:
    """Rows of Tables 4, 6, 7, 10 and the supplement's sensitivity table for a CIFAR setting.
    A row's paper cell is shown only where the run differs from the paper's configuration
    (`devs`) in that table's own switches alone; otherwise it names what else differs."""
    ds, key = cfg["data"]["dataset"], _noise_key(cfg)
    if devs is None or key is None:
        return {}
    pc, fc, out = cfg["pretrain"], cfg["finetune"], {}
    knn, plus, clf = ours.get("knn_clean_top1"), ours.get("selcl_plus"), ours.get("selcl_test_top1")
    prec_t = ours.get("precision_T")

    def cell(paper, allowed: set[str]) -> str:
        if _only(devs, allowed):
            return _paper_fmt(paper)
        return "— (also differs: " + ", ".join(k for k in devs if k not in allowed) + ")"

    if key == "asym40":
        paper = tables.get("selected_sets_knn", {}).get(ds, {}).get(pc["selected_sets"])
        out["4"] = [f"| {name} | {ds} asym 40 % | {pc['selected_sets']} | {_fmt(knn)} | "
                    f"{cell(paper, {'pretrain.selected_sets'})} |"]
    if ds == "cifar100" and key in ("sym20", "asym40"):
        off = [s for s in TABLE6_SWITCHES if not pc[s]]
        row = tables.get("ablation_cifar100", {}).get(key, {})
        allowed = {f"pretrain.{s}" for s in off}

        def pair_cell(paper_pair, allowed):     # the paper's "Sel-CL test acc / kNN" pair
            a, b = paper_pair or [None, None]
            return cell(None, allowed) if not _only(devs, allowed) else f"{_paper_fmt(a)} / {_paper_fmt(b)}"

        # without L_CLS the classifier is never trained: no test accuracy (the paper's "—")
        sel_metric = "Sel-CL test acc / k-NN"
        sel_value = f"{_fmt(clf) if pc['classifier'] else '—'} / {_fmt(knn)}"
        rows6 = []
        if len(off) == 1:
            variant = TABLE6_SWITCHES[off[0]]
            rows6.append((variant, sel_metric, sel_value, pair_cell(row.get(variant), allowed)))
        elif off:                               # several switches at once: not in the paper
            rows6.append((" + ".join(TABLE6_SWITCHES[s] for s in off), sel_metric, sel_value, cell(None, allowed)))
        else:
            if fc["augment"] == "strong":
                variant, allowed = "plus_strong_aug", {"finetune.augment"}
            elif not fc["reinit_classifier"]:
                variant, allowed = "plus_no_retrain_cls", {"finetune.reinit_classifier"}
            else:
                variant, allowed = "plus", set()
            # the full Sel-CL (its pre-trained classifier and encoder; a fine-tuning switch
            # leaves it the paper's), then the Sel-CL+ variant
            rows6.append(("sel_cl", sel_metric, sel_value, pair_cell(row.get("sel_cl"), allowed)))
            rows6.append((variant, "Sel-CL+ test acc", _fmt(plus), cell(row.get(variant), allowed)))
        out["6"] = [f"| {name} | {key} | {v} | {m} | {val} | {pc_} |" for v, m, val, pc_ in rows6]
    pseudo = tables.get("pseudo_labels_cifar100", {})
    if ds == "cifar100" and key in pseudo.get("with", {}):
        # Table 10: Sel-CL+ test accuracy / precision of the final T ("label precision"), the
        # selection scored against the neighbours' pseudo-labels (with) or noisy labels (without)
        which = "with" if pc["pseudo_labels"] else "without"
        acc, prec = pseudo.get(which, {}).get(key) or [None, None]
        paper = (f"{_paper_fmt(acc)} / {_paper_fmt(prec)}" if _only(devs, {"pretrain.pseudo_labels"})
                 else cell(None, {"pretrain.pseudo_labels"}))
        ours_cell = f"{_fmt(plus)} / {_fmt(None if prec_t is None else 100 * prec_t)}"
        out["10"] = [f"| {name} | {key} | {which} | {ours_cell} | {paper} |"]
    if key in ("sym20", "sym90", "asym40"):
        paper = tables.get("warmup", {}).get(cfg["warmup"]["method"], {}).get(ds, {}).get(key)
        out["7"] = [f"| {name} | {ds} {key} | {cfg['warmup']['method']} | {_fmt(plus)} | "
                    f"{cell(paper, {'warmup.method'})} |"]
    sens = tables.get("sensitivity_cifar10", {}) if ds == "cifar10" else {}
    swept = {"pretrain.alpha": (sens.get(key, {}), "alpha"), "pretrain.beta": (sens.get(key, {}), "beta")}
    if key == "sym20":
        swept["pretrain.lambda_sim"] = (sens.get("lambda_s_sym20", {}), "acc")
    changed = list(devs)
    if key in sens and len(changed) == 1 and changed[0] in swept:
        column, field = swept[changed[0]]
        value = pc[changed[0].split(".")[1]]
        hits = [i for i, v in enumerate(column.get("values", [])) if math.isclose(v, value, abs_tol=1e-9)]
        paper = _paper_fmt(column[field][hits[0]]) if hits else "— (not a value of the supplement's sweep)"
        out["S"] = [f"| {name} | {ds} {key} | {changed[0].split('.')[1]} | {value:g} | {_fmt(plus)} | {paper} |"]
    return out


def _webvision_row(name: str, ft: dict, paper: dict, devs: dict | None) -> tuple[str, str]:
    """Paper Table 5: Sel-CL+ top-1 / top-5 on the WebVision val set (our test split) and on
    the ILSVRC12 val images of its classes (`data.extra_test_path`). The authors' script
    prints each test set's best top-1 epoch, so the verdict reads the best WebVision top-1
    (within ±1 point), where the run has the paper's configuration."""
    def cell(top1, last, top5):
        return "—" if top1 is None else f"{_fmt(top1)} / {_fmt(last)} / {_fmt(top5)}"
    web = cell(ft.get("test_acc_best"), ft.get("test_acc_last"), ft.get("test_top5_at_best"))
    inet = cell(ft.get("test2_acc_best"), ft.get("test2_acc_last"), ft.get("test2_top5_at_best"))
    verdict = reproduced(ft.get("test_acc_best"), paper["webvision"]["top1"])
    if devs and verdict != "—":
        verdict = "not comparable (differs, see above)"
    paper_cell = (f"{_paper_fmt(paper['webvision']['top1'])} / {_paper_fmt(paper['webvision']['top5'])} · "
                  f"{_paper_fmt(paper['ilsvrc12']['top1'])} / {_paper_fmt(paper['ilsvrc12']['top5'])}")
    return f"| {name} | {web} | {inet} | {paper_cell} | {verdict} |", verdict


def _clean_labels_known(cfg: dict) -> bool:
    """Whether the run knows its true labels: every noise we inject does; a dataset taken as
    it comes (noise kind none) does only where it is a clean benchmark (CIFAR, digits), not
    an image folder of web labels (WebVision), whose noise is unknown."""
    return cfg["noise"]["kind"] != "none" or cfg["data"]["dataset"] != "imagefolder"


def _seedless(cfg: dict) -> str:
    """A setting's resolved params without its initialisation seed: settings with equal
    keys are seeds of one configuration."""
    c = json.loads(json.dumps(cfg, default=str))
    c.get("model", {}).pop("seed", None)
    c.pop("name", None)
    return json.dumps(c, sort_keys=True)


def _last_sd(hist: list[dict], n: int) -> float | None:
    vals = [float(h["test_acc"]) for h in hist[-n:] if h.get("test_acc") not in (None, "")]
    return float(np.std(vals, ddof=1)) if len(vals) >= 2 else None


def gap_spread(gaps_of_seeds: list[float], sd_sel: float | None, sd_ce: float | None) -> tuple[float | None, str]:
    """How far apart Sel-CL+ and CE can land by chance: the standard deviation of the gap
    over the seeds of one configuration in this report, when there are two or more; else,
    from one run, the epoch-to-epoch spread of the epochs each accuracy averages."""
    if len(gaps_of_seeds) >= 2:
        return float(np.std(gaps_of_seeds, ddof=1)), f"gap over {len(gaps_of_seeds)} seeds"
    if sd_sel is not None and sd_ce is not None:
        return math.hypot(sd_sel, sd_ce), "averaged epochs (one seed)"
    return None, "no spread known"


def outcome(name: str, ours, ce, budget: dict, spread: float | None, spread_what: str,
            ce_best=None) -> str:
    """One line: did Sel-CL+ win, lose or tie against the baseline, by how much, at which
    budgets. A tie is a gap within twice the spread (about a 95 % band)."""
    total = budget["warmup"] + budget["pretrain"] + budget["finetune"]
    bud = (f"Sel-CL+ {budget['warmup']} + {budget['pretrain']} + {budget['finetune']} = {total} epochs, "
           f"{budget['baseline']} {budget['ce'] if budget['ce'] is not None else '—'} epochs")
    bl = budget["baseline"]
    if ours is None:
        return f"* **{name}**: Sel-CL+ not run ({bud})."
    if ce is None:
        return f"* **{name}**: Sel-CL+ {_fmt(ours)}; no {bl} baseline run to compare ({bud})."
    gap = round(ours - ce, 2)
    band = None if spread is None else round(2 * spread, 2)
    tied = band is not None and abs(gap) <= band
    if tied:
        head = f"**tied** with {bl}: {gap:+.2f} points"
    elif gap > 0:
        head = f"**won** against {bl} by {gap:.2f} points"
    else:
        head = f"**lost** to {bl} by {-gap:.2f} points"
    band_txt = (f"a tie is a gap within ±{band:.2f}, twice the sd of the {spread_what}" if band is not None
                else spread_what)
    best = f"; {bl}'s best epoch, chosen on the test labels: {_fmt(ce_best)}" if ce_best is not None else ""
    return f"* **{name}**: Sel-CL+ {head} ({_fmt(ours)} against {_fmt(ce)}; {band_txt}{best}). Budget: {bud}."


def _bold_better(ours, ce) -> tuple[str, str]:
    """The Sel-CL+ and baseline cells, the better of the two (as printed) in bold, both on a tie."""
    a, b = _fmt(ours), _fmt(ce)
    if ours is None or ce is None:
        return (f"**{a}**" if ours is not None and ce is None else a), b
    ra, rb = round(ours, 2), round(ce, 2)
    return (f"**{a}**" if ra >= rb else a), (f"**{b}**" if rb >= ra else b)


def encoder_flag(pre: dict) -> str | None:
    """A bold line for a run whose pre-trained encoder learned nothing (pretrain.json's
    `encoder_learned`, `train.encoder_check`): its numbers are not a comparison of methods."""
    if pre.get("encoder_learned", True):
        return None
    return (f"**The encoder learned nothing**: k-NN {_fmt(pre.get('knn_top1'))} % against "
            f"{_fmt(pre.get('knn_top1_init'))} % for a freshly initialised network, L_sel "
            f"{_fmt(pre.get('l_sel'))} against {_fmt(pre.get('l_sel_no_information'))} if it had learned "
            f"nothing (both must be below to pass); do not read this setting's accuracies as a comparison "
            f"of the methods.")


def build_report(run: list[str], configs: dict[str, dict], runs_dir: Path, tables: dict,
                 out_dir: Path, plots_dir: Path = Path("plots")) -> dict:
    """Write reports/README.md, figures, metrics and the accuracy plot data; return
    the per-setting metrics."""
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    rows, knn_rows, sel_rows, figs, metrics, envs = [], [], [], [], {}, {}
    noise_rows, variants, differences = [], {"4": [], "6": [], "7": [], "10": [], "S": []}, []
    verdicts, web_rows, results = [], [], {}
    for name in run:
        cfg, d = configs[name], runs_dir / name
        ft, bl = _read_json(d / "finetune.json"), _read_json(d / "baseline.json")
        ev, pre, noise = _read_json(d / "evaluate.json"), _read_json(d / "pretrain.json"), _read_json(d / "noise.json")
        meta = _read_json(d / "data.json")
        budget = budget_of(cfg)
        paper = paper_numbers(tables, cfg)
        ours = ft.get("test_acc_mean_last")
        ce = bl.get("test_acc_mean_last") if bl.get("enabled", True) else None
        # the baseline that ran, and the paper's row for it (Cross-Entropy or Mixup)
        mixup = budget["baseline"] != "CE"
        tag = f" ({budget['baseline']})" if mixup and ce is not None else ""
        paper_bl = paper.get("mixup" if mixup else "ce")
        paper_bl_cell = _paper_fmt(paper_bl) + (" (Mixup)" if mixup and paper_bl is not None else "")
        web = is_webvision(cfg, meta.get("num_classes"))
        devs = deviations(tables, cfg, meta.get("num_classes"))
        known = _clean_labels_known(cfg)
        diff = ours - paper["selcl_plus"] if ours is not None and paper.get("selcl_plus") is not None else None
        verdict = reproduced(ours, paper.get("selcl_plus"))
        if devs:                   # not the paper's configuration: no Δ, no verdict, not counted
            diff, verdict = None, "not comparable (differs, see below)" if verdict != "—" else "—"
            differences.append(f"* **{name}**: " + "; ".join(f"{k} = {v}" for k, v in devs.items()) + ".")
        elif devs is None:
            differences.append(f"* {name}: {cfg['data']['dataset']}, not a setting of the paper's "
                               "tables (CIFAR, or WebVision-50: a 50-class image folder with its "
                               "labels as given): no published number is compared.")
        if web:
            row, web_verdict = _webvision_row(name, ft, tables["webvision50"], devs)
            web_rows.append(row)
            if web_verdict in ("yes", "no"):
                verdicts.append(web_verdict)
        if verdict in ("yes", "no"):
            verdicts.append(verdict)
        realised = noise.get("realised_noise_rate") if known else None
        noise_cell = noise_text(cfg, realised) if known else "none (the labels as given)"
        ours_cell, ce_cell = _bold_better(ours, ce)
        rows.append(f"| {name} | {cfg['data']['dataset']} | {noise_cell} | "
                    f"{_budget_text(budget)} | {ours_cell} | {_fmt(ft.get('test_acc_last'))} | "
                    f"{ce_cell}{tag} | {_fmt(bl.get('test_acc_best'))} | {_paper_fmt(paper.get('selcl_plus'))} | "
                    f"{'—' if diff is None else f'{round(diff, 2):+.2f}'} | {verdict} | {paper_bl_cell} |")
        clean = None
        if (d / "labels.npz").exists():
            with np.load(d / "labels.npz") as f:
                clean = f["clean"]
        is_file = cfg["noise"]["kind"] == "file"           # a label file has no requested rate
        kind_cell = _label_file(cfg["noise"]) if is_file else cfg["noise"]["kind"]
        requested = "—" if is_file else f"{cfg['noise']['rate']:.2f}"
        expected = expected_noise_rate(cfg, clean, meta.get('num_classes'), meta.get('dataset'))
        if not known:
            kind_cell, requested, expected = "none (the labels as given)", "—", "unknown (no true labels)"
        noise_rows.append(f"| {name} | {kind_cell} | {requested} | {expected} | "
                          f"{_fmt(realised, 3) if known else 'unknown'} |")
        hist = _read_csv(d / "pretrain_history.csv")
        knn_rows.append(f"| {name} | {_fmt(ev.get('knn_clean_top1'))} | {_fmt(ev.get('knn_clean_top5'))} | "
                        f"{_fmt(ev.get('knn_noisy_top1'))} | {_fmt(ev.get('knn_noisy_top5'))} | "
                        f"{best_knn_cell(hist)} | {'—' if devs else _paper_fmt(paper.get('knn'))} |")
        prec = [_fmt(pre.get(k), 3) if known else "n/a" for k in ("precision_T", "recall_T", "precision_G")]
        sel_rows.append(f"| {name} | {int(pre['n_selected']) if 'n_selected' in pre else '—'} | "
                        f"{prec[0]} | {prec[1]} | {prec[2]} | {_fmt(pre.get('threshold'), 3)} | "
                        f"{int(pre['n_per_class']) if 'n_per_class' in pre else '—'} |")
        for table, lines in _variant_rows(name, cfg, tables, {"knn_clean_top1": ev.get("knn_clean_top1"),
                                                               "selcl_test_top1": ev.get("selcl_test_top1"),
                                                               "selcl_plus": ours,
                                                               "precision_T": pre.get("precision_T") if known else None},
                                 devs).items():
            variants[table] += lines
        if "env" in pre:
            envs[name] = pre["env"]
        ft_hist, bl_hist = _read_csv(d / "finetune_history.csv"), _read_csv(d / "baseline_history.csv")
        results[name] = (ours, ce, budget, _last_sd(ft_hist, cfg["finetune"]["eval_last"]),
                         _last_sd(bl_hist, cfg["baseline"]["eval_last"]),
                         bl.get("test_acc_best") if ce is not None else None)
        _plot_learning(name, hist, ft_hist, bl_hist, budget, fig_dir / f"{name}_learning.png")
        _write_csv(plots_dir / "accuracy" / f"{name}.csv", accuracy_plot_rows(ft_hist, bl_hist, budget))
        section = [f"### {name}", "", f"Budget: Sel-CL+ {budget['warmup']} warm-up + {budget['pretrain']} "
                   f"pre-training + {budget['finetune']} fine-tuning epochs; {budget['baseline']} baseline "
                   f"{'not run' if budget['ce'] is None else str(budget['ce']) + ' epochs'}. "
                   + setting_text(cfg, meta), "",
                   f"![learning process]({'figures/' + name + '_learning.png'})", ""]
        if flag := encoder_flag(pre):
            section += [flag, ""]
        if ft_hist or bl_hist:
            section += [f"![test accuracy](figures/{name}_accuracy.png)", ""]
        if (d / "labels.npz").exists():
            with np.load(d / "labels.npz") as f:
                _plot_transition(name, f["transition"], fig_dir / f"{name}_transition.png")
            section += [f"![noise transition](figures/{name}_transition.png)"]
        if (d / "tsne.npz").exists():
            with np.load(d / "tsne.npz") as f:
                if len(f["xy"]):
                    _plot_tsne(name, f["xy"], f["labels"], meta.get("classes", []), fig_dir / f"{name}_tsne.png")
                    section += [f"![t-SNE](figures/{name}_tsne.png)"]
        figs += section + [""]
        # numbers only (`dvc exp show`): no strings, no environment, one file per setting,
        # the headline numbers only (the rest is in the report), so a sweep fits a terminal
        metrics[name] = {k: round(float(v), 4) for k, v in {
            "selcl_plus": ours, "ce": ce, "ce_best": bl.get("test_acc_best") if ce is not None else None,
            "knn_clean": ev.get("knn_clean_top1"),
            **({"precision_T": pre.get("precision_T"), "recall_T": pre.get("recall_T"),
                "precision_G": pre.get("precision_G")} if known else {}),
            **({"webvision_top1_best": ft.get("test_acc_best"), "webvision_top5_at_best": ft.get("test_top5_at_best"),
                "ilsvrc12_top1_best": ft.get("test2_acc_best"), "ilsvrc12_top5_at_best": ft.get("test2_top5_at_best")}
               if web else {})}.items()
            if v is not None and math.isfinite(float(v))}

    groups: dict[str, list[float]] = {}
    for name, (o, c, *_rest) in results.items():
        if o is not None and c is not None:
            groups.setdefault(_seedless(configs[name]), []).append(o - c)
    outcomes = []
    for name, (o, c, budget, sd_sel, sd_ce, ce_best) in results.items():
        spread, what = gap_spread(groups.get(_seedless(configs[name]), []), sd_sel, sd_ce)
        outcomes.append(outcome(name, o, c, budget, spread, what, ce_best))
    md = ["# Sel-CL / Sel-CL+ reproduction report", "",
          f"Git commit {git_commit()} · params hash `{params_hash({n: configs[n] for n in run})}` "
          f"(sha256 of the resolved params of the settings below) · settings: {', '.join(run)}.", "",
          "Generated by `stages/report.py` from `runs/<setting>/`; published numbers from "
          "`references/paper_tables.yaml` (Li et al., CVPR 2022). Accuracies in percent.", "",
          "## Who won", "",
          "Sel-CL+ against the baseline trained from scratch on the same noisy labels (the mean of "
          "each one's last epochs, as in the table below), with both budgets. A gap within twice "
          "the spread is a tie: the spread of the gap over the seeds of one configuration where "
          "this report has two or more, else that of the epochs each accuracy averages (a lower "
          "bound on a seed's spread).", "", *outcomes, "",
          "## Test accuracy (paper Table 3)", "",
          "Sel-CL+ = mean test accuracy over the last `finetune.eval_last` epochs, as the paper (which "
          "averages 10; each setting's value, network and image counts: its section below); "
          "*final* = last epoch. *Baseline* = our cross-entropy (CE) on the same labels, network and weak "
          "augmentation, trained from scratch, beside the paper's Cross-Entropy row; where "
          "`baseline.mixup_alpha` is set it is mixup CE instead, marked in its cell and beside the paper's "
          "Mixup row (the metrics `ce` and `ce_best` hold whichever ran). *Baseline best* = its best "
          "epoch, picked on the test labels: an upper bound that no one with only noisy labels can "
          "select, shown because with noisy labels CE peaks, then memorises the noise. *Budget* = "
          "epochs of warm-up + pre-training + fine-tuning = Sel-CL+'s total / baseline epochs; the "
          "paper trains 1 + 249 + 70 epochs (250 in all, then 70); its Cross-Entropy and Mixup rows "
          "are numbers it quotes from earlier work, trained with their own budgets. "
          "*Reproduced*: within ±1 point of the paper's Sel-CL+, given only where the run has the "
          "paper's configuration (the paper and the authors' scripts) in every param that changes the "
          "method, budget included; a run that differs in any is *not comparable*, and the list "
          "below says where it differs.", "",
          "| setting | dataset | noise | budget (epochs) | Sel-CL+ | final | baseline (ours) | baseline best | "
          "Sel-CL+ (paper) | Δ vs paper | reproduced | baseline (paper) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
          "## Differences from the paper's configuration", "",
          "Params (beyond the seeds, the noise generator, where the data lives and our CE baseline) "
          "in which a setting differs from the configuration behind the paper's numbers. A setting "
          "not listed has the paper's configuration.", "",
          *(differences or ["None: every setting has the paper's configuration."]), "",
          "## Noise: requested and realised", "",
          "The realised rate is the fraction of training labels that differ from the true ones. "
          "Symmetric noise re-draws ⌊r·N⌋ labels uniformly from all C classes, the true one included "
          "(the authors' scripts), so about 1/C of them (r/C of all labels) land back on the true class: the realised rate "
          "is about r·(C−1)/C (0.36 for r = 0.4 on 10 classes). Asymmetric noise flips an example "
          "with probability r only if the map moves its class (on CIFAR-10 five of the ten classes; "
          "the generic map of digits and image folders moves every class), so the realised rate is "
          "r times their share. Label files (CIFAR-N) have the rate their annotators gave.", "",
          "| setting | kind | requested r | expected | realised |", "|---|---|---|---|---|", *noise_rows, "",
          "## Weighted k-NN of the Sel-CL encoder (paper Table 2)", "",
          "K and σ from `evaluate`. *clean*: the paper's protocol (clean training labels); "
          "*noisy*: the noisy training labels a practitioner has. The first four columns are the "
          "final encoder's; *best epoch* is the highest clean top-1 of the per-epoch k-NN in the "
          "pre-training history (the authors' script prints this running best beside each epoch's; "
          "the paper does not say which of the two its Table 2 gives).", "",
          "| setting | clean top-1 | clean top-5 | noisy top-1 | noisy top-5 | clean top-1, best epoch "
          "| paper (clean top-1, same noise) |",
          "|---|---|---|---|---|---|---|", *knn_rows, "",
          "## Final selection (last pre-training epoch)", "",
          "Sel-CL's selection after the last pre-training epoch: the T that Sel-CL+ fine-tunes on "
          "and the pairs G it pre-trained with. A run with `pretrain.selection: false` or another "
          "`pretrain.selected_sets` (Tables 4 and 6) pre-trains and fine-tunes on that variant's "
          "sets instead; its row still shows the selection, for comparison. Precision and recall are "
          "fractions (— where T or G is empty); γ is the β-quantile of the similarities of the "
          "same-label pairs within T (G′); every same-label pair above it, in T or not, joins G; "
          "n_sel is the most examples T keeps of one class (the α-quantile of the classes' counts "
          "of examples whose label the neighbours' vote agrees with).", "",
          "| setting | \\|T\\| | precision of T | recall of T | precision of G | γ | n_sel |",
          "|---|---|---|---|---|---|---|", *sel_rows, ""]
    if web_rows:
        md += ["## WebVision-50 (paper Table 5)", "",
               "Sel-CL+ top-1 (best epoch / final epoch) / top-5 at the best epoch, on the WebVision "
               "validation set (the test split) and on the ILSVRC12 validation images of the same "
               "classes (`data.extra_test_path`; — where not set). The authors' script prints each "
               "test set's best top-1 epoch; *reproduced* reads the best WebVision top-1, within ±1 "
               "point of the paper's, only where the run has the paper's configuration.", "",
               "| setting | WebVision val | ILSVRC12 val | paper (WebVision · ILSVRC12, top-1 / top-5) | "
               "reproduced |", "|---|---|---|---|---|", *web_rows, ""]
    if variants["4"]:
        md += ["## Selected sets (paper Table 4)", "",
               "Weighted k-NN (clean protocol) by `pretrain.selected_sets`.", "",
               "| setting | noise | selected sets | k-NN (ours) | k-NN (paper) |", "|---|---|---|---|---|",
               *variants["4"], ""]
    if variants["6"]:
        md += ["## Ablations on CIFAR-100 (paper Table 6)", "",
               "| setting | noise | variant | metric | ours | paper |", "|---|---|---|---|---|---|",
               *variants["6"], ""]
    if variants["7"]:
        md += ["## Warm-up method (paper Table 7)", "",
               "| setting | noise | warm-up | Sel-CL+ (ours) | Sel-CL+ (paper) |", "|---|---|---|---|---|",
               *variants["7"], ""]
    if variants["10"]:
        md += ["## Pseudo-labels in the selection, CIFAR-100 (paper Table 10)", "",
               "Sel-CL+ test accuracy / precision of the final T in percent (the paper's \"label "
               "precision\"), with T scored against the neighbours' k-NN pseudo-labels (the method) or "
               "against their noisy labels (`pretrain.pseudo_labels: false`).", "",
               "| setting | noise | pseudo-labels | ours | paper |", "|---|---|---|---|---|",
               *variants["10"], ""]
    if variants["S"]:
        md += ["## Sensitivity to α, β and λ_s (the paper's supplement)", "",
               "Sel-CL+ test accuracy with one of them changed, the rest as the paper.", "",
               "| setting | noise | parameter | value | Sel-CL+ (ours) | Sel-CL+ (paper) |",
               "|---|---|---|---|---|---|", *variants["S"], ""]
    md += label_issues_section(run, runs_dir, fig_dir)       # issue 87: the detector table
    md += ["## Learning process (paper Fig. 3), test accuracy, noise, embeddings", "",
           "Fig. 3 panels by pre-training epoch. Test accuracy: Sel-CL+ by fine-tuning epoch (after its "
           "warm-up and pre-training) and the baseline by epoch from scratch, on separate axes. "
           "`dvc plots show` draws the same curves (Sel-CL+ and the baseline, column `CE` whichever "
           "baseline ran, on one axis of training epochs since the start).", "", *figs]
    if envs:
        md += ["## Environment", "", "| setting | device | host CPU | network passes | torch | CUDA | faiss |",
               "|---|---|---|---|---|---|---|"]
        # the host CPU with what picks its kernels (cpu_id; older runs lack it)
        md += [f"| {n} | {e.get('gpu', e.get('device'))} | {e.get('cpu', '—')}"
               f"{' (' + e['cpu_id'] + ')' if e.get('cpu_id') else ''} | {e.get('precision', '—')} "
               f"| {e.get('torch')} | {e.get('cuda')} | {e.get('faiss')} |" for n, e in envs.items()]
        md += [""]
    md += ["## Deviations from the paper", "",
           "See `docs/faithfulness.md` in the repository: every place where this implementation decides "
           "something the paper leaves open, or differs from the authors' code, is listed there.", ""]
    atomic_write_text(out_dir / "README.md", "\n".join(md))
    _write_metrics(out_dir, metrics, verdicts)
    return metrics


def _write_csv(path: Path, rows: list[dict]) -> None:
    import io
    buf = io.StringIO()
    keys = list(rows[0]) if rows else ["epoch"]
    writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    atomic_write_text(path, buf.getvalue())


def _write_metrics(out_dir: Path, metrics: dict, verdicts: list[str]) -> None:
    """reports/metrics/<setting>.json (this run's settings only: older files are removed)
    and reports/metrics.json, the summary, whose keys no setting file repeats."""
    folder = out_dir / "metrics"
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.json"):
        if stale.stem not in metrics:
            stale.unlink()
    for name, values in metrics.items():
        write_json(folder / f"{name}.json", values)
    gaps = [m["selcl_plus"] - m["ce"] for m in metrics.values() if "selcl_plus" in m and "ce" in m]
    summary = {}
    if gaps:       # Sel-CL+ minus CE: averaged over the settings, and the worst setting's (a
        # mean over unrelated settings can hide one where CE wins)
        summary["mean_gain_over_ce"] = round(float(np.mean(gaps)), 4)
        summary["min_gain_over_ce"] = round(float(np.min(gaps)), 4)
    if verdicts:   # paper settings only: how many are within ±1 point of the paper
        summary["reproduced"] = verdicts.count("yes")
        summary["not_reproduced"] = verdicts.count("no")
    write_json(out_dir / "metrics.json", summary)
    atomic_write_text(out_dir / "headline.json", json.dumps(headline(metrics), indent=2) + "\n")


# The DVC metrics file: `dvc exp show` lists metrics before params, in file order, and names
# a column by its key alone when no other file has it, so the three numbers a run is judged
# by come first, one short column per setting (`demo_sym40.Sel-CL+`), in this order (not
# sorted as write_json does).
HEADLINE = {"selcl_plus": "Sel-CL+", "ce": "CE", "precision_T": "precision_T"}


def headline(metrics: dict) -> dict:
    # (the gain over CE stays in metrics.json: a row that ran one setting would list it
    # before the next setting's columns)
    out = {name: {short: values[key] for key, short in HEADLINE.items() if key in values}
           for name, values in metrics.items()}
    return out


def load_tables(path: Path) -> dict:
    return yaml.safe_load(Path(path).read_text())
