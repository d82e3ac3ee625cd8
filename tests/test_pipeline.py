"""End to end through DVC on a tiny version of the demo (issue: the pipeline).

One module-scoped clone of the repository (git + DVC) with the demo suite shrunk to
seconds per stage, built once by `tools/demo.py` (what `make demo` runs) and then
applied to the workspace. Checks: the demo leaves every tracked file as committed; its
report has figures; a second repro reruns no stage; changing α of one setting reruns
exactly that setting's pretrain, finetune, evaluate and the report, and changing it back
restores them from the run-cache without training; `evaluate.tsne_points` and
fine-tuning params never rerun pre-training; a changed label in a noise file reruns
`noise`; queued experiments run two at a time.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
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


def tiny_params(root: Path) -> None:
    """Shrink the demo settings (params/<name>.yaml); `run` stays the committed (paper) suite."""
    params = yaml.safe_load((root / "params.yaml").read_text())
    for name in params["suites"]["demo"]:
        path = root / "params" / f"{name}.yaml"
        setting = yaml.safe_load(path.read_text())
        for section, values in TINY.items():
            setting[section].update(values)
        path.write_text(yaml.safe_dump(setting, sort_keys=False))


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("pipeline") / "repo"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for rel in files:
        if (ROOT / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dst / rel)
    tiny_params(dst)
    sh(["git", "init", "-q"], dst)
    sh(["git", "add", "-A"], dst)
    sh(["git", "commit", "-qm", "tiny"], dst)
    proc = sh([str(BIN / "python"), "tools/demo.py"], dst)          # = make demo
    (dst.parent / "demo.log").write_text(proc.stdout + proc.stderr)   # outside the repo
    return dst


@pytest.fixture(scope="module")
def applied(repo) -> Path:
    """The demo experiment brought into the workspace (`dvc exp apply demo`)."""
    sh(["dvc", "exp", "apply", "demo"], repo)
    return repo


def experiment_commit(name: str, repo: Path) -> str:
    sys.path.insert(0, str(ROOT / "tools"))
    import demo
    return demo.experiment_commit(name, repo)


def ran_stages(output: str) -> set[str]:
    """Stages that ran their command; the `config` stages run on every repro (they
    check the input files) and are left out."""
    return {s for s in re.findall(r"Running stage '([^']+)'", output) if not s.startswith("config@")}


def restored_stages(output: str) -> set[str]:
    return set(re.findall(r"Stage '([^']+)' is cached - skipping run", output))


def status(repo: Path) -> dict:
    """`dvc status` without the always-changed `config` stages."""
    st = json.loads(sh(["dvc", "status", "--json"], repo).stdout or "{}")
    return {k: v for k, v in st.items() if v != ["always changed"]}


def set_param(repo: Path, setting: str, section: str, key: str, value) -> None:
    path = repo / "params" / f"{setting}.yaml"
    params = yaml.safe_load(path.read_text())
    params[section][key] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def test_demo_leaves_the_workspace_as_committed(repo):
    """`make demo` (tools/demo.py) changes no tracked file and leaves nothing to add:
    the result is the experiment `demo`, its report a copy under the ignored demo/."""
    assert sh(["git", "status", "--porcelain"], repo).stdout == ""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    assert params["run"] == params["suites"]["paper"]
    assert not (repo / "dvc.lock").exists() and not (repo / "runs").exists()
    assert "| demo_sym40 |" in (repo / "demo" / "README.md").read_text()
    exps = sh(["dvc", "exp", "list", "--name-only"], repo).stdout.split()
    assert {"demo", "demo-demo_sym40", "demo-demo_asym40"} <= set(exps)   # side by side, then the suite
    log = (repo.parent / "demo.log").read_text()
    assert "dvc queue start -j 2" in log
    assert "WARNING" not in log and "ERROR" not in log, [ln for ln in log.splitlines() if "WARNING" in ln][:5]
    # the suite's experiment restored every training stage from the side-by-side runs
    suite_log = log.split("dvc exp run --temp", 1)[1]
    assert "Running stage 'pretrain@" not in suite_log and "Running stage 'report'" in suite_log
    assert not (repo / "scratch").exists() or not any((repo / "scratch").rglob("*.pt"))


# The first core task, as a user types it: one setting's α, only that setting run.
ALPHA_LINE = "dvc exp run -S 'run=[demo_sym40]' -S params/demo_sym40.yaml:pretrain.alpha=0.25"


def test_one_short_line_changes_alpha_of_one_setting(repo):
    """≤ 80 characters, no `++`; it trains only demo_sym40's pre-training and what follows
    (its data, noise, warm-up and CE come from the demo's run-cache). `--temp -n alpha25`
    keep this module's workspace as the demo left it."""
    assert len(ALPHA_LINE) <= 80 and "++" not in ALPHA_LINE
    out = sh([*shlex.split(ALPHA_LINE), "--temp", "-n", "alpha25"], repo).stdout
    assert ran_stages(out) == {"pretrain@demo_sym40", "finetune@demo_sym40", "evaluate@demo_sym40",
                               "label_issues@demo_sym40", "report"}, out
    assert sh(["git", "status", "--porcelain"], repo).stdout == ""


def test_diffs_show_the_values_that_changed(repo):
    """`dvc exp diff` / `dvc params diff` between the demo and the α experiment: the two values
    of α (not a file hash) in the one setting that ran in both; the demo's other setting, which
    the α experiment did not run, shows as values against `-`."""
    alpha = re.compile(r"^runs/demo_sym40/config/pretrain\.json\s+pretrain\.alpha\s+0\.5\s+0\.25\b", re.MULTILINE)
    demo, a25 = (experiment_commit(n, repo) for n in ("demo", "alpha25"))
    for out in (sh(["dvc", "exp", "diff", "demo", "alpha25"], repo).stdout,
                sh(["dvc", "params", "diff", demo, a25], repo).stdout):
        assert alpha.search(out), out
        assert not re.search(r"\b[0-9a-f]{32}\b", out), out                 # values, not hashes
        changed = [ln.split()[:2] for ln in out.splitlines() if ln.startswith("runs/demo_sym40/")]
        assert {p for _, p in changed} == {"pretrain.alpha"}, changed      # pretrain's and finetune's
        assert all(re.search(r"\s-(\s|$)", ln) for ln in out.splitlines() if ln.startswith("runs/demo_asym40/")), out


def test_exp_show_puts_the_headline_metrics_first(repo):
    """No flags: Sel-CL+, CE and the precision of T of each setting within the first 200
    characters of the header; `--only-changed` lists the metrics, `run` and α."""
    table = sh(["dvc", "exp", "show"], repo).stdout
    header = next(line for line in table.splitlines() if "Experiment" in line)[:200]
    for name in ("demo_sym40", "demo_asym40"):
        for key in ("Sel-CL+", "CE", "precision_T"):
            assert f"{name}.{key}" in header, (name, key, header)
    cols = next(csv.reader(io.StringIO(sh(["dvc", "exp", "show", "--only-changed", "--csv"], repo).stdout)))
    assert {"demo_sym40.Sel-CL+", "run", "runs/demo_sym40/config/pretrain.json:pretrain.alpha"} <= set(cols), cols
    # docs/experiments.md's table of a sweep: the headline metrics, `run` and the swept key
    sweep = ["dvc", "exp", "show", "--only-changed", "--drop", ".*/", "--keep", ".*pretrain.json:pretrain.alpha"]
    cols = next(csv.reader(io.StringIO(sh([*sweep, "--csv"], repo).stdout)))
    shown = [c for c in cols if c not in ("rev", "typ")]      # the table merges these into Experiment
    assert len(shown) <= 15 and "runs/demo_sym40/config/pretrain.json:pretrain.alpha" in shown, shown


def test_fresh_repro_builds_the_report(applied):
    repo = applied
    report = (repo / "reports" / "README.md").read_text()
    for name in ("demo_sym40", "demo_asym40"):
        assert f"| {name} |" in report
        assert f"figures/{name}_learning.png" in report
        assert (repo / "reports" / "figures" / f"{name}_learning.png").stat().st_size > 1000
        assert (repo / "reports" / "figures" / f"{name}_tsne.png").exists()
        # issue 87: the detector table, cleanlab included (on for the demo), and its figure
        for detector in ("not in T (Sel-CL)", "Sel-CL+ ≠ given", "cleanlab (5-fold CE, prune_by_noise_rate)"):
            assert f"| {name} | {detector} |" in report
        assert (repo / "reports" / "figures" / f"{name}_label_issues.png").stat().st_size > 1000
    for name in ("demo_sym40", "demo_asym40"):     # numbers only, one file per setting
        metrics = json.loads((repo / "reports" / "metrics" / f"{name}.json").read_text())
        assert 0 <= metrics["selcl_plus"] <= 100
        assert all(isinstance(v, (int, float)) for v in metrics.values())
    assert set(json.loads((repo / "reports" / "metrics.json").read_text())) == {"mean_gain_over_ce", "min_gain_over_ce"}
    # the DVC metrics file: Sel-CL+, CE, precision of T per setting, then the suite's gain
    headline = json.loads((repo / "reports" / "headline.json").read_text())
    assert list(headline) == ["demo_sym40", "demo_asym40"]
    assert list(headline["demo_sym40"]) == ["Sel-CL+", "CE", "precision_T"]
    assert "budget" in report and "1 + 1 + 2 = 4 / 2" in report    # every accuracy with its epochs (pretrain.epochs = 2 in all, warm-up 1)


def test_plots_render_without_errors(applied):
    """`dvc plots show` and `dvc plots diff demo` draw every declared plot (each setting's
    Fig. 3 and the accuracy of Sel-CL+ against CE) and report no file they failed to load."""
    repo = applied
    for cmd in (["dvc", "plots", "show", "--json"], ["dvc", "plots", "diff", "demo", "--json"],
                ["dvc", "plots", "diff", "demo", "alpha25", "--json"]):
        proc = sh(cmd, repo)
        assert "failed" not in proc.stderr.lower() and "error" not in proc.stderr.lower(), proc.stderr
        plots = json.loads(proc.stdout)
        assert not plots.get("errors"), plots.get("errors")
        drawn = " ".join(plots["data"])
        for name in ("demo_sym40", "demo_asym40"):
            assert f"runs/{name}/pretrain_history.csv" in drawn, drawn
        assert "plots/accuracy" in drawn, drawn


def test_dag_of_one_setting_fits_120_columns(applied):
    """The stages of one setting as a mermaid flowchart (`dvc dag --md`, which GitHub draws):
    text a reader can follow, unlike the ASCII drawing whose edges from `config` fan out."""
    out = sh(["dvc", "dag", "--md", "finetune@demo_sym40"], applied).stdout
    assert max(map(len, out.splitlines())) <= 120, out
    for stage in ("config", "data", "noise", "warmup", "pretrain", "finetune"):
        assert f"{stage}@demo_sym40" in out, out


def test_status_clean_and_second_repro_reruns_nothing(applied):
    repo = applied
    assert status(repo) == {}
    out = sh(["dvc", "repro"], repo).stdout
    assert ran_stages(out) == set(), out


def test_alpha_reruns_exactly_that_settings_training(applied):
    repo = applied
    set_param(repo, "demo_sym40", "pretrain", "alpha", 0.3)     # 0.25 ran above (alpha25)
    out = sh(["dvc", "repro"], repo).stdout
    assert {"pretrain@demo_sym40", "finetune@demo_sym40", "label_issues@demo_sym40", "report"} <= ran_stages(out), out
    # evaluate reads pretrain.pt, not α: a tiny run whose selection α does not move gives the
    # same encoder, and DVC restores the evaluation it already has (`is cached`)
    assert ran_stages(out) | restored_stages(out) == {"pretrain@demo_sym40", "finetune@demo_sym40",
                                                      "evaluate@demo_sym40", "label_issues@demo_sym40",
                                                      "report"}, out
    assert status(repo) == {}


def test_alpha_back_restores_from_the_run_cache(applied):
    """α A → B (previous test) → A: A's stages come back from the run-cache, no training."""
    repo = applied
    assert not (repo / "scratch").exists() or not any((repo / "scratch").rglob("*.pt"))
    set_param(repo, "demo_sym40", "pretrain", "alpha", 0.5)
    out = sh(["dvc", "repro"], repo).stdout
    assert ran_stages(out) == {"report"}, out
    assert restored_stages(out) == {"pretrain@demo_sym40", "finetune@demo_sym40", "evaluate@demo_sym40",
                                    "label_issues@demo_sym40"}, out
    assert status(repo) == {}


def test_tsne_points_never_reruns_pretraining(applied):
    repo = applied
    set_param(repo, "demo_sym40", "evaluate", "tsne_points", 30)
    out = sh(["dvc", "repro"], repo).stdout
    assert ran_stages(out) == {"evaluate@demo_sym40", "report"}, out


def test_finetune_param_never_reruns_pretraining(applied):
    repo = applied
    set_param(repo, "demo_asym40", "finetune", "lr", 0.02)
    out = sh(["dvc", "repro"], repo).stdout
    assert ran_stages(out) == {"finetune@demo_asym40", "label_issues@demo_asym40", "report"}, out


def test_changed_label_file_reruns_noise(applied):
    """noise.file is a dependency through its content: one changed label reruns noise
    (and would rerun what follows); the unchanged file reruns nothing."""
    import numpy as np
    repo = applied
    with np.load(repo / "runs" / "demo_sym40" / "labels.npz") as f:
        noisy = f["noisy"].copy()
    (repo / "data").mkdir(exist_ok=True)
    np.save(repo / "data" / "labels.npy", noisy)          # the same labels, from a file
    set_param(repo, "demo_sym40", "noise", "kind", "file")
    set_param(repo, "demo_sym40", "noise", "file", "data/labels.npy")
    out = sh(["dvc", "repro", "-s", "config@demo_sym40", "noise@demo_sym40"], repo).stdout
    assert "noise@demo_sym40" in ran_stages(out), out
    assert sh(["dvc", "status", "warmup@demo_sym40"], repo).stdout.strip().endswith("up to date."), \
        "the same labels from a file must give the same labels.npz"
    noisy[0] = (noisy[0] + 1) % 10
    np.save(repo / "data" / "labels.npy", noisy)          # one label changed
    out = sh(["dvc", "repro", "-s", "config@demo_sym40", "noise@demo_sym40"], repo).stdout
    assert "noise@demo_sym40" in ran_stages(out), out
    assert {"warmup@demo_sym40", "baseline@demo_sym40", "cleanlab_baseline@demo_sym40"} <= set(status(repo)), \
        status(repo)
    out = sh(["dvc", "repro", "-s", "config@demo_sym40", "noise@demo_sym40"], repo).stdout
    assert ran_stages(out) == set(), out                  # file unchanged since: nothing reruns
    # back to the committed noise for the experiments below (data/ is not in git)
    set_param(repo, "demo_sym40", "noise", "kind", "sym")
    set_param(repo, "demo_sym40", "noise", "file", None)
    sh(["dvc", "repro"], repo)
    assert status(repo) == {}


def test_paper_suite_on_cpu_stops_at_once(applied):
    repo = applied
    env_has_cuda = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                                  capture_output=True, text=True).stdout.strip() == "True"
    if env_has_cuda:
        pytest.skip("a GPU is visible")
    proc = sh([str(BIN / "python"), "stages/data.py", "cifar10_sym20"], repo, check=False)
    assert proc.returncode == 2
    assert "make demo" in proc.stderr and "SELCL_ALLOW_CPU" in proc.stderr
    assert not (repo / "runs" / "cifar10_sym20").exists()


