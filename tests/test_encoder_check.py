"""Every pre-training run records whether its encoder learned anything (issue 89): its last
epoch's k-NN against a freshly initialised network's, and its L_sel against the value L_sel
takes when every similarity is alike (`train.no_information_l_sel`); the report flags a run
that fails either. Recording it changes no training result."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import digits_data
from selcl import checkpoint, losses, report
from selcl import train as loops
from selcl.config import load_params, resolve

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def _alike_l_sel(read_memory: bool, g_pairs: str):
    """L_sel of the real step's losses (batch term, memory term, the fallback's u_i) for an
    encoder with one embedding for every view, key and queued key; (value, s̄, nil)."""
    B, d, C, Q, M = 16, 8, 10, 50, 96
    g = torch.Generator().manual_seed(0)
    e = F.normalize(torch.randn(1, d, generator=g), dim=1)
    ids = torch.randperm(200, generator=g)[:B]
    (lam1, p1), (lam2, p2) = losses.mixup_params(B, g), losses.mixup_params(B, g)
    lam = torch.cat([lam1.expand(B), lam2.expand(B)])
    anchor_ids, partner_rows = torch.cat([ids, ids]), torch.cat([p1, p2 + B])
    # "all": every pair in G (no anchor falls back); "own": (i, i) only, and no older copy of
    # i in the memory: no anchor has a positive (all fall back); "half": the batch's first
    # half only, the rest alone
    group = {"all": torch.zeros(200, dtype=torch.long), "own": torch.arange(200),
             "half": torch.arange(200)}[g_pairs]
    if g_pairs == "half":
        group[ids[:B // 2]] = -1
    in_G = lambda i, j: group[i][:, None] == group[j][None, :]       # noqa: E731
    z = e.expand(2 * B, d)
    p = torch.softmax(torch.randn(2 * B, C, generator=g), 1)
    own = torch.arange(2 * B)
    batch = losses.Candidates(z, p, anchor_ids, torch.ones(2 * B, dtype=torch.bool), own)
    older = torch.tensor([i for i in range(200) if i not in set(ids.tolist())])[:M - 2 * B]
    mem_ids = torch.cat([older, anchor_ids])
    current = torch.arange(M) >= M - 2 * B
    memory = losses.Candidates(e.expand(M, d), torch.softmax(torch.randn(M, C, generator=g), 1), mem_ids,
                               current, M - 2 * B + own) if read_memory else None
    u = losses.moco_loss(e.expand(B, d), e.expand(B, d), e.expand(Q, d), 0.1, reduction="none")
    out = losses.selective_losses(z, p, u, lam, anchor_ids, partner_rows, in_G, batch, memory, 0.1)
    pc = {"batch_size": B, "memory": True, "memory_start_epoch": 1 if read_memory else 10}
    s_mean = float(out["s"].mean())
    return float(out["l_sel"]), s_mean, loops.no_information_l_sel(pc, 2, s_mean, Q, M)


@pytest.mark.parametrize("read_memory", [True, False])
@pytest.mark.parametrize("g_pairs, fallback", [("all", 0.0), ("own", 1.0), ("half", 0.5)])
def test_no_information_value_is_l_sel_of_an_encoder_that_maps_everything_alike(read_memory, g_pairs, fallback):
    value, s_mean, nil = _alike_l_sel(read_memory, g_pairs)
    assert s_mean == fallback
    assert value == pytest.approx(nil, rel=1e-5)
    # the H200 subset run's numbers: B 128, memory 2,000, no fallback → about 13.1
    assert loops.no_information_l_sel({"batch_size": 128, "memory": True, "memory_start_epoch": 1},
                                      2, 0.0, 1000, 2000) == pytest.approx(math.log(255) + math.log(1999))


def test_the_check_fails_a_run_below_the_fresh_network_or_at_the_no_information_loss():
    pc = {"batch_size": 128, "memory": True, "memory_start_epoch": 1}
    row = {"epoch": 40, "knn_top1": 29.55, "l_sel": 12.67, "fallback": 0.0006}   # H200 run 4's last epoch
    bad = loops.encoder_check(row, 31.3, pc, 1000, 2000)
    assert not bad["encoder_learned"] and bad["l_sel_no_information"] == pytest.approx(13.14, abs=0.01)
    assert loops.encoder_check(dict(row, knn_top1=45.0), 31.3, pc, 1000, 2000)["encoder_learned"]
    assert not loops.encoder_check(dict(row, knn_top1=45.0, l_sel=13.2), 31.3, pc, 1000, 2000)["encoder_learned"]


def test_the_report_flags_only_a_run_whose_encoder_learned_nothing():
    assert report.encoder_flag({}) is None                                 # runs from before the check
    assert report.encoder_flag({"encoder_learned": True}) is None
    flag = report.encoder_flag({"encoder_learned": False, "knn_top1": 29.55, "knn_top1_init": 31.3,
                                "l_sel": 12.67, "l_sel_no_information": 13.15})
    assert flag.startswith("**The encoder learned nothing**") and "31.30" in flag and "13.15" in flag


def test_pretraining_records_the_check_and_trains_exactly_as_without_it(tmp_path, monkeypatch):
    """The fresh network's embedding (make_model seeds the global RNG) comes before the
    pre-training state is built: the history is the same bits with the check skipped."""
    torch.set_num_threads(2)
    cfg = copy.deepcopy(resolve(load_params(ROOT / "params.yaml"), "demo_asym40"))
    cfg["pretrain"].update(epochs=2, batch_size=32, lr_warmup_epochs=1, lr_decay_epochs=[], k=10,
                           memory_start_epoch=2)
    data = digits_data(cfg["noise"], n=128, n_test=64)
    ck = lambda name: checkpoint.Checkpointer(tmp_path / f"{name}.pt", name, 1000)   # noqa: E731
    warm = loops.warmup(cfg, data, CPU, ck("warmup"))
    pre = loops.pretrain(cfg, data, copy.deepcopy(warm), CPU, ck("pretrain"))
    check = pre["encoder_check"]
    assert set(check) == {"knn_top1_init", "l_sel", "l_sel_no_information", "encoder_learned"}
    assert check["knn_top1_init"] == loops.fresh_knn(cfg, data, CPU)
    assert check["l_sel"] == pre["history"][-1]["l_sel"]
    monkeypatch.setattr(loops, "fresh_knn", lambda *a: 0.0)
    again = loops.pretrain(cfg, data, copy.deepcopy(warm), CPU, ck("pretrain2"))
    assert repr(again["history"]) == repr(pre["history"])          # repr: nan == nan
    assert all(torch.equal(a, b) for a, b in zip(again["model"].values(), pre["model"].values()))


def test_the_built_report_carries_the_flag_in_the_setting_section(tmp_path, monkeypatch):
    import json

    from test_report import _build, fake_run

    from selcl.config import load_params
    params = load_params(ROOT / "params.yaml")
    configs = {n: resolve(params, n) for n in ("cifar10_sym20", "cifar10_asym40")}
    for name, learned in (("cifar10_sym20", True), ("cifar10_asym40", False)):
        fake_run(tmp_path / "runs" / name, selcl_plus=16.2, ce=58.5)
        pre = tmp_path / "runs" / name / "pretrain.json"
        pre.write_text(json.dumps({**json.loads(pre.read_text()), "knn_top1": 29.55, "knn_top1_init": 31.3,
                                   "l_sel": 12.67, "l_sel_no_information": 13.14, "encoder_learned": learned}))
    monkeypatch.chdir(tmp_path)
    md, _ = _build(tmp_path, configs)
    sections = {s.split("\n", 1)[0]: s for s in md.split("### ")[1:]}
    assert "The encoder learned nothing" in sections["cifar10_asym40"]
    assert "The encoder learned nothing" not in sections["cifar10_sym20"]
