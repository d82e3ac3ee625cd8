"""bench/cpu_compile.py times eager and compiled steps interleaved in one process, each
timing filed under the mode its step ran in (the augmentation reads `train.compiles` at
every step), and leaves the CPU's rule (nothing compiles) in place afterwards."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import cpu_compile  # noqa: E402
import step as bench_step  # noqa: E402

import selcl.device as device_mod  # noqa: E402
import selcl.train as train_mod  # noqa: E402

CPU = torch.device("cpu")


def test_rounds_alternate_and_each_time_is_filed_under_its_mode(monkeypatch):
    monkeypatch.setattr(device_mod, "compiles", device_mod.compiles)   # restored after the test
    monkeypatch.setattr(train_mod, "compiles", train_mod.compiles)
    clock, ran = [0.0], []

    def step(mode):     # a fake clock: an eager step "takes" 0.5 s, a compiled one 0.25 s
        def run():
            on = train_mod.compiles(CPU)
            assert on == device_mod.compiles(CPU) == (mode == "compiled")
            ran.append(mode)
            clock[0] += 0.25 if on else 0.5
        return run

    monkeypatch.setattr(bench_step.time, "perf_counter", lambda: clock[0])   # where steps are timed
    times = cpu_compile.interleaved({"eager": step("eager"), "compiled": step("compiled")}, rounds=3, steps=2)
    assert ran == ["eager", "compiled"] + (["eager"] * 2 + ["compiled"] * 2) * 3   # one untimed step of each first
    assert times == {"eager": [0.5] * 3, "compiled": [0.25] * 3}
    cpu_compile.force_compile(False)
    assert not train_mod.compiles(CPU) and not device_mod.compiles(CPU)
