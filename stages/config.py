"""Stage `config@<setting>`: resolve the setting once and write each later stage's
dependency file, runs/<setting>/config/<stage>.json: exactly the params that stage
reads (selcl/stage_params.py), plus the digest of its input files (`data.path` and
`data.extra_test_path` for `data`, `noise.file` for `noise`). Also `params.json`, the whole resolved setting,
which the report reads.

It runs on every `dvc repro` (`always_changed`: input files are checked each time,
and it takes well under a second) and rewrites identical files when nothing changed,
so DVC reruns only the stages whose own file changed. Light on purpose: no torch.
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from selcl.atomic import atomic_write_text  # noqa: E402
from selcl.config import load_setting  # noqa: E402
from selcl.errors import ConfigError  # noqa: E402
from selcl.sources import CACHE, DigestCache, digest  # noqa: E402
from selcl.stage_params import STAGES, plain, stage_view  # noqa: E402

EXIT_BAD_INPUT = 2


def dump(obj) -> str:
    """Byte-stable JSON: equal content, equal file, equal DVC hash."""
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


def run(name: str) -> None:
    cfg = load_setting(name)
    files = {stage: plain(stage_view(cfg, stage)) for stage in STAGES}
    cache = DigestCache(CACHE)                 # stat-keyed sha256 cache (git/dvc-ignored)
    dc, nc = cfg["data"], cfg["noise"]
    if dc["dataset"] == "imagefolder":       # built-in datasets: their params say it all
        files["data"]["source_sha256"] = digest(dc["path"], cache)
        # the label-issues tables' `file` column lists the folder's names: renamed files rerun them
        for stage in ("label_issues", "cleanlab_baseline"):
            files[stage]["source_sha256"] = files["data"]["source_sha256"]
    if dc["extra_test_path"]:                # a second test set: its content, not its name
        files["data"]["extra_test_sha256"] = digest(dc["extra_test_path"], cache)
    if nc["kind"] == "file":
        files["noise"]["label_file_sha256"] = digest(nc["file"], cache)
    cache.save()
    files["params"] = {k: v for k, v in cfg.items()}
    out = Path("runs") / name / "config"
    for stage, content in files.items():
        atomic_write_text(out / f"{stage}.json", dump(content))


def main() -> None:
    if len(sys.argv) != 2:
        print(f"usage: python {sys.argv[0]} <setting name from params.yaml>", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    try:
        run(sys.argv[1])
    except ConfigError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
