"""Every `dvc exp run` / `dvc repro` line of README.md and docs/*.md goes through DVC's own
parsing: its argparse (`dvc.cli.parser`), its grouping of `-S` values by params file
(`dvc.utils.cli_parse.to_path_overrides`) and its Hydra apply (`dvc.utils.hydra.apply_overrides`)
on a copy of params.yaml, then the project's own validation of every setting the line builds.

A line fails when DVC rejects it (a plain `key=value` for a key the setting does not write
needs `++`), when it names a setting that does not exist, or when it names settings but
builds others too: `-S '++settings.X.…'` without `-S 'run=[X]'` builds the whole `run` list
(the paper suite: 17 settings, about 23 GPU-hours). A line that names no setting (`dvc repro`,
`make paper`) builds the committed suite on purpose.

Written against the docs and params.yaml as they are, not against a list of commands: a
new line in any doc is checked the day it is written."""
from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DVC_CMD = re.compile(r"\bdvc\s+(exp\s+run|repro)\b")
NAME_ONLY = re.compile(r"dvc\s+(exp\s+run|repro)(\s+(-S|--set-param))?")   # prose naming the command
FOR = re.compile(r"\bfor\s+(\w+)\s+in\s+(.+?);\s*do\b")


COPY = re.compile(r"\bcp\s+([\w./-]+\.yaml)\s+params/(\w+)\.yaml\b")


def doc_settings(text: str) -> dict:
    """Settings a doc defines, in a ```yaml block under `settings:` or as a copy
    (`cp params/S.yaml params/new.yaml`, `cp selcl/defaults.yaml params/new.yaml`): its
    commands may run them."""
    out = {}
    for src, name in COPY.findall(text):
        if (ROOT / src).is_file():
            out[name] = yaml.safe_load((ROOT / src).read_text())
    for block in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL):
        data = yaml.safe_load(block)
        if isinstance(data, dict) and isinstance(data.get("settings"), dict):
            out.update(data["settings"])
    return out


def _blocks(text: str) -> list[list[str]]:
    """The shell code blocks of a markdown file (their lines), and each inline code span
    with a dvc command as a block of its own."""
    blocks, cur, inside = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if inside:
                blocks.append(cur)
            cur, inside = [], not inside
            continue
        if inside:
            cur.append(line)
        else:
            blocks += [[span] for span in re.findall(r"`([^`]*\bdvc\s+(?:exp\s+run|repro)\b[^`]*)`", line)
                       if not NAME_ONLY.fullmatch(span.strip())]
    return blocks


def _first_value(items: str, params: dict) -> str:
    """The first value a `for x in …` loop takes (a `$(…)` loop over the run list: its first)."""
    if items.strip().startswith("$("):
        return params["run"][0]
    return shlex.split(items)[0]


def doc_commands(params: dict) -> list[tuple[str, str, dict]]:
    """(where, command, the doc's own settings) for every dvc exp run / dvc repro line,
    continuations joined, loop variables replaced by the loop's first value."""
    out = []
    for doc in DOCS:
        own = doc_settings(doc.read_text())
        for block in _blocks(doc.read_text()):
            joined, buf = [], ""
            for line in block:
                if line.rstrip().endswith("\\"):
                    buf += line.rstrip()[:-1] + " "
                    continue
                joined.append(buf + line)
                buf = ""
            loops = {}
            for line in joined:
                for var, items in FOR.findall(line):
                    loops[var] = _first_value(items, params)
                if _runs_dvc(line):
                    cmd = line
                    for var, value in loops.items():
                        cmd = re.sub(rf"\$\{{?{var}\}}?", value, cmd)
                    out.append((f"{doc.relative_to(ROOT)}: {line.strip()}", cmd, own))
    return out


def _runs_dvc(line: str) -> bool:
    """The line runs `dvc exp run` or `dvc repro` (not only names it in a comment)."""
    if not DVC_CMD.search(line):
        return False
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return True                   # unbalanced quotes: let the check report it
    return any(t == "dvc" and tokens[i + 1:i + 3] in (["exp", "run"], ["repro"]) or
               t == "dvc" and tokens[i + 1:i + 2] == ["repro"] for i, t in enumerate(tokens))


def dvc_argv(cmd: str) -> list[str]:
    """The arguments after `dvc` (a `docker/run.sh`, `env VAR=…` or `VAR=…` prefix dropped,
    a trailing comment or `&& …` cut)."""
    tokens = shlex.split(cmd, comments=True)
    for stop in ("&&", ";", "|", "||"):
        if stop in tokens[tokens.index("dvc"):]:
            tokens = tokens[:tokens.index("dvc") + tokens[tokens.index("dvc"):].index(stop)]
    return tokens[tokens.index("dvc") + 1:]


