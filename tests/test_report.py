"""The report is honest about what it compares: every accuracy with its budget, a
"reproduced" verdict for paper settings, Tables 4/6/7 rows for their experiments,
the realised noise rate explained, commit and params hash on top, numbers-only metrics."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from selcl.config import resolve
from selcl.report import accuracy_plot_rows, build_report, load_tables, reproduced

ROOT = Path(__file__).resolve().parents[1]


def fake_run(folder: Path, selcl_plus: float, ce: float, classes: int = 10) -> None:
    folder.mkdir(parents=True)
    (folder / "finetune.json").write_text(json.dumps({"test_acc_mean_last": selcl_plus, "test_acc_last": selcl_plus}))
    (folder / "baseline.json").write_text(json.dumps({"enabled": True, "test_acc_mean_last": ce,
                                                      "test_acc_best": ce + 1}))
    (folder / "evaluate.json").write_text(json.dumps({"knn_clean_top1": 92.0, "knn_noisy_top1": 90.0}))
    (folder / "pretrain.json").write_text(json.dumps({"n_selected": 100, "precision_T": 0.9, "env": {"device": "cpu"}}))
    (folder / "noise.json").write_text(json.dumps({"realised_noise_rate": 0.2}))
    (folder / "data.json").write_text(json.dumps({"num_classes": classes, "dataset": "cifar10",
                                                  "classes": [str(c) for c in range(classes)]}))
    (folder / "finetune_history.csv").write_text("epoch,test_acc\n1,90\n2,93\n")
    (folder / "baseline_history.csv").write_text("epoch,test_acc\n1,50\n2,70\n3,75\n")
    y = np.arange(200) % classes
    np.savez(folder / "labels.npz", clean=y, noisy=y, num_classes=classes, transition=np.eye(classes))


def test_report_states_budgets_verdicts_and_table_rows(tmp_path, monkeypatch):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["settings"]["t4_t7"] = {"noise": {"kind": "asym", "rate": 0.4},
                                   "pretrain": {"selected_sets": "T_G1"}, "warmup": {"method": "sup_cl"}}
    run = ["cifar10_sym20", "t4_t7"]
    configs = {n: resolve(params, n) for n in run}
    fake_run(tmp_path / "runs" / "cifar10_sym20", selcl_plus=95.1, ce=80.0)   # paper 95.5: yes
    fake_run(tmp_path / "runs" / "t4_t7", selcl_plus=90.0, ce=70.0)           # paper 93.4 (sup_cl): no
    monkeypatch.chdir(tmp_path)
    build_report(run, configs, tmp_path / "runs", load_tables(ROOT / "references" / "paper_tables.yaml"),
                 tmp_path / "reports", plots_dir=tmp_path / "plots")
    md = (tmp_path / "reports" / "README.md").read_text()
    assert "params hash `" in md and "Git commit" in md
    assert "| cifar10_sym20 | cifar10 | sym 0.20 | 1 + 249 + 70 = 320 / 200 | **95.10** |" in md
    row = next(line for line in md.splitlines() if line.startswith("| cifar10_sym20 |") and "95.5" in line)
    assert "| yes |" in row
    assert "| no |" in next(line for line in md.splitlines() if line.startswith("| t4_t7 |") and "93.4" in line)
    assert "paper Table 4" in md and "| T_G1 | 92.00 | 90.64 |" in md
    assert "paper Table 7" in md and "| sup_cl | 90.00 | 93.40 |" in md
    assert "r·(C−1)/C" in md and "0.180" in md                       # expected sym rate 0.2·9/10
    metrics = json.loads((tmp_path / "reports" / "metrics" / "cifar10_sym20.json").read_text())
    assert all(isinstance(v, float) for v in metrics.values()) and "env" not in metrics
    summary = json.loads((tmp_path / "reports" / "metrics.json").read_text())
    assert summary == {"mean_gain_over_ce": 17.55, "reproduced": 1, "not_reproduced": 1}
    assert (tmp_path / "reports" / "figures" / "cifar10_sym20_accuracy.png").stat().st_size > 1000
    assert (tmp_path / "plots" / "accuracy" / "t4_t7.csv").read_text().startswith("epoch,Sel-CL+,CE\n")


def test_reproduced_verdict_and_accuracy_axis():
    assert reproduced(95.0, 95.5) == "yes" and reproduced(94.4, 95.5) == "no"
    assert reproduced(None, 95.5) == "not run" and reproduced(90.0, None) == "—"
    rows = accuracy_plot_rows([{"epoch": 1, "test_acc": 90.0}], [{"epoch": 1, "test_acc": 50.0}],
                              {"warmup": 1, "pretrain": 3, "finetune": 1, "ce": 1})
    # Sel-CL+'s fine-tuning epoch 1 is its 5th training epoch (1 warm-up + 3 pre-training)
    assert rows == [{"epoch": 1, "Sel-CL+": "", "CE": 50.0}, {"epoch": 5, "Sel-CL+": 90.0, "CE": ""}]


def test_label_file_noise_is_named_with_its_realised_rate(tmp_path, monkeypatch):
    """A CIFAR-N label file has no requested rate: the tables name the file and key and
    give the realised rate, never "file 0.00"."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["settings"]["cifar10n"] = {"noise": {"kind": "file", "file": "data/CIFAR-10_human.pt",
                                                "file_key": "worse_label"}}
    configs = {"cifar10n": resolve(params, "cifar10n")}
    fake_run(tmp_path / "runs" / "cifar10n", selcl_plus=80.0, ce=60.0)
    (tmp_path / "runs" / "cifar10n" / "noise.json").write_text(json.dumps({"realised_noise_rate": 0.4021}))
    monkeypatch.chdir(tmp_path)
    build_report(["cifar10n"], configs, tmp_path / "runs", load_tables(ROOT / "references" / "paper_tables.yaml"),
                 tmp_path / "reports", plots_dir=tmp_path / "plots")
    md = (tmp_path / "reports" / "README.md").read_text()
    assert "| cifar10n | cifar10 | file: CIFAR-10_human.pt[worse_label], realised 0.40 |" in md
    assert "| cifar10n | file: CIFAR-10_human.pt[worse_label] | — | the label file's own | 0.402 |" in md
    assert "file 0.00" not in md
