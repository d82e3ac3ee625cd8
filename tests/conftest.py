"""Shared fixtures of the reliability tests (bad inputs, resume after kill -9, faults).

A *tiny* digits setting (20 images per class, width-8 one-stage network, a few short
epochs) runs every stage in about a second, so the tests can drive the real stage
scripts: in-process through `common.main` (fast) or as subprocesses (kill -9).
"""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
STAGES = ROOT / "stages"
PYTHON = sys.executable
for p in (str(ROOT), str(STAGES)):          # `selcl` and the stages' `common`
    if p not in sys.path:
        sys.path.append(p)

# The longest test files, longest first (a 2-core host, 2026-12-03, `--durations=0`:
# 386, 116, 168, 112, 57 and 47 s). `make test` runs two workers with `--dist loadfile
# --no-loadscope-reorder`, so xdist hands files out in collection order: the two longest
# start at once, one on each worker, and the short files fill in behind them. (xdist's
# default order, most tests first, started test_method.py last, alone on one worker: the
# suite took 626 s there, 506 s in this order, one run each on one host.) Only the order
# changes; a file missing from this list runs after these, in name order.
LONGEST_FIRST = ("test_pipeline.py", "test_method.py", "test_parity_runs.py", "test_ddp.py",
                 "test_compile.py", "test_webvision.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: in-file order kept


SETTING = "tiny"

# Overrides of the repo's `defaults` (read from the real params.yaml, so the tests
# follow the committed defaults): every stage of this setting takes ~1 s on a CPU.
TINY = {
    "data": {"dataset": "digits", "subset": 20},                  # 200 training images
    "noise": {"kind": "sym", "rate": 0.4},
    "model": {"arch": "small", "width": 8, "blocks": [1]},
    "warmup": {"queue_size": 64},
    "pretrain": {"epochs": 4, "batch_size": 32, "lr_warmup_epochs": 1, "lr_decay_epochs": [3],
                 "k": 10, "queue_per_class": 4, "memory_start_epoch": 2, "checkpoint_every": 1},
    "finetune": {"epochs": 2, "batch_size": 32, "bootstrap_start": 1, "eval_last": 1,
                 "checkpoint_every": 1},
    "evaluate": {"k": 10, "tsne_points": 0},
    "baseline": {"epochs": 2, "batch_size": 32, "lr_decay_epochs": [1], "eval_last": 1,
                 "checkpoint_every": 1},
}


def repo_params() -> dict:
    """params.yaml with `defaults` (selcl/defaults.yaml) and every params/<name>.yaml."""
    from selcl.config import load_params
    return load_params(ROOT / "params.yaml")


def tiny_params_dict(**overrides) -> dict:
    """A complete params.yaml (repo defaults + the tiny setting) as a dict;
    `overrides` = {section: {key: value}} on top of the tiny setting."""
    setting = copy.deepcopy(TINY)
    for section, values in overrides.items():
        setting[section].update(values)
    return {"run": [SETTING], "suites": {"tiny": [SETTING]},
            "defaults": copy.deepcopy(repo_params()["defaults"]), "settings": {SETTING: setting}}


def write_params(folder: Path, params: dict) -> Path:
    path = Path(folder) / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture
def tiny_params(tmp_path):
    """tmp_path holding params.yaml for the tiny digits setting; returns the folder."""
    write_params(tmp_path, tiny_params_dict())
    return tmp_path


def load_stage(stage: str):
    """Import stages/<stage>.py as module `stage_<stage>` (its `from common import`
    works because stages/ is on sys.path)."""
    name = f"stage_{stage}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, STAGES / f"{stage}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def run_stage_inprocess(monkeypatch, folder: Path, stage: str, setting: str = SETTING) -> None:
    """`python stages/<stage>.py <setting>` with cwd=folder, in this process
    (common.main: may raise SystemExit)."""
    mod = load_stage(stage)
    monkeypatch.setenv("SELCL_DEVICE", "cpu")      # exact float32 results also on a CUDA host
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", [str(STAGES / f"{stage}.py"), setting])
    mod.main(mod.run)


def stage_env(**extra) -> dict:
    """Environment of a stage subprocess: CPU, one thread (deterministic, and fair to
    the other tests sharing 2 cores), no progress bars."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TQDM_DISABLE="1",
               PYTHONHASHSEED="0", SELCL_DEVICE="cpu", CUDA_VISIBLE_DEVICES="")
    env.pop("SELCL_ALLOW_CPU", None)
    env.update(extra)
    return env


def tree_digest(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `folder`."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def make_tiny_inputs(folder: Path) -> Path:
    """params.yaml and the real outputs of data → noise → warmup of the tiny setting in
    `folder`, made in this process with one thread; returns the folder."""
    import torch
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_params(folder, tiny_params_dict())
    mp = pytest.MonkeyPatch()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for stage in ("data", "noise", "warmup"):
            run_stage_inprocess(mp, folder, stage)
    finally:
        torch.set_num_threads(threads)
        mp.undo()
    return folder


@pytest.fixture(scope="session")
def tiny_upstream(tmp_path_factory):
    """`make_tiny_inputs`, once per session: the folder (with params.yaml and
    runs/tiny/...). Copy it with `copy_upstream`."""
    return make_tiny_inputs(tmp_path_factory.mktemp("upstream"))


def copy_upstream(src: Path, dst: Path) -> None:
    """Copy the runs/ of `tiny_upstream` into dst (params.yaml is written by the caller)."""
    shutil.copytree(Path(src) / "runs", Path(dst) / "runs", dirs_exist_ok=True)


def digits_data(noise: dict, n: int | None = None, n_test: int | None = None):
    """scikit-learn's digits as the loops' TrainData on the CPU: the first `n` training and
    `n_test` test images (None: all), labels noised by `noise` (a setting's noise section:
    kind, rate, seed) over those n."""
    import torch

    from selcl.data import load_dataset
    from selcl.noise import make_noisy_labels
    from selcl.train import TrainData
    ds = load_dataset("digits")
    y = ds.y_train[:n]
    noisy = make_noisy_labels(y, 10, noise["kind"], noise["rate"], noise["seed"], dataset="digits")
    arrays = {"x_train": ds.x_train[:n], "y_train": y, "x_test": ds.x_test[:n_test], "y_test": ds.y_test[:n_test],
              "mean": ds.mean, "std": ds.std}
    return TrainData.build(arrays, {"noisy": noisy, "clean": y, "num_classes": 10}, torch.device("cpu"))


def random_images_and_net(N: int = 24, C: int = 3, H: int = 12, seed: int = 1):
    """(TrainData of N random uint8 images with random labels, a width-4 one-block network
    with 8-d embeddings, the generator the data came from): one pre-training step in
    milliseconds (tests/test_parity.py, tests/test_switches.py)."""
    import torch

    from selcl.models import build_model
    from selcl.train import TrainData
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (N, 3, H, H), dtype=torch.uint8, generator=gen)
    noisy = torch.randint(0, C, (N,), generator=gen)
    data = TrainData(x=x, noisy=noisy, clean=noisy.clone(), x_test=x[:4], y_test=noisy[:4],
                     mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), num_classes=C)
    model = build_model("small", C, width=4, blocks=(1,), proj_dim=8, generator=torch.Generator().manual_seed(seed + 1))
    return data, model, gen
