"""The pre-training step as one graph (issue 89), what the CPU can check:

* no host synchronisation inside a step: after its first (warm-up) call, a Sel-CL or
  Uns-CL step of the real loops — the epoch's last, smaller batch included — never asks
  a tensor for a host value (`.item()`, `.cpu()`, `.tolist()`, `.numpy()`, or Python's
  bool / int / float of a tensor). On CUDA each of these waits for the GPU, and a CUDA
  graph cannot capture them; on a GPU `torch.cuda.set_sync_debug_mode("error")` checks
  the same thing (bench/gpu_epoch.py's command in docs/performance.md);
* the compiled step (the CUDA path's decisions, `device.COMPILE_ON`: the training forwards
  and the augmentation captured by Dynamo and AOTAutograd, the clipped L_SIM gradient
  back-propagated through the retained compiled graph) leaves the same weights, EMA, key
  queue, labelled memory, BatchNorm statistics and losses as the eager step after several
  steps, to 1e-6, the smaller last batch (eager, as on CUDA) included. The graphs run on
  the aot_eager backend, the eager kernels: Inductor's CPU kernels sum in another order,
  and on this width-4 network one step's gradients already differ by up to 1e-2 relative
  between two eager layouts (NCHW against channels_last), so any two correct paths part
  from 1e-6 within steps. Inductor's numbers against eager are bench/compile_check.py's
  (CUDA: within a 1e-6 weight perturbation).
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from conftest import digits_data
from selcl import augment, checkpoint, device
from selcl import train as loops
from selcl.config import load_params, resolve

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import step as bench_step  # noqa: E402  (bench/step.py: fake data, a realistic selection)

CPU = torch.device("cpu")
HOST_VALUES = ("item", "cpu", "tolist", "numpy", "__bool__", "__int__", "__float__")


def _cfg(epochs: int = 2) -> dict:
    cfg = copy.deepcopy(resolve(load_params(ROOT / "params.yaml"), "demo_asym40"))
    cfg["pretrain"].update(epochs=epochs, batch_size=32, lr_warmup_epochs=1, lr_decay_epochs=[], k=10,
                           memory_start_epoch=2, drop_last=False)
    return cfg


class HostSyncError(AssertionError):
    pass


@pytest.fixture
def no_host_values(monkeypatch):
    """Wraps Pretrainer.step and uns_step: from each one's second call on, any host value
    asked of a tensor inside it raises HostSyncError. Yields the calls guarded."""
    guarded = {"step": 0, "uns_step": 0}
    real_values = {name: getattr(torch.Tensor, name) for name in HOST_VALUES}

    def refuse(name):
        def f(self, *a, **k):
            raise HostSyncError(f"Tensor.{name}() inside a training step: a host synchronisation")
        return f

    def guard(method):
        real = getattr(loops.Pretrainer, method)
        calls = [0]

        def step(self, *a, **k):
            calls[0] += 1
            if calls[0] == 1:                  # warm-up of the step: compilation may look at values
                return real(self, *a, **k)
            for name in HOST_VALUES:
                setattr(torch.Tensor, name, refuse(name))
            try:
                return real(self, *a, **k)
            finally:
                for name, fn in real_values.items():
                    setattr(torch.Tensor, name, fn)
                guarded[method] += 1
        monkeypatch.setattr(loops.Pretrainer, method, step)

    guard("step"); guard("uns_step")
    yield guarded
    for name, fn in real_values.items():
        setattr(torch.Tensor, name, fn)


def test_the_guard_catches_a_host_value(no_host_values, monkeypatch, tmp_path):
    """The check can fail: a step that reads its loss on the host is caught."""
    real = loops.Pretrainer._apply

    def reads_loss(self, loss, *a, **k):
        loss.item()
        return real(self, loss, *a, **k)
    monkeypatch.setattr(loops.Pretrainer, "_apply", reads_loss)
    cfg, data = _cfg(), digits_data(_cfg()["noise"], n=72, n_test=32)
    with pytest.raises(HostSyncError):
        loops.warmup(cfg, data, CPU, checkpoint.Checkpointer(tmp_path / "warmup.pt", "x", 10 ** 6))


def test_no_step_asks_the_host_for_a_value(no_host_values, tmp_path):
    """The real warm-up and pre-training loops: 3 steps of 32 and a last one of 8 per epoch."""
    torch.set_num_threads(2)
    cfg = _cfg()
    data = digits_data(cfg["noise"], n=104, n_test=32)
    ck = lambda name: checkpoint.Checkpointer(tmp_path / f"{name}.pt", name, 10 ** 6)   # noqa: E731
    warm = loops.warmup(cfg, data, CPU, ck("warmup"))
    loops.pretrain(cfg, data, warm, CPU, ck("pretrain"))
    assert no_host_values == {"uns_step": 3, "step": 3}      # 4 of each, the first unguarded


def _steps(compile_on: bool, monkeypatch, epochs: int = 2, max_steps: int = 10 ** 6, backend: str = "aot_eager"):
    """`epochs` epochs of Sel-CL steps (200 examples, batches of 64 and a last one of 8, run
    eagerly as the loops do) from one fresh pre-training state: compiled as on CUDA
    (`backend`) or eager. Returns (state_dict, losses per step)."""
    import torch._functorch.config as functorch_config   # set by device.compiled: restored below
    donated = functorch_config.donated_buffer
    with monkeypatch.context() as m:
        m.setattr(device, "COMPILE_ON", ("cuda", "cpu") if compile_on else ("cuda",))
        m.setattr(device, "_COMPILE_FAILURE", {})
        m.setenv("SELCL_SPLIT_VIEWS", "0")             # the CUDA layout: the views in one call
        real_compile = torch.compile
        m.setattr(torch, "compile", lambda fn, mode=None, **kw: real_compile(fn, backend=backend, **kw))
        torch._dynamo.reset()
        augment._apply_strong_compiled.cache_clear()
        cfg = bench_step.bench_config("small", 64)
        cfg["model"]["width"] = 4
        data = bench_step.fake_data(200, 10, 16, CPU)
        rule, T_idx = bench_step.realistic_selection(data, 10, cfg["model"]["proj_dim"], CPU, k=25)
        tr = loops.make_pretrainer(cfg, 10, CPU)
        tr.queue.fill_random(tr.g)
        assert device.compiles(CPU) is compile_on
        pc, n, B = tr.pc, data.n, 64
        iters = loops.steps_per_epoch(n, B)
        # a run's first steps: the authors' lr ramp of 1,955 steps starts at lr/100. (At the
        # ramp's top this tiny network on random images amplifies float rounding tenfold a
        # step, so two correct paths would part from 1e-6 within a few steps.)
        pc = dict(pc, lr_warmup_epochs=5 * 391 / iters)
        out = []
        for epoch in range(1, epochs + 1):
            for it, idx in enumerate(loops._batches(n, B, tr.order, CPU)):
                if len(out) == max_steps:
                    break
                loops.set_lr(tr.opt, loops.lr_at(pc, epoch, it, iters))
                with device.eager_step(loops._last_smaller(it, n, B)):
                    out.append({k: v.detach().clone() for k, v in tr.step(data, idx, rule, T_idx, True).items()})
        state = tr.state_dict()
        functorch_config.donated_buffer = donated
        torch._dynamo.reset()
        augment._apply_strong_compiled.cache_clear()
    return state, out


def _close(a, b, path="state", tol=1e-6):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}", tol)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]", tol)
    elif isinstance(a, torch.Tensor) and a.is_floating_point():
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{path}: {m}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, path


def test_the_compiled_step_leaves_what_the_eager_step_leaves(monkeypatch):
    """Weights and BatchNorm statistics, EMA, optimiser, key queue and labelled memory (with
    their pointers), the random streams and every step's losses, after 8 steps over two
    epochs (the last, smaller batch of each eager, as on CUDA), to 1e-6."""
    torch.set_num_threads(2)
    compiled_state, compiled_out = _steps(True, monkeypatch)
    eager_state, eager_out = _steps(False, monkeypatch)
    assert len(eager_out) == 8 and set(eager_out[0]) >= {"l_sel", "l_cls", "l_sim", "loss"}
    _close(compiled_out, eager_out, "losses")
    # SGD's momentum buffers are sums of gradients, whose rounding is a gradient's, not a
    # weight's (the decomposed BatchNorm backward rounds its bias gradients differently): 1e-5
    opt_c, opt_e = compiled_state.pop("opt"), eager_state.pop("opt")
    _close(opt_c, opt_e, "opt", tol=1e-5)
    _close(compiled_state, eager_state)
    moved = [k for k, v in eager_state["model"].items() if v.is_floating_point()]
    assert moved    # the comparison saw the weights
