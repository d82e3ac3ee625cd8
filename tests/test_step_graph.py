"""The pre-training step as one graph (issue 89), what the CPU can check:

* no host synchronisation inside a step: after its first (warm-up) call, a Sel-CL or
  Uns-CL step of the real loops — the epoch's last, smaller batch included — never asks
  a tensor for a host value (`.item()`, `.cpu()`, `.tolist()`, `.numpy()`, or Python's
  bool / int / float of a tensor). On CUDA each of these waits for the GPU, and a CUDA
  graph cannot capture them; on a GPU `torch.cuda.set_sync_debug_mode("error")` checks
  the same thing (bench/gpu_epoch.py's command in docs/performance.md);
* the compiled step (Inductor's CPU backend, the CUDA path's decisions: `device.COMPILE_ON`)
  leaves the same weights, EMA, key queue, labelled memory, BatchNorm statistics and
  losses as the eager step after several steps, to 1e-6, the smaller last batch included.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from conftest import digits_data
from selcl import augment, checkpoint, device
from selcl import train as loops
from selcl.config import load_params, resolve

ROOT = Path(__file__).resolve().parents[1]
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
