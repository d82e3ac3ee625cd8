"""Bad inputs stop a stage with ONE line naming the key or file, a fixed exit code,
and nothing already produced under runs/ changed or deleted (docs/troubleshooting.md).

Each case runs the real stage script's `run` through `common.main` in this process
(cwd = a tmp folder with its own params.yaml and a copy of real upstream outputs of
the tiny digits setting), then checks

  * SystemExit with code 2 (3 for CUDA out of memory),
  * stderr is exactly one line, starting with `error:`, containing the expected
    key / file names (and no traceback),
  * every file under runs/ is byte-identical and nothing was added or deleted.
"""
from __future__ import annotations

import errno
import io
import tarfile
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
import yaml
from conftest import (ROOT, SETTING, copy_upstream, load_stage, tiny_params_dict, tree_digest,
                      write_params)

S = f"settings.{SETTING}"
RUN = Path("runs") / SETTING
CKPT = Path("scratch") / SETTING          # resume state: CKPT/<stage>/checkpoint.pt


# ----------------------------------------------------------------------------- edits
def setv(dotted: str, value):
    """Edit: params[a][b][c] = value (dotted path)."""
    def edit(params, folder):
        *parents, last = dotted.split(".")
        d = params
        for k in parents:
            d = d[k]
        d[last] = value
    return edit


def delv(dotted: str):
    def edit(params, folder):
        *parents, last = dotted.split(".")
        d = params
        for k in parents:
            d = d[k]
        del d[last]
    return edit


def chain(*edits):
    def edit(params, folder):
        for e in edits:
            out = e(params, folder)
            if out is not None:
                return out
    return edit


def raw_text(text: str):
    """Edit: params.yaml gets exactly this text."""
    return lambda params, folder: text


def write_file(rel: str, data: bytes | Callable[[Path], bytes]):
    """Edit: write bytes (or fn(folder) -> bytes) to folder/rel (before the snapshot)."""
    def edit(params, folder):
        path = Path(folder) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data(folder) if callable(data) else data)
    return edit


def remove_file(rel: str):
    return lambda params, folder: (Path(folder) / rel).unlink()


def truncated(rel: str):
    """fn(folder) -> the first half of folder/rel (a real file cut short)."""
    return lambda folder: (Path(folder) / rel).read_bytes()[: (Path(folder) / rel).stat().st_size // 2]


def noise_file(name: str, labels=None, key=None, **arrays):
    """Edit: kind=file with a label file written by numpy (.npy; .npz if arrays given)."""
    def edit(params, folder):
        path = Path(folder) / name
        if arrays:
            np.savez(path, **arrays)
        else:
            np.save(path, np.asarray(labels))
        params["settings"][SETTING]["noise"] = {"kind": "file", "file": name, "file_key": key}
    return edit


def targz_of_pngs(folder: Path) -> bytes:
    """A real imagefolder .tar.gz (train/ and test/, 2 classes × 3 PNGs)."""
    from PIL import Image
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for split in ("train", "test"):
            for c in ("cat", "dog"):
                for i in range(3):
                    png = io.BytesIO()
                    rng = np.random.default_rng(i)
                    Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(png, "PNG")
                    info = tarfile.TarInfo(f"cifar/{split}/{c}/{i:04d}.png")
                    info.size = png.tell()
                    png.seek(0)
                    tf.addfile(info, png)
    return buf.getvalue()


# ----------------------------------------------------------------------------- patches
def offline(monkeypatch, folder):
    """No network: torchvision's download fails as it does offline."""
    import selcl.data

    def no_network(name, root):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
    monkeypatch.setattr(selcl.data, "_download_cifar", no_network)


def no_cuda(monkeypatch, folder):
    """A CPU-only machine without SELCL_ALLOW_CPU (also on a CUDA host)."""
    import common
    monkeypatch.delenv("SELCL_ALLOW_CPU", raising=False)
    monkeypatch.setattr(common, "cuda_available", lambda: False)


def oom_in(stage: str, fn: str):
    def patch(monkeypatch, folder):
        def boom(*args, **kwargs):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB "
                                              "(GPU 0; 79.1 GiB total capacity)\nsecond line")
        monkeypatch.setattr(load_stage(stage), fn, boom)
    return patch


