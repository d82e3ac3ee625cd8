"""`model.bn_replicas`: BatchNorm as nn.DataParallel over R GPUs computes it (the authors'
WebVision-50 scripts: four GPUs, batch 64). The reference below is DataParallel's recipe
written out on one device: scatter the batch into R consecutive shards of ceil(n / R) rows,
run one copy of the network per shard (replica 0's buffers are the module's own, the other
copies' are dropped), gather the outputs, and sum every replica's gradient into the
module's parameters."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from selcl import models as M
from selcl.errors import ConfigError
from selcl.train import make_model

CFG = {"arch": "small", "width": 4, "blocks": [1, 1], "proj_dim": 8, "seed": 1}


def net(replicas: int = 1):
    m = M.build_model("small", 5, width=4, blocks=(1, 1), proj_dim=8,
                      generator=torch.Generator().manual_seed(0))
    return M.set_bn_replicas(m, replicas).train()


def images(n: int, seed: int = 1):
    return torch.randn(n, 3, 12, 12, generator=torch.Generator().manual_seed(seed))


def loss_of(z, logits):
    w = torch.linspace(-1, 1, z.shape[1])
    return (z * w).sum() + logits.square().mean() * 3


def dataparallel_reference(module, x, R):
    size = math.ceil(x.shape[0] / R)                       # scatter: the sizes torch.chunk gives
    shards = list(torch.split(x, size))
    replicas = [module] + [copy.deepcopy(module) for _ in shards[1:]]
    outs = [r(s) for r, s in zip(replicas, shards)]
    loss = loss_of(torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs]))
    loss.backward()
    for r in replicas[1:]:                                 # Broadcast's backward: a sum
        for p, q in zip(module.parameters(), r.parameters()):
            p.grad += q.grad
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])


@pytest.mark.parametrize("n, R", [(16, 4), (50, 4), (12, 2)])
def test_sharded_batchnorm_is_dataparallel(n, R):
    x = images(n)
    ref, sharded = net(1), net(R)
    z_ref, l_ref = dataparallel_reference(ref, x, R)
    z, logits = sharded(x)
    loss_of(z, logits).backward()
    torch.testing.assert_close(z, z_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, l_ref, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(sharded.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
    for (name, b), c in zip(sharded.named_buffers(), ref.buffers()):   # replica 0's statistics
        torch.testing.assert_close(b, c, atol=1e-6, rtol=1e-5, msg=name)


def test_the_reference_is_not_whole_batch_batchnorm():
    """The comparison above can fail: BatchNorm over the whole batch is another function."""
    x = images(16)
    z_ref, _ = dataparallel_reference(net(1), x, 4)
    z, _ = net(1)(x)
    assert float((z - z_ref).detach().abs().max()) > 1e-3


def test_shards_within_per_view_groups():
    """One call of three views under `bn_groups` with R shards equals three calls, each
    sharded (the CUDA path's concatenated views against the authors' call per view)."""
    views = [images(8, seed=s) for s in (1, 2, 3)]
    one, three = net(2), net(2)
    with M.bn_groups(one, 3):
        z_one, _ = one(torch.cat(views))
    z_three = torch.cat([three(v)[0] for v in views])
    torch.testing.assert_close(z_one, z_three, atol=1e-5, rtol=1e-5)
    for (name, b), c in zip(one.named_buffers(), three.buffers()):
        torch.testing.assert_close(b, c, atol=1e-6, rtol=1e-5, msg=name)


def test_eval_mode_ignores_shards():
    x = images(16)
    a, b = net(4).eval(), net(1).eval()
    torch.testing.assert_close(a(x)[0], b(x)[0])


def test_make_model_sets_every_batchnorm_and_the_ema_inherits():
    m = make_model({**CFG, "bn_replicas": 4}, 5, torch.device("cpu"))
    bns = [mod for mod in m.modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)]
    assert bns and all(mod.replicas == 4 for mod in bns)
    assert all(mod.replicas == 4 for mod in M.EMA(m).model.modules() if isinstance(mod, M.BatchNorm2d))
    plain = make_model({**CFG, "bn_replicas": 1}, 5, torch.device("cpu"))
    assert all(mod.replicas == 1 for mod in plain.modules() if isinstance(mod, M.BatchNorm2d))


def test_under_ddp_each_rank_takes_its_share_of_the_shards(monkeypatch):
    """SELCL_NPROC=2 with bn_replicas 4: each rank's half-batch is two shards; 3 cannot be
    split over two processes and stops with the parameter's name."""
    import selcl.train as train_mod
    monkeypatch.setattr(train_mod.dist, "world_size", lambda: 2)
    m = make_model({**CFG, "bn_replicas": 4}, 5, torch.device("cpu"))
    assert {mod.replicas for mod in m.modules() if isinstance(mod, M.BatchNorm2d)} == {2}
    with pytest.raises(ConfigError, match=r"model\.bn_replicas = 3"):
        make_model({**CFG, "bn_replicas": 3}, 5, torch.device("cpu"))


@pytest.mark.parametrize("value", [0, -1, 1.5, True, None])
def test_bad_bn_replicas_is_a_config_error(value):
    """Through `validate`, the check every stage makes of params.yaml."""
    from conftest import repo_params
    from selcl.config import validate
    params = repo_params()
    validate(params)
    params["defaults"]["model"]["bn_replicas"] = value
    with pytest.raises(ConfigError, match=r"defaults\.model\.bn_replicas"):
        validate(params)
