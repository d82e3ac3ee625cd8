"""Tests for selcl.models (SPEC §2): shapes, architecture facts, init, heads, EMA."""
import math

import pytest
import torch
import torch.nn as nn

from selcl import models as M
from selcl.device import autocast


def gen(seed):
    return torch.Generator().manual_seed(seed)


def n_params(m):
    return sum(p.numel() for p in m.parameters())


@pytest.fixture(scope="module")
def preact():
    return M.build_model("preact_resnet18", 10, generator=gen(0))


def test_preact_resnet18_shapes_and_size(preact):
    x = torch.randn(1, 3, 32, 32, generator=gen(1))
    shapes, feats = [], []
    hooks = [st.register_forward_hook(lambda mod, i, o: shapes.append(tuple(o.shape[1:])))
             for st in preact.encoder.stages]
    hooks.append(preact.encoder.register_forward_hook(lambda mod, i, o: feats.append(o)))
    preact.eval()                               # batch of 1: BN running stats
    with torch.no_grad():                       # one forward pass: the CPU is slow
        z, logits = preact(x)
    preact.train()
    for h in hooks:
        h.remove()
    assert shapes == [(64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 4, 4)]   # strides 1/2/2/2
    assert feats[0].shape == (1, 512) and preact.feat_dim == 512
    assert z.shape == (1, 128) and logits.shape == (1, 10)
    assert z.dtype == logits.dtype == torch.float32
    torch.testing.assert_close(z.norm(dim=1), torch.ones(1))
    # PreAct ResNet-18 (kuangliu / authors' layout) has 11,166,016 conv/BN params in
    # the blocks + stem conv; SPEC's stem BN adds 2·64
    assert n_params(preact.encoder) == 11_166_016 + 128
    assert n_params(preact.classifier) == 512 * 10 + 10
    assert n_params(preact.projector) == 512 * 128 + 128
    blocks = [m for m in preact.modules() if isinstance(m, M.PreActBlock)]
    assert len(blocks) == 8


def test_preact_block_adds_the_pre_activated_input():
    """The authors' block, written out from its parameters: a = ReLU(BN1(x)),
    out = conv2(ReLU(BN2(conv1(a)))) + (a | conv1×1(a)). The identity shortcut adds a, not x."""
    import torch.nn.functional as F
    for cin, cout, stride in ((8, 8, 1), (8, 16, 2)):
        blk = M.PreActBlock(cin, cout, stride)
        M.init_weights(blk, gen(7))
        with torch.no_grad():                      # BN affine away from (1, 0): a ≠ x for sure
            for bn in (blk.bn1, blk.bn2):
                bn.weight.uniform_(0.5, 1.5, generator=gen(8)); bn.bias.uniform_(-0.5, 0.5, generator=gen(9))
        x = torch.randn(4, cin, 6, 6, generator=gen(10))

        def bn(m, t):
            return F.batch_norm(t, None, None, m.weight, m.bias, training=True, eps=m.eps)
        a = F.relu(bn(blk.bn1, x))
        branch = F.conv2d(F.relu(bn(blk.bn2, F.conv2d(a, blk.conv1.weight, stride=stride, padding=1))),
                          blk.conv2.weight, padding=1)
        short = a if blk.shortcut is None else F.conv2d(a, blk.shortcut.weight, stride=stride)
        blk.train()
        torch.testing.assert_close(blk(x), branch + short)
        if blk.shortcut is None:                   # the two readings differ: the test can tell
            assert not torch.allclose(blk(x), branch + x)


def test_resnet18_webvision_layout():
    m = M.build_model("resnet18", 50, generator=gen(0))
    assert not any(isinstance(x, nn.MaxPool2d) for x in m.modules())
    assert len([x for x in m.modules() if isinstance(x, M.BasicBlock)]) == 8
    assert m.encoder.conv1.kernel_size == (3, 3) and m.encoder.conv1.stride == (1, 1)
    # standard CIFAR-style ResNet-18: 11,168,832 encoder params
    assert n_params(m.encoder) == 11_168_832
    x = torch.randn(2, 3, 16, 16, generator=gen(3))        # small input keeps the test fast
    with torch.no_grad():
        z, logits = m(x)
    assert z.shape == (2, 128) and logits.shape == (2, 50)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(2))