def disk_full(monkeypatch, folder):
    """The disk is full: flushing the first output's data fails (as write/fsync do)."""
    import os

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full)


# ----------------------------------------------------------------------------- the table
@dataclass
class Case:
    id: str
    stage: str
    expect: tuple                       # substrings of the error line
    edit: Callable | None = None        # (params, folder) -> None | raw params.yaml text
    patch: Callable | None = None       # (monkeypatch, folder), applied after the snapshot
    code: int = 2
    setting: str = SETTING              # the stage's command-line argument
    marks: tuple = ()


CASES = [
    # --- ranges
    Case("alpha_gt_1", "pretrain", (f"{S}.pretrain.alpha", "[0, 1]"), setv(f"{S}.pretrain.alpha", 1.5)),
    Case("beta_negative", "pretrain", (f"{S}.pretrain.beta",), setv(f"{S}.pretrain.beta", -0.1)),
    Case("noise_rate_1.5", "noise", (f"{S}.noise.rate", "1.5"), setv(f"{S}.noise.rate", 1.5)),
    Case("k_zero", "pretrain", (f"{S}.pretrain.k",), setv(f"{S}.pretrain.k", 0)),
    Case("pretrain_epochs_zero", "pretrain", (f"{S}.pretrain.epochs",), setv(f"{S}.pretrain.epochs", 0)),
    Case("defaults_warmup_epochs_zero", "warmup", ("defaults.warmup.epochs",),
         setv("defaults.warmup.epochs", 0)),
    Case("lr_infinite", "pretrain", (f"{S}.pretrain.lr", "finite"), setv(f"{S}.pretrain.lr", float("inf"))),
    Case("lr_nan", "baseline", (f"{S}.baseline.lr",), setv(f"{S}.baseline.lr", float("nan"))),
    Case("decay_epochs_negative", "pretrain", (f"{S}.pretrain.lr_decay_epochs",),
         setv(f"{S}.pretrain.lr_decay_epochs", [3, -1])),
    Case("finetune_eval_last_gt_epochs", "finetune", (f"{S}.finetune.eval_last",),
         setv(f"{S}.finetune.eval_last", 5)),
    Case("baseline_mixup_alpha_zero", "baseline", (f"{S}.baseline.mixup_alpha", "> 0"),
         setv(f"{S}.baseline.mixup_alpha", 0)),
    Case("baseline_eval_last_gt_epochs", "baseline", (f"{S}.baseline.eval_last",),
         setv(f"{S}.baseline.eval_last", 3)),
    Case("blocks_empty", "warmup", (f"{S}.model.blocks",), setv(f"{S}.model.blocks", [])),
    Case("memory_smaller_than_two_batches", "warmup", (f"{S}.pretrain.queue_per_class = 3", "64"),
         setv(f"{S}.pretrain.queue_per_class", 3)),
    # --- names
    Case("unknown_dataset", "data", (f"{S}.data.dataset", "'cifar'"), setv(f"{S}.data.dataset", "cifar")),
    Case("unknown_noise_kind", "noise", (f"{S}.noise.kind", "symmetric"),
         setv(f"{S}.noise.kind", "symmetric")),
    Case("unknown_noise_generator", "noise", (f"{S}.noise.generator", "'mt19937'"),
         setv(f"{S}.noise.generator", "mt19937")),
    Case("unknown_arch", "warmup", (f"{S}.model.arch", "resnet50"), setv(f"{S}.model.arch", "resnet50")),
    Case("unknown_key_did_you_mean", "pretrain", (f"{S}.pretrain.alhpa", "did you mean 'alpha'"),
         setv(f"{S}.pretrain.alhpa", 0.5)),
    Case("unknown_key_in_defaults", "data", ("defaults.noise.sede", "did you mean 'seed'"),
         setv("defaults.noise.sede", 1)),
    Case("unknown_section", "data", (f"{S}.pretrian", "did you mean 'pretrain'"), setv(f"{S}.pretrian", {})),
    Case("missing_defaults_section", "data", ("defaults.evaluate", "missing section"),
         delv("defaults.evaluate")),
    Case("unknown_top_level_key", "data", ("setings", "did you mean 'settings'"), setv("setings", {})),
    Case("missing_top_level_key", "data", ("suites", "missing"), delv("suites")),
    Case("setting_not_a_mapping", "data", (f"{S}", "mapping"), setv(f"{S}", ["data", "noise"])),
    Case("settings_not_a_mapping", "data", ("settings", "mapping"), setv("settings", [SETTING])),
    # --- types
    Case("string_for_int", "pretrain", (f"{S}.pretrain.batch_size", "'32'"),
         setv(f"{S}.pretrain.batch_size", "32")),
    Case("bool_for_int", "pretrain", (f"{S}.pretrain.epochs", "True"), setv(f"{S}.pretrain.epochs", True)),
    Case("float_for_int", "warmup", (f"{S}.warmup.queue_size",), setv(f"{S}.warmup.queue_size", 64.5)),
    Case("string_for_float", "pretrain", (f"{S}.pretrain.alpha",), setv(f"{S}.pretrain.alpha", "0.5")),
    Case("int_for_bool", "pretrain", (f"{S}.pretrain.mixup",), setv(f"{S}.pretrain.mixup", 1)),
    Case("section_not_a_mapping", "noise", (f"{S}.noise",), setv(f"{S}.noise", "sym")),
    Case("invalid_yaml", "data", ("params.yaml", "not valid YAML"), raw_text("run: [tiny\nsettings: {a: 1\n")),
    Case("params_yaml_missing", "data", ("params.yaml", "not found"), raw_text("")),
    # --- settings named on the command line / in `run`
    Case("argv_unknown_setting", "pretrain", ("settings.tinny", "did you mean 'tiny'"), setting="tinny"),
    Case("run_unknown_setting", "data", ("run: unknown setting 'tiny_sym40'",),
         setv("run", [SETTING, "tiny_sym40"])),
    Case("report_run_unknown_setting", "report", ("run: unknown setting 'tiny_sym40'",),
         setv("run", [SETTING, "tiny_sym40"])),
    Case("suite_unknown_setting", "noise", ("suites.tiny", "'tiyn'"), setv("suites.tiny", ["tiyn"])),
    # --- datasets
    Case("imagefolder_without_path", "data", (f"{S}.data.path", "imagefolder"),
         setv(f"{S}.data", {"dataset": "imagefolder", "path": None})),
    Case("imagefolder_path_missing", "data", (f"{S}.data.path", "no/such/cifar.tar.gz"),
         setv(f"{S}.data", {"dataset": "imagefolder", "path": "no/such/cifar.tar.gz"})),
    Case("imagefolder_corrupt_targz", "data", (f"{S}.data.path", "cifar.tar.gz", "corrupt"),
         chain(write_file("cifar.tar.gz", b"\x1f\x8b\x08\x00" + bytes(range(256)) * 8),
               setv(f"{S}.data", {"dataset": "imagefolder", "path": "cifar.tar.gz"}))),
    Case("imagefolder_truncated_targz", "data", (f"{S}.data.path", "cut.tar.gz"),
         chain(write_file("cut.tar.gz", lambda f: targz_of_pngs(f)[:300]),
               setv(f"{S}.data", {"dataset": "imagefolder", "path": "cut.tar.gz"}))),
    Case("imagefolder_no_train_folder", "data", (f"{S}.data.path", "empty", "train/"),
         chain(write_file("empty/readme.txt", b"nothing here"),
               setv(f"{S}.data", {"dataset": "imagefolder", "path": "empty"}))),
    Case("extra_test_path_missing", "data", (f"{S}.data.extra_test_path", "no/such/val50", "does not exist"),
         setv(f"{S}.data.extra_test_path", "no/such/val50")),
    Case("cifar10_offline", "data", (f"{S}.data.root", "CIFAR-10", "download failed"),
         setv(f"{S}.data", {"dataset": "cifar10", "root": "raw"}), patch=offline),
    Case("cifar10_missing_download_off", "data", (f"{S}.data.root", "CIFAR-10", "download is off"),
         setv(f"{S}.data", {"dataset": "cifar10", "root": "raw", "download": False}), patch=offline),
    # --- noisy-label files
    Case("noise_file_missing", "noise", (f"{S}.noise.file", "labels.npy", "does not exist"),
         setv(f"{S}.noise", {"kind": "file", "file": "labels.npy"})),
    Case("noise_kind_file_without_file", "noise", (f"{S}.noise.file", "required"),
         setv(f"{S}.noise", {"kind": "file"})),
    Case("noise_file_wrong_length", "noise", (f"{S}.noise.file", "short.npy", "200 labels"),
         noise_file("short.npy", np.arange(199) % 10)),
    Case("noise_labels_out_of_range", "noise", (f"{S}.noise.file", "big.npy", "[0, 10)"),
         noise_file("big.npy", np.arange(200) % 11)),
    Case("noise_labels_not_integers", "noise", (f"{S}.noise.file", "half.npy", "integers"),
         noise_file("half.npy", np.full(200, 0.5))),
    Case("noise_file_dict_missing_key", "noise", (f"{S}.noise.file", "cifar10n.npz", "random_label9"),
         noise_file("cifar10n.npz", key="random_label9", worse_label=np.zeros(200, dtype=np.int64),
                    aggre_label=np.zeros(200, dtype=np.int64))),
    Case("noise_file_dict_without_file_key", "noise", (f"{S}.noise.file", "cifar10n.npz", "file_key"),
         noise_file("cifar10n.npz", worse_label=np.zeros(200, dtype=np.int64))),
    Case("noise_asym_map_wrong_dataset", "noise", (f"{S}.noise.asym_map", "num_classes=100"),
         setv(f"{S}.noise", {"kind": "asym", "rate": 0.2, "asym_map": "cifar100"})),
    # --- stage inputs and checkpoints
    Case("corrupt_pretrain_checkpoint", "pretrain", (f"{CKPT}/pretrain/checkpoint.pt", "corrupt"),
         write_file(f"{CKPT}/pretrain/checkpoint.pt", b"\x00garbage\xff" * 100)),
    # a real torch file cut short (the warm-up output; its own checkpoint is deleted on completion)
    Case("truncated_warmup_checkpoint", "warmup", (f"{CKPT}/warmup/checkpoint.pt", "corrupt"),
         write_file(f"{CKPT}/warmup/checkpoint.pt", truncated(f"{RUN}/warmup.pt"))),
    Case("checkpoint_not_of_this_pipeline", "warmup", (f"{CKPT}/warmup/checkpoint.pt", "not a checkpoint"),
         write_file(f"{CKPT}/warmup/checkpoint.pt", lambda f: _torch_bytes([1, 2, 3]))),
    Case("corrupt_warmup_output", "pretrain", (f"{RUN}/warmup.pt", "corrupt"),
         write_file(f"{RUN}/warmup.pt", b"PK\x03\x04 not a zip")),
    Case("corrupt_pretrain_output", "finetune", (f"{RUN}/pretrain.pt", "corrupt"),
         write_file(f"{RUN}/pretrain.pt", b"garbage")),
    Case("missing_warmup_output", "pretrain", (f"{RUN}/warmup.pt", "not found"), remove_file(f"{RUN}/warmup.pt")),
    Case("missing_pretrain_output", "evaluate", (f"{RUN}/pretrain.pt", "not found"),
         remove_file(f"{RUN}/pretrain.pt")),
    Case("missing_labels", "warmup", (f"{RUN}/labels.npz", "noise stage"), remove_file(f"{RUN}/labels.npz")),
    Case("missing_data_arrays", "noise", (f"{RUN}/data.npz", "does not exist"), remove_file(f"{RUN}/data.npz")),
    Case("corrupt_data_arrays_noise", "noise", (f"{RUN}/data.npz", "corrupt"),
         write_file(f"{RUN}/data.npz", truncated(f"{RUN}/data.npz"))),
    Case("corrupt_data_arrays_warmup", "warmup", (f"{RUN}/data.npz", "corrupt array file"),
         write_file(f"{RUN}/data.npz", truncated(f"{RUN}/data.npz"))),
    Case("corrupt_labels_warmup", "warmup", (f"{RUN}/labels.npz", "corrupt labels file"),
         write_file(f"{RUN}/labels.npz", b"garbage")),
    # --- limits known only once the data are there (n = 200 training images)
    Case("pretrain_batch_larger_than_dataset", "pretrain", (f"{S}.pretrain.batch_size", "larger than the 200"),
         setv(f"{S}.pretrain.batch_size", 256)),
    Case("pretrain_k_not_below_dataset", "pretrain", (f"{S}.pretrain.k", "smaller than the 200"),
         setv(f"{S}.pretrain.k", 500)),
    Case("warmup_output_from_two_processes", "pretrain", (f"{RUN}/warmup.pt", "2 process(es), read by 1", "SELCL_NPROC"),
         write_file(f"{RUN}/warmup.pt", lambda f: _warmup_output_of_two_processes(f))),
    Case("finetune_on_empty_selection", "finetune", (f"{S}.pretrain.alpha", "selection T is empty", "raise alpha"),
         write_file(f"{RUN}/pretrain.pt", lambda f: _pretrain_output_with_empty_T())),
    # --- machine
    Case("paper_arch_on_cpu", "warmup", (f"{S}.model.arch", "CUDA", "make demo", "SELCL_ALLOW_CPU"),
         setv(f"{S}.model.arch", "preact_resnet18"), patch=no_cuda),
    Case("paper_arch_on_cpu_data_stage", "data", (f"{S}.model.arch", "SELCL_ALLOW_CPU"),
         setv(f"{S}.model.arch", "resnet18"), patch=no_cuda),
    Case("cuda_oom_pretrain", "pretrain", (f"`pretrain.batch_size` in params/{SETTING}.yaml", "out of memory"),
         patch=oom_in("pretrain", "pretrain"), code=3),
    Case("cuda_oom_warmup", "warmup", (f"`pretrain.batch_size` in params/{SETTING}.yaml",),
         patch=oom_in("warmup", "warmup"), code=3),
    Case("disk_full_writing_output", "noise", ("no space left", f"{RUN}/labels.npz"), patch=disk_full),
    Case("usage_without_setting", "data", ("usage",), setting=None),
]


