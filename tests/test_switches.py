"""The paper's ablation switches on the authors' iteration (SPEC §10.2): each one changes
exactly the part of `Pretrainer.step` it names (Table 6: mixup, memory, classifier, L_SIM;
Table 7: Sup-CL warm-up; the memory read from `memory_start_epoch`), seen through the
arguments the step hands to `losses.selective_losses` and the parts it returns."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import random_images_and_net
from selcl import losses
from selcl.memory import KeyQueue, LabelledMemory
from selcl.models import EMA, set_bn_replicas
from selcl.train import Pretrainer

N, B, C, H = 24, 6, 3, 12
BASE = {"mixup": True, "classifier": True, "lambda_cls": 1.0, "sim_loss": True, "lambda_sim": 0.01,
        "memory": True, "temperature": 0.1, "sim_grad_clip": 0.25, "grad_clip": None}


def _setup(**pc):
    data, model, _ = random_images_and_net(N, C, H)
    noisy = data.noisy
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    tr = Pretrainer(model, EMA(model, 0.99), opt, KeyQueue(16, 8), LabelledMemory(4 * B, 8, C),
                    torch.Generator().manual_seed(3), np.random.default_rng(0), {**BASE, **pc})
    same = lambda i, j: noisy[i][:, None] == noisy[j][None, :]  # noqa: E731
    rule = type("Rule", (), {"in_G": staticmethod(same)})
    return tr, data, rule


@pytest.fixture
def spy(monkeypatch):
    seen = []
    real = losses.selective_losses

    def wrapper(*args, **kwargs):
        names = ("z_mix", "p_mix", "u", "lam", "anchor_ids", "partner_rows", "in_G", "batch", "memory",
                 "temperature")
        call = dict(zip(names, args), **kwargs)
        seen.append(call)
        return real(*args, **kwargs)
    monkeypatch.setattr(losses, "selective_losses", wrapper)
    return seen


def _step(tr, data, rule, read_memory=True, **kw):
    idx = torch.randperm(N, generator=torch.Generator().manual_seed(4))[:B]
    tr.step(data, idx, rule, torch.arange(0, N, 2), read_memory=False)      # the memory holds a batch
    return tr.step(data, idx.flip(0), rule, torch.arange(0, N, 2), read_memory=read_memory, **kw)


def test_default_has_every_part(spy):
    tr, data, rule = _setup()
    out = _step(tr, data, rule)
    call = spy[-1]
    assert call["memory"] is not None and len(call["memory"].ids) == len(tr.memory) == 4 * B
    assert call["u"] is not None and call.get("similarity", True)
    assert not torch.equal(call["partner_rows"], torch.arange(2 * B)) and (call["lam"] < 1).any()
    assert {"l_sel", "l_cls", "l_sim", "loss", "fallback"} <= set(out)


def test_memory_is_read_only_when_asked(spy):
    tr, data, rule = _setup()
    _step(tr, data, rule, read_memory=False)        # before memory_start_epoch
    assert spy[-1]["memory"] is None and len(tr.memory) == 4 * B   # but it is written


def test_no_memory_queue(spy):
    tr, data, rule = _setup(memory=False)
    _step(tr, data, rule)
    assert spy[-1]["memory"] is None


def test_no_mixup_is_lambda_one_and_identity_partners(spy):
    tr, data, rule = _setup(mixup=False)
    _step(tr, data, rule)
    call = spy[-1]
    assert torch.equal(call["lam"], torch.ones(2 * B))
    assert torch.equal(call["partner_rows"], torch.cat([torch.arange(B), torch.arange(B) + B]))


def test_no_classifier_learning(spy):
    tr, data, rule = _setup(classifier=False)
    out = _step(tr, data, rule)
    assert spy[-1]["similarity"] is False and "l_cls" not in out and "l_sim" not in out


def test_no_similarity_loss(spy):
    tr, data, rule = _setup(sim_loss=False)
    out = _step(tr, data, rule)
    assert spy[-1]["similarity"] is False and "l_sim" not in out and "l_cls" in out


def test_sup_cl_warmup_has_no_uns_term_no_mixup_no_sim(spy):
    tr, data, rule = _setup()
    out = _step(tr, data, rule, read_memory=False, supervised_warmup=True)
    call = spy[-1]
    assert call["u"] is None and call["similarity"] is False and call["memory"] is None
    assert torch.equal(call["lam"], torch.ones(2 * B)) and "l_cls" in out


def test_uns_cl_warmup_fills_queue_and_memory():
    tr, data, rule = _setup()
    idx = torch.arange(B)
    out = tr.uns_step(data, idx)
    assert len(tr.queue) == B and len(tr.memory) == 2 * B and torch.equal(tr.memory.ids, torch.cat([idx, idx]))
    assert set(out) == {"loss"} and torch.isfinite(out["loss"])
    # the encoder and the projection head took a step; the classifier, which no warm-up loss
    # reaches, has no gradient, so SGD leaves it alone (the authors' loop; tests/test_loops.py)
    missing = {n for n, p in tr.model.named_parameters() if p.grad is None}
    assert missing == {"classifier.weight", "classifier.bias"}, missing


@pytest.mark.parametrize("read_memory", [False, True])
def test_sim_recompute_takes_the_same_step(read_memory):
    """SELCL_SIM_RECOMPUTE: L_SIM's clipped gradient from its own forward (each online graph
    back-propagated once) gives the step of the retained-graph path: same parameters,
    momentum and BatchNorm running statistics (the extra forward leaves no trace), up to
    float rounding (its forward sees 2B rows, the main one 3B)."""
    runs = []
    for recompute in (False, True):
        tr, data, rule = _setup()
        tr.sim_recompute = recompute
        out = _step(tr, data, rule, read_memory=read_memory)
        runs.append((tr, out))
    (a, out_a), (b, out_b) = runs
    for name, p in a.model.state_dict().items():          # weights and BN running statistics
        torch.testing.assert_close(b.model.state_dict()[name], p, atol=1e-6, rtol=1e-5, msg=name)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(b.opt.state[pb]["momentum_buffer"], a.opt.state[pa]["momentum_buffer"],
                                   atol=1e-6, rtol=1e-5)
    for k in ("l_sel", "l_sim", "l_cls", "loss"):
        torch.testing.assert_close(out_b[k], out_a[k], atol=1e-6, rtol=1e-5)
    assert out_a["l_sim"] > 0


def test_sim_recompute_is_not_a_no_op():
    """The clipped L_SIM gradient is really added on the recompute path: without it
    (λ_s = 0) the step differs."""
    tr, data, rule = _setup()
    tr.sim_recompute = True
    _step(tr, data, rule)
    tr0, data0, rule0 = _setup(lambda_sim=0.0)
    tr0.sim_recompute = True
    _step(tr0, data0, rule0)
    diffs = [float((p - q).detach().abs().max()) for p, q in zip(tr.model.parameters(), tr0.model.parameters())]
    assert max(diffs) > 1e-7


@pytest.mark.parametrize("recompute, replicas", [(False, 1), (True, 1), (False, 2)])
def test_split_views_takes_the_same_step(recompute, replicas):
    """`device.split_views` (the CPU default: one network call per view) takes the step of
    one concatenated call with per-view BatchNorm (the CUDA default): same parameters,
    momentum, BatchNorm running statistics, queue, memory and losses up to float rounding
    (only the order of the weight-gradient sums differs). The two paths really differ in
    how they call the networks: one call for [v1, m1, m2] against three. With
    `model.bn_replicas` each view's batch is also sharded, the same way in both."""
    runs = []
    for split in (False, True):
        tr, data, rule = _setup()
        set_bn_replicas(tr.model, replicas)
        set_bn_replicas(tr.ema.model, replicas)
        tr.split_views, tr.sim_recompute = split, recompute
        calls = []
        tr.net = lambda x, _m=tr.model, _c=calls: (_c.append(x.shape[0]), _m(x))[1]
        out = _step(tr, data, rule)
        runs.append((tr, out, calls))
    (a, out_a, calls_a), (b, out_b, calls_b) = runs
    assert max(calls_a) == 3 * B and max(calls_b) == B and sum(calls_a) == sum(calls_b)
    for name, p in a.model.state_dict().items():          # weights and BN running statistics
        torch.testing.assert_close(b.model.state_dict()[name], p, atol=1e-6, rtol=1e-5, msg=name)
    for name, p in a.ema.model.state_dict().items():
        torch.testing.assert_close(b.ema.model.state_dict()[name], p, atol=1e-6, rtol=1e-5, msg=name)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(b.opt.state[pb]["momentum_buffer"], a.opt.state[pa]["momentum_buffer"],
                                   atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(b.memory.feats, a.memory.feats, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(b.queue.keys, a.queue.keys, atol=1e-6, rtol=1e-5)
    for k in ("l_sel", "l_sim", "l_cls", "loss"):
        torch.testing.assert_close(out_b[k], out_a[k], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("split, calls", [(True, 7), (False, 3)], ids=["call-per-view", "one-call"])
def test_each_loss_back_propagates_only_through_the_calls_it_reads(split, calls):
    """Backward passes through the network per step. One call per view (the CPU's): L_SIM's
    separate gradient runs through the two mixed views' calls, as in the authors' loop, and
    the main backward through all five online calls (v1, the mixed views, the L_CLS
    views): 7, not 8 (a slice of the concatenated outputs would run view 1's backward on
    zeros for L_SIM too). The concatenated views (CUDA's): the three-view call for each of
    the two backwards, and the L_CLS call: 3."""
    tr, data, rule = _setup()
    tr.split_views = split
    arrivals = []

    def count_backward(module, inputs, out):     # each online call's features: one gradient arrival
        if out.requires_grad:
            out.register_hook(arrivals.append)
    tr.model.encoder.register_forward_hook(count_backward)
    _step(tr, data, rule)                       # two steps
    assert len(arrivals) == 2 * calls


def test_split_views_without_per_view_statistics_would_differ(monkeypatch):
    """The comparison above can fail: normalising the concatenated views with one set of
    BatchNorm statistics (no `bn_groups`) gives another step."""
    import selcl.train as train_mod
    tr, data, rule = _setup()
    tr.split_views = True
    _step(tr, data, rule)
    real = train_mod.bn_groups
    monkeypatch.setattr(train_mod, "bn_groups", lambda model, groups: real(model, 1))
    tr1, data1, rule1 = _setup()
    tr1.split_views = False
    _step(tr1, data1, rule1)
    diffs = [float((p - q).detach().abs().max()) for p, q in zip(tr.model.parameters(), tr1.model.parameters())]
    assert max(diffs) > 1e-4


class GraphPool:
    """A CPU stand-in for the CUDA-graph trees of `torch.compile(mode="reduce-overhead")`:
    the outputs of graphed forwards and the gradients their backwards produce live in one
    memory pool, and a forward called once every pending backward has run begins a new
    generation that reuses that memory. Here the old generation is overwritten with NaN,
    so a step that still reads any of it after the boundary goes wrong visibly."""

    def __init__(self, model: torch.nn.Module):
        self.live: list = []          # the current generation's tensors
        self.ended = False            # a backward ran since the last graphed forward
        for p in model.parameters():
            p.register_hook(self._grad)

    def _grad(self, g):
        self.live.append(g)
        self.ended = True
        return g

    def wrap(self, net):
        def call(x):
            if self.ended:            # a new generation: the pool's memory is reused
                with torch.no_grad():
                    for t in self.live:
                        t.fill_(float("nan"))
                self.live, self.ended = [], False
            out = net(x)
            self.live.extend(out)
            return out
        return call


def _cuda_path(pooled: bool):
    """A pretrainer on the CUDA path (one call for the views, L_SIM recomputed), its two
    networks behind an emulated graph pool when `pooled`."""
    tr, data, rule = _setup()
    tr.split_views, tr.sim_recompute = False, True
    if pooled:
        pool = GraphPool(tr.model)
        tr.net, tr.ema_net = pool.wrap(tr.model), pool.wrap(tr.ema.model)
    return tr, data, rule


def _assert_same_state(a, b):
    for name, p in a.model.state_dict().items():
        assert torch.equal(b.model.state_dict()[name], p), name
    assert torch.equal(b.queue.keys, a.queue.keys) and torch.equal(b.memory.feats, a.memory.feats)


def test_sim_recompute_reads_nothing_of_an_ended_graph_generation():
    """The L_SIM recompute lets the online network run as CUDA graphs, but its backward ends
    a graph generation inside the step: what the step reads after that (the EMA key k, the
    clipped L_SIM gradient) must be its own memory. Seen on an H200: reading either there
    raised 'accessing tensor output of CUDAGraphs that has been overwritten'. With the
    pool emulated, the step is exactly the step without it."""
    runs = []
    for pooled in (False, True):
        tr, data, rule = _cuda_path(pooled)
        _step(tr, data, rule)
        runs.append(tr)
    _assert_same_state(*runs)


def test_graph_pool_catches_a_gradient_left_in_the_pool(monkeypatch):
    """The emulation can fail: scaling L_SIM's gradients in place (they stay in the pool, as
    before the fix) lets the main pass's new generation overwrite them."""
    def in_place(self, sim, max_norm, retain):
        g = torch.autograd.grad(sim, self.params, retain_graph=retain, allow_unused=True)
        g = [torch.zeros_like(p) if gi is None else gi for p, gi in zip(self.params, g)]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(gi) for gi in g]))
        torch._foreach_mul_(g, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return g
    monkeypatch.setattr(Pretrainer, "_clipped_sim_grad", in_place)
    tr, data, rule = _cuda_path(pooled=True)
    _step(tr, data, rule)
    assert not all(torch.isfinite(p).all() for p in tr.model.parameters())


def test_uns_cl_warmup_reads_nothing_of_an_ended_graph_generation():
    """The same for the Uns-CL warm-up iteration, whose online network is graphed too when
    the recompute is on: two steps with the pool emulated equal two without it."""
    runs = []
    for pooled in (False, True):
        tr, data, _ = _cuda_path(pooled)
        for idx in (torch.arange(B), torch.arange(B, 2 * B)):
            tr.uns_step(data, idx)
        runs.append(tr)
    _assert_same_state(*runs)


def test_env_flags_read_on_off_words_and_refuse_a_typo(monkeypatch):
    """The SELCL_* switches: unset or empty → the default; 1/true/yes/on and 0/false/no/off
    in any case; anything else is one error naming the variable (not a silent "on")."""
    from selcl.device import env_flag
    from selcl.errors import ConfigError
    monkeypatch.delenv("SELCL_X", raising=False)
    assert env_flag("SELCL_X", True) is True and env_flag("SELCL_X", False) is False
    for word, on in [("", None), ("1", True), ("ON", True), ("Yes", True), ("off", False), ("FALSE", False), ("0", False)]:
        monkeypatch.setenv("SELCL_X", word)
        for default in (True, False):
            assert env_flag("SELCL_X", default) is (default if on is None else on), (word, default)
    monkeypatch.setenv("SELCL_X", "of")
    with pytest.raises(ConfigError, match="SELCL_X='of'"):
        env_flag("SELCL_X", True)


def test_sim_recompute_is_refused_on_cuda(monkeypatch):
    """Measured on an H200 (bench/results/gpu_real_h200_4/call1_recompute/): no faster, and its one
    run diverged. So CUDA refuses it with one clear error before building anything; the
    CPU keeps it (the tests above)."""
    from selcl.errors import ConfigError
    from selcl.train import make_pretrainer, sim_recompute_enabled
    assert not sim_recompute_enabled(torch.device("cuda"))          # unset: off, no error
    monkeypatch.setenv("SELCL_SIM_RECOMPUTE", "1")
    assert sim_recompute_enabled(torch.device("cpu"))
    with pytest.raises(ConfigError, match="SELCL_SIM_RECOMPUTE=1 is refused on CUDA"):
        sim_recompute_enabled(torch.device("cuda"))
    with pytest.raises(ConfigError, match="refused on CUDA"):     # before any CUDA tensor is made
        make_pretrainer({"pretrain": {}}, 3, torch.device("cuda"))


def test_a_diverged_network_stops_the_selection_with_its_epoch():
    """Non-finite embeddings at the per-epoch selection: one error naming the epoch and the
    parameter to lower, which the stages report as one line (stages/common.py)."""
    from selcl.errors import DivergedError
    from selcl.train import run_selection
    data, model, _ = random_images_and_net(N, C, H)
    pc = {"k": 3, "alpha": 0.5, "beta": 0.25, "knn_weighting": "uniform", "knn_index": "flat",
          "pseudo_labels": True, "selection_version": "v1"}
    z = torch.nn.functional.normalize(torch.randn(N, 8, generator=torch.Generator().manual_seed(0)), dim=1)
    assert run_selection(model, data, pc, epoch=5, z=z).examples.shape == (N,)
    z[2] = float("nan")
    with pytest.raises(DivergedError, match=r"pre-training diverged by epoch 5: 1 of 24 .*pretrain\.lr"):
        run_selection(model, data, pc, epoch=5, z=z)
