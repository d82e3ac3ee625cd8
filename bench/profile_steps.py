"""torch.profiler over a few Sel-CL steps of a real pre-training run (`bench/gpu_real.py
--profile-steps N`): where a real epoch's step spends its time, beside `bench/step.py`'s.

The benchmark's step has always been faster than a real epoch's on a GPU (H100: 28.0 against
40.8 ms; H200: 34.8 against 57.7 ms; `results/gpu_real_h100/step.md`, `results/gpu_real_h200_4/`). This records `n` consecutive
steps after `skip` steps (compilation and CUDA-graph recording done; by default inside the
second pre-training epoch) and writes one text file: the wall time per step (synchronised),
the device's kernel time per step, and torch.profiler's table of the most expensive ops.
Only those `n` steps run under the profiler; the run is otherwise unchanged.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from selcl import train
from selcl.device import synchronize


def kernel_time_us(events) -> float:
    """Device time of `events` (torch.profiler's key_averages) in µs, from the kernels only.
    A CPU op's self device time is the time of the kernels it launched, and every kernel
    is also an event of its own (device_type CUDA): summing both counts each kernel twice
    (the "35.1 ms of kernels" of gpu_real_h200_4, really 17.5 ms). Kernels, memcpys and
    memsets are the events whose device_type is not the CPU; a user annotation on the device
    (a compiled graph's "## Call CompiledFxGraph" range) spans kernels counted already. The
    same rule as the profiler table's "Self CUDA time total"."""
    from torch.autograd import DeviceType
    return float(sum(e.self_device_time_total for e in events
                     if e.device_type != DeviceType.CPU and not getattr(e, "is_user_annotation", False)))


class StepProfiler:
    def __init__(self, n: int, skip: int, out: Path, device: torch.device):
        self.n, self.skip, self.out, self.device = n, skip, Path(out), device
        self.calls, self.prof, self.t0 = 0, None, 0.0

    def install(self) -> None:
        """Wrap `Pretrainer.step` (every Sel-CL step of this process goes through it)."""
        real = train.Pretrainer.step
        me = self

        def step(tr, *args, **kwargs):
            me.calls += 1
            if me.calls == me.skip + 1:
                me._start()
            out = real(tr, *args, **kwargs)
            if me.prof is not None and me.calls == me.skip + me.n:
                me._stop()
            return out
        train.Pretrainer.step = step

    def _start(self) -> None:
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        synchronize(self.device)
        self.prof = profile(activities=acts)
        self.prof.__enter__()
        self.t0 = time.perf_counter()

    def _stop(self) -> None:
        synchronize(self.device)
        wall = (time.perf_counter() - self.t0) / self.n
        self.prof.__exit__(None, None, None)
        events = self.prof.key_averages()
        cuda = self.device.type == "cuda"
        device_us = kernel_time_us(events) / self.n if cuda else float("nan")
        sort = "self_device_time_total" if cuda else "self_cpu_time_total"
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(
            f"Sel-CL steps {self.skip + 1}-{self.skip + self.n} of this process, under torch.profiler\n"
            f"wall time per step (synchronised, profiler overhead included): {1000 * wall:.2f} ms\n"
            f"device kernel time per step: {device_us / 1000:.2f} ms\n\n"
            + events.table(sort_by=sort, row_limit=40) + "\n")
        self.prof = None
