"""bench/heldout_set.py: the test images after the first data.subset_test per class, as an
archive a run reads through data.extra_test_path and scores after every epoch."""
from __future__ import annotations

import copy
import dataclasses
import math
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import digits_data
from selcl import checkpoint, evaluate
from selcl import train as loops
from selcl.config import load_params, resolve
from selcl.data import load_dataset, load_extra_test
from test_heldout import PER_CLASS, SEEN, _archive

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, tar: Path, k: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "heldout_set.py"), str(tar), "--subset-test", str(k),
                           "--out", str(tmp_path / "held.tar.gz")], capture_output=True, text=True, timeout=120)


def _members(tar: Path) -> dict[str, bytes]:
    with tarfile.open(tar) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf if m.isfile()}


def test_the_archive_holds_the_test_images_after_the_first_k_per_class_byte_for_byte(tmp_path):
    tar = _archive(tmp_path / "imgs")
    r = _write(tmp_path, tar, SEEN)
    assert r.returncode == 0, r.stderr
    n = PER_CLASS["test"]
    full = load_dataset("imagefolder", path=tar, subset=PER_CLASS["train"])
    x, y = load_extra_test(tmp_path / "held.tar.gz", full.classes)
    held = np.array([i for i in range(3 * n) if i % n >= SEEN])         # files 05..19 of each class
    assert np.array_equal(x, full.x_test[held]) and np.array_equal(y, full.y_test[held])
    src, out = _members(tar), _members(tmp_path / "held.tar.gz")
    assert sorted(out) == sorted(f"test/{c}/{i:02d}.png" for c in ("cat", "dog", "owl") for i in range(SEEN, n))
    assert all(out[name] == src[name] for name in out)                  # the files as they were
    assert f"{len(held):,} test images of 3 classes" in r.stdout


def test_hidden_files_and_non_images_are_skipped_as_the_data_stage_skips_them(tmp_path):
    """An archive packed on a Mac: '._00.png' and '.DS_Store' sort before the images, and
    would shift the first-k cut by a file if they counted. A folder works as an archive does."""
    _archive(tmp_path / "imgs")
    (tmp_path / "imgs" / "test" / "cat" / "._00.png").write_bytes(b"\0\5\26\7")
    (tmp_path / "imgs" / "test" / "dog" / ".DS_Store").write_bytes(b"\0")
    (tmp_path / "imgs" / "test" / "owl" / "README.txt").write_text("owls")
    r = _write(tmp_path, tmp_path / "imgs", SEEN)
    assert r.returncode == 0, r.stderr
    out = _members(tmp_path / "held.tar.gz")
    assert sorted(out) == sorted(f"test/{c}/{i:02d}.png" for c in ("cat", "dog", "owl")
                                 for i in range(SEEN, PER_CLASS["test"]))


def test_a_missing_source_is_one_clear_error(tmp_path):
    r = _write(tmp_path, tmp_path / "nowhere.tar.gz", SEEN)
    assert r.returncode != 0 and "nowhere.tar.gz does not exist" in r.stderr and "Traceback" not in r.stderr


def test_a_k_that_keeps_every_test_image_is_refused_and_nothing_is_written(tmp_path):
    tar = _archive(tmp_path / "imgs")
    r = _write(tmp_path, tar, PER_CLASS["test"])
    assert r.returncode != 0 and "none is held out" in r.stderr
    assert not (tmp_path / "held.tar.gz").exists() and not (tmp_path / "held.tar.gz.part").exists()


def test_a_second_test_set_is_scored_every_epoch_and_training_is_unchanged(tmp_path):
    """The docstring's promise: the held-out set adds test2_acc to every epoch's row and
    changes nothing else (no random draw, the network back in train mode)."""
    torch.set_num_threads(2)
    cfg = copy.deepcopy(resolve(load_params(ROOT / "params.yaml"), "demo_asym40"))
    cfg["baseline"].update(epochs=3, batch_size=32, lr_decay_epochs=[], eval_last=2, drop_last=False)
    data = digits_data(cfg["noise"], n=128, n_test=32)
    extra = load_dataset("digits")
    with_held = dataclasses.replace(data, x_test2=torch.as_tensor(extra.x_test[32:96]),
                                    y_test2=torch.as_tensor(extra.y_test[32:96], dtype=torch.int64))
    runs = [loops.baseline(cfg, d, torch.device("cpu"), checkpoint.Checkpointer(tmp_path / f"b{i}.pt", "b", 1000))
            for i, d in enumerate((data, with_held))]
    plain, held = runs[0]["history"], runs[1]["history"]
    assert all("test2_acc" not in row for row in plain) and all("test2_acc" in row for row in held)
    assert [{k: v for k, v in row.items() if not k.startswith("test2")} for row in held] == plain
    for key, value in runs[1]["model"].items():
        assert torch.equal(value, runs[0]["model"][key]), key
    model = loops.make_model(cfg["model"], 10, torch.device("cpu"))
    model.load_state_dict(runs[1]["model"])
    final = evaluate.test_accuracy(model, with_held.x_test2, with_held.y_test2, data.mean, data.std)["top1"]
    assert held[-1]["test2_acc"] == final          # the last epoch's network on the second set


