"""bench/cpu_bf16.py times float32 and bf16 autocast steps interleaved in one process, each
timing filed under the precision the step really ran in, and leaves SELCL_CPU_BF16 as it
found it."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import cpu_bf16  # noqa: E402
import step as bench_step  # noqa: E402

from selcl.device import precision  # noqa: E402


def test_rounds_alternate_and_each_time_is_filed_under_its_precision(monkeypatch):
    monkeypatch.delenv("SELCL_CPU_BF16", raising=False)
    f32, bf16 = "float32", "bf16 autocast"
    clock, ran = [0.0], []

    def step():     # a fake clock: a float32 step "takes" 0.25 s, a bf16 one 1 s
        ran.append(precision(torch.device("cpu")))
        clock[0] += 1.0 if ran[-1] == bf16 else 0.25

    monkeypatch.setattr(bench_step.time, "perf_counter", lambda: clock[0])   # where steps are timed
    times = cpu_bf16.interleaved(step, rounds=3, steps=2)
    assert ran == [f32, bf16] + ([f32] * 2 + [bf16] * 2) * 3        # one untimed step of each first
    assert times == {f32: [0.25] * 3, bf16: [1.0] * 3}              # per step, filed by precision
    assert "SELCL_CPU_BF16" not in os.environ                        # unset again, as found


def test_the_benchmark_runs_and_restores_the_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("SELCL_CPU_BF16", "0")
    real_resolve = cpu_bf16.resolve

    def small(params, setting):              # the preset's code path on a smaller network, batch, memory
        cfg = real_resolve(params, setting)
        cfg["model"]["width"] = 8
        cfg["pretrain"].update(batch_size=16, queue_per_class=2)
        return cfg
    monkeypatch.setattr(cpu_bf16, "resolve", small)
    out = tmp_path / "t.md"
    monkeypatch.setattr(sys, "argv", ["cpu_bf16.py", "--n", "300", "--rounds", "1", "--steps", "1",
                                      "--out", str(out)])
    cpu_bf16.main()
    text = out.read_text()
    assert "| Sel-CL pre-training step |" in text and "| plain CE step |" in text and text.count("×** |") == 2
    assert os.environ["SELCL_CPU_BF16"] == "0"
