"""Stage `report`: reports/README.md, figures and metrics for every setting in `run`.

Each setting's params come from runs/<setting>/config/params.json (written by its
`config` stage), so the report depends on `run` and on runs/ only. No torch here."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from selcl.config import load_params, validate  # noqa: E402
from selcl.errors import ConfigError  # noqa: E402
from selcl.report import build_report, load_tables  # noqa: E402

EXIT_BAD_INPUT = 2


def main() -> None:
    try:
        params = load_params()
        validate(params)             # the whole file: `run` names settings that exist, …
        run = params["run"]
        configs = {}
        for name in run:
            path = Path("runs") / name / "config" / "params.json"
            if not path.exists():
                raise ConfigError(f"{path}: not found (run `dvc repro`, which writes it in stage config@{name})")
            configs[name] = json.loads(path.read_text())
    except ConfigError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    tables = load_tables(Path("references/paper_tables.yaml"))
    build_report(run, configs, Path("runs"), tables, Path("reports"))
    print(f"[report] wrote {Path('reports/README.md').resolve()}")


if __name__ == "__main__":
    main()
