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


def test_per_setting_stages_track_their_own_sections():
    stages = load_dvc()["stages"]
    expected = {"noise": {"noise"}, "warmup": {"model", "warmup"},
                "finetune": {"finetune"}, "baseline": {"model", "baseline"}}
    for name, sections in expected.items():
        params = stages[name]["do"]["params"]
        own = {p.split(".")[2] for p in params if isinstance(p, str) and p.startswith("settings.")}
        assert sections <= own, f"{name} must track settings.<name>.{sections}"
    # pre-training never depends on fine-tuning params
    pre = stages["pretrain"]["do"]["params"]
    assert not any("finetune" in p for p in pre)
