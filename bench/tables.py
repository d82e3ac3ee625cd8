"""What the benchmark scripts share: print a result table and save it under bench/results/."""
from __future__ import annotations

from pathlib import Path


def emit(lines: list[str], out: str | None = None) -> str:
    """Join `lines`, print them and, if `out` is given, write them there (folders made)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
    return text


def stats_line(stats: dict) -> str:
    """`Selection.stats` as one line: floats to 4 significant digits."""
    return "selection stats: " + ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items())
