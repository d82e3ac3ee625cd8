"""The crossover study's budgets (tools/crossover.py): every epoch count scales together,
lr decays stay inside their runs, CE keeps its ratio to Sel-CL+."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from crossover import exp_name, scaled  # noqa: E402

from selcl.config import load_params, resolve  # noqa: E402


@pytest.mark.parametrize("scale", [0.25, 0.5, 1.0, 2.0])
def test_scaled_budget_keeps_the_setting_proportions(scale):
    cfg = resolve(load_params(ROOT / "params.yaml"), "cpu_cifar10_asym40")
    o = scaled(cfg, scale)
    w, pre = cfg["warmup"]["epochs"], cfg["pretrain"]["epochs"] - cfg["warmup"]["epochs"]
    assert o["pretrain.epochs"] - w == max(1, round(pre * scale))          # warm-up never scales
    assert o["baseline.epochs"] == max(1, round(cfg["baseline"]["epochs"] * scale))
    assert o["finetune.epochs"] == max(1, round(cfg["finetune"]["epochs"] * scale))
    assert all(w < d < o["pretrain.epochs"] for d in o["pretrain.lr_decay_epochs"])
    assert all(0 < d < o["baseline.epochs"] for d in o["baseline.lr_decay_epochs"])
    assert 1 <= o["finetune.bootstrap_start"] <= o["finetune.epochs"]
    if scale == 1.0:     # the setting itself, unchanged
        assert o["pretrain.lr_decay_epochs"] == cfg["pretrain"]["lr_decay_epochs"]
        assert o["baseline.lr_decay_epochs"] == cfg["baseline"]["lr_decay_epochs"]
        assert o["finetune.bootstrap_start"] == cfg["finetune"]["bootstrap_start"]
    ratio = o["baseline.epochs"] / (o["pretrain.epochs"] + o["finetune.epochs"])
    assert ratio == pytest.approx(cfg["baseline"]["epochs"] / (cfg["pretrain"]["epochs"] + cfg["finetune"]["epochs"]),
                                  rel=0.15)


def test_experiment_names_round_trip():
    assert exp_name("cpu_cifar10_asym40", 0.25) == "cpu_cifar10_asym40-x0.25"
    assert float(exp_name("s", 2.0).rsplit("-x", 1)[1]) == 2.0


def test_collect_keeps_earlier_rows_it_does_not_replace():
    from crossover import keep_earlier
    new = [{"name": "s-x2", "scale": 2.0, "ce": 50.0}, {"name": "s-x0.5", "scale": 0.5, "ce": 40.0}]
    earlier = [{"name": "s-x0.25", "scale": 0.25, "ce": 30.0}, {"name": "s-x0.5", "scale": 0.5, "ce": 1.0}]
    rows = keep_earlier(new, earlier)
    by_name = {r["name"]: r for r in rows}
    assert sorted(by_name) == ["s-x0.25", "s-x0.5", "s-x2"] and len(rows) == 3
    assert by_name["s-x0.5"]["ce"] == 40.0                 # this run's experiment wins
    assert by_name["s-x0.25"].get("kept") and not by_name["s-x2"].get("kept")


def test_row_sources_old_and_new_collects():
    from crossover import _source
    assert _source({"name": "s-x2", "source": "DVC queue"}) == "DVC queue"
    assert _source({"name": "s-x2"}) == "DVC queue"                       # a row of an older collect
    assert _source({"name": "s (parity_runs, r.jsonl)"}) == "bench/parity_runs.py"
    assert _source({"name": "s-preset", "source": "DVC queue, s-preset", "kept": True}) == \
        "DVC queue, s-preset, earlier clone"


def test_collect_also_names_a_missing_experiment(tmp_path, capsys):
    from crossover import main
    rc = main(["collect", "cpu_cifar10_asym40", "--out", str(tmp_path / "x"),
               "--also", "no-such-experiment-anywhere=4"])
    assert rc == 2 and "no-such-experiment-anywhere" in capsys.readouterr().err


def test_ce_factor_trains_ce_longer_and_scales_only_ce():
    """`--ce-factor 4/3` at a quarter of asym40 (CE 240 → 80, decays at 40 and 60) keeps the
    first presets' CE (80 epochs for 1 + 30 + 20) while Sel-CL+'s epochs stay as without it."""
    cfg = resolve(load_params(ROOT / "params.yaml"), "cpu_cifar10_asym40")
    plain, longer = scaled(cfg, 0.25), scaled(cfg, 0.25, ce_factor=4 / 3)
    assert longer["baseline.epochs"] == round(cfg["baseline"]["epochs"] / 3)
    assert longer["baseline.lr_decay_epochs"] == [round(d / 3) for d in cfg["baseline"]["lr_decay_epochs"]]
    assert longer["baseline.epochs"] > plain["baseline.epochs"]
    assert {k: v for k, v in longer.items() if not k.startswith("baseline.")} == \
        {k: v for k, v in plain.items() if not k.startswith("baseline.")}


def _write_run(folder: Path, s: str, pre_epochs: range, ft: int, ce: int, selcl_plus: float, ce_acc: float):
    """A folder as `collect --histories` writes it, with made-up numbers."""
    folder.mkdir(parents=True)
    (folder / f"{s}.json").write_text(json.dumps({
        "selcl_plus": selcl_plus, "ce": ce_acc, "precision_T": 0.9, "recall_T": 0.6, "knn_clean": 50.0}))
    (folder / "pretrain_history.csv").write_text(
        "epoch,precision_T\n" + "".join(f"{e},{0.8 + e / 100}\n" for e in pre_epochs))
    (folder / "pretrain_timing.csv").write_text(
        "epoch,train_s,select_s,knn_s\n" + "".join(f"{e},30,6,24\n" for e in pre_epochs))
    (folder / "finetune_history.csv").write_text("epoch,test_acc\n" + "".join(f"{e},1\n" for e in range(1, ft + 1)))
    (folder / "baseline_history.csv").write_text(
        "epoch,test_acc\n" + "".join(f"{e},{ce_acc + e}\n" for e in range(1, ce + 1)))


def test_collect_reads_runs_of_another_clone_from_their_folders(tmp_path):
    """`--folders DIR=SCALE`: a run kept only as the CSVs `--histories` wrote joins the table;
    its epochs are counted from its histories (warm-up = epochs before pre-training's first row)."""
    from crossover import main
    s = "no_such_setting_here"                          # so no experiment of this clone joins
    _write_run(tmp_path / "a", s, range(2, 5), ft=2, ce=5, selcl_plus=60.0, ce_acc=50.0)
    _write_run(tmp_path / "b", s, range(2, 5), ft=2, ce=5, selcl_plus=62.0, ce_acc=51.0)
    _write_run(tmp_path / "c", s, range(3, 11), ft=4, ce=9, selcl_plus=70.0, ce_acc=52.0)
    out = tmp_path / "x"
    assert main(["collect", s, "--out", str(out), "--folders",
                 f"{tmp_path / 'c'}=2", f"{tmp_path / 'a'}=1", f"{tmp_path / 'b'}=1"]) == 0
    rows = json.loads(out.with_suffix(".json").read_text())
    assert [r["scale"] for r in rows] == [1, 1, 2]
    assert rows[0]["epochs"] == "1 + 3 + 2 / 5" and rows[0]["selcl_epochs"] == 6
    assert rows[2]["epochs"] == "2 + 8 + 4 / 9" and rows[2]["selcl_epochs"] == 14
    assert rows[0]["pretrain_min"] == pytest.approx(3 * 60 / 60)
    assert rows[0]["ce_final"] == 55.0 and rows[0]["ce_best"] == 55.0
    assert "| 2 | 2 + 8 + 4 / 9 |" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 0


def test_ce_factor_names_its_experiments_apart():
    from crossover import name_scale
    assert exp_name("s", 0.5, 4 / 3) == "s-x0.5-ce1.33333" != exp_name("s", 0.5)
    assert name_scale(exp_name("s", 0.5, 4 / 3)) == 0.5 == name_scale(exp_name("s", 0.5))


def test_collect_folders_names_a_missing_folder(tmp_path, capsys):
    from crossover import main
    assert main(["collect", "s", "--out", str(tmp_path / "x"), "--folders", str(tmp_path / "nowhere") + "=1"]) == 2
    err = capsys.readouterr().err
    assert "--folders" in err and "nowhere" in err


def test_an_experiment_name_on_two_baselines_takes_heads_or_is_refused():
    """DVC keeps names unique per baseline commit only: the same name queued on an old and a
    new commit must not be read at random."""
    from crossover import _experiments
    a, b = "a" * 40, "b" * 40
    listing = (f"refs/exps/{a[:2]}/{a[2:]}/s-x0.5 {'1' * 40}\n"
               f"refs/exps/{b[:2]}/{b[2:]}/s-x0.5 {'2' * 40}\n"
               f"refs/exps/{b[:2]}/{b[2:]}/s-x1 {'3' * 40}\n")
    assert _experiments(listing, head=b) == {"s-x0.5": "2" * 40, "s-x1": "3" * 40}
    with pytest.raises(SystemExit, match="s-x0.5 exists on 2 baselines"):
        _experiments(listing, head="c" * 40)


def test_collect_shows_a_missing_value_as_a_dash(tmp_path, capsys):
    """A --no-ce run of bench/parity_runs.py has no CE: a dash in the table, not a crash;
    a run with --set overrides is not the setting and is left out, saying so."""
    from crossover import main
    row = {"label": "x", "setting": "s", "from_run": None, "epochs": {"warmup": 1, "pretrain": 31, "finetune": 20, "ce": 80},
           "seconds": {"warmup+pretrain": 600}, "selcl_plus_mean_last": 50.0, "ce_mean_last": None, "ce_final": None,
           "ce_best": None, "precision_T": 0.9, "recall_T": 0.5, "knn_top1": 52.0}
    extra = tmp_path / "results.jsonl"
    extra.write_text(json.dumps(row) + "\n" + json.dumps(dict(row, label="y", overrides=["pretrain.alpha=0.75"])) + "\n")
    assert main(["collect", "s", "--out", str(tmp_path / "x"), "--extra", str(extra)]) == 0
    md = (tmp_path / "x.md").read_text()
    assert "| 50.00 | — | — | — | — |" in md and md.count("| bench/parity_runs.py |") == 1
    assert "y skipped: it ran with pretrain.alpha=0.75" in capsys.readouterr().err


def test_the_ce_line_never_averages_two_ce_budgets():
    """At one Sel-CL+ budget, CE trained 240 epochs twice and 320 once (a --ce-factor run):
    the CE line is the mean of the two 240-epoch runs, the 320-epoch run a marker only; at a
    tie the longer CE is the line. Sel-CL+ averages all of its runs."""
    from crossover import figure_points

    def row(sel, ce, ce_epochs, budget=201, **kw):
        return {"selcl_epochs": budget, "epochs": f"1 + 120 + 80 / {ce_epochs}", "selcl_plus": sel, "ce": ce,
                "ce_best": ce + 1, **kw}
    rows = [row(60.0, 50.0, 240), row(62.0, 52.0, 240), row(61.0, 70.0, 320),
            row(40.0, 30.0, 80, budget=51), row(41.0, 33.0, 100, budget=51),
            row(10.0, 10.0, 999, budget=51, kept=True)]
    budgets, mean, others = figure_points(rows)
    assert budgets == [51, 201]
    assert mean["selcl_plus"] == [40.5, 61.0]
    assert mean["ce"] == [33.0, 51.0] and mean["ce_best"] == [34.0, 52.0]
    assert sorted(others["ce"]) == [(51, 10.0), (51, 30.0), (51, 33.0), (201, 50.0), (201, 52.0), (201, 70.0)]
    lone = figure_points([row(60.0, 50.0, 240)])
    assert lone[1]["ce"] == [50.0] and lone[2] == {"selcl_plus": [], "ce": []}