def _pretrain_output_with_empty_T() -> bytes:
    """A valid pretrain.pt of the tiny model whose final selection T is empty (as a too
    strict α/β can give): fine-tuning has no example to train on."""
    from selcl.config import resolve
    from selcl.train import make_model
    cfg = resolve(tiny_params_dict(), SETTING)
    model = make_model(cfg["model"], 10, torch.device("cpu"))
    return _torch_bytes({"model": model.state_dict(), "examples": torch.zeros(200, dtype=torch.bool)})


def _without_cache(tree: dict) -> dict:
    """scratch/ without digests.json: a stat-keyed sha256 cache (selcl.sources), which a
    stage may fill before it fails (the warm-up and the baseline hash data.npz for their
    checkpoints' fingerprints); it holds no result, and a stale entry is only re-read."""
    return {k: v for k, v in tree.items() if k != "digests.json"}


def _warmup_output_of_two_processes(folder) -> bytes:
    """The tiny setting's real warm-up output, its random state as torchrun with 2 processes
    writes it (one entry per rank)."""
    warm = torch.load(Path(folder) / RUN / "warmup.pt", weights_only=False)
    warm["rng"] = {"ranks": [warm["rng"], warm["rng"]]}
    return _torch_bytes(warm)


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_bad_input(case: Case, tiny_upstream, tmp_path, monkeypatch, capsys):
    # A folder with real upstream outputs of the setting plus unrelated earlier results.
    copy_upstream(tiny_upstream, tmp_path)
    (tmp_path / RUN / "pretrain.pt").write_bytes(b"previous pre-training output")
    (tmp_path / "scratch" / "other" / "pretrain").mkdir(parents=True)
    (tmp_path / "scratch" / "other" / "pretrain" / "checkpoint.pt").write_bytes(b"another setting's checkpoint")
    params = tiny_params_dict()
    text = case.edit(params, tmp_path) if case.edit else None
    if text is None:
        write_params(tmp_path, params)
    elif text:
        (tmp_path / "params.yaml").write_text(text)
    before = tree_digest(tmp_path / "runs"), _without_cache(tree_digest(tmp_path / "scratch"))
    if case.patch:
        case.patch(monkeypatch, tmp_path)
    monkeypatch.setenv("SELCL_DEVICE", "cpu")
    monkeypatch.chdir(tmp_path)
    mod = load_stage(case.stage)
    argv = [str(ROOT / "stages" / f"{case.stage}.py")] + ([case.setting] if case.setting else [])
    monkeypatch.setattr("sys.argv", argv)
    capsys.readouterr()

    with pytest.raises(SystemExit) as exit_info:
        mod.main() if case.stage == "report" else mod.main(mod.run)

    err = capsys.readouterr().err
    assert exit_info.value.code == case.code, err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected exactly one line on stderr, got:\n{err}"
    line = lines[0]
    print(line)                         # shown by `pytest -rP`: the message a user gets
    assert line.startswith("error: "), line
    assert "Traceback" not in line
    for part in case.expect:
        assert part in line, f"{part!r} not named in: {line}"
    assert (tree_digest(tmp_path / "runs"), _without_cache(tree_digest(tmp_path / "scratch"))) == before, \
        "runs/ or scratch/ changed although the stage failed"


def test_case_table_covers_the_issue():
    """The table keeps at least the 25 cases of the "Reliability" issue."""
    assert len(CASES) >= 25
    assert len({c.id for c in CASES}) == len(CASES)


def test_repo_params_validate():
    """The committed params.yaml validates as a whole and every setting resolves."""
    from selcl.config import SECTIONS, load_params, resolve, validate
    params = load_params(ROOT / "params.yaml")
    validate(params)
    for name in params["settings"]:
        cfg = resolve(params, name)
        assert set(SECTIONS) <= set(cfg) and cfg["name"] == name
    for suite, names in params["suites"].items():
        assert set(names) <= set(params["settings"]), suite


def test_tiny_params_validate_and_demo_readme_messages():
    """The test setting itself is valid (else every case above would pass vacuously),
    and the README's example message for α is what a user sees."""
    from selcl.config import ConfigError, validate
    params = tiny_params_dict()
    validate(params)
    params["settings"][SETTING]["pretrain"]["alpha"] = 1.5
    with pytest.raises(ConfigError, match=r"^settings\.tiny\.pretrain\.alpha = 1\.5: must be in \[0, 1\]$"):
        validate(yaml.safe_load(yaml.safe_dump(params)))
