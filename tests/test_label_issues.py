"""Issue 87, which labels are wrong: the verdict tables line up with the dataset's example
order, the cleaned labels round-trip as a noise file, the detectors are scored right, and
the cleanlab stage is tracked by DVC and reruns only when its inputs change.

The image folder's file names encode each image's truth and given label, and every image's
first pixel encodes its name, so a row of a table can be checked against three sources:
its `file`, the data stage's array at its `index`, and the noise stage's labels."""
from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from conftest import SETTING, run_stage_inprocess, tiny_params_dict, write_params

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ["cat", "dog", "emu"]
PER_CLASS = 14                       # names 0..13 unpadded: string order ≠ numeric order
NAME = re.compile(r"(\d+)_true(\d)_given(\d)\.png$")
STAGES_RUN = ("data", "noise", "warmup", "pretrain", "finetune", "label_issues", "cleanlab_baseline")


def make_folder(root: Path, seed: int = 0) -> np.ndarray:
    """train/<class>/<n>_true<c>_given<g>.png (+ a small test split); returns the given
    labels in the dataset order of selcl/data.py, which the label file must follow."""
    rng = np.random.default_rng(seed)
    given_by_name = {}
    for c, cname in enumerate(CLASSES):
        for split, count in (("train", PER_CLASS), ("test", 4)):
            (root / split / cname).mkdir(parents=True, exist_ok=True)
            for n in range(count):
                # 40 % of the training labels wrong, the rest kept
                g = int(rng.choice([k for k in range(3) if k != c])) if rng.random() < 0.4 else c
                img = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
                img[:3, :3] = 60 * c + 20           # a class-coloured corner: something to learn
                img[0, 0] = (c, n, g)               # the name, read back from data.npz
                name = f"{n}_true{c}_given{g}.png"
                Image.fromarray(img).save(root / split / cname / name)
                if split == "train":
                    given_by_name[(cname, name)] = g
    # THE dataset order: classes by name, files by name (Python string order)
    order = [(c, f) for c in sorted(CLASSES) for f in sorted(f for cc, f in given_by_name if cc == c)]
    return np.array([given_by_name[k] for k in order], dtype=np.int64)


def folder_params(folder: Path) -> dict:
    params = tiny_params_dict(
        data={"dataset": "imagefolder", "path": str(folder / "images"), "subset": None},
        noise={"kind": "file", "file": str(folder / "given.npy")},
        pretrain={"k": 5, "queue_per_class": 12, "alpha": 0.75},   # T neither empty nor everything on 42 images
        evaluate={"k": 5},
        baseline={"epochs": 2},
    )
    params["settings"][SETTING]["cleanlab"] = {"enabled": True, "folds": 3}
    return params


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Every stage up to label_issues and cleanlab_baseline, in this process, on the folder."""
    import torch
    folder = tmp_path_factory.mktemp("label_issues")
    np.save(folder / "given.npy", make_folder(folder / "images"))
    write_params(folder, folder_params(folder))
    mp = pytest.MonkeyPatch()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for stage in STAGES_RUN:
            run_stage_inprocess(mp, folder, stage)
    finally:
        torch.set_num_threads(threads)
        mp.undo()
    return folder


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_rows_line_up_with_the_dataset_order(finished):
    import torch
    run = finished / "runs" / SETTING
    rows = read_rows(run / "label_issues.csv")
    with np.load(run / "data.npz") as d:
        x = d["x_train"]
    with np.load(run / "labels.npz") as f:
        noisy, clean = f["noisy"], f["clean"]
    assert len(rows) == len(x) == 3 * PER_CLASS
    assert sorted(int(r["index"]) for r in rows) == list(range(len(x)))
    pre = torch.load(run / "pretrain.pt", weights_only=False)
    for r in rows:
        i = int(r["index"])
        n, true, given = map(int, NAME.search(r["file"]).groups())
        assert Path(r["file"]).parent.name == CLASSES[true]
        assert tuple(x[i][:, 0, 0]) == (true, n, given), r          # the image at `index` is this file
        assert int(r["given_label"]) == given == noisy[i] and r["given_class"] == CLASSES[given]
        assert clean[i] == true
        assert int(r["in_T"]) == int(pre["examples"][i])
        assert int(r["selcl_label"]) == int(pre["selection"]["pseudo_labels"][i])
        assert math.isclose(float(r["selcl_score"]), 1 - float(pre["selection"]["agreement"][i]), abs_tol=1e-5)
        assert r["selcl_class"] == CLASSES[int(r["selcl_label"])]
    # most suspicious first
    scores = [float(r["selcl_score"]) for r in rows]
    assert scores == sorted(scores, reverse=True)
    # the same alignment for cleanlab's table, and its score is cleanlab's self-confidence
    cl = read_rows(run / "cleanlab_issues.csv")
    assert len(cl) == len(rows)
    for r in cl:
        i = int(r["index"])
        n, true, given = map(int, NAME.search(r["file"]).groups())
        assert tuple(x[i][:, 0, 0]) == (true, n, given) and int(r["given_label"]) == given
        assert math.isclose(float(r["cleanlab_score"]), 1 - float(r["cleanlab_prob_given"]), abs_tol=1e-5)
    meta = json.loads((run / "cleanlab.json").read_text())
    assert meta["flagged"] == sum(int(r["cleanlab_flag"]) for r in cl) and len(meta["seconds_folds"]) == 3


def test_agreement_is_the_selection_loss(finished):
    """The exported score orders examples as Sel-CL's ℓ = −log clamp(q̂(ỹ)) does, and T is
    the per-class n_sel smallest ℓ: every example in T scores at most its class's worst."""
    import torch
    pre = torch.load(finished / "runs" / SETTING / "pretrain.pt", weights_only=False)
    sel, T = pre["selection"], pre["examples"].numpy()
    q = sel["agreement"].numpy().astype(np.float64)
    assert ((q >= 0) & (q <= 1)).all()
    loss = -np.log(np.clip(q, 0.01, 0.99))
    y = sel["labels"].numpy()
    for c in np.unique(y):
        inside, outside = loss[(y == c) & T], loss[(y == c) & ~T]
        if len(inside) and len(outside):
            assert inside.max() <= outside.min() + 1e-6


