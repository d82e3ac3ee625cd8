"""Point params.yaml `run` at a named suite: `python tools/use_suite.py demo`.

Only the `run:` entry is rewritten (comments and everything else stay as they are),
so `dvc repro` then builds exactly that suite and `dvc status` speaks only of it."""
import re
import sys
from pathlib import Path

import yaml


def use_suite(suite: str, path: Path = Path("params.yaml")) -> list[str]:
    text = path.read_text()
    params = yaml.safe_load(text)
    suites = params.get("suites") or {}
    if suite not in suites:
        raise SystemExit(f"error: suites.{suite}: no such suite in {path} (have: {', '.join(suites)})")
    names = suites[suite]
    new_run = "run: [" + ", ".join(names) + "]\n"
    # `run:` is a top-level key whose flow list may wrap over several indented lines.
    pattern = re.compile(r"^run:[^\n]*\n(?:[ \t]+[^\n]*\n)*", re.MULTILINE)
    if not pattern.search(text):
        raise SystemExit(f"error: {path}: no top-level `run:` entry to rewrite")
    new_text = pattern.sub(lambda _: new_run, text, count=1)
    if yaml.safe_load(new_text)["run"] != names:  # pragma: no cover - guards the regex
        raise SystemExit(f"error: {path}: could not rewrite `run:` safely")
    if new_text != text:
        path.write_text(new_text)
    return names


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tools/use_suite.py <suite>")
    chosen = use_suite(sys.argv[1])
    print(f"params.yaml: run = {chosen}")
