"""Which labels are wrong: the per-example verdicts of Sel-CL, Sel-CL+ and cleanlab, as
CSV tables, the cleaned labels, and their scoring against the truth (docs/label_issues.md).

Sel-CL's verdict on example i comes from the final selection of pre-training (SPEC §5):
  ŷ_i           the majority given label ỹ among i's K nearest neighbours (pass 1);
  q̂_i(ỹ_i)      the share of those neighbours whose ŷ is i's given label (pass 2);
  score_i     = 1 − q̂_i(ỹ_i) ∈ [0, 1]: how strongly the neighbourhood disputes ỹ_i
                (Sel-CL's selection loss is ℓ_i = −log clamp(q̂_i(ỹ_i), 0.01, 0.99), so the
                score orders examples exactly as ℓ does, without the clamp's ties);
  in_T          whether i is in the final confident set T (the per-class n_sel smallest ℓ).
Sel-CL+ adds its fine-tuned classifier's softmax on the un-augmented image.

Cleaned labels (RELABEL_RULE): keep ỹ_i for i in T; outside T, take ŷ_i where the
fine-tuned Sel-CL+ classifier also predicts ŷ_i (two independent views of the example
agree on the replacement), else keep ỹ_i.

No torch here: the stages compute the arrays, this module only tabulates and scores them
(the report stage imports it too).
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from .atomic import atomic_path, atomic_write_text

RELABEL_RULE = ("ỹ kept for examples in T; outside T, ŷ (the neighbours' majority label) where the "
                "Sel-CL+ classifier also predicts ŷ, else ỹ kept")

# Columns of runs/<setting>/label_issues.csv (Sel-CL) and cleanlab_issues.csv (cleanlab);
# `index` is the example's position in the dataset order (selcl/data.py), which every
# noisy-label file and cleaned_labels.npy follow.
SELCL_COLUMNS = ("index", "file", "given_label", "given_class", "selcl_label", "selcl_class", "selcl_score",
                 "in_T", "selcl_plus_label", "selcl_plus_class", "selcl_plus_prob", "selcl_plus_prob_given",
                 "cleaned_label")
CLEANLAB_COLUMNS = ("index", "file", "given_label", "given_class", "cleanlab_label", "cleanlab_class",
                    "cleanlab_score", "cleanlab_flag", "cleanlab_prob", "cleanlab_prob_given")


def cleaned_labels(given: np.ndarray, y_hat: np.ndarray, in_T: np.ndarray, plus_label: np.ndarray) -> np.ndarray:
    """RELABEL_RULE: int64 [N], usable as `noise: {kind: file, file: cleaned_labels.npy}`."""
    given = np.asarray(given, dtype=np.int64)
    relabel = ~np.asarray(in_T, dtype=bool) & (y_hat != given) & (plus_label == y_hat)
    return np.where(relabel, np.asarray(y_hat, dtype=np.int64), given)


def suspicion_order(score: np.ndarray, tie_break: np.ndarray) -> np.ndarray:
    """Row order, most suspicious first: score descending, then `tie_break` ascending (the
    probability another model gives the given label), then dataset index."""
    n = len(score)
    return np.lexsort((np.arange(n), np.asarray(tie_break, dtype=np.float64), -np.asarray(score, dtype=np.float64)))


def _cell(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "1" if v else "0"
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.6g}"
    return str(v)


def write_table(path: Path, columns: tuple, values: dict, order: np.ndarray) -> None:
    """One row per example in `order`; `values` maps each column to an array [N]."""
    missing = [c for c in columns if c not in values]
    if missing:
        raise KeyError(f"{path}: no values for columns {missing}")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    cols = [values[c] for c in columns]
    for i in order:
        w.writerow([_cell(col[i]) for col in cols])
    atomic_write_text(path, buf.getvalue())


def read_table(path: Path) -> dict[str, np.ndarray]:
    """A table written by `write_table`, back in dataset order (sorted by `index`)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return {}
    idx = np.array([int(r["index"]) for r in rows])
    order = np.argsort(idx)
    out = {}
    for key in rows[0]:
        col = [rows[i][key] for i in order]
        try:
            out[key] = np.array([float(v) for v in col])
        except ValueError:
            out[key] = np.array(col, dtype=object)
    return out


def save_labels(path: Path, labels: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, np.asarray(labels, dtype=np.int64))


def class_names(classes, labels: np.ndarray) -> np.ndarray:
    names = np.asarray([str(c) for c in classes], dtype=object)
    return names[np.asarray(labels, dtype=np.int64)]


# --------------------------------------------------------------------- scoring

def prf(flags: np.ndarray, wrong: np.ndarray) -> dict:
    """Precision, recall and F1 of `flags` as a detector of `wrong` labels (NaN where undefined)."""
    flags, wrong = np.asarray(flags, dtype=bool), np.asarray(wrong, dtype=bool)
    tp = int((flags & wrong).sum())
    p = tp / flags.sum() if flags.sum() else math.nan
    r = tp / wrong.sum() if wrong.sum() else math.nan
    f1 = 2 * p * r / (p + r) if p + r > 0 else (0.0 if tp == 0 and flags.sum() and wrong.sum() else math.nan)
    return {"flagged": int(flags.sum()), "precision": p, "recall": r, "f1": f1}


def truth_known(noise_kind: str) -> bool:
    """Synthetic noise and label files (CIFAR-N, a labels file beside a clean folder) keep the
    dataset's own labels as the truth; `none` has no noise to find (the labels are the truth
    only by assumption, e.g. WebVision's web labels)."""
    return noise_kind in ("sym", "asym", "file")


