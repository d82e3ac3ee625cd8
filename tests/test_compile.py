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


def _setup(tmp_path, monkeypatch, n: int, drop_last: bool, min_steps: int, force: bool = True):
    """A short asym40 digits setting on `n` examples (batch 64), compiled as on CUDA (`force`:
    whatever `device.compiles` would say), with one call per step, and loops of `min_steps`
    steps or more compiling (`device.worth_compiling`; the tests' loops are all short)."""
    if force:
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
    monkeypatch.setattr(device, "COMPILE_ON", ("cuda", "cpu"))        # as on CUDA ...
    monkeypatch.setattr(device, "compile_failure", lambda kind: None)  # ... with a working compiler
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


# --- Where torch.compile cannot work: eager, one warning line, the numbers of SELCL_COMPILE=0 ---

@pytest.fixture
def compile_on_cpu(monkeypatch):
    """The CUDA path's compile decisions on this machine: the CPU counts as a device that
    compiles (`device.COMPILE_ON`), and no process-wide verdict from another test."""
    monkeypatch.setattr(device, "COMPILE_ON", ("cuda", "cpu"))
    monkeypatch.setattr(device, "_COMPILE_FAILURE", {})
    monkeypatch.delenv("SELCL_COMPILE", raising=False)
    torch._dynamo.reset()
    augment._apply_strong_compiled.cache_clear()
    yield
    torch._dynamo.reset()
    augment._apply_strong_compiled.cache_clear()


def _compile_failed(*args, **kwargs):
    """What a compiled call raises when Triton finds no C compiler (wrapped by Dynamo)."""
    from torch._dynamo.exc import BackendCompilerFailed
    raise BackendCompilerFailed(lambda gm, ex: gm, RuntimeError(
        "Failed to find C compiler. Please specify via CC environment variable or set triton.knobs.build.impl."),
        None)


def _short_run(tmp_path, monkeypatch):
    """Warm-up and pre-training (memory read, selection, L_CLS) on 256 digits, every loop
    compiling where `device.compiles` says so: the model, the EMA model and the history."""
    cfg, data, ck, cpu = _setup(tmp_path, monkeypatch, 256, drop_last=False, min_steps=0, force=False)
    pre = pretrain(cfg, data, warmup(cfg, data, cpu, ck("warmup")), cpu, ck("pretrain"))
    return pre["model"], pre["ema"], pre["history"]


def _same(a, b) -> bool:
    """Bit for bit, through nested state dicts."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def _same_run(a, b) -> None:
    assert _same(a[0], b[0]) and _same(a[1], b[1]), "model or EMA state differs from SELCL_COMPILE=0's"
    assert a[2] == b[2]


def _warnings(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if "torch.compile cannot run" in ln]


def test_no_c_compiler_means_eager_with_one_warning_line(compile_on_cpu, monkeypatch, capsys):
    monkeypatch.setattr(device, "cxx_compiler", lambda: None)
    monkeypatch.setattr(device, "c_compiler", lambda: None)
    monkeypatch.setattr(torch, "compile", lambda *a, **kw: pytest.fail("compiled without a compiler"))
    cpu = torch.device("cpu")
    assert not device.compiles(cpu) and not device.compiles(cpu)
    net = torch.nn.Linear(2, 2)
    assert device.compiled(net) is net
    assert device.compiles(torch.device("cuda")) is False             # the CUDA check: no cc either
    lines = _warnings(capsys.readouterr().err)
    assert len(lines) == 2 and "no C++ compiler" in lines[0] and "no C compiler" in lines[1], lines
    assert all("SELCL_COMPILE=0" in ln and "eagerly" in ln for ln in lines)


def test_no_triton_means_eager(compile_on_cpu, monkeypatch, capsys):
    monkeypatch.setattr(device, "c_compiler", lambda: "/usr/bin/gcc")
    monkeypatch.setattr(device, "_importable", lambda m: m != "triton")
    assert device.compile_failure("cuda") == "Triton is not installed"
    assert len(_warnings(capsys.readouterr().err)) == 1


def test_selcl_compile_0_skips_the_check(compile_on_cpu, monkeypatch, capsys):
    monkeypatch.setenv("SELCL_COMPILE", "0")
    monkeypatch.setattr(device, "compile_failure", lambda kind: pytest.fail("checked"))
    assert not device.compiles(torch.device("cpu"))
    assert capsys.readouterr().err == ""


def test_a_run_without_a_compiler_gives_the_numbers_of_selcl_compile_0(compile_on_cpu, tmp_path, monkeypatch,
                                                                        capsys):
    """Three ways torch.compile fails: no compiler (found before compiling), the test
    compilation fails (a compiler that is there but broken), the first compiled training
    call fails (the test compilation passed). Each run says so in one line and computes
    bit for bit what SELCL_COMPILE=0 computes."""
    monkeypatch.setenv("SELCL_COMPILE", "0")
    reference = _short_run(tmp_path / "eager", monkeypatch)
    assert capsys.readouterr().err.count("torch.compile") == 0
    monkeypatch.delenv("SELCL_COMPILE")
    calls = []

    def broken_compile(fn, **kw):
        return lambda *a, **k: calls.append(fn) or _compile_failed()

    for case in ("no compiler", "test compilation fails", "first training call fails"):
        monkeypatch.setattr(device, "_COMPILE_FAILURE", {})
        with monkeypatch.context() as m:
            if case == "no compiler":
                m.setattr(device, "cxx_compiler", lambda: None)
                m.setattr(torch, "compile", lambda *a, **kw: pytest.fail("compiled without a compiler"))
            else:
                m.setattr(torch, "compile", broken_compile)
            if case == "first training call fails":
                m.setattr(device, "_probe", lambda kind: None)
            calls.clear()
            run = _short_run(tmp_path / case.replace(" ", "_"), monkeypatch)
        lines = _warnings(capsys.readouterr().err)
        assert len(lines) == 1 and "SELCL_COMPILE=0" in lines[0], (case, lines)
        assert ("Failed to find C compiler" in lines[0]) is (case != "no compiler"), lines
        assert len(calls) == (0 if case == "no compiler" else 1), (case, calls)   # tried once, then eager
        _same_run(run, reference)
