"""Faults: CUDA out of memory, a full disk while writing a checkpoint, checkpoints of
other runs, and crashes between writing a file and renaming it into place."""
from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path

import pytest
import torch
from conftest import SETTING, copy_upstream, load_stage, run_stage_inprocess

from selcl import checkpoint
from selcl.checkpoint import Checkpointer, atomic_path, atomic_write_bytes, fingerprint

RUN = Path("runs") / SETTING


def small_state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g)},
            "history": [{"epoch": seed, "loss": 0.5}], "epoch": seed}


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a["epoch"] == b["epoch"] and a["history"] == b["history"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def leftovers(folder: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in Path(folder).iterdir() if p.name not in keep)


def _oom(*args, **kwargs):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB (GPU 0; "
                                      "79.11 GiB total capacity; 77.80 GiB already allocated)")


def exit_of(monkeypatch, tmp_path, stage: str, capsys) -> tuple[int, str]:
    """Run `stage` in-process, expecting it to exit: (exit code, what it printed on stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_stage_inprocess(monkeypatch, tmp_path, stage)
    return exit_info.value.code, capsys.readouterr().err


# ----------------------------------------------------------------------------- (a) CUDA OOM
@pytest.mark.parametrize("stage", ["warmup", "pretrain", "finetune", "baseline"])
def test_cuda_oom_names_the_batch_size(stage, tiny_upstream, tiny_params, tmp_path, monkeypatch, capsys):
    """OOM from the training call: exit 3, one line naming <stage>.batch_size in params/<s>.yaml."""
    copy_upstream(tiny_upstream, tmp_path)
    checkpoint.save({"model": {}, "examples": torch.ones(4, dtype=torch.bool)}, tmp_path / RUN / "pretrain.pt")       # finetune's input
    monkeypatch.setattr(load_stage(stage), stage, _oom)                  # e.g. stages/pretrain.py: pretrain()
    code, err = exit_of(monkeypatch, tmp_path, stage, capsys)
    assert code == 3
    assert err.splitlines() == [err.strip()], err
    assert err.startswith("error: CUDA out of memory")
    section = "pretrain" if stage == "warmup" else stage      # the warm-up runs on pre-training's loader
    assert f"`{section}.batch_size` in params/{SETTING}.yaml" in err
    assert "Traceback" not in err


def test_a_diverged_pretraining_is_one_line(tiny_upstream, tiny_params, tmp_path, monkeypatch, capsys):
    """Non-finite embeddings at the selection (selcl.train.run_selection): exit 2 and the one
    line of the DivergedError, no traceback."""
    from selcl.errors import DivergedError
    copy_upstream(tiny_upstream, tmp_path)

    def diverged(*args, **kwargs):
        raise DivergedError("pre-training diverged by epoch 3: 2 of 64 feature rows are not finite")
    monkeypatch.setattr(load_stage("pretrain"), "pretrain", diverged)
    code, err = exit_of(monkeypatch, tmp_path, "pretrain", capsys)
    assert code == 2
    assert err.splitlines() == ["error: pre-training diverged by epoch 3: 2 of 64 feature rows are not finite"], err


def test_cuda_oom_in_evaluate_gives_no_wrong_advice(tiny_upstream, tiny_params, tmp_path, monkeypatch, capsys):
    """evaluate has no batch size of its own: lowering pre-training's would rerun
    pre-training and change nothing, so the line must not suggest it."""
    copy_upstream(tiny_upstream, tmp_path)
    checkpoint.save({"model": {}, "examples": torch.ones(4, dtype=torch.bool)}, tmp_path / RUN / "pretrain.pt")
    monkeypatch.setattr(load_stage("evaluate"), "knn_report", _oom)
    code, err = exit_of(monkeypatch, tmp_path, "evaluate", capsys)
    assert code == 3
    assert err.splitlines() == ["error: CUDA out of memory in stage evaluate: free GPU memory "
                                "(other processes on the GPU) and rerun"], err


def test_cuda_oom_mid_training_keeps_the_last_checkpoint(tiny_upstream, tiny_params, tmp_path, monkeypatch,
                                                          capsys):
    """OOM inside the real pre-training loop (its second epoch, global epoch 3): exit 3 with
    the one error line (progress bars aside), and the checkpoint of its first epoch (global
    epoch 2, after the warm-up's 1) stays loadable for the rerun."""
    import selcl.train
    copy_upstream(tiny_upstream, tmp_path)
    step, calls = selcl.train.Pretrainer.step, []

    def step_then_oom(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 8:                                              # epoch 2, step 2
            _oom()
        return step(self, *args, **kwargs)
    monkeypatch.setattr(selcl.train.Pretrainer, "step", step_then_oom)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(SystemExit) as exit_info:
            run_stage_inprocess(monkeypatch, tmp_path, "pretrain")
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert exit_info.value.code == 3
    errors = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("error:")]
    assert errors == [f"error: CUDA out of memory in stage pretrain: lower `pretrain.batch_size` in "
                      f"params/{SETTING}.yaml (or free the GPU)"], err
    assert "Traceback" not in err
    assert checkpoint.load(tmp_path / "scratch" / SETTING / "pretrain" / "checkpoint.pt")["epoch"] == 2
    assert not (tmp_path / RUN / "pretrain.pt").exists()


# ----------------------------------------------------------------------------- (b) full disk
def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _partial_write_then_enospc(self, data):
    """The disk fills up halfway through the file."""
    with open(self, "wb") as fh:
        fh.write(data[: len(data) // 2])
    _enospc()


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_full_disk_keeps_the_previous_checkpoint(where, tmp_path, monkeypatch):
    path = tmp_path / "ckpt" / "pretrain.pt"
    checkpoint.save(small_state(1), path)
    before = path.read_bytes()
    if where == "write":
        monkeypatch.setattr(Path, "write_bytes", _partial_write_then_enospc)
    else:
        monkeypatch.setattr(os, where, _enospc)
    with pytest.raises(OSError) as exc_info:
        checkpoint.save(small_state(2), path)
    monkeypatch.undo()
    assert exc_info.value.errno == errno.ENOSPC
    assert exc_info.value.filename == str(path), "the error must say which output failed"
    assert path.read_bytes() == before
    assert_same_state(checkpoint.load(path), small_state(1))
    assert leftovers(path.parent, {"pretrain.pt"}) == [], "temp file left behind"


def test_full_disk_through_checkpointer_then_recovers(tmp_path, monkeypatch):
    """Checkpointer.maybe_save on a full disk: the run stops, the last checkpoint
    resumes; once there is space again the next save succeeds and leaves no temp file."""
    path = tmp_path / "pretrain.pt"
    ck = Checkpointer(path, "fp-A", every=1)
    ck.maybe_save(1, 4, lambda: small_state(1))
    with monkeypatch.context() as m:
        m.setattr(Path, "write_bytes", _partial_write_then_enospc)
        with pytest.raises(OSError):
            ck.maybe_save(2, 4, lambda: small_state(2))
    state = Checkpointer(path, "fp-A", every=1).load()
    assert state["epoch"] == 1 and state["fingerprint"] == "fp-A"
    ck.maybe_save(2, 4, lambda: small_state(2))
    assert Checkpointer(path, "fp-A", every=1).load()["epoch"] == 2
    assert leftovers(tmp_path, {"pretrain.pt"}) == []


def test_unserialisable_state_touches_nothing(tmp_path):
    """torch.save fails before any file is opened: old checkpoint intact, no temp file."""
    path = tmp_path / "pretrain.pt"
    checkpoint.save(small_state(1), path)
    before = path.read_bytes()
    with pytest.raises(Exception):
        checkpoint.save({"bad": lambda: None}, path)
    assert path.read_bytes() == before and leftovers(tmp_path, {"pretrain.pt"}) == []


# ----------------------------------------------------------------------------- (c) fingerprints
def test_checkpointer_resumes_only_its_own_fingerprint(tmp_path, capsys):
    path = tmp_path / "ckpt" / "warmup.pt"
    assert Checkpointer(path, "fp-A", every=1).load() is None             # nothing yet
    Checkpointer(path, "fp-A", every=1).maybe_save(3, 10, lambda: small_state(3))
    before = path.read_bytes()

    state = Checkpointer(path, "fp-A", every=1).load()
    assert state["fingerprint"] == "fp-A" and state["epoch"] == 3
    assert_same_state({k: v for k, v in state.items() if k != "fingerprint"}, small_state(3))

    capsys.readouterr()
    assert Checkpointer(path, "fp-B", every=1).load() is None             # other params: fresh start
    assert "starting fresh" in capsys.readouterr().out
    assert path.read_bytes() == before, "a foreign checkpoint is ignored, not deleted"

    Checkpointer(path, "fp-B", every=1).maybe_save(1, 10, lambda: small_state(1))
    assert Checkpointer(path, "fp-A", every=1).load() is None
    assert Checkpointer(path, "fp-B", every=1).load()["epoch"] == 1


def test_checkpointer_cadence(tmp_path):
    """Saved every `every` epochs and at the last epoch, nowhere else."""
    path = tmp_path / "c.pt"
    ck, saved = Checkpointer(path, "fp", every=3), []
    for epoch in range(1, 8):
        ck.maybe_save(epoch, 7, lambda: small_state(epoch))
        if path.exists() and checkpoint.load(path)["epoch"] == epoch:
            saved.append(epoch)
    assert saved == [3, 6, 7]


def test_fingerprint_is_stable_and_sensitive(tmp_path):
    cfg = {"alpha": 0.5, "beta": 0.25, "lr_decay_epochs": [125, 200]}
    same = {"lr_decay_epochs": [125, 200], "beta": 0.25, "alpha": 0.5}          # other key order
    assert fingerprint("pretrain", cfg, "abc") == fingerprint("pretrain", same, "abc")
    assert fingerprint("pretrain", cfg, "abc") != fingerprint("pretrain", dict(cfg, alpha=0.25), "abc")
    assert fingerprint("pretrain", cfg, "abc") != fingerprint("pretrain", cfg, "abd")   # other input file
    assert fingerprint("pretrain", cfg) != fingerprint("finetune", cfg)
    f = tmp_path / "warmup.pt"
    f.write_bytes(b"one")
    d1 = checkpoint.file_digest(f)
    f.write_bytes(b"two")
    assert checkpoint.file_digest(f) != d1


# ----------------------------------------------------------------------------- (d) atomic writes
CRASH_POINTS = {
    # where the process dies → what the destination must hold afterwards
    "mid_write": "old",         # half the new bytes written to the temp file
    "before_rename": "old",     # temp file complete and fsync'ed, rename never happens
    "after_rename": "new",      # renamed, the process dies before its cleanup
}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("point", list(CRASH_POINTS))
def test_crash_leaves_old_or_new_content(point, tmp_path):
    """A forked writer dies with os._exit (no finally, no atexit: like kill -9) at
    `point`; the destination holds exactly the old or the new content, a leftover temp
    file is hidden, and the next successful write removes it."""
    path = tmp_path / "pretrain.pt"
    old, new = b"old" * 10_000, b"NEW" * 20_000
    atomic_write_bytes(path, old)
    pid = os.fork()
    if pid == 0:                                            # the writer that crashes
        try:
            if point == "mid_write":
                def write_bytes(self, data):
                    with open(self, "wb") as fh:
                        fh.write(data[: len(data) // 2])
                        fh.flush()
                    os._exit(9)
                Path.write_bytes = write_bytes
            elif point == "before_rename":
                os.replace = lambda src, dst: os._exit(9)
            else:
                real = os.replace
                os.replace = lambda src, dst: (real(src, dst), os._exit(9))
            atomic_write_bytes(path, new)
        finally:
            os._exit(1)                                     # never reached when the crash works
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 9
    assert path.read_bytes() == {"old": old, "new": new}[CRASH_POINTS[point]]
    others = leftovers(tmp_path, {"pretrain.pt"})
    assert all(n.startswith(".pretrain.pt.") and n.endswith(".tmp") for n in others), others
    if point == "before_rename":
        assert len(others) == 1 and (tmp_path / others[0]).read_bytes() == new
    atomic_write_bytes(path, b"next")
    assert path.read_bytes() == b"next"
    assert leftovers(tmp_path, {"pretrain.pt"}) == [], "orphaned temp file not cleaned up"


def test_exception_inside_atomic_path_keeps_old_content(tmp_path):
    path = tmp_path / "labels.npz"
    path.write_bytes(b"previous labels")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"half")
            raise KeyboardInterrupt                          # Ctrl-C while writing
    assert path.read_bytes() == b"previous labels"
    assert leftovers(tmp_path, {"labels.npz"}) == []


def test_cleanup_only_touches_temp_files_of_the_same_output(tmp_path):
    foreign = [".pretrain.pt.bak.abcd1234.tmp", ".warmup.pt.abcd1234.tmp", "pretrain.pt.abcd1234.tmp",
               ".pretrain.pt.keepme"]
    for name in foreign:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / ".pretrain.pt.zz_9y8x7.tmp").write_bytes(b"orphan")
    atomic_write_bytes(tmp_path / "pretrain.pt", b"data")
    assert leftovers(tmp_path, {"pretrain.pt"}) == sorted(foreign)


def test_outputs_get_the_usual_file_mode(tmp_path):
    """mkstemp creates 0600 files; outputs must be readable like any file the user makes
    (DVC cache, shared result folders, the container writing as another UID)."""
    mask = os.umask(0o022)
    try:
        checkpoint.write_json(tmp_path / "m.json", {"a": 1})
        checkpoint.save({"x": torch.zeros(1)}, tmp_path / "m.pt")
    finally:
        os.umask(mask)
    for name in ("m.json", "m.pt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def test_equal_content_saves_to_equal_bytes(tmp_path):
    """A resumed run's state mixes rows loaded from a checkpoint (fresh string objects)
    with rows built by the code (interned literals); its file must still be byte-
    identical to an uninterrupted run's (DVC hashes, `file_digest` fingerprints)."""
    def row(epoch):
        return {"epoch": epoch, "loss": 1.0 / epoch, "lr": 0.1}
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    fresh = {"model": model.state_dict(), "history": [row(1), row(2), row(3)], "epoch": 3}
    checkpoint.save({"history": [row(1), row(2)]}, tmp_path / "ckpt.pt")
    loaded = checkpoint.load(tmp_path / "ckpt.pt")["history"]            # as after a kill -9
    resumed = {"model": model.state_dict(), "history": loaded + [row(3)], "epoch": 3}
    buf_fresh, buf_resumed = io.BytesIO(), io.BytesIO()
    torch.save(fresh, buf_fresh)
    torch.save(resumed, buf_resumed)
    assert buf_fresh.getvalue() != buf_resumed.getvalue()     # plain torch.save: pickle memo differs
    checkpoint.save(fresh, tmp_path / "a.pt")
    checkpoint.save(resumed, tmp_path / "b.pt")
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()
    # ... and the canonical copy is still a loadable state_dict (BatchNorm `_metadata` kept).
    back = checkpoint.load(tmp_path / "a.pt")
    assert back["model"]._metadata == fresh["model"]._metadata
    model.load_state_dict(back["model"], strict=True)
    assert back["history"] == fresh["history"]


def test_canonical_copy_keeps_sharing_and_leaves_tensors_alone():
    shared, t = [1, "a"], torch.arange(3)
    out = checkpoint._canonical({"x": shared, "y": shared, "t": t, "tup": ("a", shared)}, {}, {})
    assert out["x"] is out["y"] is out["tup"][1] and out["x"] == shared
    assert out["t"] is t
