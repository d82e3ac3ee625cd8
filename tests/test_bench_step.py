"""bench/step.py times the step training takes: with a selection of realistic size, so
the L_CLS batch is part of it (random embeddings once gave an empty T, and the timed
step silently skipped L_CLS)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import step as bench_step  # noqa: E402

from selcl.train import make_pretrainer  # noqa: E402


def _tiny_pretrainer(dev):
    cfg = bench_step.bench_config("small", 16)
    cfg["model"]["width"] = 8                  # half the CPU presets' width: a faster test
    return make_pretrainer(cfg, 10, dev)


def test_the_timed_step_runs_every_part():
    dev = torch.device("cpu")
    data = bench_step.fake_data(1024, 10, 16, dev)
    rule, T_idx = bench_step.realistic_selection(data, 10, 128, dev)
    frac = len(T_idx) / 1024
    assert 0.2 < frac < 0.9                                       # most clean examples, few noisy
    assert (data.noisy[T_idx] == data.clean[T_idx]).float().mean() > 0.9
    tr = _tiny_pretrainer(dev)
    idx = torch.randperm(1024)[:16]
    out = tr.step(data, idx, rule, T_idx, read_memory=True)
    assert {"l_sel", "l_sim", "l_cls"} <= set(out)


def test_random_embeddings_would_have_skipped_the_classifier_batch():
    """Why the selection is built that way: on random embeddings T is (nearly) empty."""
    dev = torch.device("cpu")
    data = bench_step.fake_data(1024, 10, 16, dev)
    z = torch.nn.functional.normalize(torch.randn(1024, 128, generator=torch.Generator().manual_seed(0)), dim=1)
    sel = bench_step.select(z, data.noisy, 10, k=250, alpha=0.5, beta=0.25)
    assert int(sel.examples.sum()) < 0.05 * 1024


def test_step_profiler_records_only_the_steps_asked_for(tmp_path, monkeypatch):
    """bench/gpu_real.py --profile-steps: n steps after `skip`, one text file with the wall
    time per step and the profiler's op table; the other steps run without the profiler."""
    import profile_steps
    from selcl import train
    monkeypatch.setattr(train.Pretrainer, "step", train.Pretrainer.step)     # restored afterwards
    dev = torch.device("cpu")
    data = bench_step.fake_data(256, 10, 16, dev)
    rule, T_idx = bench_step.realistic_selection(data, 10, 128, dev, k=25)
    tr = _tiny_pretrainer(dev)
    out = tmp_path / "selcl_profile.txt"
    prof = profile_steps.StepProfiler(2, 1, out, dev)
    prof.install()
    active = []
    for i in range(4):
        tr.step(data, torch.arange(16 * i, 16 * i + 16), rule, T_idx, read_memory=True)
        active.append(prof.prof is not None)
        assert out.exists() == (i >= 2)
    assert active == [False, True, False, False]          # started at step 2, stopped after step 3
    text = out.read_text()
    assert "Sel-CL steps 2-3" in text and "wall time per step" in text
    assert "aten::convolution" in text                     # the op table


def test_each_round_times_both_steps_so_the_ratio_is_taken_within_a_round(monkeypatch):
    """A host that slows down halfway must not show up in the ratio: each round times the
    Sel-CL steps and then the CE steps, and the ratio is per round."""
    clock, ran = [0.0], []
    slow = [1.0]

    def step(name, cost):
        def run():
            ran.append(name)
            clock[0] += cost * slow[0]
            if len(ran) == 12:               # after the warm-up and the first round: twice as slow
                slow[0] = 2.0
        return run

    monkeypatch.setattr(bench_step.time, "perf_counter", lambda: clock[0])
    times = bench_step.interleaved({"sel": step("sel", 8.0), "ce": step("ce", 1.0)}, rounds=3, iters=3,
                                   device=torch.device("cpu"))
    sel, ce = times["sel"], times["ce"]
    assert ran == ["sel"] * 3 + ["ce"] * 3 + (["sel"] * 3 + ["ce"] * 3) * 3
    assert sel == [8.0, 16.0, 16.0] and ce == [1.0, 2.0, 2.0]
    assert [a / b for a, b in zip(sel, ce)] == [8.0] * 3     # two blocks minutes apart: 16 / 1


def test_profile_totals_count_each_kernel_once():
    """A CPU op's self device time is its kernels' time, and each kernel is an event of its
    own too: the total is the kernels' (device) events alone, not both (issue 89: the
    recorded "35.1 ms of kernels" of gpu_real_h200_4 was 17.5 ms counted twice)."""
    from types import SimpleNamespace

    import profile_steps
    from torch.autograd import DeviceType
    ev = lambda kind, us, note=False: SimpleNamespace(device_type=kind, self_device_time_total=us,  # noqa: E731
                                                      is_user_annotation=note)
    events = [ev(DeviceType.CPU, 300.0), ev(DeviceType.CUDA, 200.0), ev(DeviceType.CUDA, 100.0),
              ev(DeviceType.CPU, 0.0), ev(DeviceType.CUDA, 250.0, note=True)]     # a compiled graph's range
    assert profile_steps.kernel_time_us(events) == 300.0
