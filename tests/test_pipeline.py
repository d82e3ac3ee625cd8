"""End to end through DVC on a tiny version of the demo (issue: the pipeline).

One module-scoped clone of the repository (git + DVC) with the demo suite shrunk to
seconds per stage. Checks: a fresh `dvc repro` builds the report with figures; `dvc
status` is then clean and a second repro reruns nothing; changing α of one setting
reruns exactly that setting's pretrain, finetune, evaluate and the report; changing a
fine-tuning param never reruns pre-training; queued experiments run two at a time.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

TINY = {
    "data": {"dataset": "digits", "subset": 12},
    "model": {"arch": "small", "width": 8, "blocks": [1]},
    "warmup": {"queue_size": 64},
    "pretrain": {"epochs": 2, "batch_size": 32, "lr_decay_epochs": [], "k": 5, "queue_per_class": 4,
                 "memory_start_epoch": 2, "checkpoint_every": 1},
    "finetune": {"epochs": 2, "batch_size": 32, "lr": 0.01, "bootstrap_start": 1, "eval_last": 1,
                 "checkpoint_every": 1},
    "evaluate": {"k": 5, "tsne_points": 40},
    "baseline": {"epochs": 2, "batch_size": 32, "lr": 0.05, "lr_decay_epochs": [], "eval_last": 1,
                 "checkpoint_every": 1},
}


def sh(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", OMP_NUM_THREADS="1",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def tiny_params(path: Path) -> None:
    params = yaml.safe_load(path.read_text())
    for name in params["suites"]["demo"]:
        for section, values in TINY.items():
            params["settings"][name][section].update(values)
    params["run"] = list(params["suites"]["demo"])
    path.write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("pipeline") / "repo"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for rel in files:
        if (ROOT / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dst / rel)
    tiny_params(dst / "params.yaml")
    sh(["git", "init", "-q"], dst)
    sh(["git", "add", "-A"], dst)
    sh(["git", "commit", "-qm", "tiny"], dst)
    sh(["dvc", "repro"], dst)
    return dst


def ran_stages(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


def status(repo: Path) -> dict:
    return json.loads(sh(["dvc", "status", "--json"], repo).stdout or "{}")


def set_param(repo: Path, setting: str, section: str, key: str, value) -> None:
    path = repo / "params.yaml"
    params = yaml.safe_load(path.read_text())
    params["settings"][setting][section][key] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def test_fresh_repro_builds_the_report(repo):
    report = (repo / "reports" / "README.md").read_text()
    for name in ("demo_sym40", "demo_asym40"):
        assert f"| {name} |" in report
        assert f"figures/{name}_learning.png" in report
        assert (repo / "reports" / "figures" / f"{name}_learning.png").stat().st_size > 1000
        assert (repo / "reports" / "figures" / f"{name}_tsne.png").exists()
    metrics = json.loads((repo / "reports" / "metrics.json").read_text())
    assert set(metrics) == {"demo_sym40", "demo_asym40"}
    assert all(0 <= m["selcl_plus_test_acc"] <= 100 for m in metrics.values())


def test_status_clean_and_second_repro_reruns_nothing(repo):
    assert status(repo) == {}
    out = sh(["dvc", "repro"], repo).stdout
    assert ran_stages(out) == set(), out


def test_alpha_reruns_exactly_that_settings_training(repo):
    set_param(repo, "demo_sym40", "pretrain", "alpha", 0.25)
    assert set(status(repo)) == {"pretrain@demo_sym40"}
    out = sh(["dvc", "repro"], repo).stdout
    assert ran_stages(out) == {"pretrain@demo_sym40", "finetune@demo_sym40", "evaluate@demo_sym40",
                               "report"}, out
    assert status(repo) == {}


def test_finetune_param_never_reruns_pretraining(repo):
    set_param(repo, "demo_asym40", "finetune", "lr", 0.02)
    assert set(status(repo)) == {"finetune@demo_asym40"}
    out = sh(["dvc", "repro"], repo).stdout
    assert ran_stages(out) == {"finetune@demo_asym40", "report"}, out


def test_paper_suite_on_cpu_stops_at_once(repo):
    env_has_cuda = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                                  capture_output=True, text=True).stdout.strip() == "True"
    if env_has_cuda:
        pytest.skip("a GPU is visible")
    proc = sh([str(BIN / "python"), "stages/data.py", "cifar10_sym20"], repo, check=False)
    assert proc.returncode == 2
    assert "make demo" in proc.stderr and "SELCL_ALLOW_CPU" in proc.stderr
    assert not (repo / "runs" / "cifar10_sym20").exists()


def test_three_queued_experiments_two_workers(repo):
    """Issue (reliability): three queued demo experiments with `dvc queue start -j 2`
    complete without lock errors or mixed outputs."""
    import time
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "baseline results"], repo)
    alphas = (0.25, 0.5, 0.75)
    for a in alphas:
        sh(["dvc", "exp", "run", "--queue", "-S", f"++settings.demo_sym40.pretrain.alpha={a}",
            "-S", "run=[demo_sym40]"], repo)
    sh(["dvc", "queue", "start", "-j", "2"], repo)
    deadline = time.time() + 300
    while time.time() < deadline:
        st = sh(["dvc", "queue", "status"], repo).stdout
        if not re.search(r"\b(Queued|Running)\b", st):
            break
        time.sleep(3)
    st = sh(["dvc", "queue", "status"], repo).stdout
    failed = re.findall(r"^\s*\S+\s+(\S+)\s+.*\bFailed\b", st, re.MULTILINE)
    logs = "\n".join(sh(["dvc", "queue", "logs", name], repo, check=False).stdout[-3000:] for name in failed)
    assert not failed, st + logs
    assert len(re.findall(r"\bSuccess\b", st)) == 3, st
    show = json.loads(sh(["dvc", "exp", "show", "--json"], repo).stdout)
    seen = {}
    for exp in _iter_exps(show):
        params = exp.get("params", {}).get("params.yaml", {}).get("data", {})
        alpha = params.get("settings", {}).get("demo_sym40", {}).get("pretrain", {}).get("alpha")
        metrics = exp.get("metrics", {}).get("reports/metrics.json", {}).get("data", {})
        if alpha in alphas and metrics:
            seen[alpha] = metrics
    assert set(seen) == set(alphas), json.dumps(show)[:2000]
    for alpha, metrics in seen.items():
        assert set(metrics) == {"demo_sym40"}        # each experiment's own run list, not mixed


def _iter_exps(node):
    """Every experiment record in `dvc exp show --json` output (its layout is nested)."""
    if isinstance(node, dict):
        if "params" in node and "metrics" in node:
            yield node
        for v in node.values():
            yield from _iter_exps(v)
    elif isinstance(node, list):
        for v in node:
            yield from _iter_exps(v)