def check(cmd: str, params_path: Path, tmp_path: Path, own: dict | None = None) -> str | None:
    """None when the command is sound; else why not. `own`: settings the doc defines
    (added to the copy of params.yaml first, as its reader would)."""
    from dvc.cli import DvcParserError
    from dvc.cli.parser import get_main_parser
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import apply_overrides

    from selcl.config import SETTINGS_DIR

    argv = dvc_argv(cmd)
    try:
        args = get_main_parser().parse_args(argv)
    except (SystemExit, DvcParserError):
        return f"DVC's argparse rejects {argv}"
    overrides = list(getattr(args, "set_param", None) or [])
    copy = tmp_path / "params.yaml"
    committed = yaml.safe_load(params_path.read_text())
    committed.setdefault("settings", {})
    if own:
        committed["settings"].update(own)
        copy.write_text(yaml.safe_dump(committed, sort_keys=False))
    else:
        shutil.copy(params_path, copy)
    folder = params_path.parent / SETTINGS_DIR            # params/<name>.yaml, copied beside it
    if folder.is_dir():
        shutil.copytree(folder, tmp_path / SETTINGS_DIR, dirs_exist_ok=True)
    files = {f"{SETTINGS_DIR}/{f.name}": f.stem for f in sorted(folder.glob("*.yaml"))}
    known = set(committed["settings"]) | set(files.values())
    named: set = set()
    # DVC groups `-S [file:]override` by file (params.yaml when none is given) and applies
    # each group with Hydra to that file, as `dvc exp run` does (a key the file does not
    # write needs `++`); a sweep (`k=a,b`) queues one experiment per combination.
    from dvc.utils.hydra import get_hydra_sweeps, to_hydra_overrides
    groups = to_path_overrides(overrides)
    for path in groups:
        if path != "params.yaml" and path not in files:
            return (f"-S for {path}: not a params file of this repository "
                    f"(params.yaml or one of {SETTINGS_DIR}/<setting>.yaml)")
    try:
        sweep = any(o.is_sweep_override() for v in groups.values() for o in to_hydra_overrides(v))
        if sweep and not getattr(args, "queue", False):
            return "DVC rejects a sweep override without --queue"
        combos = get_hydra_sweeps(groups) if sweep else [groups]
    except Exception as e:               # DVC's InvalidArgumentError, Hydra's parse errors
        return f"DVC rejects {groups}: {e}"
    pristine = {p: (tmp_path / p).read_bytes() for p in groups}
    for combo in combos:
        for path, data in pristine.items():
            (tmp_path / path).write_bytes(data)
        for path, values in combo.items():
            try:
                apply_overrides(tmp_path / path, values)
            except InvalidArgumentError as e:
                return f"DVC rejects {path}:{values}: {e} ({e.__cause__})"
            if path in files:
                named.add(files[path])
                continue
            for value in values:
                key = value.lstrip("+~").split("=", 1)[0]
                if key == "run":
                    named |= set(yaml.safe_load(value.split("=", 1)[1]) or [])
                elif key.startswith("settings."):
                    named.add(key.split(".")[1])
        problem = _validate(copy, named, known, args)
        if problem:
            return problem
    return None


def _validate(copy: Path, named: set, known: set, args) -> str | None:
    """The project's validation of the params after the overrides, and whether the line
    builds only the settings it names."""
    from selcl.config import SETTINGS_DIR, load_params, resolve, validate

    targets = [t for t in (getattr(args, "targets", None) or [])]
    for t in targets:                                  # a stage@setting target names its setting
        if "@" in t:
            named.add(t.split("@", 1)[1])
    unknown = sorted(n for n in named if n not in known)
    if unknown:
        return f"names settings that params.yaml and {SETTINGS_DIR}/ do not have: {unknown}"
    try:
        params = load_params(copy)
        validate(params)
        for name in params["run"]:
            resolve(params, name)
    except (KeyError, ValueError, TypeError) as e:
        return f"params after the overrides fail the project's validation: {e}"
    if named and not targets:
        extra = sorted(set(params["run"]) - named)
        if extra:
            return (f"names {sorted(named)} but builds {len(params['run'])} settings "
                    f"(add -S 'run=[{', '.join(sorted(named))}]'); also builds {extra[:4]}…")
    return None


def _params():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


COMMANDS = doc_commands(_params())


def test_the_docs_have_commands_to_check():
    assert len(COMMANDS) >= 10, COMMANDS