def test_small_variant():
    m = M.build_model("small", 10, width=16, blocks=(1, 1, 1, 1), proj_dim=32, generator=gen(0))
    assert m.feat_dim == 128
    assert len([x for x in m.modules() if isinstance(x, M.PreActBlock)]) == 4
    z, logits = m(torch.randn(3, 3, 32, 32, generator=gen(4)))
    assert z.shape == (3, 32) and logits.shape == (3, 10)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(3))
    # same code path as PreAct ResNet-18: width 64, blocks (2,2,2,2) gives the same net
    a = M.build_model("small", 10, width=64, blocks=(2, 2, 2, 2), generator=gen(5))
    b = M.build_model("preact_resnet18", 10, generator=gen(5))
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_unknown_arch():
    with pytest.raises(ValueError, match="wide_resnet.*preact_resnet18.*resnet18.*small"):
        M.build_model("wide_resnet", 10)


def test_kaiming_fan_out_init(preact):
    for mod in preact.modules():
        if isinstance(mod, nn.Conv2d) and mod.weight.numel() > 20_000:
            fan_out = mod.out_channels * mod.kernel_size[0] * mod.kernel_size[1]
            std = math.sqrt(2.0 / fan_out)
            w = mod.weight.double()
            assert abs(w.std().item() / std - 1) < 0.05, mod
            assert abs(w.mean().item()) < 0.05 * std
        if isinstance(mod, nn.BatchNorm2d):
            assert (mod.weight == 1).all() and (mod.bias == 0).all()
    bound = 1 / math.sqrt(512)
    assert preact.classifier.weight.abs().max() <= bound
    assert preact.classifier.weight.abs().max() > 0.9 * bound


def test_init_is_seeded():
    a = M.build_model("small", 10, width=8, blocks=(1, 1), generator=gen(1)).state_dict()
    b = M.build_model("small", 10, width=8, blocks=(1, 1), generator=gen(1)).state_dict()
    c = M.build_model("small", 10, width=8, blocks=(1, 1), generator=gen(2)).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["encoder.conv1.weight"], c["encoder.conv1.weight"])


