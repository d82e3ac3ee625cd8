"""Parity of a Sel-CL+ fine-tuning epoch (SPEC §7, §10.3) with an independent port of
the authors' `train_mixup` + `criterionMixBoot` (utils/utils_plus.py) and of their
fine-tuning script's start (CIFAR/train_Sel-CL_fine-tuning.py: the saved online network,
a new classifier, SGD), written from reading them.

The project runs `selcl.train.finetune` (the stage's function) for one epoch of two
steps on a tiny network. The reference replays what the project drew: the augmented
views are recorded as `_views` returns them (with the generator state before and after,
so the reference checks the order of the draws), and the batch order, λ and the mixup
permutation are drawn again from copies of the project's generators with plain torch /
numpy. Everything else is the authors' step in plain torch: the network in train mode
on the mixed batch, a second train-mode forward of the un-augmented images (no gradient;
it updates the BatchNorm running statistics), the hard-bootstrapping loss with
B = 0.2 after `bootstrap_start`, SGD. Shared with the project: torch and the network
definition (`selcl.models.build_model`).

Compared to 1e-6: every parameter and BatchNorm buffer after the epoch, and the epoch's
mean loss. Documented difference kept on the reference side: λ ~ Beta(1, 1) is not folded
to max(λ, 1 − λ) (README "Faithfulness": the same distribution of batches).
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import selcl.train as train
from selcl.models import build_model

N, C, B, SEED = 24, 3, 6, 1
NET = dict(width=4, blocks=(1,), proj_dim=8)
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


class NoCheckpoint:
    def load(self):
        return None

    def maybe_save(self, *args):
        pass


class Recorder:
    """Wraps `selcl.train._views` and `_generators` for one test (monkeypatch).

    views: per `_views` call (generator state before [5056] uint8, what it returned: one
           float32 [b, 3, H, W] batch or a tuple of n, generator state after);
    gens:  per `_generators` call (torch state, numpy bit-generator state, order is g)."""

    def __init__(self, monkeypatch):
        self.views, self.gens = [], []
        views, generators = train._views, train._generators

        def rec_views(x, g, *args, **kwargs):
            before = g.get_state()
            out = views(x, g, *args, **kwargs)
            self.views.append((before, out, g.get_state()))
            return out

        def rec_generators(*args, **kwargs):
            g, np_rng, order = generators(*args, **kwargs)
            self.gens.append((g.get_state(), copy.deepcopy(np_rng.bit_generator.state), order is g))
            return g, np_rng, order

        monkeypatch.setattr(train, "_views", rec_views)
        monkeypatch.setattr(train, "_generators", rec_generators)


def pretrained_states(data_x):
    """(the online network's state, the EMA's): different weights, BatchNorm statistics
    from a few train-mode forwards, as a pre-training run leaves them."""
    gen = torch.Generator().manual_seed(11)
    states = []
    for _ in range(2):
        net = build_model("small", C, **NET, generator=gen)
        net.train()
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
            net((data_x.float() / 255 - 0.5) / 0.25)
        states.append(copy.deepcopy(net.state_dict()))
    return states


def reference_finetune(pre, data, rec, fc, model_seed):
    """The authors' fine-tuning epoch on the project's recorded draws. Returns (network,
    mean loss over the epoch's examples)."""
    net = build_model("small", C, **NET)
    net.load_state_dict(pre["model"])                       # the saved *online* network
    g0 = torch.Generator().manual_seed(model_seed + 7)      # a new classifier, U(±1/√fan_in)
    bound = 1 / math.sqrt(net.classifier.in_features)
    with torch.no_grad():
        net.classifier.weight.uniform_(-bound, bound, generator=g0)
        net.classifier.bias.uniform_(-bound, bound, generator=g0)
    net = net.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=fc["lr"], momentum=fc["momentum"], weight_decay=fc["weight_decay"])
    (g_state, np_state, order_is_g), = rec.gens
    assert order_is_g
    g = torch.Generator().manual_seed(0)
    g.set_state(g_state)
    np_rng = np.random.default_rng(0)
    np_rng.bit_generator.state = np_state
    pool = torch.nonzero(pre["examples"]).squeeze(1)        # T
    order = torch.randperm(len(pool), generator=g)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    total, seen, epoch = 0.0, 0, 1
    net.train()
    for step, (before, v, after) in enumerate(rec.views):
        idx = pool[order[step * B:(step + 1) * B]]
        x, y = data.x[idx], data.noisy[idx]
        assert torch.equal(g.get_state(), before)           # the views come next in the stream
        g.set_state(after)
        lam = float(np_rng.beta(fc["mixup_alpha"], fc["mixup_alpha"]))
        perm = torch.randperm(len(idx), generator=g)
        _, preds = net(lam * v + (1 - lam) * v[perm])
        no_da = ((x.float() / 255 - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            _, preds_no_da = net(no_da)                     # train mode: BatchNorm statistics move
        ce = lambda t: F.cross_entropy(preds, t, reduction="none")  # noqa: E731
        if epoch <= fc["bootstrap_start"]:
            loss = (lam * ce(y) + (1 - lam) * ce(y[perm])).mean()
        else:                                                # criterionMixBoot, B = 0.2
            z1 = F.log_softmax(preds_no_da, dim=1).max(1)[1]
            z2 = z1[perm]
            b = fc["bootstrap"]
            loss = (lam * (1 - b) * ce(y)).mean() + (lam * b * ce(z1)).mean() \
                + ((1 - lam) * (1 - b) * ce(y[perm])).mean() + ((1 - lam) * b * ce(z2)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        total, seen = total + float(loss.detach()) * len(idx), seen + len(idx)
    assert seen == len(pool)
    return net, total / seen


@pytest.mark.parametrize("bootstrap_start", [0, 1], ids=["bootstrapping", "mixup-CE"])
def test_finetune_epoch_matches_the_authors_train_mixup(bootstrap_start, monkeypatch):
    """Two fine-tuning steps (T of 12 examples, batch 6) from a pre-trained state whose
    EMA differs from its online network: weights, BatchNorm statistics and the loss equal
    the authors' loop to 1e-6; every encoder tensor moved (the projection head gets no
    gradient here, and SGD leaves it as it was, in both loops)."""
    from conftest import random_images_and_net
    data, _, _ = random_images_and_net(N, C)
    online, ema = pretrained_states(data.x)
    examples = torch.zeros(N, dtype=torch.bool)
    examples[torch.randperm(N, generator=torch.Generator().manual_seed(5))[:2 * B]] = True
    pre = {"model": online, "ema": {"momentum": 0.99, "model": ema}, "examples": examples}
    fc = {"reinit_classifier": True, "batch_size": B, "epochs": 1, "lr": 0.05, "momentum": 0.9,
          "weight_decay": 5e-4, "mixup_alpha": 1.0, "bootstrap": 0.2, "bootstrap_start": bootstrap_start,
          "augment": "weak", "drop_last": False}
    cfg = {"model": {"arch": "small", "seed": SEED, "bn_replicas": 1, **NET}, "finetune": fc}
    rec = Recorder(monkeypatch)
    out = train.finetune(cfg, data, pre, torch.device("cpu"), NoCheckpoint())
    assert len(rec.views) == 2 and out["n_train"] == 2 * B

    ref, ref_loss = reference_finetune(pre, data, rec, fc, SEED)
    for name, want in ref.state_dict().items():
        got = out["model"][name]
        assert torch.allclose(got.double(), want.double(), atol=1e-6, rtol=0), (name, (got - want).abs().max())
        if got.is_floating_point() and not name.startswith(("classifier", "projector")):
            assert not torch.equal(got, online[name]), name          # the step reached it
    assert out["history"][0]["loss"] == pytest.approx(ref_loss, abs=1e-6)
