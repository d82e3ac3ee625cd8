"""tools/table4_real.py: one row per Table 4 variant from parity_runs' lines and histories."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import table4_real  # noqa: E402


CFG = {"data": {"dataset": "imagefolder", "subset": 200},
       "noise": {"kind": "asym", "rate": 0.4, "seed": 42, "asym_map": "cifar10", "include_true_class": True,
                 "generator": "auto"}}


def _run(folder: Path, variant: str, knn: list, plus: float, n_T=None, prec_T=None, noise=0.196) -> None:
    line = {"label": f"table4-{variant}", "n_train": 2000, "realised_noise": noise, "knn_top1": knn[-1],
            "selcl_plus_mean_last": plus, "n_T": n_T, "precision_T": prec_T,
            "seconds": {"warmup+pretrain": 600, "finetune": 120, "ce": 0}}
    with open(folder / "results.jsonl", "a") as fh:
        fh.write(json.dumps(line) + "\n")
    hist = {"cfg": CFG, "pretrain": [{"epoch": e + 2, "knn_top1": k} for e, k in enumerate(knn)]}
    (folder / f"{variant}.json").write_text(json.dumps(hist))


def test_rows_markdown_and_figure(tmp_path):
    _run(tmp_path, "T_G1_G2", [40.0, 50.0, 52.0, 54.0], 55.0, n_T=1060, prec_T=0.913)
    _run(tmp_path, "all", [30.0, 31.0, 33.0, 35.0], 20.0)
    _run(tmp_path, "clean_assoc", [41.0, 45.0, 47.0, 49.0], 60.0)
    _run(tmp_path, "all", [38.0, 40.0, 42.0, 44.0], 40.0)                   # a rerun replaces the first
    _run(tmp_path, "all-seed2", [30.0, 32.0, 34.0, 36.0], 30.0)
    ref = tmp_path / "dvc-run"
    ref.mkdir()
    (ref / "pretrain_history.csv").write_text("epoch,n_selected,precision_T,precision_G,knn_top1\n"
                                              "2,900,0.9,0.8,45\n3,1000,0.91,0.82,47\n4,1060,0.913,0.839,49\n")
    (ref / "finetune_history.csv").write_text("epoch,loss,test_acc,lr\n" + "".join(
        f"{e},1.0,{50 + e},0.01\n" for e in range(1, 8)))
    out = tmp_path / "t4"
    assert table4_real.main([str(tmp_path), "--out", str(out), "--last", "2", "--reference", f"1={ref}"]) == 0
    rows = {r["variant"]: r for r in table4_real.rows(table4_real.load(tmp_path), {"all": 90.58}, last=2)}
    assert list(rows) == ["all", "all (model.seed 2)", "T_G1_G2", "clean_assoc"]   # the paper's order
    assert rows["all (model.seed 2)"]["knn_mean_last"] == 35.0 and rows["all (model.seed 2)"]["paper"] is None
    r = table4_real.reference_row("1", ref, last=2)
    assert (r["knn_last"], r["knn_mean_last"], r["pairs_right"], r["n_examples"]) == (49.0, 48.0, 0.839, 1060.0)
    assert r["selcl_plus"] == 55.0 and r["knn_by_epoch"][0] == (2, 45.0)          # mean of the last 5 of 51..57
    assert rows["all"]["knn_last"] == 44.0 and rows["all"]["knn_mean_last"] == 43.0
    assert rows["all"]["n_examples"] == 2000 and abs(rows["all"]["examples_clean"] - 0.804) < 1e-9
    assert rows["T_G1_G2"]["n_examples"] == 1060 and rows["T_G1_G2"]["examples_clean"] == 0.913
    assert rows["clean_assoc"]["n_examples"] == 1608 and rows["clean_assoc"]["examples_clean"] == 1.0
    assert rows["all"]["paper"] == 90.58 and rows["clean_assoc"]["paper"] is None
    assert rows["T_G1_G2"]["minutes"] == 12.0
    # all same-noisy-label pairs of the preset's labels (rebuilt, checked against the realised noise)
    assert abs(rows["all"]["pairs_right"] - 0.6976) < 1e-4 and rows["clean_assoc"]["pairs_right"] == 1.0
    _run(tmp_path, "all", [38.0, 40.0, 42.0, 44.0], 40.0, noise=0.25)      # labels that are not these
    assert table4_real.rows(table4_real.load(tmp_path), {})[0]["pairs_right"] is None
    md = out.with_suffix(".md").read_text()
    lines = md.splitlines()
    assert len(lines) == 2 + 5 and "| all |" in md and "| 43.00 |" in md and "| 90.58 |" in md
    assert lines[4].startswith("| T_G1_G2 |") and lines[5].startswith("| T_G1_G2, DVC preset (model.seed 1) |")
    assert out.with_suffix(".png").stat().st_size > 1000
