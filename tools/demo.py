"""`make demo`: run a suite (default: the demo) as a DVC experiment and leave the
workspace exactly as committed.

Why an experiment: `dvc exp run --temp` runs the pipeline in a temporary copy of the
repository with `run` set to the suite (`-S run=[...]`) and records the result as the
experiment `demo` (`dvc exp show`, `dvc plots diff demo`). params.yaml, dvc.lock,
runs/ and reports/ of the workspace are not touched, so neither `git commit -a` nor
`git add -A` can record the demo as the committed default or put its lock file beside
the paper suite's params. The stages' outputs are in DVC's cache (`dvc exp apply demo`
brings them into the workspace, deliberately). The report is copied from the
experiment's commit to demo/ (git-ignored) for reading.

Side by side: each setting first trains as its own queued experiment `<name>-<setting>`
(`dvc exp run --queue -S run=[<setting>]`, then `dvc queue start -j <settings>`), all at
once with the cores split between them (OMP_NUM_THREADS), because the demo's small
network uses two cores little better than one: on 2 cores the two settings together
take about the time of one. The experiment `<name>` then runs the whole suite, and DVC's
run-cache restores every training stage from those runs, so it only writes the report.
`--one-by-one` skips the queue (one `dvc exp run --temp`, settings in turn).

    python tools/demo.py [--suite demo] [--name demo] [--one-by-one] [extra `dvc exp run` args, e.g. -S ...]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import yaml


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def experiment_commit(name: str, cwd: Path) -> str:
    """The commit of experiment `name` on the current baseline (refs/exps/<ab>/<cdef…>/<name>)."""
    head = git("rev-parse", "HEAD", cwd=cwd)
    return git("rev-parse", f"refs/exps/{head[:2]}/{head[2:]}/{name}", cwd=cwd)


def extract_report(commit: str, dest: Path, cwd: Path) -> None:
    """reports/ of `commit` → dest/ (README.md, figures/, metrics/)."""
    blob = subprocess.run(["git", "archive", "--format=tar", commit, "reports"], cwd=cwd,
                          capture_output=True, check=True).stdout
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        for member in tar.getmembers():
            rel = Path(member.name).relative_to("reports") if member.name != "reports" else Path(".")
            if member.isfile() and ".." not in rel.parts:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                (dest / rel).write_bytes(tar.extractfile(member).read())


def summary_lines(report: Path) -> list[str]:
    lines = []
    for path in sorted((report / "metrics").glob("*.json")):
        m = json.loads(path.read_text())
        lines.append(f"  {path.stem}: Sel-CL+ {m.get('selcl_plus', float('nan')):.2f} %, "
                     f"CE {m.get('ce', float('nan')):.2f} %")
    return lines


# DVC checks out every cached output of the baseline's dvc.lock before it runs an
# experiment; the committed repository has no lock for the demo's stages (it never ran
# them), so each fresh experiment warns once per output that it has nothing to restore:
# 16 lines per setting, expected and not actionable, which buried the demo's own output.
NOTHING_TO_RESTORE = re.compile(r"^WARNING: No file hash info found for '.*'\. It won't be created\.$")


def dvc(*args: str, cwd: Path, env: dict | None = None, quiet: bool = False) -> subprocess.CompletedProcess:
    if quiet:
        return subprocess.run(["dvc", *args], cwd=cwd, env=env, text=True, capture_output=True)
    return stream(["dvc", *args], cwd=cwd, env=env)


def stream(cmd: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `cmd`, printing its output (stdout and stderr, as they come) without the
    NOTHING_TO_RESTORE warnings."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, bufsize=1)
    for line in proc.stdout:
        if not NOTHING_TO_RESTORE.match(line.rstrip("\n")):
            sys.stdout.write(line)
            sys.stdout.flush()
    return subprocess.CompletedProcess(cmd, proc.wait())


def train_side_by_side(settings: list[str], name: str, extra: list[str], root: Path) -> bool:
    """Each setting as its own queued experiment, all running at once; True when all succeed.

    A setting whose experiment failed is queued once more, alone, with the same thread
    count (so the same numbers; its finished stages come from the run-cache): parallel
    queue workers share one cache, and two of them committing a byte-identical output at
    the same moment can fail one ("unable to remove ... without a confirmation", a DVC
    race: treeverse/dvc#10673). Tiny settings whose stages end alike meet it."""
    threads = max(1, (os.cpu_count() or 1) // len(settings))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    todo = settings
    for attempt in (1, 2):
        missing = _queue_and_wait(todo, name, extra, root, env)
        if missing is None:
            return False
        if not missing:
            return True
        todo = [s for s in todo if f"{name}-{s}" in missing]
        print(f"{', '.join(missing)} failed" + ("; queued once more, alone" if attempt == 1 else ""),
              file=sys.stderr, flush=True)
    print("error: see `dvc queue logs <name>`", file=sys.stderr)
    return False


def _queue_and_wait(settings: list[str], name: str, extra: list[str], root: Path, env: dict) -> list[str] | None:
    """Queue `settings`, start one worker each, follow them; the experiments that failed
    (None: queueing itself failed)."""
    names = [f"{name}-{s}" for s in settings]
    for exp in names:                                       # an older demo's (absent: no-op)
        dvc("exp", "remove", exp, cwd=root, quiet=True)
    waiting = [ln for ln in dvc("queue", "status", cwd=root, quiet=True).stdout.splitlines() if "Queued" in ln]
    if waiting:    # `dvc queue start` runs every queued task: the demo would wait for them all
        print("error: the DVC queue already holds queued experiments, which `dvc queue start` would run "
              "before the demo finishes: run them (`dvc queue start`) or drop them (`dvc queue remove "
              "--queued`) first:\n" + "\n".join(waiting), file=sys.stderr)
        return None
    for exp, setting in zip(names, settings):
        cmd = ["exp", "run", "--queue", "--name", exp, "-S", f"run=[{setting}]", *extra]
        print("$ dvc " + " ".join(cmd), flush=True)
        if dvc(*cmd, cwd=root).returncode != 0:
            return None
    print(f"$ OMP_NUM_THREADS={env['OMP_NUM_THREADS']} dvc queue start -j {len(settings)}", flush=True)
    if dvc("queue", "start", "-j", str(len(settings)), cwd=root, env=env).returncode != 0:
        return None
    for exp in names:                  # their live output, one after the other (tqdm bars)
        while re.search(rf"\b{re.escape(exp)}\b.*\bQueued\b", dvc("queue", "status", cwd=root, quiet=True).stdout):
            time.sleep(2)              # a queued task has no log yet
        print(f"\n--- {exp} (dvc queue logs {exp}) ---", flush=True)
        dvc("queue", "logs", "--follow", exp, cwd=root)
    while True:                        # a task not yet started has no log to follow
        status = dvc("queue", "status", cwd=root, quiet=True).stdout
        if not any(re.search(rf"\b{re.escape(exp)}\b.*\b(Queued|Running)\b", status) for exp in names):
            break
        time.sleep(5)
    missing = []                       # older experiments of these names were removed above
    for exp in names:
        try:
            experiment_commit(exp, root)
        except subprocess.CalledProcessError:
            missing.append(exp)
    if missing:
        print(status, file=sys.stderr)
    return missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="demo", help="a suite of params.yaml `suites` (default: demo)")
    ap.add_argument("--name", default="demo", help="experiment name (default: demo; an older one is replaced)")
    ap.add_argument("--out", default="demo", help="folder for the report (default: demo/, git-ignored)")
    ap.add_argument("--one-by-one", action="store_true",
                    help="train the settings in turn in one `dvc exp run --temp` (no queue)")
    args, extra = ap.parse_known_args(argv)
    root = Path(__file__).resolve().parents[1]        # the repository, wherever it is called from
    suites = yaml.safe_load((root / "params.yaml").read_text()).get("suites") or {}
    if args.suite not in suites:
        print(f"error: suites.{args.suite}: no such suite in params.yaml (have: {', '.join(suites)})",
              file=sys.stderr)
        return 2
    settings = suites[args.suite]
    if len(settings) > 1 and not args.one_by_one and not train_side_by_side(settings, args.name, extra, root):
        return 1
    names = ",".join(settings)
    dvc("exp", "remove", args.name, cwd=root, quiet=True)   # an older demo (not --force: that retrains)
    cmd = ["dvc", "exp", "run", "--temp", "--name", args.name, "-S", f"run=[{names}]", *extra]
    print("$ " + " ".join(cmd), flush=True)
    if stream(cmd, cwd=root).returncode != 0:
        return 1
    dest = root / args.out
    extract_report(experiment_commit(args.name, root), dest, root)
    print("\n".join([f"\nExperiment '{args.name}' (dvc exp show; dvc plots diff {args.name}); "
                     f"the workspace is unchanged.", *summary_lines(dest),
                     f"Report: {dest / 'README.md'}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
