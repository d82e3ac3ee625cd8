"""bench/parity_runs.py --from-run: a finished run's pre-trained encoder fine-tuned again
(issue 11's oracle fine-tunes at the shipped budget) gives the run's own Sel-CL+ back, bit
for bit, and the three oracles beside it."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from conftest import PYTHON, ROOT, SETTING, copy_upstream, run_stage_inprocess, stage_env, tiny_params_dict, \
    write_params


@pytest.fixture
def finished_run(tiny_upstream, tmp_path):
    """A tiny setting's folder after the pretrain and finetune stages (one thread)."""
    copy_upstream(tiny_upstream, tmp_path)
    write_params(tmp_path, tiny_params_dict())
    mp = pytest.MonkeyPatch()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for stage in ("pretrain", "finetune"):
            run_stage_inprocess(mp, tmp_path, stage)
    finally:
        torch.set_num_threads(threads)
        mp.undo()
    return tmp_path


def _parity_runs(folder, *args) -> dict:
    env = stage_env(SELCL_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([PYTHON, str(ROOT / "bench" / "parity_runs.py"), "--root", str(folder),
                          "--setting", SETTING, "--from-run", str(folder / "runs" / SETTING), "--no-ce", *args],
                         cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_from_run_refinetunes_the_run_and_its_oracles(finished_run):
    stage = json.loads((finished_run / "runs" / SETTING / "finetune.json").read_text())
    got = _parity_runs(finished_run, "--oracles")
    assert got["from_run"] == str(finished_run / "runs" / SETTING)
    assert got["selcl_plus_final"] == stage["test_acc_last"]            # the same fine-tune, bit for bit
    assert got["selcl_plus_mean_last"] == stage["test_acc_mean_last"]
    assert set(got["finetune_oracles"]) == {"T_clean_labels", "all_noisy_labels", "all_clean_labels"}
    assert all(0 <= v <= 100 for v in got["finetune_oracles"].values())
    pre = torch.load(finished_run / "runs" / SETTING / "pretrain.pt", weights_only=False)
    assert got["precision_T"] == pre["history"][-1]["precision_T"]       # the run's own selection


def test_no_finetune_leaves_out_the_plain_fine_tune(finished_run):
    got = _parity_runs(finished_run, "--no-finetune")
    assert got["selcl_plus_final"] is None and got["finetune_oracles"] == {}
