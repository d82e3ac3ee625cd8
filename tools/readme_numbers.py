"""The README's demo numbers, rendered from a demo report (never typed by hand).

The numbers live between `<!-- demo-numbers -->` and `<!-- /demo-numbers -->` in
README.md and come from the record bench/results/demo/ (the `reports/metrics/` and
README.md of a demo run, as `make demo` copies them to demo/). tests/test_readme.py
keeps the README and the record in step.

    make demo && python tools/readme_numbers.py --from demo   # refresh record + README
    python tools/readme_numbers.py --check                     # exit 1 if out of step
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from selcl.config import load_params, resolve  # noqa: E402

RECORD = ROOT / "bench" / "results" / "demo"
BLOCK = re.compile(r"(<!-- demo-numbers -->\n)(.*?)(\n<!-- /demo-numbers -->)", re.DOTALL)
BUDGET = re.compile(r"Budget: Sel-CL\+ (\d+) warm-up \+ (\d+) pre-training \+ (\d+) fine-tuning epochs; "
                    r"CE baseline (\d+) epochs")
LABELS = {"demo_sym40": "40 % symmetric noise", "demo_asym40": "40 % asymmetric noise"}


NOT_RECORDED = ("No demo run is recorded for this version yet: run `make demo && python "
                "tools/readme_numbers.py --from demo` to record its report in `bench/results/demo/` "
                "and print its numbers here.")


def render(record: Path = RECORD, params_path: Path = ROOT / "params.yaml") -> str:
    """The README sentence for the recorded demo report (or says there is none)."""
    if not (record / "metrics").is_dir():
        return NOT_RECORDED
    params = load_params(params_path)
    report = (record / "README.md").read_text() if (record / "README.md").exists() else ""
    parts = []
    for name in params["suites"]["demo"]:
        m = json.loads((record / "metrics" / f"{name}.json").read_text())
        ran = BUDGET.search(report.split(f"### {name}\n", 1)[1]) if f"### {name}\n" in report else None
        if ran:        # the epochs the recorded run trained, as its report states them
            w, p, f, ce = (int(x) for x in ran.groups())
        else:          # a record without them: today's params
            cfg = resolve(params, name)
            w, f, ce = cfg["warmup"]["epochs"], cfg["finetune"]["epochs"], cfg["baseline"]["epochs"]
            p = cfg["pretrain"]["epochs"] - w             # pretrain.epochs counts the warm-up's
        parts.append(f"Sel-CL+ {m['selcl_plus']:.2f} % vs cross-entropy {m['ce']:.2f} % "
                     f"({LABELS.get(name, name)}; Sel-CL+ {w} + {p} + {f} epochs of warm-up, "
                     f"pre-training and fine-tuning, CE {ce} epochs)")
    return ("The demo run recorded in `bench/results/demo/` (its report: `bench/results/demo/README.md`) "
            "gives " + "; ".join(parts) + ".")


def rewrite(readme: Path, text: str) -> str:
    old = readme.read_text()
    if not BLOCK.search(old):
        raise SystemExit(f"{readme}: no <!-- demo-numbers --> block")
    return BLOCK.sub(lambda m: m.group(1) + text + m.group(3), old, count=1)


def record(src: Path, dest: Path = RECORD) -> None:
    """Copy a demo report folder's metrics, figures and README into the record. Only what a demo
    report holds is replaced: other files there (seeds/, the extra seeds' runs) stay. A source
    that is not a finished demo report leaves the record as it was."""
    missing = [p for p in ("metrics", "metrics.json", "README.md") if not (Path(src) / p).exists()]
    if missing:
        raise SystemExit(f"error: {src}: no demo report here (missing {', '.join(missing)}); run `make demo` first")
    shutil.rmtree(dest / "metrics", ignore_errors=True)
    shutil.rmtree(dest / "figures", ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / "metrics", dest / "metrics")
    shutil.copy2(src / "metrics.json", dest / "metrics.json")
    if (src / "figures").is_dir():     # the report's figures, so its links resolve in the record
        shutil.copytree(src / "figures", dest / "figures")
    shutil.copy2(src / "README.md", dest / "README.md")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", help="a demo report folder (e.g. demo/) to record first")
    ap.add_argument("--check", action="store_true", help="only check the README is in step")
    args = ap.parse_args()
    readme = ROOT / "README.md"
    if args.src:
        record(Path(args.src))
    new = rewrite(readme, render())
    if args.check:
        if new != readme.read_text():
            print("README.md: demo numbers differ from bench/results/demo/ "
                  "(python tools/readme_numbers.py)", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    print(f"README.md: {render()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
