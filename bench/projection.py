"""The wall time of a whole CIFAR setting, projected from measured per-stage step times.

A short or subset run measures each stage's seconds per step, its one-off compilation and
its fixed per-epoch costs (selection, k-NN, test evaluation); the full setting is

    Σ_stages  steps · step_s  +  epochs · epoch_s  +  compile_s

with the full run's steps (391 a CIFAR pre-training epoch; ⌈|T| / B⌉ a fine-tuning epoch).
Scaling whole measured epochs instead also multiplies each epoch's fixed costs, and a first
epoch's compilation, by the ratio of the sets: the H200 5,000-image run projected that way
gave 101.7 min where its own step times give about 85.
Used by bench/gpu_real.py and bench/gpu_epoch.py.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Stage:
    name: str
    steps: int                 # training steps of the full run's stage
    step_s: float              # measured seconds per step (compiled steps once compiled)
    epochs: int = 0            # full run's epochs, for the fixed per-epoch cost
    epoch_s: float = 0.0       # fixed seconds per epoch (selection + k-NN, test evaluation)
    compile_s: float = 0.0     # one-off: compilation and CUDA-graph recording
    note: str = field(default="", compare=False)

    @property
    def seconds(self) -> float:
        return self.steps * self.step_s + self.epochs * self.epoch_s + self.compile_s


def setting_minutes(stages: list[Stage]) -> float:
    return sum(s.seconds for s in stages) / 60


def step_times(timing: list[dict]) -> tuple[float, float, float]:
    """(step_s, compile_s, epoch_s) from a loop's per-epoch timing rows (train_s, steps and
    the epoch's fixed parts: select_s + knn_s, or eval_s): the median step time of the
    epochs after the first, the first epoch's time beyond its steps at that rate (its
    compilation), and the median fixed cost. One epoch: its step time, no compilation
    separated."""
    per_step = [r["train_s"] / r["steps"] for r in timing]
    step_s = statistics.median(per_step[1:]) if len(per_step) > 1 else per_step[0]
    compile_s = max(0.0, timing[0]["train_s"] - timing[0]["steps"] * step_s)
    fixed = [sum(r.get(k, 0.0) for k in ("select_s", "knn_s", "eval_s")) for r in timing]
    return step_s, compile_s, statistics.median(fixed)


def table(stages: list[Stage]) -> list[str]:
    """Markdown rows: one per stage, then the total."""
    rows = ["| stage (full run) | steps | ms / step | fixed s / epoch | compile s | minutes |",
            "|---|---|---|---|---|---|"]
    rows += [f"| {s.name}{f' ({s.note})' if s.note else ''} | {s.steps:,} | {1000 * s.step_s:.1f} | "
             f"{s.epoch_s:.2f} | {s.compile_s:.0f} | {s.seconds / 60:.1f} |" for s in stages]
    rows.append(f"| **whole setting** | | | | | **{setting_minutes(stages):.1f}** |")
    return rows
