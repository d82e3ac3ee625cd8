"""Exact resume after kill -9, and determinism, of the real pre-training stage.

Folder A: data → noise → warmup, then `python stages/pretrain.py tiny` uninterrupted.
Folder B: the same inputs made independently, then pre-training that is SIGKILLed
  1. in the middle of epoch 2 (after 3 of its 6 steps; the epoch-1 checkpoint exists),
  2. after resuming, inside the epoch-3 checkpoint write, between the complete temp
     file and its rename (an orphaned temp file is left behind),
and finally resumed to completion. B's outputs must be bit-identical to A's, the last
resume must run only the missing epochs, every file present after each kill must load,
and no temp file may outlive the run.

The kills are placed deterministically: the child runs the stage through a small
driver that, at the chosen point, writes a marker file and blocks until killed.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import PYTHON, ROOT, SETTING, TINY, make_tiny_inputs, stage_env

from selcl import checkpoint

RUN = Path("runs") / SETTING
CKPT = Path("scratch") / SETTING / "pretrain" / "checkpoint.pt"     # stages/common.checkpoint_path
EPOCHS = TINY["pretrain"]["epochs"] - TINY["warmup"].get("epochs", 1)   # pre-training's, after the warm-up
FIRST = TINY["warmup"].get("epochs", 1) + 1                            # its first (global) epoch
STEPS_PER_EPOCH = -(-200 // TINY["pretrain"]["batch_size"])     # 20 per class × 10, the last batch kept

DRIVER = r'''
"""Run stages/pretrain.py, counting SGD steps; block at a chosen point (for kill -9)."""
import os, runpy, sys, time
from pathlib import Path
ROOT = Path(sys.argv[1])
sys.path[:0] = [str(ROOT / "stages"), str(ROOT)]
import selcl.train as T

hang_after_step = int(os.environ.get("HANG_AFTER_STEP", "0"))      # global step count
hang_at_replace = int(os.environ.get("HANG_AT_CKPT_REPLACE", "0"))  # n-th rename of the checkpoint
count = {"steps": 0, "replace": 0}

def hang():
    Path("hanging").write_text(str(count))
    while True:
        time.sleep(60)

step = T.Pretrainer.step
def counted_step(self, *args, **kwargs):
    out = step(self, *args, **kwargs)
    count["steps"] += 1
    if count["steps"] == hang_after_step:
        hang()
    return out
T.Pretrainer.step = counted_step

replace = os.replace
def slow_replace(src, dst, *args, **kwargs):
    if Path(dst).as_posix().endswith("pretrain/checkpoint.pt"):
        count["replace"] += 1
        if count["replace"] == hang_at_replace:
            hang()       # the temp file is complete and fsync'ed; the rename never happens
    return replace(src, dst, *args, **kwargs)
os.replace = slow_replace

sys.argv = [str(ROOT / "stages" / "pretrain.py"), sys.argv[2]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print(f"STEPS {count['steps']}", flush=True)
'''


# ----------------------------------------------------------------------------- helpers
def start_pretrain(folder: Path, driver: Path | None = None, **env) -> subprocess.Popen:
    cmd = ([PYTHON, str(driver), str(ROOT), SETTING] if driver
           else [PYTHON, str(ROOT / "stages" / "pretrain.py"), SETTING])
    env = {k: str(v) for k, v in env.items()}
    env.setdefault("SELCL_KEEP_CHECKPOINTS", "1")     # compare the final resume states
    return subprocess.Popen(cmd, cwd=folder, env=stage_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 400) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"stage failed ({proc.returncode}):\n{out}"
    return out


def kill_when_hanging(proc: subprocess.Popen, folder: Path, timeout: float = 400) -> None:
    """Wait for the driver's marker, then SIGKILL (no cleanup handler can run)."""
    marker = folder / "hanging"
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"the stage ended ({proc.returncode}) before the kill point:\n{proc.stdout.read()}")
        assert time.monotonic() < deadline, "the stage never reached the kill point"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    marker.unlink()


TMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


def check_outputs_load(folder: Path) -> list[Path]:
    """Every file under runs/ and scratch/ (resume state) is complete and loads, except
    hidden temp files (never an output path); returns those temp files."""
    temps = []
    for p in sorted([*(folder / "runs").rglob("*"), *(folder / "scratch").rglob("*")]):
        if not p.is_file():
            continue
        if p.name.startswith("."):
            assert TMP_NAME.fullmatch(p.name), f"unexpected hidden file {p}"
            temps.append(p)
        elif p.suffix == ".pt":
            checkpoint.load(p)                     # raises CheckpointError if half-written
        elif p.suffix == ".npz":
            with np.load(p) as z:
                [z[k] for k in z.files]
        elif p.suffix == ".json":
            json.loads(p.read_text())
        elif p.suffix == ".csv":
            rows = list(csv.DictReader(p.open()))
            assert rows or p.read_text().strip() == "", p
        else:
            pytest.fail(f"unexpected output {p}")
    return temps