@pytest.mark.parametrize("where,cmd,own", COMMANDS, ids=[w[:90] for w, _, _ in COMMANDS])
def test_every_documented_dvc_command_parses_and_builds_only_what_it_names(where, cmd, own, tmp_path):
    problem = check(cmd, ROOT / "params.yaml", tmp_path, own)
    assert problem is None, f"{where}: {problem}"


@pytest.mark.parametrize("cmd,why", [
    ("dvc exp run -S params/cifar100_sym20.yaml:pretrain.mixup=false", "builds 17 settings"),
    ("dvc exp run -S settings.webvision50.warmup.method=sup_cl", "DVC rejects"),
    ("dvc exp run -S 'run=[no_such_setting]'", "do not have"),
    ("dvc exp run -S 'run=[demo_sym40]' -S '++params/demo_sym40.yaml:pretrain.alhpa=0.2'", "not a params file"),
    ("dvc exp run -S 'run=[demo_sym40]' -S 'params/demo_sym40.yaml:++pretrain.alhpa=0.2'", "validation"),
    ("dvc exp run -S 'run=[demo_sym40]' -S params/demo_sym40.yaml:pretrain.alhpa=0.2", "DVC rejects"),
    ("dvc exp run -S 'run=[demo_sym40]' -S params/demo_sym40.yaml:pretrain.alpha=1.5", "validation"),
    ("dvc exp run -S 'run=[demo_sym40]' -S params/demo_sym04.yaml:pretrain.alpha=0.2", "not a params file"),
    ("dvc exp run -S 'run=[demo_sym40]' -S dvc.yaml:vars=1", "not a params file"),
    ("dvc exp run -S 'run=[demo_sym40]' -S '++settings.demo_sym40.pretrain.alpha=0.2'", "given both"),
    ("dvc exp run -S 'run=[demo_sym40]' -S params/demo_sym40.yaml:pretrain.alpha=0,0.5", "without --queue"),
    ("dvc exp run --queue -S 'run=[demo_sym40]' -S params/demo_sym40.yaml:pretrain.alhpa=0,0.5", "DVC rejects"),
    ("dvc exp run --queue -S 'run=[demo_sym40]' -S params/demo_sym40.yaml:pretrain.alpha=0,1.5", "validation"),
    ("dvc exp run --no-such-flag", "argparse"),
])
def test_the_check_catches_the_known_mistakes(cmd, why, tmp_path):
    """The mistakes this test exists for: the Table 6 line without run=[…], a key the file
    does not write (without ++), an unknown setting, a misspelt key, a value out of range,
    an unknown params file, the old inline form for a committed setting, a flag DVC does
    not have."""
    problem = check(cmd, ROOT / "params.yaml", tmp_path)
    assert problem is not None and why in problem, problem


def test_sound_lines_pass_and_loops_are_expanded(tmp_path):
    assert check("dvc exp run -S 'run=[cifar100_sym20]' -S params/cifar100_sym20.yaml:pretrain.mixup=false",
                 ROOT / "params.yaml", tmp_path) is None
    (tmp_path / "two").mkdir()
    assert check("dvc exp run -S 'run=[demo_sym40]' -S params/demo_sym40.yaml:pretrain.alpha=0.25 -S params/demo_sym40.yaml:pretrain.k=50",
                 ROOT / "params.yaml", tmp_path / "two") is None
    assert check("docker/run.sh env SELCL_NPROC=4 dvc exp run -S 'run=[webvision50]'  # four",
                 ROOT / "params.yaml", tmp_path) is None
    assert check("SELCL_NPROC=2 dvc repro -f warmup@demo_sym40", ROOT / "params.yaml", tmp_path) is None
    assert check("dvc repro", ROOT / "params.yaml", tmp_path) is None
    text = "```bash\nfor a in 0.0 0.25; do\n  dvc exp run --queue -S 'run=[demo_sym40]' -S \"params/demo_sym40.yaml:pretrain.alpha=$a\"\ndone\n```\n"
    blocks = _blocks(text)
    assert blocks and any("$a" in line for line in blocks[0])
    demo = yaml.safe_dump({"settings": {"mine": yaml.safe_load((ROOT / "params/demo_sym40.yaml").read_text())}})
    own = doc_settings(f"```yaml\n{demo}```\n")
    assert check("dvc exp run -S 'run=[mine]'", ROOT / "params.yaml", tmp_path, own) is None
    assert check("dvc exp run -S 'run=[mine]'", ROOT / "params.yaml", tmp_path) is not None
