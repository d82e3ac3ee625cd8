"""tools/demo.py: a setting whose queued experiment failed is queued once more, alone,
with the thread count of the first try (DVC's parallel-worker race, treeverse/dvc#10673)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))


def _fake(monkeypatch, results):
    import demo
    calls = []

    def fake(settings, name, extra, root, env):
        calls.append((list(settings), env["OMP_NUM_THREADS"]))
        return results[len(calls) - 1]
    monkeypatch.setattr(demo, "_queue_and_wait", fake)
    monkeypatch.setattr(demo.os, "cpu_count", lambda: 2)
    return demo, calls


def test_a_failed_setting_is_retried_alone_with_the_same_threads(monkeypatch):
    demo, calls = _fake(monkeypatch, [["demo-b"], []])
    assert demo.train_side_by_side(["a", "b"], "demo", [], ROOT) is True
    assert calls == [(["a", "b"], "1"), (["b"], "1")]


def test_a_second_failure_is_an_error(monkeypatch, capsys):
    demo, calls = _fake(monkeypatch, [["demo-a"], ["demo-a"]])
    assert demo.train_side_by_side(["a", "b"], "demo", [], ROOT) is False
    assert len(calls) == 2 and "dvc queue logs" in capsys.readouterr().err


def test_all_succeeding_runs_once(monkeypatch):
    demo, calls = _fake(monkeypatch, [[]])
    assert demo.train_side_by_side(["a", "b"], "demo", [], ROOT) is True and len(calls) == 1