def test_cleaned_labels_round_trip_as_a_noise_file(finished, tmp_path, monkeypatch):
    run = finished / "runs" / SETTING
    cleaned = np.load(run / "cleaned_labels.npy")
    rows = read_rows(run / "label_issues.csv")
    by_index = {int(r["index"]): r for r in rows}
    assert cleaned.dtype == np.int64 and len(cleaned) == len(rows)
    for i, r in by_index.items():
        assert cleaned[i] == int(r["cleaned_label"])
        relabel = r["in_T"] == "0" and r["selcl_label"] != r["given_label"] and r["selcl_plus_label"] == r["selcl_label"]
        assert cleaned[i] == int(r["selcl_label"] if relabel else r["given_label"])
    # retrain on them: `noise: {kind: file, file: runs/<setting>/cleaned_labels.npy}`
    shutil.copytree(run, tmp_path / "runs" / SETTING)
    params = folder_params(finished)
    params["settings"][SETTING]["noise"] = {"kind": "file", "file": f"runs/{SETTING}/cleaned_labels.npy"}
    write_params(tmp_path, params)
    run_stage_inprocess(monkeypatch, tmp_path, "noise")
    with np.load(tmp_path / "runs" / SETTING / "labels.npz") as f:
        assert np.array_equal(f["noisy"], cleaned)


def test_cleaned_labels_rule():
    from selcl.label_issues import cleaned_labels
    given = np.array([0, 0, 1, 1, 2])
    y_hat = np.array([0, 1, 2, 1, 0])
    in_T = np.array([True, True, False, False, False])
    plus = np.array([0, 1, 2, 0, 1])
    # in T: kept even where ŷ differs; outside T: ŷ where Sel-CL+ agrees with it, else kept
    assert cleaned_labels(given, y_hat, in_T, plus).tolist() == [0, 0, 2, 1, 2]


def test_precision_recall_f1():
    from selcl.label_issues import prf
    wrong = np.array([1, 1, 0, 0, 1], dtype=bool)
    q = prf(np.array([1, 0, 1, 0, 1], dtype=bool), wrong)
    assert q["flagged"] == 3 and q["precision"] == pytest.approx(2 / 3) and q["recall"] == pytest.approx(2 / 3)
    assert q["f1"] == pytest.approx(2 / 3)
    assert math.isnan(prf(np.zeros(5, bool), wrong)["precision"])