def assert_identical(a, b, where: str = "state") -> None:
    """Bit-identical nested states: tensors by bytes, NaN equals NaN."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        same = torch.equal(a, b) or a.cpu().numpy().tobytes() == b.cpu().numpy().tobytes()
        assert same, f"{where} differs"
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, where
        assert a.tobytes() == b.tobytes(), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for k in a:
            assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ckpt_epoch(folder: Path) -> int:
    return checkpoint.load(folder / CKPT)["epoch"]


# ----------------------------------------------------------------------------- the test
def test_pretrain_resumes_exactly_after_kill_9(tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    make_tiny_inputs(a)
    make_tiny_inputs(b)
    # Determinism of the upstream stages: two independent runs, the same labels.
    assert sha256(a / RUN / "labels.npz") == sha256(b / RUN / "labels.npz")
    assert sha256(a / RUN / "warmup.pt") == sha256(b / RUN / "warmup.pt")
    assert_identical(checkpoint.load(a / RUN / "warmup.pt"), checkpoint.load(b / RUN / "warmup.pt"), "warmup")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)

    # A runs uninterrupted while B is killed in the middle of epoch 2 (2 cores).
    proc_a = start_pretrain(a)
    proc_b = start_pretrain(b, driver, HANG_AFTER_STEP=STEPS_PER_EPOCH + 3)
    kill_when_hanging(proc_b, b)
    assert ckpt_epoch(b) == FIRST
    assert not (b / RUN / "pretrain.pt").exists()
    check_outputs_load(b)

    # Resume; killed inside the epoch-3 checkpoint write (after the epoch-2 save).
    proc_b = start_pretrain(b, driver, HANG_AT_CKPT_REPLACE=2)
    kill_when_hanging(proc_b, b)
    assert ckpt_epoch(b) == FIRST + 1, "the checkpoint must still be the last complete one"
    orphans = check_outputs_load(b)
    assert [p.parent.name for p in orphans] == ["pretrain"], orphans
    assert checkpoint.load(orphans[0])["epoch"] == FIRST + 2  # complete, never renamed

    # Resume to the end: only the 2 missing epochs run.
    out = finish(start_pretrain(b, driver))
    assert f"STEPS {(EPOCHS - 2) * STEPS_PER_EPOCH}" in out, out
    assert "starting fresh" not in out
    finish(proc_a)

    assert check_outputs_load(b) == [], "a temp file outlived the run"
    assert check_outputs_load(a) == []
    final_a = checkpoint.load(a / RUN / "pretrain.pt")
    final_b = checkpoint.load(b / RUN / "pretrain.pt")
    assert {"model", "ema", "selection", "examples", "history"} <= set(final_a)
    assert len(final_a["history"]) == EPOCHS
    for key in ("model", "ema", "selection", "examples", "history"):
        assert_identical(final_a[key], final_b[key], key)
    assert_identical(final_a, final_b, "pretrain.pt")
    # The resumable state (optimiser, queues, memory, RNG) too (SELCL_KEEP_CHECKPOINTS=1
    # keeps it; by default it is deleted once the outputs are written: see test_dvc).
    assert_identical(checkpoint.load(a / CKPT), checkpoint.load(b / CKPT), "resume state")
    # Byte-identical files: DVC's hashes and later stages' fingerprints ignore the kills.
    for name in ("pretrain.pt", "pretrain_history.csv"):
        assert (a / RUN / name).read_bytes() == (b / RUN / name).read_bytes(), name
    metrics_a = json.loads((a / RUN / "pretrain.json").read_text())
    metrics_b = json.loads((b / RUN / "pretrain.json").read_text())
    metrics_a.pop("env", None), metrics_b.pop("env", None)   # machine description, not a result
    assert metrics_a == metrics_b


def test_warmup_and_baseline_checkpoints_follow_the_images(tmp_path, tiny_upstream, monkeypatch, capsys):
    """A checkpoint left by an interrupted warm-up or CE baseline is resumed only on the same
    images: data.npz enters their fingerprints. A change that keeps the labels (another
    data.image_size or crop, images replaced under the same names) starts them fresh."""
    from conftest import copy_upstream, run_stage_inprocess, tiny_params_dict, write_params
    from selcl.data import load_arrays, save_arrays
    write_params(tmp_path, tiny_params_dict())
    copy_upstream(tiny_upstream, tmp_path)
    monkeypatch.setenv("SELCL_KEEP_CHECKPOINTS", "1")      # leave the checkpoints behind
    for stage in ("warmup", "baseline"):
        run_stage_inprocess(monkeypatch, tmp_path, stage)
    capsys.readouterr()
    for stage in ("warmup", "baseline"):                   # same images: resumed, not fresh
        run_stage_inprocess(monkeypatch, tmp_path, stage)
        assert "starting fresh" not in capsys.readouterr().out, stage
    path = tmp_path / "runs" / SETTING / "data.npz"
    data = load_arrays(path)
    data.x_train = 255 - data.x_train                      # other images, the same labels
    save_arrays(data, path)
    for stage in ("warmup", "baseline"):
        run_stage_inprocess(monkeypatch, tmp_path, stage)
        assert "starting fresh" in capsys.readouterr().out, stage