def _history(path: Path, rows: list[tuple]) -> None:
    path.write_text("epoch,loss,test_acc,test2_acc\n" + "".join(f"{i + 1},1.0,{a},{b}\n" for i, (a, b) in enumerate(rows)))


def _epochs(run: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "heldout_epochs.py"), str(run), *extra],
                          capture_output=True, text=True, timeout=60)


def _rows(table: str) -> dict[str, list[str]]:
    """The table's rows by label: [on the scored images, on the held-out ones]."""
    return {label: cells[:2] for label, cells in _cells(table).items() if label}


def test_every_epoch_table_reads_ce_stopped_early_on_the_held_out_images(tmp_path):
    # CE peaks at epoch 3 on the scored images (54, the first of two equal) and at
    # epoch 4 on the held-out ones; Sel-CL+'s last two epochs average 60 / 58, and it
    # peaks at epoch 2 on the scored images (62), where the held-out images read 57.
    _history(tmp_path / "finetune_history.csv", [(40, 41), (62, 57), (58, 59)])
    _history(tmp_path / "baseline_history.csv", [(50, 49), (52, 51), (54, 50), (54, 53), (51, 48), (50, 47)])
    r = _epochs(tmp_path, "--eval-last", "2", "--out", str(tmp_path / "t.md"))
    assert r.returncode == 0, r.stderr
    rows = _rows(r.stdout)
    assert rows["Sel-CL+, mean of the last 2 epochs"] == ["60.00", "58.00"]
    assert rows["CE, mean of the last 2 epochs"] == ["50.50", "47.50"]
    assert rows["CE stopped early (epoch 3, best on the images scored every epoch)"] == ["54.00", "50.00"]
    assert rows["CE's best held-out epoch (epoch 4; an oracle)"] == ["54.00", "53.00"]
    assert rows["Sel-CL+ (last 2) − CE, CE stopped early"] == ["+6.00", "+8.00"]
    assert rows["Sel-CL+ (last 2) − CE, CE's best held-out epoch"] == ["+6.00", "+5.00"]
    assert rows["Sel-CL+ stopped early (epoch 2, best on the images scored every epoch)"] == ["62.00", "57.00"]
    assert rows["Sel-CL+ stopped early − CE stopped early"] == ["+8.00", "+7.00"]
    assert r.stdout.strip() in (tmp_path / "t.md").read_text()


def test_every_epoch_table_needs_the_held_out_column(tmp_path):
    (tmp_path / "finetune_history.csv").write_text("epoch,test_acc\n1,50\n")
    _history(tmp_path / "baseline_history.csv", [(50, 49)])
    r = _epochs(tmp_path, "--eval-last", "1")
    assert r.returncode != 0 and "finetune_history.csv: no test2_acc column" in r.stderr


def test_a_run_of_ce_alone_is_read_against_a_given_final_network(tmp_path):
    # No fine-tuning history: Sel-CL+ is its final network's (58, 57); its margins are
    # against CE's final epoch, CE stopped early (epoch 2) and CE's best held-out epoch (3).
    _history(tmp_path / "baseline_history.csv", [(50, 49), (55, 50), (53, 54), (52, 51)])
    r = _epochs(tmp_path, "--eval-last", "2", "--selcl-final", "58", "57")
    assert r.returncode == 0, r.stderr
    rows = _rows(r.stdout)
    assert rows["Sel-CL+, final network (given)"] == ["58.00", "57.00"]
    assert rows["Sel-CL+ (final network) − CE, final epoch"] == ["+6.00", "+6.00"]
    assert rows["Sel-CL+ (final network) − CE, CE stopped early"] == ["+3.00", "+7.00"]
    assert rows["Sel-CL+ (final network) − CE, CE's best held-out epoch"] == ["+5.00", "+3.00"]
    assert not any("mean of the last 2 epochs" in k and "Sel-CL+" in k for k in rows)
    assert not any(k.startswith("Sel-CL+ stopped early") for k in rows)