def test_report_section_scores_the_three_detectors(finished, tmp_path):
    from selcl.label_issues import _fmt, prf, report_section
    md = "\n".join(report_section([SETTING], finished / "runs", tmp_path))
    run = finished / "runs" / SETTING
    with np.load(run / "labels.npz") as f:
        wrong = f["noisy"] != f["clean"]
    rows = sorted(read_rows(run / "label_issues.csv"), key=lambda r: int(r["index"]))
    q = prf(np.array([r["in_T"] == "0" for r in rows]), wrong)
    assert 0 < q["flagged"] < len(rows)
    assert f"| {SETTING} | not in T (Sel-CL) | {q['flagged']} | {_fmt(q['precision'])} | {_fmt(q['recall'])} |" in md
    assert "| Sel-CL+ ≠ given |" in md and "| cleanlab (3-fold CE, prune_by_noise_rate) |" in md
    assert (tmp_path / f"{SETTING}_label_issues.png").stat().st_size > 0


def test_cleanlab_stage_is_tracked_and_reruns_only_when_its_inputs_change(tmp_path):
    """Through DVC: cleanlab_baseline@tiny runs once, is up to date after, ignores params it
    does not read (fine-tuning's, the baseline's eval_last and mixup_alpha) and reruns when one it reads
    (cleanlab.seed) changes."""
    dst = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for rel in files:
        if (ROOT / rel).is_file() and not rel.startswith(("tests/", "bench/", "references/")):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dst / rel)
    params = tiny_params_dict(baseline={"epochs": 2})
    params["settings"][SETTING]["cleanlab"] = {"enabled": True, "folds": 2}
    write_params(dst, params)
    bin_dir = Path(sys.executable).parent
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "SELCL_DEVICE": "cpu",
           "HOME": str(tmp_path), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}

    def sh(*cmd):
        proc = subprocess.run(cmd, cwd=dst, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{cmd}: {proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        return proc.stdout

    def ran(out):
        return {s for s in re.findall(r"Running stage '([^']+)'", out) if not s.startswith("config@")}

    def set_param(section, key, value):
        p = yaml.safe_load((dst / "params.yaml").read_text())
        p["settings"][SETTING].setdefault(section, {})[key] = value
        (dst / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))

    sh("git", "init", "-q")
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "tiny")
    target = f"cleanlab_baseline@{SETTING}"
    assert ran(sh("dvc", "repro", target)) == {f"data@{SETTING}", f"noise@{SETTING}", target}
    assert (dst / "runs" / SETTING / "cleanlab_issues.csv").exists()
    assert ran(sh("dvc", "repro", target)) == set()
    set_param("finetune", "epochs", 3)
    set_param("baseline", "eval_last", 2)
    set_param("baseline", "mixup_alpha", 1.0)        # the folds always train plain CE
    assert ran(sh("dvc", "repro", target)) == set()
    set_param("cleanlab", "seed", 1)
    assert ran(sh("dvc", "repro", target)) == {target}


def test_renamed_images_rerun_the_tables_only_through_their_config(tmp_path):
    """The `file` column lists the folder's names: config@<setting> gives label_issues and
    cleanlab_baseline the folder's digest (names included), so a renamed image reruns them."""
    make_folder(tmp_path / "images")
    np.save(tmp_path / "given.npy", np.zeros(3 * PER_CLASS, dtype=np.int64))
    write_params(tmp_path, folder_params(tmp_path))
    config = tmp_path / "runs" / SETTING / "config"

    def configs():
        subprocess.run([sys.executable, str(ROOT / "stages" / "config.py"), SETTING], cwd=tmp_path, check=True)
        return {s: (config / f"{s}.json").read_text() for s in ("label_issues", "cleanlab_baseline", "warmup")}

    before = configs()
    assert '"source_sha256"' in before["label_issues"] and '"source_sha256"' in before["cleanlab_baseline"]
    first = sorted((tmp_path / "images" / "train" / "cat").iterdir())[0]
    first.rename(first.with_name("renamed_" + first.name))
    after = configs()
    assert after["label_issues"] != before["label_issues"]
    assert after["cleanlab_baseline"] != before["cleanlab_baseline"]
    assert after["warmup"] == before["warmup"]
