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

    python tools/demo.py [--suite demo] [--name demo] [extra `dvc exp run` args, e.g. -S ...]
"""
from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tarfile
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="demo", help="a suite of params.yaml `suites` (default: demo)")
    ap.add_argument("--name", default="demo", help="experiment name (default: demo; an older one is replaced)")
    ap.add_argument("--out", default="demo", help="folder for the report (default: demo/, git-ignored)")
    args, extra = ap.parse_known_args(argv)
    root = Path.cwd()
    suites = yaml.safe_load((root / "params.yaml").read_text()).get("suites") or {}
    if args.suite not in suites:
        print(f"error: suites.{args.suite}: no such suite in params.yaml (have: {', '.join(suites)})",
              file=sys.stderr)
        return 2
    names = ",".join(suites[args.suite])
    cmd = ["dvc", "exp", "run", "--temp", "--force", "--name", args.name, "-S", f"run=[{names}]", *extra]
    print("$ " + " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=root).returncode != 0:
        return 1
    dest = root / args.out
    extract_report(experiment_commit(args.name, root), dest, root)
    print("\n".join([f"\nExperiment '{args.name}' (dvc exp show; dvc plots diff {args.name}); "
                     f"the workspace is unchanged.", *summary_lines(dest),
                     f"Report: {dest / 'README.md'}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
