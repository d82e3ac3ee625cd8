"""The scripts' docstrings are their --help (argparse, RawDescriptionHelpFormatter): a shell
continuation written as a single backslash at a line's end inside a non-raw docstring is a
Python line continuation, so --help shows the command glued onto one line, its "\\" gone."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def glued_lines(src: str) -> list[int]:
    """Source lines of the module docstring that end in one (Python-eaten) backslash."""
    tree = ast.parse(src)
    if not (tree.body and isinstance(tree.body[0], ast.Expr)
            and isinstance(tree.body[0].value, ast.Constant) and isinstance(tree.body[0].value.value, str)):
        return []
    node = tree.body[0].value
    seg = ast.get_source_segment(src, node)
    if re.match(r"[rR]", seg):                       # raw: the backslash stays
        return []
    return [node.lineno + i for i, line in enumerate(seg.split("\n")[:-1])
            if re.search(r"(?<!\\)(\\\\)*\\$", line)]


def test_the_check_finds_a_glued_continuation():
    src = '"""Run:\n\n    python x.py --a 1 \\\n        --b 2\n"""\n'
    assert glued_lines(src) == [3]
    assert glued_lines(src.replace("1 \\\n", "1 \\\\\n")) == []     # "\\": shown as one "\"
    assert glued_lines("r" + src) == []


def test_no_script_docstring_glues_its_command_lines():
    scripts = [p for d in ("bench", "tools", "stages") for p in sorted((ROOT / d).glob("*.py"))]
    assert len(scripts) > 10
    bad = {str(p.relative_to(ROOT)): lines for p in scripts if (lines := glued_lines(p.read_text()))}
    assert bad == {}
