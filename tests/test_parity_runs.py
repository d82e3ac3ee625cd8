"""bench/parity_runs.py --from-run: a finished run's pre-trained encoder fine-tuned again
(issue 11's oracle fine-tunes at the shipped budget) gives the run's own Sel-CL+ back, bit
for bit, and the three oracles beside it."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import tempfile
import uuid

import pytest
import torch
from conftest import PYTHON, ROOT, SETTING, TINY, copy_upstream, run_stage_inprocess, stage_env, tiny_params_dict, \
    write_params


MARK = 0.123456          # written into the run's pre-training history: must come back from it


@pytest.fixture(scope="module")
def finished_run(tiny_upstream, tmp_path_factory):
    """A tiny setting's folder after the pretrain and finetune stages (one thread); the last
    pre-training epoch's precision of T replaced by MARK, so a fresh pre-training shows."""
    folder = tmp_path_factory.mktemp("finished")
    copy_upstream(tiny_upstream, folder)
    write_params(folder, tiny_params_dict())
    mp = pytest.MonkeyPatch()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for stage in ("pretrain", "finetune"):
            run_stage_inprocess(mp, folder, stage)
    finally:
        torch.set_num_threads(threads)
        mp.undo()
    path = folder / "runs" / SETTING / "pretrain.pt"
    pre = torch.load(path, weights_only=False)
    pre["history"][-1]["precision_T"] = MARK
    torch.save(pre, path)
    return folder


