"""What the training loops update, and when (read against the authors' loops):

* the Uns-CL warm-up trains the encoder and the projection head only: the classifier, which
  no warm-up loss reaches, takes no SGD step at all (no weight decay, no momentum buffer),
  as in the authors' code, where its gradient stays missing;
* every loop takes ⌈n / batch⌉ steps an epoch and sees every example once: the last,
  smaller batch is kept, as the authors' loaders (drop_last=False) keep it; a setting's
  `drop_last: true` drops it (⌊n / batch⌋ steps);
* Sel-CL+ fine-tuning uses plain mixup CE up to epoch `bootstrap_start` and mixup + hard
  bootstrapping after it (SPEC §10.3; epoch 31 with the paper's 30), the target coming from
  a train-mode forward of the un-augmented image, without gradient, at every iteration.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from conftest import digits_data
from selcl import checkpoint, losses
from selcl import train as loops
from selcl.config import load_params, resolve

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def _cfg():
    cfg = copy.deepcopy(resolve(load_params(ROOT / "params.yaml"), "demo_asym40"))
    cfg["pretrain"].update(epochs=2, batch_size=32, lr_warmup_epochs=1, lr_decay_epochs=[], k=10,
                           memory_start_epoch=2)
    return cfg


def _ck(tmp_path, name):
    return checkpoint.Checkpointer(tmp_path / f"{name}.pt", name, 1000)


def test_uns_cl_warmup_leaves_the_classifier_alone(tmp_path):
    torch.set_num_threads(2)
    cfg = _cfg()
    assert cfg["warmup"]["method"] == "uns_cl" and cfg["pretrain"]["weight_decay"] > 0
    data = digits_data(cfg["noise"], n=128, n_test=32)
    start = loops.make_model(cfg["model"], data.num_classes, CPU).state_dict()
    warm = loops.warmup(cfg, data, CPU, _ck(tmp_path, "warmup"))
    end = warm["model"]
    for name in ("classifier.weight", "classifier.bias"):
        torch.testing.assert_close(end[name], start[name], rtol=0, atol=0, msg=name)
    moved = [n for n in start if n.endswith("weight") and not n.startswith("classifier")
             and not torch.equal(start[n], end[n])]
    assert moved, "the warm-up trained nothing"          # the test can see a step
    # the optimiser's state is keyed by position in model.parameters()
    params = [n for n, _ in loops.make_model(cfg["model"], data.num_classes, CPU).named_parameters()]
    with_buffer = {params[i] for i, s in warm["opt"]["state"].items() if "momentum_buffer" in s}
    assert set(params) - with_buffer == {"classifier.weight", "classifier.bias"}


@pytest.mark.parametrize("memory", [True, False])
def test_sup_cl_warmup_reads_the_memory_from_memory_start_epoch(tmp_path, monkeypatch, memory):
    """The Sup-CL warm-up (Table 7) reads the labelled memory from the same global epoch as
    pre-training, as the authors' `train_sup` (`epoch > sup_queue_begin`): a 3-epoch warm-up
    with memory_start_epoch 2 has no memory term in epoch 1 and one at every step of epochs
    2 and 3; with `memory: false`, never. The warm-up gets the stage's view of the setting,
    so a key it reads that stage_params.READS does not list fails here."""
    from selcl.stage_params import stage_view
    torch.set_num_threads(2)
    cfg = _cfg()
    cfg["warmup"].update(method="sup_cl", epochs=3)
    cfg["pretrain"].update(epochs=4, memory=memory)
    data = digits_data(cfg["noise"], n=96, n_test=32)                # 3 steps of 32 an epoch
    cfg = stage_view(cfg, "warmup")
    with_memory = []
    real = losses.selective_losses
    monkeypatch.setattr(losses, "selective_losses",
                        lambda *a, **k: with_memory.append(a[8] is not None) or real(*a, **k))
    loops.warmup(cfg, data, CPU, _ck(tmp_path, "warmup"))
    assert with_memory == [False] * 3 + [memory] * 6


@pytest.mark.parametrize("drop_last", [False, True])
def test_finetune_bootstraps_after_bootstrap_start_from_a_train_mode_forward(tmp_path, monkeypatch, drop_last):
    torch.set_num_threads(2)
    cfg = _cfg()
    cfg["finetune"].update(epochs=3, bootstrap_start=1, batch_size=32, eval_last=1, drop_last=drop_last)
    data = digits_data(cfg["noise"], n=128, n_test=32)
    T = torch.ones(data.n, dtype=torch.bool)
    T[::9] = False                                        # |T| = 113: three batches of 32 and one of 17
    pre = {"model": loops.make_model(cfg["model"], data.num_classes, CPU).state_dict(), "examples": T}
    batches = [32, 32, 32] if drop_last else [32, 32, 32, 17]
    iters = len(batches)

    calls = []
    real_ce, real_boot = losses.mixup_cross_entropy, losses.mixup_bootstrap_loss
    monkeypatch.setattr(losses, "mixup_cross_entropy", lambda *a, **k: calls.append("ce") or real_ce(*a, **k))
    monkeypatch.setattr(losses, "mixup_bootstrap_loss", lambda *a, **k: calls.append("boot") or real_boot(*a, **k))

    forwards = []                          # (train mode, with gradient, batch) per network call
    real_make = loops.make_model

    def make_recording(*a, **k):
        model = real_make(*a, **k)
        model.register_forward_hook(lambda m, i, o: forwards.append((m.training, torch.is_grad_enabled(),
                                                                     len(i[0]))))
        return model

    monkeypatch.setattr(loops, "make_model", make_recording)
    loops.finetune(cfg, data, pre, CPU, _ck(tmp_path, "finetune"))

    assert calls == ["ce"] * iters + ["boot"] * 2 * iters
    epochs = cfg["finetune"]["epochs"]
    mixed = [b for train, grad, b in forwards if train and grad]
    target = [b for train, grad, b in forwards if train and not grad]
    assert mixed == batches * epochs                                # the mixed batch; all of T each epoch
    assert target == mixed                                          # the bootstrapping target
    assert any(not train and not grad for train, grad, _ in forwards)   # test accuracy, eval mode
    assert not any(not train and grad for train, grad, _ in forwards)


def test_baseline_is_plain_ce_unless_mixup_alpha_is_set(tmp_path, monkeypatch):
    """`baseline.mixup_alpha`: null trains plain CE on clean views (the paper's
    Cross-Entropy row); a number trains mixup CE with λ ~ Beta(α, α) (its Mixup row)."""
    torch.set_num_threads(2)
    data = digits_data(_cfg()["noise"], n=128, n_test=32)
    iters = loops.steps_per_epoch(data.n, 32)
    calls = []
    real_ce = losses.mixup_cross_entropy
    monkeypatch.setattr(losses, "mixup_cross_entropy", lambda *a, **k: calls.append(a[3]) or real_ce(*a, **k))
    histories = {}
    for alpha in (None, 1.0):
        cfg = _cfg()
        cfg["baseline"].update(epochs=2, batch_size=32, lr_decay_epochs=[], eval_last=1, mixup_alpha=alpha,
                               drop_last=False)
        calls.clear()
        histories[alpha] = loops.baseline(cfg, data, CPU, _ck(tmp_path, f"baseline{alpha}"))["history"]
        if alpha is None:
            assert calls == []
        else:
            assert len(calls) == 2 * iters and all(0 <= lam <= 1 for lam in calls)
            assert len(set(calls)) > 1                       # a fresh λ every iteration
    assert histories[None][-1]["loss"] != histories[1.0][-1]["loss"]


def test_every_epoch_sees_every_example_once_the_last_batch_smaller():
    """⌈n / B⌉ batches, the last one smaller, together a permutation of 0..n−1 (the
    authors' DataLoader(shuffle=True), drop_last False); a new order each epoch."""
    g = torch.Generator().manual_seed(0)
    for n, B in ((128, 32), (130, 32), (5, 8), (391 * 128 - 48, 128)):
        epochs = [list(loops._batches(n, B, g, CPU)) for _ in range(2)]
        for batches in epochs:
            assert len(batches) == loops.steps_per_epoch(n, B) == -(-n // B)
            assert [len(b) for b in batches[:-1]] == [B] * (len(batches) - 1)
            assert len(batches[-1]) == n - B * (len(batches) - 1)
            assert torch.equal(torch.sort(torch.cat(batches)).values, torch.arange(n))
        assert not torch.equal(torch.cat(epochs[0]), torch.cat(epochs[1]))
        dropped = list(loops._batches(n, B, g, CPU, drop_last=True))
        assert len(dropped) == loops.steps_per_epoch(n, B, drop_last=True) == n // B
        assert all(len(b) == B for b in dropped)
        assert len(torch.cat(dropped + [torch.zeros(0, dtype=torch.long)]).unique()) == B * (n // B)
    assert loops.steps_per_epoch(50_000, 128) == 391                 # CIFAR: the last step has 80


def test_pretraining_steps_through_the_last_smaller_batch(tmp_path, monkeypatch):
    """Warm-up and pre-training take the last batch too: its L_CLS batch has its size (the
    authors' selected-example loader ends with the same short batch), and the memory
    receives its 2·b entries under the authors' wrap rule."""
    torch.set_num_threads(2)
    cfg = _cfg()
    cfg["pretrain"]["drop_last"] = False                            # the paper's (default) loaders
    data = digits_data(cfg["noise"], n=120, n_test=32)            # 3 batches of 32, one of 24
    sizes = {"uns": [], "sel": []}
    real_uns, real_step = loops.Pretrainer.uns_step, loops.Pretrainer.step
    monkeypatch.setattr(loops.Pretrainer, "uns_step",
                        lambda self, d, idx, *a, **k: sizes["uns"].append(len(idx)) or real_uns(self, d, idx, *a, **k))
    monkeypatch.setattr(loops.Pretrainer, "step",
                        lambda self, d, idx, *a, **k: sizes["sel"].append(len(idx)) or real_step(self, d, idx, *a, **k))
    enq = []
    real_enqueue = loops.LabelledMemory.enqueue
    monkeypatch.setattr(loops.LabelledMemory, "enqueue",
                        lambda self, z, p, ids: enq.append(len(ids)) or real_enqueue(self, z, p, ids))
    cls = []
    real_ce = losses.mixup_cross_entropy
    monkeypatch.setattr(losses, "mixup_cross_entropy", lambda *a, **k: cls.append(len(a[1])) or real_ce(*a, **k))
    warm = loops.warmup(cfg, data, CPU, _ck(tmp_path, "warmup"))
    pre = loops.pretrain(cfg, data, warm, CPU, _ck(tmp_path, "pretrain"))
    assert sizes["uns"] == [32, 32, 32, 24]
    assert cls == [64, 64, 64, 48] * (cfg["pretrain"]["epochs"] - cfg["warmup"]["epochs"])   # L_CLS, two views
    assert sizes["sel"] == [32, 32, 32, 24] * (cfg["pretrain"]["epochs"] - cfg["warmup"]["epochs"])
    assert enq == [64, 64, 64, 48] * cfg["pretrain"]["epochs"]
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in pre["history"])


def test_pretraining_logs_the_sel_cl_classifiers_test_accuracy(tmp_path):
    """Every pre-training epoch logs the classifier's test accuracy in eval mode (the
    authors' per-epoch test_eval; Table 6's "Sel-CL test acc"), and the evaluate stage's
    `selcl_test_top1` is the same number for the final model."""
    from selcl.evaluate import test_accuracy
    torch.set_num_threads(2)
    cfg = _cfg()
    data = digits_data(cfg["noise"], n=128, n_test=64)
    warm = loops.warmup(cfg, data, CPU, _ck(tmp_path, "warmup"))
    pre = loops.pretrain(cfg, data, warm, CPU, _ck(tmp_path, "pretrain"))
    assert all(0.0 <= h["test_acc"] <= 100.0 for h in pre["history"])
    report, _ = loops.knn_report(pre["model"], cfg, data, CPU)
    model = loops.make_model(cfg["model"], data.num_classes, CPU)
    model.load_state_dict(pre["model"])
    expect = test_accuracy(model, data.x_test, data.y_test, data.mean, data.std)["top1"]
    assert pre["history"][-1]["test_acc"] == report["selcl_test_top1"] == expect


def test_epoch_means_weigh_each_step_by_its_batch_size():
    """The logged per-epoch losses are per-example means, as the authors' meters
    (`update(loss, batch_size)`): a short last batch of 8 after one of 64 counts for 8
    examples, so (64·1 + 8·4) / 72, not the mean of the two steps (2.5)."""
    from selcl.train import EpochMeans
    m = EpochMeans()
    m.add({"loss": torch.tensor(1.0), "fallback": torch.tensor(0.25)}, 64)
    m.add({"loss": torch.tensor(4.0), "fallback": torch.tensor(1.0)}, 8)
    got = m.means()
    assert got["loss"] == pytest.approx(96 / 72)
    assert got["fallback"] == pytest.approx((16 + 8) / 72)     # the share of examples that fell back
    assert EpochMeans().means() == {}


def test_cpu_bf16_puts_every_network_pass_under_autocast_and_only_then(tmp_path, monkeypatch):
    """SELCL_CPU_BF16=1 (opt-in): the warm-up's online and EMA passes and the CE baseline's
    training passes run under CPU bf16 autocast; unset, none does, so CPU results stay
    float32. The embedding passes (eval mode: the baseline's test accuracy) never do, as on
    CUDA. Both train (finite losses), and differently."""
    torch.set_num_threads(2)
    cfg = _cfg()
    cfg["baseline"].update(epochs=1, batch_size=32, lr_decay_epochs=[], eval_last=1)
    data = digits_data(cfg["noise"], n=96, n_test=32)
    seen = []
    real_conv = torch.nn.Conv2d._conv_forward
    monkeypatch.setattr(torch.nn.Conv2d, "_conv_forward",
                        lambda self, x, w, b: seen.append((self.training, torch.is_autocast_enabled("cpu")))
                        or real_conv(self, x, w, b))
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("SELCL_CPU_BF16", flag)
        seen.clear()
        warm = loops.warmup(cfg, data, CPU, _ck(tmp_path, f"warmup{flag}"))
        base = loops.baseline(cfg, data, CPU, _ck(tmp_path, f"baseline{flag}"))
        assert set(seen) == {(True, flag == "1"), (False, False)}, (flag, set(seen))
        runs[flag] = (warm["model"], base["history"][-1])
        assert all(torch.isfinite(torch.tensor(h["loss"])) for h in warm["history"] + base["history"])
    assert not torch.equal(runs["0"][0]["encoder.conv1.weight"], runs["1"][0]["encoder.conv1.weight"])
    assert runs["0"][1]["loss"] != runs["1"][1]["loss"]