def test_heads_float32_under_bf16_autocast():
    m = M.build_model("small", 10, width=8, blocks=(1, 1), generator=gen(0))
    x = torch.randn(4, 3, 16, 16, generator=gen(6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z, logits = m(x)
        v = m.encode(x)
    assert z.dtype == logits.dtype == v.dtype == torch.float32
    torch.testing.assert_close(z.norm(dim=1), torch.ones(4))
    with autocast(torch.device("cpu")):                      # project helper: no-op on CPU
        z2, _ = m(x)
    torch.testing.assert_close(z2, m(x)[0])
    # z = normalise(projector(v)), logits = classifier(v)  (float64 reference)
    v64 = m.encode(x).double()
    zr = v64 @ m.projector.weight.double().T + m.projector.bias.double()
    zr = zr / zr.norm(dim=1, keepdim=True)
    lr = v64 @ m.classifier.weight.double().T + m.classifier.bias.double()
    z, logits = m(x)
    torch.testing.assert_close(z.double(), zr, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits.double(), lr, atol=1e-5, rtol=0)


def test_channels_last():
    m = M.build_model("small", 10, width=16, blocks=(1, 1, 1, 1), generator=gen(0))
    x = torch.randn(4, 3, 32, 32, generator=gen(7))
    z, logits = m(x)
    m_cl = m.to(memory_format=torch.channels_last)
    z2, logits2 = m_cl(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(z2, z, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits2, logits, atol=1e-4, rtol=1e-4)


def test_training_layout_is_channels_last_unless_turned_off(monkeypatch):
    """Every device trains in channels_last (oneDNN / cuDNN NHWC); SELCL_CHANNELS_LAST=0
    gives NCHW, and a model made under either computes the same function."""
    from selcl.device import memory_format
    from selcl.train import make_model
    cfg = {"arch": "small", "width": 8, "blocks": [1, 1], "proj_dim": 16, "seed": 1, "bn_replicas": 1}
    x = torch.randn(6, 3, 16, 16, generator=gen(3))
    monkeypatch.delenv("SELCL_CHANNELS_LAST", raising=False)
    assert memory_format(torch.device("cpu")) == torch.channels_last
    m_cl = make_model(cfg, 10, torch.device("cpu"))
    assert m_cl.encoder.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    monkeypatch.setenv("SELCL_CHANNELS_LAST", "0")
    assert memory_format(torch.device("cpu")) == torch.contiguous_format
    m = make_model(cfg, 10, torch.device("cpu"))
    assert m.encoder.conv1.weight.is_contiguous()
    for a, b in zip(m(x), m_cl(x.contiguous(memory_format=torch.channels_last))):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_backward_reaches_all_params():
    m = M.build_model("small", 10, width=8, blocks=(1, 1), generator=gen(0))
    z, logits = m(torch.randn(4, 3, 16, 16, generator=gen(8)))
    (z.sum() + logits.sum()).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_reset_classifier_changes_only_classifier():
    m = M.build_model("small", 10, width=8, blocks=(1, 1), generator=gen(0))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    m.reset_classifier(gen(9))
    after = m.state_dict()
    for k in before:
        if k.startswith("classifier."):
            assert not torch.equal(before[k], after[k]), k
        else:
            assert torch.equal(before[k], after[k]), k
    bound = 1 / math.sqrt(m.feat_dim)
    assert m.classifier.weight.abs().max() <= bound and m.classifier.bias.abs().max() <= bound
    w = m.classifier.weight.clone()
    m.reset_classifier(gen(9))
    assert torch.equal(w, m.classifier.weight)                 # seeded


def _perturb(model, seed):
    with torch.no_grad():
        g = gen(seed)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g))
        for b in model.buffers():
            if b.dtype.is_floating_point:
                b.add_(torch.rand(b.shape, generator=g))
            else:
                b.add_(3)


def test_ema_update_math():
    m = M.build_model("small", 10, width=8, blocks=(1, 1), generator=gen(0))
    ema = M.EMA(m, momentum=0.9)
    assert all(not p.requires_grad for p in ema.model.parameters())
    assert all(p.requires_grad for p in m.parameters())
    old = {k: v.double().clone() for k, v in ema.model.state_dict().items()}
    _perturb(m, 10)
    online = {k: v.clone() for k, v in m.state_dict().items()}
    ema.update(m)
    new_ema = ema.model.state_dict()
    params = {n for n, _ in ema.model.named_parameters()}
    for k, v in m.state_dict().items():
        if k in params:   # θ_ema ← m·θ_ema + (1−m)·θ
            ref = 0.9 * old[k] + 0.1 * v.double()
            torch.testing.assert_close(new_ema[k].double(), ref, atol=1e-6, rtol=0)
        else:             # buffers copied
            assert torch.equal(new_ema[k], v), k
    # the online model is not touched, and is a different object
    assert ema.model is not m
    for k, v in m.state_dict().items():
        assert torch.equal(v, online[k]), k


def test_ema_uses_batch_statistics_and_no_grad():
    m = M.build_model("small", 10, width=8, blocks=(1, 1), generator=gen(0))
    _perturb(m, 11)                                # running stats ≠ batch stats
    ema = M.EMA(m, momentum=0.999)
    ema.model.eval()
    x = torch.randn(6, 3, 16, 16, generator=gen(12))
    z, _ = ema(x)
    assert ema.model.training and not z.requires_grad
    m.train()
    z_train, _ = m(x)
    m.eval()
    z_eval, _ = m(x)
    torch.testing.assert_close(z, z_train.detach())
    assert not torch.allclose(z, z_eval)


def test_ema_state_dict_roundtrip():
    m = M.build_model("small", 10, width=8, blocks=(1, 1), generator=gen(0))
    ema = M.EMA(m, momentum=0.99)
    _perturb(m, 13)
    ema.update(m)
    other = M.EMA(M.build_model("small", 10, width=8, blocks=(1, 1), generator=gen(5)), 0.5)
    other.load_state_dict(ema.state_dict())
    assert other.momentum == 0.99
    sa, sb = ema.model.state_dict(), other.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_channels_last():
    dev = torch.device("cuda")
    m = M.build_model("preact_resnet18", 10, generator=gen(0)).to(dev)
    x = torch.randn(16, 3, 32, 32, generator=gen(14)).to(dev)
    with torch.no_grad():
        z32, l32 = m(x)
        m = m.to(memory_format=torch.channels_last)
        with autocast(dev):
            z, logits = m(x.contiguous(memory_format=torch.channels_last))
    assert z.dtype == logits.dtype == torch.float32
    torch.testing.assert_close(z.norm(dim=1), torch.ones(16, device=dev))
    assert (z * z32).sum(1).min() > 0.98                       # bf16 close to fp32
    ema = M.EMA(m)
    ema.update(m)
    ze, _ = ema(x.contiguous(memory_format=torch.channels_last))
    assert ze.is_cuda and not ze.requires_grad


def test_training_forward_is_the_model_itself_on_cpu(monkeypatch):
    """CUDA graphs (torch.compile reduce-overhead) are a CUDA-only speed path: on the CPU
    the loops call the plain module, so CPU results stay exact and eager."""
    from selcl.device import compiled
    from selcl.train import training_forward
    model = M.build_model("small", 10, width=8, blocks=(1,))
    assert compiled(model) is model
    assert training_forward(model, torch.device("cpu")) is model


def test_embedding_does_not_depend_on_the_evaluation_batch():
    """`evaluate.embed` runs in `device.eval_batch_size` rows per call (128 on the CPU,
    1,024 on CUDA): eval-mode rows are independent, so 1,024 rows per call give the same
    bits as the default (CPU: 128, several calls for 300 images). A tiny batch may take
    another CPU kernel (on an Intel Xeon host 7 rows differ by one float32 ulp; on AMD EPYC
    they did not), so it is held to rounding only."""
    from conftest import random_images_and_net
    from selcl.device import eval_batch_size
    from selcl.evaluate import embed
    data, model, gen = random_images_and_net(N=300, C=3, H=12)
    assert eval_batch_size(torch.device("cpu")) < 300
    z_default, logits_default = embed(model, data.x, data.mean, data.std)
    z, logits = embed(model, data.x, data.mean, data.std, batch_size=1024)
    assert torch.equal(z, z_default) and torch.equal(logits, logits_default)
    z, logits = embed(model, data.x, data.mean, data.std, batch_size=7)
    torch.testing.assert_close(z, z_default, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits, logits_default, rtol=1e-5, atol=1e-6)
    assert model.training        # the model's mode is restored


def test_embeddings_are_float32_whatever_autocast_surrounds_them(monkeypatch):
    """`evaluate.embed` (the selection's, the k-NN's and test accuracy's passes) runs in
    float32 even inside the training passes' bf16 autocast or with SELCL_CPU_BF16=1: its
    convolutions run with autocast off, and it returns the same bits as without autocast. Given
    `autocast_dtype` it runs under that autocast instead (bench/selection_sweep.py
    --precision), which rounds."""
    from conftest import random_images_and_net
    from selcl.evaluate import embed
    data, model, _ = random_images_and_net(N=40, C=3, H=12)
    z32, l32 = embed(model, data.x, data.mean, data.std)
    seen = []
    real_conv = nn.Conv2d._conv_forward
    cast = lambda: torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32  # noqa: E731
    monkeypatch.setattr(nn.Conv2d, "_conv_forward",
                        lambda self, x, w, b: seen.append(cast()) or real_conv(self, x, w, b))
    monkeypatch.setenv("SELCL_CPU_BF16", "1")
    with autocast(torch.device("cpu")):
        assert torch.is_autocast_enabled("cpu")
        z, logits = embed(model, data.x, data.mean, data.std)
    assert seen and set(seen) == {torch.float32}
    assert torch.equal(z, z32) and torch.equal(logits, l32)
    seen.clear()
    zb, _ = embed(model, data.x, data.mean, data.std, autocast_dtype=torch.bfloat16)
    assert set(seen) == {torch.bfloat16} and zb.dtype == torch.float32 and not torch.equal(zb, z32)


def test_cpu_bf16_flag_turns_the_cpu_autocast_on(monkeypatch):
    """The project's autocast is a no-op on CPU (float32) unless SELCL_CPU_BF16=1; the
    report's environment records which."""
    from selcl.device import describe
    m = M.build_model("small", 10, width=8, blocks=(1, 1), generator=gen(0))
    x = torch.randn(4, 3, 16, 16, generator=gen(6))
    cpu = torch.device("cpu")
    for flag, dtype, name in (("0", torch.float32, "float32"), ("1", torch.bfloat16, "bf16 autocast")):
        monkeypatch.setenv("SELCL_CPU_BF16", flag)
        with autocast(cpu):
            assert m.encoder(x).dtype == dtype
            z, logits = m(x)
        assert z.dtype == logits.dtype == torch.float32          # the heads stay float32 either way
        assert describe(cpu)["precision"] == name
