"""`make gpu-check` in its CPU form (what CI runs): the same items as on CUDA, through the
library's loops, with the CUDA-only ones marked SKIP and named; and a failing item is a
FAIL line and a non-zero exit, never a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))


def test_the_cpu_form_passes_and_names_what_it_could_not_check():
    env = {**os.environ, "SELCL_DEVICE": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    status = {ln.split(":")[0][6:]: ln[:4] for ln in out if ln[:4] in ("PASS", "FAIL", "SKIP")}
    assert status == {
        "data + augmentation on the device": "PASS", "short real run": "PASS",
        "compiled forwards (torch.compile)": "SKIP", "CUDA graphs": "SKIP", "bf16 autocast": "SKIP",
        "selection (faiss-cpu)": "PASS", "one DDP process": "PASS"}, proc.stdout
    timing = next(ln for ln in out if ln.startswith("time "))
    assert "pre-training step" in timing and "projected CIFAR-10 pre-training epoch" in timing \
        and "projected setting (250 + 70 epochs)" in timing, timing
    skipped = next(ln for ln in out if ln.startswith("not checked on cpu:"))
    for item in ("compiled forwards", "CUDA graphs", "bf16 autocast", "faiss-gpu"):
        assert item in skipped, skipped
    assert out[-1] == "gpu-check: all checked items PASS"


def test_a_failing_item_is_one_fail_line(capsys):
    import gpu_check
    report = gpu_check.Report()
    report.check("works", lambda: (True, "fine"))
    report.check("wrong", lambda: (False, "gradients differ"))
    report.check("raises", lambda: (_ for _ in ()).throw(RuntimeError("NCCL error: unhandled\nmore")))
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["PASS  works: fine", "FAIL  wrong: gradients differ", "FAIL  raises: RuntimeError: NCCL error: unhandled"]
    assert report.failed == 2