def _cells(table: str) -> dict[str, list[str]]:
    """Every row of the markdown tables by its first cell: the other cells."""
    return {cells[0]: cells[1:] for line in table.splitlines() if line.startswith("| ")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}


def _seeds(root: Path, *extra: str, preset: str = "x") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "heldout_seeds.py"), str(root), preset, *extra],
                          capture_output=True, text=True, timeout=60)


def test_seeds_table_reads_every_seed_and_the_spread_of_each_margin(tmp_path):
    # Sel-CL+ of seed s: held out a above its scored accuracy from epoch 2 on, best scored at
    # epoch 2; CE the same in every seed: best scored at epoch 2 (held out 52), final 53.
    # So "both stopped early" is 60 + a − 52 = 8 + a, and with a = −4, −2, 0 the margins are
    # 4, 6, 8: mean 6, sd 2, 95 % t-interval 6 ± 4.303 · 2 / √3 (t with 2 df: 4.303).
    layout = {1: ("x-seed1", "x-seed1"), 2: ("x-seed2-selcl", "x-seed2-ce"), 3: ("x-seed3-selcl", "x-seed3-ce")}
    for seed, (ft_dir, ce_dir) in layout.items():
        a = 2 * seed - 6
        for d in {ft_dir, ce_dir}:
            (tmp_path / d).mkdir()
        _history(tmp_path / ft_dir / "finetune_history.csv", [(50, 50), (60, 60 + a), (58, 58 + a)])
        _history(tmp_path / ce_dir / "baseline_history.csv", [(50, 50), (55, 52), (54, 53)])
    (tmp_path / "x-seed4-ce").mkdir()                    # CE alone: left out, and said so
    _history(tmp_path / "x-seed4-ce" / "baseline_history.csv", [(50, 50), (55, 52), (54, 53)])
    r = _seeds(tmp_path, "--eval-last", "2", "--out", str(tmp_path / "t.md"))
    assert r.returncode == 0, r.stderr
    assert "seed 4 (fine-tuning history)" in r.stderr
    rows = _cells(r.stdout)
    # seed 1 (a = −4): Sel-CL+ last 2 / final / stopped early, CE the same, then the four margins
    assert rows["1"] == ["55.00", "54.00", "2: 56.00", "52.50", "53.00", "2: 52.00", "+2.50", "+1.00", "+2.00", "+4.00"]
    assert "4" not in rows and rows["3"][-1] == "+8.00"
    half = 4.302653 * 2 / math.sqrt(3)
    t = 3 / (2 / math.sqrt(3))       # "over 3": t with 2 df, whose tail is (1 − t / √(t² + 2)) / 2
    assert rows["stopped early − stopped early"] == [
        "+6.00", "2.00", f"{6 - half:+.2f} to {6 + half:+.2f}", "0", f"{(1 - t / math.sqrt(t * t + 2)) / 2:.3f}"]
    assert rows["final − CE stopped early"][:2] == ["+4.00", "2.00"] and rows["final − CE stopped early"][3] == "1"
    assert r.stdout.strip() in (tmp_path / "t.md").read_text()


def test_seeds_table_needs_two_seeds_with_both_histories(tmp_path):
    (tmp_path / "x-seed1").mkdir()
    _history(tmp_path / "x-seed1" / "finetune_history.csv", [(50, 50)])
    _history(tmp_path / "x-seed1" / "baseline_history.csv", [(50, 50)])
    r = _seeds(tmp_path, "--eval-last", "1")
    assert r.returncode != 0 and "1 seed(s) of x with both histories" in r.stderr


@pytest.mark.parametrize("preset", ["asym40", "sym50"])
def test_the_recorded_seeds_table_is_the_recorded_histories(preset):
    # bench/results/heldout/<preset>-seeds.md, which docs/evidence.md quotes, is heldout_seeds.py's
    # reading of the histories committed beside it: a history added or changed fails this
    r = _seeds(ROOT / "bench" / "results" / "cpu_real_histories" / "heldout_epochs", preset=preset)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in (ROOT / "bench" / "results" / "heldout" / f"{preset}-seeds.md").read_text()
