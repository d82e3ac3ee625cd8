"""Stage `report`: reports/README.md, figures and metrics for every setting in `run`."""
import sys
from pathlib import Path

from common import EXIT_BAD_INPUT

from selcl.config import ConfigError, load_params, resolve, validate
from selcl.report import build_report, load_tables


def main() -> None:
    try:
        params = load_params()
        validate(params)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    configs = {name: resolve(params, name) for name in params["run"]}
    tables = load_tables(Path("references/paper_tables.yaml"))
    build_report(params["run"], configs, Path("runs"), tables, Path("reports"))
    print(f"[report] wrote {Path('reports/README.md').resolve()}")


if __name__ == "__main__":
    main()