def _fmt(v, digits=3) -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def _seconds(v) -> str:
    return "—" if v is None else (f"{v / 60:.1f} min" if v >= 600 else f"{v:.0f} s")


def _read_json(path: Path) -> dict:
    import json
    return json.loads(path.read_text()) if path.exists() else {}


def _pr_figure(name: str, wrong: np.ndarray, curves: list[tuple], path: Path) -> None:
    """Precision–recall curves of the detectors' scores, each flag set as a point on it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import average_precision_score, precision_recall_curve
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    for label, score, flags in curves:
        p, r, _ = precision_recall_curve(wrong, score)
        line, = ax.plot(r, p, label=f"{label} (AP {average_precision_score(wrong, score):.3f})")
        q = prf(flags, wrong)
        if math.isfinite(q["precision"]) and math.isfinite(q["recall"]):
            ax.plot([q["recall"]], [q["precision"]], "o", color=line.get_color())
    ax.axhline(wrong.mean(), color="grey", lw=0.8, ls=":", label=f"noise rate {wrong.mean():.2f}")
    ax.set_xlabel("recall (of the wrong labels)")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(f"{name}: which labels are wrong (dots: the flags)", fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)


def detector_rows(name: str, run_dir: Path) -> tuple[list[str], dict | None]:
    """This setting's rows of the detector table and the arrays for its figure (None when
    the truth is unknown or an output is missing)."""
    noise = _read_json(run_dir / "noise.json")
    li = _read_json(run_dir / "label_issues.json")
    if not truth_known(noise.get("kind", "none")) or not li or not (run_dir / "labels.npz").exists():
        return [], None
    with np.load(run_dir / "labels.npz") as f:
        given, clean = f["noisy"].astype(np.int64), f["clean"].astype(np.int64)
    wrong = given != clean
    sel = read_table(run_dir / "label_issues.csv")
    t = li.get("seconds", {})
    curves = [("Sel-CL: 1 − q̂(ỹ)", sel["selcl_score"], sel["in_T"] == 0),
              ("Sel-CL+: 1 − p(ỹ)", 1 - sel["selcl_plus_prob_given"], sel["selcl_plus_label"] != given)]
    rows = [("not in T (Sel-CL)", sel["in_T"] == 0, t.get("selcl")),
            ("Sel-CL+ ≠ given", sel["selcl_plus_label"] != given, t.get("selcl_plus"))]
    cl = _read_json(run_dir / "cleanlab.json")
    if cl.get("enabled") and (run_dir / "cleanlab_issues.csv").exists():
        tab = read_table(run_dir / "cleanlab_issues.csv")
        rows.append((f"cleanlab ({cl['folds']}-fold CE, {cl['filter_by']})", tab["cleanlab_flag"] == 1,
                     cl.get("seconds_total")))
        curves.append(("cleanlab: 1 − self-confidence", tab["cleanlab_score"], tab["cleanlab_flag"] == 1))
    out = []
    for label, flags, secs in rows:
        q = prf(flags, wrong)
        out.append(f"| {name} | {label} | {q['flagged']} | {_fmt(q['precision'])} | {_fmt(q['recall'])} | "
                   f"{_fmt(q['f1'])} | {_seconds(secs)} |")
    cleaned = np.load(run_dir / "cleaned_labels.npy")
    acc = f"| {name} | {_fmt(float((given == clean).mean()))} | {_fmt(float((cleaned == clean).mean()))} | " \
          f"{int((cleaned != given).sum())} | {int(wrong.sum())} |"
    return out, {"wrong": wrong, "curves": curves, "acc_row": acc}


def report_section(run: list[str], runs_dir: Path, fig_dir: Path) -> list[str]:
    """Markdown for reports/README.md: the detector table, the accuracy of the cleaned
    labels and one precision–recall figure per setting whose truth is known."""
    table, acc_rows, figs = [], [], []
    for name in run:
        rows, fig = detector_rows(name, runs_dir / name)
        if fig is None:
            continue
        table += rows
        acc_rows.append(fig["acc_row"])
        _pr_figure(name, fig["wrong"], fig["curves"], fig_dir / f"{name}_label_issues.png")
        figs += [f"![label issues PR](figures/{name}_label_issues.png)"]
    if not table:
        return []
    return ["## Which labels are wrong: Sel-CL beside cleanlab", "",
            "Each detector flags training examples as mislabelled; a flag is right where the given label "
            "differs from the truth. *not in T*: outside Sel-CL's final confident set; *Sel-CL+ ≠ given*: "
            "the fine-tuned classifier predicts another class; *cleanlab*: `cleanlab.filter.find_label_issues` "
            "on K-fold out-of-fold probabilities of the CE baseline's network and recipe. Time: wall-clock of "
            "what each needs — Sel-CL: pre-training (`pretrain_timing.csv`, per-epoch evaluation included, "
            "the warm-up epoch(s) not); Sel-CL+: that plus fine-tuning and its prediction pass; cleanlab: "
            "its K trainings (per-epoch test evaluation included) and the cleanlab call. Per-example "
            "verdicts: `runs/<setting>/label_issues.csv`, `cleanlab_issues.csv` (docs/label_issues.md).", "",
            "| setting | detector | flagged | precision | recall | F1 | time |", "|---|---|---|---|---|---|---|",
            *table, "",
            f"Cleaned labels (`runs/<setting>/cleaned_labels.npy`; rule: {RELABEL_RULE}): accuracy "
            "against the truth, before and after.", "",
            "| setting | given labels | cleaned labels | relabelled | wrong given |", "|---|---|---|---|---|",
            *acc_rows, "",
            "Precision–recall of each detector's score (dots: its flags; AP = average precision).", "",
            *figs, ""]

