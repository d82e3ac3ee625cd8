"""Parity of the Uns-CL warm-up (SPEC §4, §10.2–10.3) with an independent port of the
authors' `train_uns` (utils/utils_noise.py), their MoCo queue (utils/MemoryMoCo.py) and
their labelled queue (utils/queue_with_pro.py, `AuthorsQueue` of tests/test_parity.py),
written from reading them.

The project runs `selcl.train.warmup` (the stage's function) for one epoch of two steps
on a tiny network. The reference replays what the project drew: its initial weights (as
`make_model` returns them), the augmented views (recorded as `_views` returns them, with
the generator state before and after), and the generator's initial state, from which it
draws again with plain torch the MoCo queue's random start (their MemoryMoCo: uniform in
[−s, s], s = 1/√(d/3)), the batch order and each view's mixup (λ = max(u, 1 − u), a
permutation). The step itself is theirs in plain torch: online query of view 1, EMA key
of view 2 (train mode, no gradient), MoCo's loss against the queue as it was, the queue
then takes the keys; the EMA embeds the two mixed views into the labelled queue; SGD;
the EMA's parameters move to m·EMA + (1 − m)·online. Shared with the project: torch
and the network definition.

Compared to 1e-6: the online parameters and BatchNorm statistics, the EMA parameters,
the MoCo queue, the labelled memory (entries, indices, pointer; it wraps at the second
step) and the epoch's mean loss.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import selcl.train as train
from selcl.models import build_model
from test_parity import AuthorsQueue
from test_parity_finetune import NoCheckpoint, Recorder

N, C, B, D, K_MOCO, TAU, M = 12, 3, 6, 8, 16, 0.1, 0.99
NET = dict(width=4, blocks=(1,), proj_dim=D)


def config():
    pc = {"batch_size": B, "drop_last": False, "memory": True, "memory_start_epoch": 4, "ema": 0.999,
          "queue_per_class": 3, "classifier": True, "lambda_cls": 1.0, "sim_loss": True, "lambda_sim": 0.01,
          "sim_grad_clip": 0.25, "grad_clip": None, "temperature": TAU, "mixup": True,
          "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4, "lr_warmup_epochs": 0, "lr_decay_epochs": [],
          "lr_decay": 0.1}
    wc = {"method": "uns_cl", "epochs": 1, "ema": M, "queue_size": K_MOCO, "temperature": TAU}
    return {"name": "parity", "model": {"arch": "small", "seed": 1, "bn_replicas": 1, **NET},
            "pretrain": pc, "warmup": wc}


def reference_warmup(data, rec, init_state, pc):
    """The authors' warm-up epoch on the project's recorded draws. Returns (online net,
    EMA net, MoCo queue [K, d], AuthorsQueue, mean loss)."""
    net = build_model("small", C, **NET).to(memory_format=torch.channels_last)
    net.load_state_dict(init_state)
    ema = copy.deepcopy(net)
    for p in ema.parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD(net.parameters(), lr=pc["lr"], momentum=pc["momentum"], weight_decay=pc["weight_decay"])
    (g_state, _, order_is_g), = rec.gens
    assert order_is_g
    g = torch.Generator().manual_seed(0)
    g.set_state(g_state)
    stdv = 1.0 / math.sqrt(D / 3)                          # MemoryMoCo's random start
    queue = torch.rand(K_MOCO, D, generator=g).mul_(2 * stdv).add_(-stdv)
    queue_index = 0
    memory = AuthorsQueue(pc["queue_per_class"] * C * 2, D, C)
    order = torch.randperm(N, generator=g)
    net.train(); ema.train()
    total = 0.0
    for step, (before, (v1, v2), after) in enumerate(rec.views):
        idx = order[step * B:(step + 1) * B]
        assert torch.equal(g.get_state(), before)
        g.set_state(after)
        mixes = []
        for _ in range(2):                                  # mix_data_lab, per view
            lam = torch.rand((), generator=g)
            mixes.append((torch.maximum(lam, 1 - lam), torch.randperm(B, generator=g)))
        q, _ = net(v1)
        with torch.no_grad():
            k, _ = ema(v2)
        out = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.clone().T], 1) / TAU   # [B, 1 + K]
        loss = F.cross_entropy(out, torch.zeros(B, dtype=torch.long))
        queue[(torch.arange(B) + queue_index) % K_MOCO] = k                        # update=True
        queue_index = (queue_index + B) % K_MOCO
        with torch.no_grad():
            (lam1, p1), (lam2, p2) = mixes
            zA, lA = ema(lam1 * v1 + (1 - lam1) * v1[p1])
            zB, lB = ema(lam2 * v2 + (1 - lam2) * v2[p2])
        memory.enqueue_dequeue(torch.cat([zA, zB]).double(), torch.cat([lA, lB]).softmax(1).double(),
                               torch.cat([idx, idx]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():                               # moment_update: parameters only
            for pe, pn in zip(ema.parameters(), net.parameters()):
                pe.mul_(M).add_(pn, alpha=1 - M)
        total += float(loss.detach()) * B
    return net, ema, queue, memory, total / N


def test_warmup_epoch_matches_the_authors_train_uns(monkeypatch):
    from conftest import random_images_and_net
    data, _, _ = random_images_and_net(N, C)
    rec = Recorder(monkeypatch)
    init = []
    make_model = train.make_model

    def rec_make_model(*args, **kwargs):
        model = make_model(*args, **kwargs)
        init.append(copy.deepcopy(model.state_dict()))
        return model

    monkeypatch.setattr(train, "make_model", rec_make_model)
    cfg = config()
    out = train.warmup(cfg, data, torch.device("cpu"), NoCheckpoint())
    assert len(rec.views) == 2 and len(init) == 1

    net, ema, queue, memory, loss = reference_warmup(data, rec, init[0], cfg["pretrain"])
    for name, want in net.state_dict().items():
        got = out["model"][name]
        assert torch.allclose(got.double(), want.double(), atol=1e-6, rtol=0), (name, (got - want).abs().max())
        if got.is_floating_point() and not name.startswith("classifier"):
            assert not torch.equal(got, init[0][name]), name             # the step reached it
    assert torch.equal(out["model"]["classifier.weight"], init[0]["classifier.weight"])  # no loss reaches it
    ema_state = out["ema"]["model"]
    for name, want in ema.named_parameters():
        assert torch.allclose(ema_state[name].double(), want.double(), atol=1e-6, rtol=0), name
    assert torch.allclose(out["queue"]["keys"].double(), queue.double(), atol=1e-6, rtol=0)
    assert out["queue"]["ptr"] == (2 * B) % K_MOCO
    feats, probs, ids = memory.get()
    mem = out["memory"]
    assert mem["ptr"] == memory.ptr == 0 and torch.equal(mem["ids"], ids)         # wrapped at step 2
    assert torch.allclose(mem["feats"].double(), feats, atol=1e-6, rtol=0)
    assert torch.allclose(mem["probs"].double(), probs, atol=1e-6, rtol=0)
    assert out["history"][0]["loss"] == pytest.approx(loss, abs=1e-6)
