"""What the training loops update, and when (read against the authors' loops):

* the Uns-CL warm-up trains the encoder and the projection head only: the classifier, which
  no warm-up loss reaches, takes no SGD step at all (no weight decay, no momentum buffer),
  as in the authors' code, where its gradient stays missing;
* Sel-CL+ fine-tuning uses plain mixup CE up to epoch `bootstrap_start` and mixup + hard
  bootstrapping after it (SPEC §10.3; epoch 31 with the paper's 30), the target coming from
  a train-mode forward of the un-augmented image, without gradient, at every iteration.
"""
from __future__ import annotations

import copy
from pathlib import Path

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


def test_finetune_bootstraps_after_bootstrap_start_from_a_train_mode_forward(tmp_path, monkeypatch):
    torch.set_num_threads(2)
    cfg = _cfg()
    cfg["finetune"].update(epochs=3, bootstrap_start=1, batch_size=32, eval_last=1)
    data = digits_data(cfg["noise"], n=128, n_test=32)
    pre = {"model": loops.make_model(cfg["model"], data.num_classes, CPU).state_dict(),
           "examples": torch.ones(data.n, dtype=torch.bool)}
    iters = data.n // 32

    calls = []
    real_ce, real_boot = losses.mixup_cross_entropy, losses.mixup_bootstrap_loss
    monkeypatch.setattr(losses, "mixup_cross_entropy", lambda *a, **k: calls.append("ce") or real_ce(*a, **k))
    monkeypatch.setattr(losses, "mixup_bootstrap_loss", lambda *a, **k: calls.append("boot") or real_boot(*a, **k))

    forwards = []                                        # (train mode, with gradient) per network call
    real_make = loops.make_model

    def make_recording(*a, **k):
        model = real_make(*a, **k)
        model.register_forward_hook(lambda m, i, o: forwards.append((m.training, torch.is_grad_enabled())))
        return model

    monkeypatch.setattr(loops, "make_model", make_recording)
    loops.finetune(cfg, data, pre, CPU, _ck(tmp_path, "finetune"))

    assert calls == ["ce"] * iters + ["boot"] * 2 * iters
    epochs = cfg["finetune"]["epochs"]
    assert forwards.count((True, True)) == epochs * iters           # the mixed batch
    assert forwards.count((True, False)) == epochs * iters          # the bootstrapping target
    assert (False, False) in forwards                               # test accuracy, eval mode
    assert (False, True) not in forwards


def test_baseline_is_plain_ce_unless_mixup_alpha_is_set(tmp_path, monkeypatch):
    """`baseline.mixup_alpha`: null trains plain CE on clean views (the paper's
    Cross-Entropy row); a number trains mixup CE with λ ~ Beta(α, α) (its Mixup row)."""
    torch.set_num_threads(2)
    data = digits_data(_cfg()["noise"], n=128, n_test=32)
    iters = data.n // 32
    calls = []
    real_ce = losses.mixup_cross_entropy
    monkeypatch.setattr(losses, "mixup_cross_entropy", lambda *a, **k: calls.append(a[3]) or real_ce(*a, **k))
    histories = {}
    for alpha in (None, 1.0):
        cfg = _cfg()
        cfg["baseline"].update(epochs=2, batch_size=32, lr_decay_epochs=[], eval_last=1, mixup_alpha=alpha)
        calls.clear()
        histories[alpha] = loops.baseline(cfg, data, CPU, _ck(tmp_path, f"baseline{alpha}"))["history"]
        if alpha is None:
            assert calls == []
        else:
            assert len(calls) == 2 * iters and all(0 <= lam <= 1 for lam in calls)
            assert len(set(calls)) > 1                       # a fresh λ every iteration
    assert histories[None][-1]["loss"] != histories[1.0][-1]["loss"]