def test_three_queued_experiments_two_workers(applied):
    """Issue (reliability): three queued demo experiments with `dvc queue start -j 2`
    complete without lock errors or mixed outputs."""
    import time
    repo = applied
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "baseline results"], repo)
    alphas = (0.25, 0.5, 0.75)
    for a in alphas:
        sh(["dvc", "exp", "run", "--queue", "-S", f"params/demo_sym40.yaml:pretrain.alpha={a}",
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
    ours = [line for line in st.splitlines() if "Success" in line and "demo-" not in line]  # not make demo's
    assert len(ours) == 3, st
    show = json.loads(sh(["dvc", "exp", "show", "--json"], repo).stdout)
    seen = {}
    for exp in _iter_exps(show):
        params = exp.get("params", {}).get("runs/demo_sym40/config/pretrain.json", {}).get("data", {})
        alpha = params.get("pretrain", {}).get("alpha")
        metrics = exp.get("metrics", {}).get("reports/headline.json", {}).get("data", {})
        if alpha in alphas and metrics:
            seen[alpha] = metrics
    assert set(seen) == set(alphas), json.dumps(show)[:2000]
    for alpha, metrics in seen.items():
        # each experiment's own run list, not mixed
        assert set(metrics) == {"demo_sym40"}, metrics


def test_crossover_queues_scaled_budgets_and_collects_a_table(applied):
    """Issue 11: `tools/crossover.py queue` runs one experiment per budget through the DVC
    queue; `collect` reads their metrics, histories and timing back into a table + figure."""
    import time
    repo = applied
    sh([str(BIN / "python"), "tools/crossover.py", "queue", "demo_asym40", "--scales", "1", "2",
        "--start", "--jobs", "2"], repo)
    deadline = time.time() + 300
    while time.time() < deadline and re.search(r"\b(Queued|Running)\b", sh(["dvc", "queue", "status"], repo).stdout):
        time.sleep(3)
    out = repo.parent / "crossover"
    sh([str(BIN / "python"), "tools/crossover.py", "collect", "demo_asym40", "--out", str(out)], repo)
    rows = json.loads(out.with_suffix(".json").read_text())
    assert [r["scale"] for r in rows] == [1.0, 2.0]
    assert [r["epochs"] for r in rows] == ["1 + 1 + 2 / 2", "1 + 2 + 4 / 4"]    # tiny: 2 in all, 2, 2
    for r in rows:
        assert 0 <= r["selcl_plus"] <= 100 and 0 <= r["ce_best"] <= 100 and r["pretrain_min"] > 0
    table = out.with_suffix(".md").read_text()
    assert table.count("\n| 1 |") == 1 and table.count("\n| 2 |") == 1
    assert out.with_suffix(".png").stat().st_size > 1000


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