def _run(folder, *args, from_run: bool = True) -> subprocess.CompletedProcess:
    env = stage_env(SELCL_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    source = ["--from-run", str(folder / "runs" / SETTING)] if from_run else []
    return subprocess.run([PYTHON, str(ROOT / "bench" / "parity_runs.py"), "--root", str(folder),
                           "--setting", SETTING, *source, "--no-ce", *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def _parity_runs(folder, *args, from_run: bool = True) -> dict:
    out = _run(folder, *args, from_run=from_run)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_from_run_refinetunes_the_run_and_its_oracles(finished_run):
    stage = json.loads((finished_run / "runs" / SETTING / "finetune.json").read_text())
    hist = finished_run / "history.json"
    got = _parity_runs(finished_run, "--oracles", "--history", str(hist))
    assert got["from_run"] == str(finished_run / "runs" / SETTING)
    assert got["precision_T"] == MARK                                    # the run's encoder, not a new one
    h = json.loads(hist.read_text())
    assert h["warmup"] is None and set(h["oracles"]) == set(got["finetune_oracles"])
    assert got["selcl_plus_final"] == stage["test_acc_last"]            # the same fine-tune, bit for bit
    assert got["selcl_plus_mean_last"] == stage["test_acc_mean_last"]
    assert set(got["finetune_oracles"]) == {"T_clean_labels", "all_noisy_labels", "all_clean_labels"}
    assert all(0 <= v <= 100 for v in got["finetune_oracles"].values())
    # each fine-tuned network's predictions on the training images, against the given labels
    assert set(got["train_label_fit"]) == {"selcl_plus", *got["finetune_oracles"]}
    assert all(0 <= f[k] <= 1 for f in got["train_label_fit"].values() for k in ("wrong_as_given", "right_as_given"))


def test_oracles_fine_tune_T_when_the_run_trained_on_other_examples(finished_run, tmp_path):
    """A run that fine-tuned on every example (pretrain.selected_sets=all, paper Table 4) gets
    one more oracle, T with its given labels; made here from the finished run by marking every
    example as trained on, so that oracle must give the run's own Sel-CL+ (on T) back. Named
    oracles only: all_noisy_labels is left out."""
    import shutil
    stage = json.loads((finished_run / "runs" / SETTING / "finetune.json").read_text())
    folder = tmp_path / "as_all"
    shutil.copytree(finished_run, folder)
    path = folder / "runs" / SETTING / "pretrain.pt"
    pre = torch.load(path, weights_only=False)
    T = torch.as_tensor(pre["selection"]["examples"]).bool()
    assert 0 < int(T.sum()) < len(T)
    pre["examples"] = torch.ones_like(T)
    torch.save(pre, path)
    got = _parity_runs(folder, "--oracles", "T_given_labels", "T_clean_labels", "all_clean_labels",
                       "--no-finetune", "--history", str(tmp_path / "h.json"))
    assert set(got["finetune_oracles"]) == {"T_clean_labels", "all_clean_labels", "T_given_labels"}
    assert got["finetune_oracles"]["T_given_labels"] == stage["test_acc_mean_last"]
    # T's clean-label oracle trains on T, not on the examples the run marked (every one here)
    h = json.loads((tmp_path / "h.json").read_text())["oracles"]
    assert [e["loss"] for e in h["T_clean_labels"]] != [e["loss"] for e in h["all_clean_labels"]]


def test_no_finetune_leaves_out_the_plain_fine_tune(finished_run):
    got = _parity_runs(finished_run, "--no-finetune")
    assert got["selcl_plus_final"] is None and got["finetune_oracles"] == {}


def test_leaves_no_checkpoints_behind(finished_run):
    """The loops' checkpoints go to a temporary folder, removed when the process exits, with
    or without an error (a disk shared with CI filled up once)."""
    label = f"cleanup-{uuid.uuid4().hex[:8]}"
    _parity_runs(finished_run, "--label", label)                      # fine-tunes: writes checkpoints
    left = [p for d in {tempfile.gettempdir(), "/tmp"} for p in glob.glob(f"{d}/parity_{label}_*")]
    assert left == []


def test_no_finetune_needs_a_finished_run(tmp_path):
    out = subprocess.run([PYTHON, str(ROOT / "bench" / "parity_runs.py"), "--setting", "demo_asym40",
                          "--no-finetune"], cwd=tmp_path, env=stage_env(), capture_output=True, text=True)
    assert out.returncode == 2 and "--no-finetune needs --from-run, --rev or --pretrained" in out.stderr


def test_a_mistyped_set_key_stops_before_any_work(tmp_path):
    """`--set pretrain.selected_set=all` (no such param) would run the default under the
    variant's label: it is refused, naming the key."""
    out = subprocess.run([PYTHON, str(ROOT / "bench" / "parity_runs.py"), "--root", str(ROOT),
                          "--setting", "demo_asym40", "--set", "pretrain.selected_set=all", "--no-ce"], cwd=tmp_path, env=stage_env(),
                         capture_output=True, text=True)
    assert out.returncode != 0 and "has no param pretrain.selected_set" in out.stderr


def test_a_named_oracle_that_is_the_run_itself_says_so(finished_run):
    """On a run that fine-tuned on T, T with its given labels is that fine-tune: named, it is
    not run, and the output says why instead of leaving it out without a word."""
    out = _run(finished_run, "--no-finetune", "--oracles", "T_given_labels")
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["finetune_oracles"] == {}
    assert "fine-tuned on T" in got["oracles_not_run"]["T_given_labels"]
    assert "--oracles T_given_labels not run" in out.stderr


def test_swap_crosses_two_pre_trainings_both_ways(finished_run, tmp_path):
    """--swap fine-tunes this encoder on the other run's T and the other encoder on both Ts.
    Crossed the other way round (the other run given as --pretrained, as the resume checkpoint
    a run leaves: no `examples`, T from its selection), the same fine-tunes come back with
    their roles exchanged, and the other's encoder on its own T is that run's plain fine-tune.
    Compared by their per-epoch training losses, exact floats."""
    base = finished_run / "runs" / SETTING / "pretrain.pt"
    pre = torch.load(base, weights_only=False)
    T = torch.as_tensor(pre["selection"]["examples"]).bool()
    g = torch.Generator().manual_seed(0)
    T2 = T.clone()
    T2[torch.nonzero(T).squeeze(1)[::2]] = False                  # half of T out, ...
    T2[torch.nonzero(~T).squeeze(1)[::3]] = True                  # ... a third of the rest in
    other = {k: v for k, v in pre.items() if k != "examples"}
    other["selection"] = {**pre["selection"], "examples": T2}
    other["model"] = {k: v + 0.05 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
                      for k, v in pre["model"].items()}
    other_path = tmp_path / "other.pt"
    torch.save(other, other_path)
    a = _parity_runs(finished_run, "--no-finetune", "--swap", str(other_path), "--history", str(tmp_path / "a.json"))
    b = _parity_runs(finished_run, "--pretrained", str(other_path), "--swap", str(base),
                     "--history", str(tmp_path / "b.json"))
    ha, hb = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ab")
    loss = lambda h: [e["loss"] for e in h]                                # noqa: E731
    sa, sb = a["swap"], b["swap"]
    assert sa["n_T"] == {"this": int(T.sum()), "swap": int(T2.sum()), "both": int((T & T2).sum())}
    assert sb["n_T"] == {"this": int(T2.sum()), "swap": int(T.sum()), "both": int((T & T2).sum())}
    cells = {   # (encoder, T): its fine-tune's losses
        ("base", "T2"): loss(ha["oracles"]["this_encoder_on_swap_T"]),
        ("other", "T"): loss(ha["oracles"]["swap_encoder_on_this_T"]),
        ("other", "T2"): loss(ha["oracles"]["swap_encoder_on_swap_T"]),
        ("base", "T"): loss(hb["oracles"]["swap_encoder_on_swap_T"])}
    assert cells["base", "T2"] == loss(hb["oracles"]["swap_encoder_on_this_T"])
    assert cells["other", "T"] == loss(hb["oracles"]["this_encoder_on_swap_T"])
    assert cells["other", "T2"] == loss(hb["finetune"])                  # --pretrained's plain fine-tune
    stage = json.loads((finished_run / "runs" / SETTING / "finetune.json").read_text())
    assert sb["swap_encoder_on_swap_T"] == stage["test_acc_mean_last"]     # base encoder on its T: the run's
    assert len({tuple(v) for v in cells.values()}) == 4                   # encoder and T each matter


def test_swap_refuses_a_file_of_other_data(finished_run, tmp_path):
    pre = torch.load(finished_run / "runs" / SETTING / "pretrain.pt", weights_only=False)
    pre["selection"] = {**pre["selection"], "examples": torch.ones(7, dtype=torch.bool)}
    torch.save(pre, tmp_path / "short.pt")
    out = _run(finished_run, "--no-finetune", "--swap", str(tmp_path / "short.pt"))
    assert out.returncode != 0 and "short.pt: its selection covers 7 examples" in out.stderr


def test_save_pretrain_gives_back_the_same_fine_tune(finished_run, tmp_path):
    """A pre-training written by --save-pretrain and read back by --pretrained fine-tunes to
    the same losses as the run that wrote it (warm-up and pre-training not run again)."""
    saved = tmp_path / "pre.pt"
    a = _parity_runs(finished_run, "--save-pretrain", str(saved), "--history", str(tmp_path / "a.json"),
                     from_run=False)
    b = _parity_runs(finished_run, "--pretrained", str(saved), "--history", str(tmp_path / "b.json"),
                     from_run=False)
    ha, hb = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ab")
    assert ha["warmup"] and hb["warmup"] is None
    assert [e["loss"] for e in ha["finetune"]] == [e["loss"] for e in hb["finetune"]]
    assert a["selcl_plus_mean_last"] == b["selcl_plus_mean_last"] and a["precision_T"] == b["precision_T"]


def test_save_pretrain_writes_a_finished_runs_pre_training_too(finished_run, tmp_path):
    """With --from-run there is no new pre-training: --save-pretrain writes the run's own, the
    same history and selection, rather than nothing."""
    saved = tmp_path / "from_run.pt"
    _parity_runs(finished_run, "--no-finetune", "--save-pretrain", str(saved))
    run = torch.load(finished_run / "runs" / SETTING / "pretrain.pt", weights_only=False)
    got = torch.load(saved, weights_only=False)
    assert got["history"] == run["history"]
    assert torch.equal(torch.as_tensor(got["selection"]["examples"]), torch.as_tensor(run["selection"]["examples"]))


def test_an_older_experiments_params_get_the_keys_added_since():
    """--rev reads the params.yaml an experiment ran with; a default key added since (here
    model.bn_replicas, which make_model reads) is taken from today's file and named, and
    nothing the experiment set is changed."""
    import importlib.util

    import copy

    from selcl.config import load_params, resolve
    spec = importlib.util.spec_from_file_location("parity_runs", ROOT / "bench" / "parity_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    today = load_params(ROOT / "params.yaml")
    # an older params.yaml: the setting inline, writing only what differs from its `defaults`
    now = resolve(today, "cpu_cifar10_asym40")
    sparse = {s: {k: v for k, v in now[s].items() if v != today["defaults"][s][k]} for s in today["defaults"]}
    old = {"run": ["cpu_cifar10_asym40"], "suites": {}, "defaults": copy.deepcopy(today["defaults"]),
           "settings": {"cpu_cifar10_asym40": sparse}}
    del old["defaults"]["model"]["bn_replicas"]
    old["defaults"]["model"]["seed"] = 7
    assert "bn_replicas" not in resolve(old, "cpu_cifar10_asym40")["model"]   # make_model would fail
    assert mod.fill_new_defaults(old, today) == ["model.bn_replicas"]
    cfg = resolve(old, "cpu_cifar10_asym40")
    assert cfg["model"]["bn_replicas"] == 1 and cfg["model"]["seed"] == 7
    assert mod.fill_new_defaults(old, today) == []


def test_ce_only_gives_the_full_runs_baseline_and_nothing_else(tmp_path):
    """`--ce-only` (a baseline variant beside existing Sel-CL+ runs, e.g. mixup CE) trains
    the CE baseline alone, and it is the same baseline a full run trains, bit for bit: the
    baseline seeds itself, so leaving out warm-up and pre-training changes nothing in it."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    write_params(folder, tiny_params_dict())
    env = stage_env(SELCL_THREADS="1")
    cmd = [PYTHON, str(ROOT / "bench" / "parity_runs.py"), "--root", str(folder), "--setting", SETTING]
    outs = {}
    for name, extra in {"full": [], "ce_only": ["--ce-only"]}.items():
        hist = tmp_path / f"{name}.json"
        out = subprocess.run([*cmd, *extra, "--history", str(hist)], cwd=folder, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        outs[name] = json.loads(out.stdout.strip().splitlines()[-1]), json.loads(hist.read_text())
    (full, h_full), (alone, h_alone) = outs["full"], outs["ce_only"]
    assert full["selcl_plus_mean_last"] is not None and h_full["pretrain"]
    assert alone["selcl_plus_mean_last"] is None and alone["n_T"] is None
    assert h_alone["warmup"] is None and h_alone["pretrain"] is None and h_alone["finetune"] is None
    assert len(h_alone["ce"]) == TINY["baseline"]["epochs"]
    assert h_alone["ce"] == h_full["ce"]
    assert alone["ce_mean_last"] == full["ce_mean_last"] and alone["encoder_knn_top1"] == {
        "ce": full["encoder_knn_top1"]["ce"]}


def test_ce_only_refuses_options_that_need_sel_cl(tmp_path):
    out = subprocess.run([PYTHON, str(ROOT / "bench" / "parity_runs.py"), "--setting", "demo_asym40",
                          "--ce-only", "--no-ce"], cwd=tmp_path, env=stage_env(), capture_output=True, text=True)
    assert out.returncode == 2 and "--ce-only runs the CE baseline alone" in out.stderr


def test_finetune_baseline_is_sel_cl_plus_recipe_on_the_baselines_network(finished_run, tmp_path):
    """--finetune-baseline: the CE baseline's own trained network (the one --save-baseline
    writes), fine-tuned with Sel-CL+'s recipe on every example with the noisy labels. The
    same fine-tune done here from the saved network gives the same per-epoch losses; from a
    fresh network it does not (so the flag really starts from the baseline)."""
    import numpy as np

    from selcl.checkpoint import Checkpointer
    from selcl.config import load_params, resolve
    from selcl.train import TrainData, finetune, make_model
    saved, hist = tmp_path / "baseline.pt", tmp_path / "h.json"
    env = stage_env(SELCL_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([PYTHON, str(ROOT / "bench" / "parity_runs.py"), "--root", str(finished_run),
                          "--setting", SETTING, "--from-run", str(finished_run / "runs" / SETTING), "--no-finetune",
                          "--finetune-baseline", "--save-baseline", str(saved), "--history", str(hist)],
                         cwd=finished_run, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got, h = json.loads(out.stdout.strip().splitlines()[-1]), json.loads(hist.read_text())
    assert len(h["ce_then_finetune"]) == TINY["finetune"]["epochs"] and h["finetune"] is None
    assert got["ce_then_finetune_final"] == h["ce_then_finetune"][-1]["test_acc"]
    base = torch.load(saved, weights_only=False)
    assert base["history"] == h["ce"]
    cfg = resolve(load_params(finished_run / "params.yaml"), SETTING)
    data = TrainData.load(finished_run / "runs" / SETTING, torch.device("cpu"))
    every = np.ones(data.n, dtype=bool)
    # the run's final T (a proper part of the examples, so "on T" is another fine-tune)
    T = torch.load(finished_run / "runs" / SETTING / "pretrain.pt", weights_only=False)["selection"]["examples"]
    T = torch.as_tensor(T).bool()
    assert 0 < int(T.sum()) < data.n
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        losses = {}
        for name, (state, examples) in {
                "baseline": (base["model"], every), "baseline_on_T": (base["model"], T),
                "fresh": (make_model(cfg["model"], data.num_classes, torch.device("cpu")).state_dict(), every)}.items():
            ck = Checkpointer(tmp_path / f"ft_{name}.pt", name, 10_000)
            losses[name] = [e["loss"] for e in finetune(cfg, data, {"model": state, "examples": examples},
                                                        torch.device("cpu"), ck)["history"]]
    finally:
        torch.set_num_threads(threads)
    assert [e["loss"] for e in h["ce_then_finetune"]] == losses["baseline"] != losses["fresh"]
    assert h["ce_then_finetune_on_T"] is None and got["ce_then_finetune_on_T_final"] is None
    # --baseline-from reads the saved baseline back instead of training it: the same fine-tune;
    # --finetune-baseline-on-T fine-tunes that network on the run's final T as well
    again = subprocess.run([PYTHON, str(ROOT / "bench" / "parity_runs.py"), "--root", str(finished_run),
                            "--setting", SETTING, "--from-run", str(finished_run / "runs" / SETTING), "--no-finetune",
                            "--baseline-from", str(saved), "--finetune-baseline", "--finetune-baseline-on-T",
                            "--history", str(tmp_path / "again.json")],
                           cwd=finished_run, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    h2 = json.loads((tmp_path / "again.json").read_text())
    assert h2["ce"] == h["ce"] and h2["ce_then_finetune"] == h["ce_then_finetune"]
    assert [e["loss"] for e in h2["ce_then_finetune_on_T"]] == losses["baseline_on_T"] != losses["baseline"]
    got2 = json.loads(again.stdout.strip().splitlines()[-1])
    assert got2["ce_then_finetune_on_T_final"] == h2["ce_then_finetune_on_T"][-1]["test_acc"]
    assert set(got2["train_label_fit"]) == {"ce", "ce_then_finetune", "ce_then_finetune_on_T"}
    from selcl.device import cpu_id, cpu_name
    assert got2["host"] == f"{cpu_name()}; {cpu_id()}"          # which kind of host gave these numbers
    # what the baseline's network predicts on its training images, against the classifier
    # accuracy of the same network on the wrong- and right-labelled parts (selcl.evaluate)
    from selcl.evaluate import test_accuracy
    model = make_model(cfg["model"], data.num_classes, torch.device("cpu"))
    model.load_state_dict(base["model"])
    model.eval()
    wrong = data.noisy != data.clean
    acc = lambda part, labels: test_accuracy(model, data.x[part], labels[part], data.mean, data.std)["top1"] / 100  # noqa: E731
    fit = got["train_label_fit"]["ce"]
    assert set(got["train_label_fit"]) == {"ce", "ce_then_finetune"} and fit["n_wrong"] == int(wrong.sum()) > 0
    assert fit["wrong_as_given"] == pytest.approx(acc(wrong, data.noisy), abs=1e-9)
    assert fit["wrong_as_true"] == pytest.approx(acc(wrong, data.clean), abs=1e-9)
    assert fit["right_as_given"] == pytest.approx(acc(~wrong, data.noisy), abs=1e-9)


def test_finetune_baseline_on_own_T_selects_on_the_baselines_features(finished_run, tmp_path):
    """--finetune-baseline-on-own-T (with --ce-only: no pre-training): §5's selection with
    the setting's K, α, β on the baseline network's L2-normalised backbone features, then
    Sel-CL+'s fine-tune of that network on the T it picks. The same selection and fine-tune
    done here from the saved network give the same T and the same per-epoch losses."""
    import numpy as np
    import torch.nn.functional as F

    from selcl import augment
    from selcl.checkpoint import Checkpointer
    from selcl.config import load_params, resolve
    from selcl.evaluate import weighted_knn_accuracy
    from selcl.pairs import configured_rule
    from selcl.selection import select
    from selcl.train import TrainData, finetune, make_model
    saved, hist = tmp_path / "baseline.pt", tmp_path / "h.json"
    env = stage_env(SELCL_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([PYTHON, str(ROOT / "bench" / "parity_runs.py"), "--root", str(finished_run),
                          "--setting", SETTING, "--ce-only", "--save-baseline", str(saved),
                          "--finetune-baseline-on-own-T", "--history", str(hist)],
                         cwd=finished_run, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got, h = json.loads(out.stdout.strip().splitlines()[-1]), json.loads(hist.read_text())
    assert h["pretrain"] is None and h["finetune"] is None and h["ce_then_finetune_on_T"] is None
    assert len(h["ce_then_finetune_on_own_T"]) == TINY["finetune"]["epochs"]
    assert got["ce_then_finetune_on_own_T_final"] == h["ce_then_finetune_on_own_T"][-1]["test_acc"]
    assert "ce_then_finetune_on_own_T" in got["train_label_fit"] and "n_in_selcl_T" not in got["baseline_own_T"]
    cfg = resolve(load_params(finished_run / "params.yaml"), SETTING)
    pc = cfg["pretrain"]
    data = TrainData.load(finished_run / "runs" / SETTING, torch.device("cpu"))
    model = make_model(cfg["model"], data.num_classes, torch.device("cpu"))
    model.load_state_dict(torch.load(saved, weights_only=False)["model"])
    model.eval()
    with torch.no_grad():
        feats = F.normalize(model.encode(augment.eval_view(data.x, data.mean, data.std, data.crop)), dim=1)
    sel = select(feats, data.noisy, data.num_classes, k=pc["k"], alpha=pc["alpha"], beta=pc["beta"],
                 weighting=pc["knn_weighting"], seed=pc["epochs"], clean_labels=data.clean,
                 pseudo_labels=pc["pseudo_labels"])
    T = configured_rule(sel, data.noisy, data.clean, pc).examples
    assert 0 < int(T.sum()) < data.n
    assert got["baseline_own_T"]["n_selected"] == int(T.sum())
    assert got["baseline_own_T"]["precision_T"] == pytest.approx(
        float((data.noisy == data.clean)[T].double().mean()), abs=1e-12)
    # the baseline's k-NN reuses the features the selection ran on: the same as computed here
    with torch.no_grad():
        feats_test = F.normalize(model.encode(augment.eval_view(data.x_test, data.mean, data.std, data.crop)), dim=1)
    ev = cfg["evaluate"]
    assert got["encoder_knn_top1"]["ce"] == pytest.approx(weighted_knn_accuracy(
        feats, data.clean, feats_test, data.y_test, data.num_classes, k=min(ev["k"], data.n),
        sigma=ev["sigma"])["top1"], abs=1e-9)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        r = finetune(cfg, data, {"model": model.state_dict(), "examples": T}, torch.device("cpu"),
                     Checkpointer(tmp_path / "ft.pt", "own_T", 10_000))
        every = finetune(cfg, data, {"model": model.state_dict(), "examples": np.ones(data.n, dtype=bool)},
                         torch.device("cpu"), Checkpointer(tmp_path / "ft_every.pt", "every", 10_000))
    finally:
        torch.set_num_threads(threads)
    losses = [e["loss"] for e in h["ce_then_finetune_on_own_T"]]
    assert losses == [e["loss"] for e in r["history"]] != [e["loss"] for e in every["history"]]


def test_finetune_baseline_needs_the_baseline(tmp_path):
    for flag in ("--finetune-baseline", "--finetune-baseline-on-T", "--finetune-baseline-on-own-T"):
        out = subprocess.run([PYTHON, str(ROOT / "bench" / "parity_runs.py"), "--setting", "demo_asym40",
                              "--no-ce", flag], cwd=tmp_path, env=stage_env(), capture_output=True, text=True)
        assert out.returncode == 2 and "need the CE baseline" in out.stderr
    # on T needs a pre-training (its T): not with the baseline alone
    out = subprocess.run([PYTHON, str(ROOT / "bench" / "parity_runs.py"), "--setting", "demo_asym40",
                          "--ce-only", "--finetune-baseline-on-T"], cwd=tmp_path, env=stage_env(),
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--ce-only runs the CE baseline alone" in out.stderr


def test_built_data_is_the_pipelines(finished_run, tmp_path):
    """Without --from-run the script builds the data and noisy labels itself; they must be the
    data and noise stages' own (the tiny setting keeps 20 digits a class, `data.subset`, which
    the script once ignored for every dataset but an image folder): the CE baseline trained on
    them equals the one trained on the finished run's files, epoch for epoch."""
    env = stage_env(SELCL_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    hists = {}
    for name, source in {"built": ["--ce-only"],
                         "run": ["--from-run", str(finished_run / "runs" / SETTING), "--no-finetune"]}.items():
        out = subprocess.run([PYTHON, str(ROOT / "bench" / "parity_runs.py"), "--root", str(finished_run),
                              "--setting", SETTING, *source, "--history", str(tmp_path / f"{name}.json")],
                             cwd=finished_run, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got["n_train"] == TINY["data"]["subset"] * 10
        hists[name] = json.loads((tmp_path / f"{name}.json").read_text())["ce"]
    assert hists["built"] == hists["run"]
