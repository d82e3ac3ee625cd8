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


def test_other_queued_experiments_stop_the_demo_before_it_queues(monkeypatch, capsys):
    """`dvc queue start` runs every queued task: with someone's crossover study queued, the
    demo would wait hours for it, so it stops first and says what is queued."""
    import subprocess
    import demo
    calls = []

    def fake_dvc(*args, cwd, env=None, quiet=False):
        calls.append(args)
        out = "Task     Name                    Created    Status\n1a2b3c4  cpu_cifar10_asym40-x0.5  10:00 AM   Queued\n" \
            if args[:2] == ("queue", "status") else ""
        return subprocess.CompletedProcess(["dvc", *args], 0, stdout=out, stderr="")
    monkeypatch.setattr(demo, "dvc", fake_dvc)
    assert demo._queue_and_wait(["a"], "demo", [], ROOT, {"OMP_NUM_THREADS": "1"}) is None
    assert not any(c[:2] in (("exp", "run"), ("queue", "start")) for c in calls)
    assert "cpu_cifar10_asym40-x0.5" in capsys.readouterr().err
