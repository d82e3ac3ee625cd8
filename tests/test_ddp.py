"""Scale-out: torchrun DDP on the CPU (gloo, 2 processes), and one GPU per queue worker.

* The gathered L_sel + L_SIM (batch and memory terms): each rank's loss over its own
  anchors against the candidates of all ranks, gradients averaged as DDP does, equals
  the one-process gradient of the whole batch.
* The training stages under `SELCL_NPROC=2` (torchrun re-launch): warm-up,
  pre-training, fine-tuning and the CE baseline run, every rank computes the same
  selection (the loop checks it every epoch and fails otherwise), rank 0 writes the
  outputs.
* `claim_gpu`: concurrent processes (the stages of `dvc queue start -j N` workers) take
  different GPUs of a simulated multi-GPU machine, and wait when all are held.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import PYTHON, ROOT, STAGES, SETTING, copy_upstream, stage_env, tiny_params_dict, write_params

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")

GRAD_DRIVER = textwrap.dedent(r"""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    import torch.nn.functional as F
    from selcl import dist, losses
    dist.init(torch.device("cpu"))
    r, w = dist.rank(), dist.world_size()
    torch.manual_seed(0)                                    # the same global data on every rank
    B, M0, d, C = 4, 6, 5, 3                                # examples per rank, older memory, dims, classes
    n = B * w                                               # examples in the global batch
    ex = torch.randperm(20)[:n]                             # their dataset indices, rank r: ex[rB:(r+1)B]
    z = torch.randn(2 * n, d, dtype=torch.float64, requires_grad=True)       # rank blocks [v1 | v2]
    logits = torch.randn(2 * n, C, dtype=torch.float64, requires_grad=True)
    lam = torch.rand(2 * n, dtype=torch.float64) * 0.5 + 0.5
    u = torch.rand(n, dtype=torch.float64)
    prow = torch.cat([torch.cat([torch.randperm(B), torch.randperm(B) + B]) for _ in range(w)])  # local rows
    blk_ids = torch.cat([torch.cat([ex[i * B:(i + 1) * B]] * 2) for i in range(w)])              # rank blocks
    mem_ids = torch.cat([torch.randint(0, 20, (M0,)), blk_ids])       # older entries, then this batch
    mem = F.normalize(torch.randn(M0 + 2 * n, d, dtype=torch.float64), dim=1)
    mem_p = torch.softmax(torch.randn(M0 + 2 * n, C, dtype=torch.float64), 1)
    cur = torch.arange(M0 + 2 * n) >= M0
    in_G = lambda i, j: (i[:, None] % 3) == (j[None, :] % 3)

    def loss_of(za, pa, lam_, u_, ids, prows, own_batch, own_mem, gathered):
        g = (dist.gather_with_grad, dist.gather) if gathered else (lambda t: t, lambda t: t)
        batch = losses.Candidates(g[0](za), g[0](pa), g[1](ids), torch.ones(len(g[1](ids)), dtype=torch.bool),
                                  own_batch)
        memory = losses.Candidates(mem, mem_p, mem_ids, cur, own_mem)
        out = losses.selective_losses(za, pa, u_, lam_, ids, prows, in_G, batch, memory, 0.1)
        return out["l_sel"] + 0.01 * out["l_sim"]

    rows = torch.arange(r * 2 * B, (r + 1) * 2 * B)          # this process: its own 2B anchors
    own = dist.offset(2 * B) + torch.arange(2 * B)
    loss_of(F.normalize(z[rows], dim=1), logits[rows].softmax(1), lam[rows], u[r * B:(r + 1) * B],
            blk_ids[rows], prow[rows], own, M0 + own, True).backward()
    gz, gl = z.grad.clone(), logits.grad.clone()
    torch.distributed.all_reduce(gz); torch.distributed.all_reduce(gl)     # DDP: average over ranks
    gz, gl = gz / w, gl / w
    # one process, the whole batch: rows [all view-1 anchors, all view-2 anchors]
    z.grad = None; logits.grad = None
    glob = torch.cat([torch.cat([i * 2 * B + torch.arange(B) for i in range(w)]),
                      torch.cat([i * 2 * B + B + torch.arange(B) for i in range(w)])])
    pos = torch.empty(2 * n, dtype=torch.long); pos[glob] = torch.arange(2 * n)   # block row -> global row
    prow_g = pos[(glob // (2 * B)) * 2 * B + prow[glob]]
    loss_of(F.normalize(z[glob], dim=1), logits[glob].softmax(1), lam[glob], u, blk_ids[glob], prow_g,
            torch.arange(2 * n), M0 + glob, False).backward()
    err = max((gz - z.grad).abs().max().item(), (gl - logits.grad).abs().max().item())
    scale = z.grad.abs().max().item()
    try:
        dist.check_same("a tensor that differs by rank", torch.tensor([r]))
        caught = False
    except RuntimeError:
        caught = True
    if r == 0:
        print(json.dumps({"err": err, "scale": scale, "check_same_caught": caught}))
    dist.shutdown()
""")


def torchrun(args: list[str], cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    return subprocess.run(cmd, cwd=cwd, env=env or stage_env(), capture_output=True, text=True, timeout=timeout)


def test_gathered_loss_gradient_equals_one_process(tmp_path):
    driver = tmp_path / "grad_driver.py"
    driver.write_text(GRAD_DRIVER)
    proc = torchrun([str(driver), str(ROOT)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    assert out["scale"] > 1e-3                        # a real gradient ...
    assert out["err"] < 1e-10 * max(1.0, out["scale"]), out   # ... equal to the one-process one
    assert out["check_same_caught"]                   # the per-epoch agreement guard can fail


def test_training_stages_under_torchrun(tmp_path, tiny_upstream):
    """SELCL_NPROC=2: each training stage re-launches itself under torchrun (gloo)."""
    write_params(tmp_path, tiny_params_dict(pretrain={"epochs": 4}))   # warm-up 1 + pre-training 3
    copy_upstream(tiny_upstream, tmp_path)
    (tmp_path / "runs" / SETTING / "warmup.pt").unlink()
    # keep the resume state after each stage, to check what a DDP checkpoint holds
    env = stage_env(SELCL_NPROC="2", SELCL_ALLOW_CPU="1", SELCL_KEEP_CHECKPOINTS="1")
    for stage in ("warmup", "pretrain", "finetune", "baseline"):
        proc = subprocess.run([PYTHON, str(STAGES / f"{stage}.py"), SETTING], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{stage}: {proc.stderr[-3000:]}"
    run = tmp_path / "runs" / SETTING
    for name in ("warmup.pt", "pretrain.pt", "finetune.pt", "pretrain.json", "finetune.json", "baseline.json"):
        assert (run / name).exists(), name
    hist = (run / "pretrain_history.csv").read_text().splitlines()
    assert len(hist) == 1 + 3                         # header + one row per epoch, written once
    ckpt = torch.load(tmp_path / "scratch" / SETTING / "pretrain" / "checkpoint.pt", weights_only=False)
    assert len(ckpt["rng"]["ranks"]) == 2             # both ranks' RNG states: exact resume


def test_pretraining_without_l_cls_under_torchrun(tmp_path, tiny_upstream):
    """λ_cls = 0 leaves the classifier without a gradient in the main backward (L_SIM's is
    added by hand): DDP must be told, or its reducer waits. First, a one-process warm-up
    output read by 2 processes is one clear error naming the file (its random state has
    one entry, not one per rank)."""
    write_params(tmp_path, tiny_params_dict(pretrain={"epochs": 3, "lambda_cls": 0.0}))
    copy_upstream(tiny_upstream, tmp_path)
    env = stage_env(SELCL_NPROC="2", SELCL_ALLOW_CPU="1")
    run = lambda stage: subprocess.run([PYTHON, str(STAGES / f"{stage}.py"), SETTING], cwd=tmp_path,  # noqa: E731
                                       env=env, capture_output=True, text=True, timeout=600)
    proc = run("pretrain")
    assert proc.returncode == 2 and f"runs/{SETTING}/warmup.pt" in proc.stderr, proc.stderr[-3000:]
    assert "written by 1 process(es), read by 2" in proc.stderr
    (tmp_path / "runs" / SETTING / "warmup.pt").unlink()
    for stage in ("warmup", "pretrain"):
        proc = run(stage)
        assert proc.returncode == 0, f"{stage}: {proc.stderr[-3000:]}"
    assert len((tmp_path / "runs" / SETTING / "pretrain_history.csv").read_text().splitlines()) == 1 + 2


def test_batch_not_divisible_by_processes_is_one_clear_error(tmp_path, tiny_upstream):
    write_params(tmp_path, tiny_params_dict(pretrain={"batch_size": 33}))   # the warm-up's loader too
    copy_upstream(tiny_upstream, tmp_path)
    proc = subprocess.run([PYTHON, str(STAGES / "warmup.py"), SETTING], cwd=tmp_path,
                          env=stage_env(SELCL_NPROC="2"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: settings.tiny.pretrain.batch_size = 33: not divisible by the 2 torchrun processes (SELCL_NPROC)"]


CLAIM = textwrap.dedent(r"""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from selcl.device import claim_gpu
    print(claim_gpu(int(sys.argv[2]), sys.argv[3], poll_s=0.2), flush=True)
    try:
        time.sleep(float(sys.argv[4]))           # hold for N seconds ...
    except ValueError:                           # ... or until the file named appears
        from pathlib import Path
        while not Path(sys.argv[4]).exists():
            time.sleep(0.05)
""")


def test_queue_workers_take_different_gpus(tmp_path):
    """Three concurrent stage processes on a simulated 2-GPU machine: the first two hold
    GPUs 0 and 1, the third waits until one of them exits and takes its GPU."""
    script = tmp_path / "claim.py"
    script.write_text(CLAIM)
    locks = tmp_path / "locks"
    start = lambda hold: subprocess.Popen([PYTHON, str(script), str(ROOT), "2", str(locks), str(hold)],  # noqa: E731
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    release = tmp_path / "release-a"                  # `a` holds its GPU until this exists:
    a = start(str(release))                           # no race with slow starts under load
    first = a.stdout.readline().strip()
    b = start(300.0)
    second = b.stdout.readline().strip()
    assert {first, second} == {"0", "1"}
    c = start(0.0)
    assert "waiting" in c.stderr.readline()           # both GPUs held: c waits ...
    release.touch()
    third = c.stdout.readline().strip()               # ... and takes the GPU that `a` released
    assert third == first
    b.kill()
    for p in (a, b, c):
        p.wait(timeout=60)


def test_get_device_claims_a_gpu_when_several_are_visible(monkeypatch, tmp_path):
    from selcl import device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("SELCL_DEVICE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("SELCL_GPU_LOCK_DIR", str(tmp_path))
    monkeypatch.setattr(device, "_CLAIMED", {})
    held = open(tmp_path / "gpu0.lock", "a+")          # another worker holds GPU 0
    import fcntl
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        # flock locks belong to the open file description: a second open() in this
        # process conflicts with `held` exactly as another process would.
        assert device.get_device() == torch.device("cuda", 1)
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_RANK", "3")
        assert device.get_device() == torch.device("cuda", 3)   # torchrun: the rank's GPU
    finally:
        held.close()


def test_selcl_device_under_torchrun(monkeypatch):
    """Under torchrun SELCL_DEVICE=cuda means each rank's own GPU (LOCAL_RANK); an explicit
    index would put every rank on one GPU, so it is one clear error naming the variable.
    Without CUDA, asking for it is one clear error too."""
    from selcl import device
    from selcl.errors import ConfigError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("SELCL_DEVICE", "cuda")
    assert device.get_device() == torch.device("cuda", 1)
    monkeypatch.setenv("SELCL_DEVICE", "cuda:0")
    with pytest.raises(ConfigError, match="SELCL_DEVICE=cuda:0 under torchrun"):
        device.get_device()
    monkeypatch.setenv("SELCL_DEVICE", "cpu")
    assert device.get_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SELCL_DEVICE", "cuda")
    with pytest.raises(ConfigError, match="SELCL_DEVICE=cuda: CUDA is not available"):
        device.get_device()
