"""The CUDA path's compiled graphs are static (`device.compiled`, `augment`'s compiled
pipeline): one process calls the network with B, 2B and 3B rows and 1, 2 or 3 BatchNorm
groups (Uns-CL warm-up, the main Sel-CL pass, the L_CLS batch, fine-tuning, the CE
baseline). By default Dynamo recompiles after a second input size as a dynamic-shape graph
(symbolic batch size): slower kernels, longer compilation, and which graphs turn dynamic
depends on call order — the benchmark and the real loop compiled different graphs.

Runs on the CPU: `device.compiles` is forced on and `torch.compile` records the graphs
Dynamo hands to its backend (no Inductor, no GPU), which is where static or dynamic is
decided."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from selcl import augment, checkpoint, device
from conftest import digits_data
from selcl.config import load_params, resolve
from selcl.train import baseline, finetune, pretrain, warmup

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def graphs(monkeypatch):
    """Every graph compiled within the test: True where its inputs hold a symbolic size.
    `force_dynamic`: the default (dynamic=None) whatever the caller asked, to show that
    this check sees dynamic graphs where they arise."""
    import torch._functorch.config as functorch_config   # set by device.compiled: restored here
    donated = functorch_config.donated_buffer             # (monkeypatch's undo breaks a config module)
    seen, real = [], torch.compile
    opts = {"force_dynamic": False, "rows": []}   # rows: the leading sizes of each graph's tensor inputs

    def record(gm, example_inputs):
        seen.append(any(isinstance(n.meta.get("example_value"), torch.SymInt)
                        for n in gm.graph.nodes if n.op == "placeholder"))
        opts["rows"].append({t.shape[0] for t in example_inputs if isinstance(t, torch.Tensor) and t.dim()})
        return gm.forward

    def compile_recording(fn, mode=None, dynamic=None, **kw):
        return real(fn, backend=record, dynamic=None if opts["force_dynamic"] else dynamic)

    monkeypatch.setattr(torch, "compile", compile_recording)
    torch._dynamo.reset()
    augment._apply_strong_compiled.cache_clear()
    yield seen, opts
    functorch_config.donated_buffer = donated
    torch._dynamo.reset()
    augment._apply_strong_compiled.cache_clear()


def _setup(tmp_path, monkeypatch, n: int, drop_last: bool, min_steps: int):
    """A short asym40 digits setting on `n` examples (batch 64), compiled as on CUDA, with
    one call per step, and loops of `min_steps` steps or more compiling
    (`device.worth_compiling`; the tests' loops are all short)."""
    monkeypatch.setattr(device, "compiles", lambda d: True)
    monkeypatch.setattr(device, "COMPILE_MIN_STEPS", min_steps)
    monkeypatch.setenv("SELCL_SPLIT_VIEWS", "0")
    cfg = copy.deepcopy(resolve(load_params(ROOT / "params.yaml"), "demo_asym40"))
    cfg["pretrain"].update(epochs=3, memory_start_epoch=2, lr_warmup_epochs=1, lr_decay_epochs=[],
                           drop_last=drop_last)
    cfg["finetune"].update(epochs=1, bootstrap_start=0, eval_last=1, drop_last=drop_last)
    cfg["baseline"].update(epochs=1, lr_decay_epochs=[], eval_last=1, drop_last=drop_last)
    data = digits_data({"kind": "asym", "rate": 0.4, "seed": 1}, n=n, n_test=64)
    ck = lambda name: checkpoint.Checkpointer(tmp_path / f"{name}.pt", name, 1000)  # noqa: E731
    return cfg, data, ck, torch.device("cpu")


def _one_process(tmp_path, monkeypatch, n: int = 256, drop_last: bool = True):
    """Warm-up, pre-training (memory read, L_CLS on), fine-tuning and the CE baseline in one
    process, as `bench/gpu_real.py`, on `n` digits, every loop compiled."""
    cfg, data, ck, cpu = _setup(tmp_path, monkeypatch, n, drop_last, min_steps=0)
    pre = pretrain(cfg, data, warmup(cfg, data, cpu, ck("warmup")), cpu, ck("pretrain"))
    finetune(cfg, data, pre, cpu, ck("finetune"))
    baseline(cfg, data, cpu, ck("baseline"))


@pytest.mark.parametrize("recompute", ["0", "1"])
def test_training_graphs_are_static(graphs, tmp_path, monkeypatch, recompute):
    seen, _ = graphs
    monkeypatch.setenv("SELCL_SIM_RECOMPUTE", recompute)
    _one_process(tmp_path, monkeypatch)
    # online B (warm-up, fine-tuning, CE), 3B (main pass), 2B (L_CLS, L_SIM recompute); EMA 3B
    assert 4 <= len(seen) <= 6 and not any(seen), seen


def test_the_kept_last_batch_runs_eagerly(graphs, tmp_path, monkeypatch):
    """The paper's loaders keep an epoch's last, smaller batch (`drop_last: false`).
    Compiled, it would give every call site a second static graph, forward and backward
    (about half of a fresh process's compilation, for one step an epoch); it runs eagerly
    instead (`device.eager_step`): no graph of the process holds the last batch's rows."""
    from selcl import train
    seen, opts = graphs
    monkeypatch.setattr(train, "compiles", lambda d: True)   # the augmentation compiles too
    _one_process(tmp_path, monkeypatch, n=250, drop_last=False)          # 3 batches of 64 and one of 58
    assert len(seen) >= 5 and not any(seen), seen    # the networks and the augmentation did compile
    assert any(64 in rows for rows in opts["rows"]) and any(128 in rows for rows in opts["rows"])
    tail_rows = {58, 2 * 58, 3 * 58}          # a view, two (L_CLS, augmentation), three (main pass)
    assert not any(rows & tail_rows for rows in opts["rows"]), opts["rows"]


def test_a_loop_too_short_to_repay_compilation_runs_eagerly(graphs, tmp_path, monkeypatch):
    """A loop compiles only with `device.COMPILE_MIN_STEPS` steps or more left: here 5, so
    the one-epoch warm-up (4 steps), fine-tuning and CE (1 epoch each) run eagerly and
    only pre-training (2 epochs, 8 steps) compiles; networks and augmentation alike."""
    from selcl import train
    seen, opts = graphs
    monkeypatch.setattr(train, "compiles", lambda d: True)   # the augmentation compiles too
    cfg, data, ck, cpu = _setup(tmp_path, monkeypatch, 256, drop_last=True, min_steps=5)
    warm = warmup(cfg, data, cpu, ck("warmup"))
    assert seen == []
    pre = pretrain(cfg, data, warm, cpu, ck("pretrain"))
    compiled_in_pretrain = len(seen)
    assert compiled_in_pretrain >= 3 and any(192 in rows for rows in opts["rows"]), opts["rows"]  # 3B: main pass
    finetune(cfg, data, pre, cpu, ck("finetune"))
    baseline(cfg, data, cpu, ck("baseline"))
    assert len(seen) == compiled_in_pretrain, opts["rows"]


def test_the_paper_settings_compile_all_but_the_cifar_warm_up():
    """The bar's place: CIFAR's one warm-up epoch (391 steps) runs eagerly; the paper's
    other loops (WebVision's 5 warm-up epochs of ~1,030 steps, 70 fine-tuning epochs, …)
    and the GPU lease's shortened ones (24 Sel-CL epochs, 12 fine-tuning epochs on a T of
    ~27,000 images: 211 steps each) compile."""
    cifar = 391
    assert not device.worth_compiling(cifar)
    assert device.worth_compiling(5 * 1030) and device.worth_compiling(70 * cifar)
    assert device.worth_compiling(23 * cifar) and device.worth_compiling(12 * 211)


def test_eager_step_switches_a_compiled_forward_to_its_module(monkeypatch):
    monkeypatch.setattr(device, "compiles", lambda d: True)
    monkeypatch.setattr(torch, "compile", lambda m, **kw: (lambda x: "graph"))
    net = torch.nn.Linear(2, 2)
    fwd = device.compiled(net)
    x = torch.zeros(1, 2)
    assert fwd(x) == "graph"
    with device.eager_step():
        assert torch.equal(fwd(x), net(x)) and device.in_eager_step()
    with device.eager_step(False):
        assert fwd(x) == "graph"
    assert fwd(x) == "graph" and not device.in_eager_step()


def test_the_check_sees_dynamic_graphs(graphs, tmp_path, monkeypatch):
    """The same process with Dynamo's default: graphs after the first size turn dynamic."""
    seen, opts = graphs
    opts["force_dynamic"] = True
    _one_process(tmp_path, monkeypatch)
    assert sum(seen) >= 2, seen


def test_augmentation_graphs_are_static(graphs):
    """The compiled strong augmentation is called with 2B rows (two views) and B rows
    (fine-tuning) in one process: one static graph each."""
    seen, _ = graphs
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    for rows in (8, 4, 8):
        augment.strong_augment(x[:rows], torch.Generator().manual_seed(rows), (0.5,) * 3, (0.25,) * 3,
                               compiled=True)
    assert len(seen) == 2 and not any(seen), seen


def test_selcl_compile_0_turns_every_compiled_part_off(monkeypatch):
    """SELCL_COMPILE=0 (gpu_real.sh's fallback when compilation fails) means eager everywhere:
    the networks and the strong augmentation; on CUDA both compile by default."""
    from selcl import train
    monkeypatch.setattr(device, "is_cuda", lambda d: True)
    asked = []
    monkeypatch.setattr(augment, "strong_augment", lambda *a, compiled, **kw: asked.append(compiled) or a[0].float())
    data = type("D", (), {"mean": (0.5,) * 3, "std": (0.25,) * 3, "crop": None, "crop_scale": (0.2, 1.0)})
    x = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    for flag, expected in ((None, True), ("0", False)):
        if flag is None:
            monkeypatch.delenv("SELCL_COMPILE", raising=False)
        else:
            monkeypatch.setenv("SELCL_COMPILE", flag)
        assert device.compiles(torch.device("cpu")) is expected
        train._views(x, None, data)
        assert asked[-1] is expected
        with device.eager_step():             # an epoch's last, smaller batch: eager too
            train._views(x, None, data)
        assert asked[-1] is False
