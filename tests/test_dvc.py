"""dvc.yaml stays honest: each stage's code deps are exactly its script's import closure,
and each stage tracks exactly its own params sections."""
from __future__ import annotations

import ast
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def import_closure(script: Path) -> set[str]:
    """Project files (relative paths) that `script` imports, transitively."""
    seen: set[str] = set()
    todo = [script]
    while todo:
        path = todo.pop()
        rel = str(path.relative_to(ROOT))
        if rel in seen:
            continue
        seen.add(rel)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative import inside selcl
                    base = path.parent
                    for _ in range(node.level - 1):
                        base = base.parent
                    pkg = ".".join(base.relative_to(ROOT).parts)
                    mod = f"{pkg}.{node.module}" if node.module else pkg
                    names = [mod] + [f"{mod}.{a.name}" for a in node.names]
                else:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                for cand in (ROOT / Path(*name.split(".")).with_suffix(".py"),
                             script.parent / f"{name}.py"):
                    if cand.exists() and cand.is_file():
                        todo.append(cand)
    return seen


def stage_code_deps(stage: dict) -> set[str]:
    deps = stage["do"]["deps"] if "do" in stage else stage["deps"]
    return {d for d in deps if isinstance(d, str) and d.endswith(".py")}


def load_dvc():
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())


def test_code_deps_are_the_import_closure():
    stages = load_dvc()["stages"]
    assert stages, "dvc.yaml has no stages"
    for name, stage in stages.items():
        cmd = stage["do"]["cmd"] if "do" in stage else stage["cmd"]
        script = ROOT / cmd.split()[1]
        closure = import_closure(script)
        closure.discard("selcl/__init__.py")
        assert stage_code_deps(stage) == closure, (
            f"stage {name}: deps differ from the import closure of {script.name}: "
            f"missing {sorted(closure - stage_code_deps(stage))}, "
            f"extra {sorted(stage_code_deps(stage) - closure)}")


def test_per_setting_stages_depend_on_exactly_their_params():
    """Each per-setting stage declares runs/<setting>/config/<stage>.json (written by
    config@<setting> from selcl/stage_params.READS) as its DVC params file, and no other
    params: a stage reruns only when a key it reads changes, and `dvc exp diff` shows the
    values. params/<setting>.yaml itself is no DVC params file (the config stage, which runs
    on every repro, reads it), so `dvc exp show` lists no setting that an experiment did not run."""
    from selcl.stage_params import READS
    dvc = load_dvc()
    stages = dvc["stages"]
    assert "params" not in dvc and "params" not in stages["config"]["do"]
    for name in READS:
        do = stages[name]["do"]
        assert do["params"] == [{f"runs/${{item}}/config/{name}.json": None}], name
        assert not any("config/" in d for d in do["deps"]), name
    # the examples: t-SNE size and fine-tuning never rerun pre-training
    assert READS["pretrain"]["evaluate"] == ["k", "sigma"]
    assert "finetune" not in READS["pretrain"] and "evaluate" not in READS["finetune"]


def test_stage_view_rejects_undeclared_keys():
    """A stage that reads a key it does not declare fails at once (dvc.yaml stays honest)."""
    import pytest
    from selcl.stage_params import stage_view
    cfg = {"name": "s", "model": {"arch": "small"}, "data": {"dataset": "digits"},
           "evaluate": {"k": 1, "sigma": 0.1, "tsne_points": 5}}
    view = stage_view(cfg, "data")
    assert view["data"]["dataset"] == "digits" and view["model"]["arch"] == "small"
    with pytest.raises(KeyError, match="stage_params.py"):
        view["evaluate"]
    with pytest.raises(KeyError, match=r"model\.width"):
        view["model"]["width"]


def test_outputs_allow_the_run_cache():
    """No `persist` output (it turns the run-cache off), and every output of a training
    stage is cached or a metric/plot (DVC saves no run-cache entry for a stage with a
    plain `cache: false` output)."""
    stages = load_dvc()["stages"]
    for name, stage in stages.items():
        do = stage.get("do", stage)
        for out in do.get("outs", []):
            props = next(iter(out.values())) if isinstance(out, dict) else {}
            assert not props.get("persist"), f"{name}: persist output {out}"
            if name not in ("config", "report"):        # always_changed / cheap, never cached
                assert props.get("cache", True), f"{name}: plain cache: false output {out}"
