"""tools/sensitivity_real.py: one row per fractile run, read from parity_runs' histories."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import sensitivity_real  # noqa: E402

PAPER = {"values": [0.0, 0.15, 0.25, 0.35, 0.50, 0.75],
         "alpha": [92.1, 92.5, 92.6, 93.0, 93.4, 89.9], "beta": [91.4, 93.3, 93.4, 92.6, 92.8, 92.5]}


def _run(folder: Path, name: str, alpha: float, beta: float, n_T: list, knn: list, plus: list,
         seconds: float | None = None) -> Path:
    pre = [{"epoch": e + 1, "n_selected": n, "n_per_class": n / 10, "precision_T": 0.9 - 0.01 * e,
            "recall_T": 0.5, "precision_G": 0.8, "threshold": 0.85, "knn_top1": k}
           for e, (n, k) in enumerate(zip(n_T, knn))]
    hist = {"cfg": {"pretrain": {"alpha": alpha, "beta": beta}, "model": {"seed": 1}}, "pretrain": pre,
            "finetune": [{"epoch": e + 1, "test_acc": a} for e, a in enumerate(plus)]}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(hist))
    if seconds is not None:
        with open(folder / "results.jsonl", "a") as fh:
            fh.write(json.dumps({"label": name, "seconds": {"warmup+pretrain": seconds, "finetune": 60}}) + "\n")
    return path


def test_rows_markdown_and_figure(tmp_path):
    ref = _run(tmp_path, "selcl", 0.5, 0.25, [900, 910], [50.0, 52.0], [50.0, 51, 52, 53, 54, 55], seconds=540)
    hi = _run(tmp_path, "alpha0.75", 0.75, 0.25, [1200, 1300], [54.0, 56.0], [40.0, 41.0], seconds=480)
    b0 = _run(tmp_path, "beta0", 0.5, 0.0, [900, 905], [51.0, 53.0], [45.0])
    odd = _run(tmp_path, "alpha0.6", 0.6, 0.25, [1000, 1100], [50.0, 51.0], [44.0])
    rows = {p.stem: sensitivity_real.row(p, last=2) for p in (ref, hi, b0, odd)}
    r = rows["alpha0.75"]
    assert (r["moved"], r["n_T"], r["knn_last"], r["knn_mean_last"], r["selcl_plus"]) == ("alpha", 1300, 56.0, 55.0, 40.5)
    assert r["minutes"] == 9.0 and rows["beta0"]["minutes"] is None
    assert rows["selcl"]["moved"] is None and rows["selcl"]["selcl_plus"] == 53.0      # mean of the last 5
    assert rows["beta0"]["moved"] == "beta"
    # the paper's Sel-CL+ at the run's value of the fractile it moves; both rows at the default
    assert sensitivity_real.paper_value(r, PAPER, "alpha") == 89.9
    assert sensitivity_real.paper_value(r, PAPER, "beta") is None
    assert sensitivity_real.paper_value(rows["beta0"], PAPER, "beta") == 91.4
    assert sensitivity_real.paper_value(rows["selcl"], PAPER, "alpha") == 93.4
    assert sensitivity_real.paper_value(rows["alpha0.6"], PAPER, "alpha") is None     # not a value of the paper's
    dvc = tmp_path / "dvc-run"                  # a DVC run of the preset: its history CSVs
    dvc.mkdir()
    (dvc / "pretrain_history.csv").write_text(
        "epoch,n_selected,n_per_class,threshold,precision_T,recall_T,precision_G,knn_top1\n"
        "2,800,80,0.9,0.88,0.4,0.8,45\n3,1150,115,0.835,0.913,0.653,0.818,47\n")
    (dvc / "finetune_history.csv").write_text("epoch,loss,test_acc,lr\n" + "".join(
        f"{e},1.0,{50 + e},0.01\n" for e in range(1, 8)))
    d = sensitivity_real.reference_row("2", dvc, last=2)
    assert (d["moved"], d["alpha"], d["beta"], d["seed"], d["n_T"], d["knn_mean_last"]) == (None, 0.5, 0.25, 2, 1150, 46.0)
    assert d["selcl_plus"] == 55.0 and d["by_epoch"][0] == (2, 800.0, 0.88)      # mean of the last 5 of 51..57
    out = tmp_path / "s"
    assert sensitivity_real.main([str(p) for p in (hi, ref, b0)] + ["--out", str(out), "--last", "2",
                                                                     "--reference", f"2={dvc}"]) == 0
    lines = out.with_suffix(".md").read_text().splitlines()
    assert len(lines) == 2 + 4 and lines[3].startswith("| 0.50 | 0.25 | 2 | 115 | 1,150 / 0.913 / 0.653 |")
    del lines[3]
    assert lines[2].startswith("| 0.50 | 0.25 | 1 | 91 | 910 / 0.890 / 0.500 |") and "| 93.4 / 93.4 | 10.0 |" in lines[2]
    assert lines[3].startswith("| **0.75** | 0.25 |") and "| 40.50 | 89.9 | 9.0 |" in lines[3]
    assert lines[4].startswith("| 0.50 | **0.00** |") and "| 91.4 | — |" in lines[4]
    assert out.with_suffix(".png").stat().st_size > 1000


def test_both_fractiles_moved_or_missing_file(tmp_path, capsys):
    both = _run(tmp_path, "both", 0.75, 0.0, [900], [50.0], [50.0])
    with pytest.raises(SystemExit, match="α and β both differ"):
        sensitivity_real.row(both)
    assert sensitivity_real.main([str(tmp_path / "nope.json"), "--out", str(tmp_path / "s")]) == 1
    assert "nope.json" in capsys.readouterr().err


def _setting(path: Path, name: str, kind: str) -> Path:
    h = json.loads(path.read_text())
    h["cfg"].update(name=name, noise={"kind": kind, "rate": 0.5 if kind == "sym" else 0.4})
    path.write_text(json.dumps(h))
    return path


def test_symmetric_runs_get_the_papers_sym20_curve_and_settings_do_not_mix(tmp_path, capsys):
    a = _setting(_run(tmp_path, "a", 0.75, 0.25, [900], [50.0], [50.0]), "cpu_cifar10_sym50", "sym")
    out = tmp_path / "s"
    assert sensitivity_real.main([str(a), "--out", str(out)]) == 0
    text = out.with_suffix(".md").read_text()
    assert "paper Sel-CL+, sym20" in text and "| 95.6 |" in text         # sym20's α = 0.75, not asym40's 89.9
    b = _setting(_run(tmp_path, "b", 0.75, 0.25, [900], [50.0], [50.0]), "cpu_cifar10_asym40", "asym")
    assert sensitivity_real.main([str(a), str(b), "--out", str(out)]) == 1
    assert "different settings" in capsys.readouterr().err
