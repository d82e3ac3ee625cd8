"""What every stage script shares: the setting's folder, the CUDA guard, one-line errors.

A stage is `python stages/<stage>.py <setting>`; it validates its own setting in
params.yaml before any work, writes its outputs atomically under runs/<setting>/,
and on bad input prints one line naming the key or file and exits non-zero,
leaving everything already produced untouched.
"""
from __future__ import annotations

import csv
import errno
import io
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from selcl import checkpoint, dist  # noqa: E402
from selcl.atomic import atomic_write_text  # noqa: E402
from selcl.config import load_setting  # noqa: E402
from selcl.device import cuda_available, env_flag, get_device, no_cuda_reason  # noqa: E402
# The exceptions only: importing selcl.data / selcl.noise for them would make every
# stage depend on the image loader and the noise model (dvc.yaml code deps).
from selcl.errors import CheckpointError, ConfigError, DataError, DivergedError, NoiseError  # noqa: E402
from selcl.stage_params import stage_view  # noqa: E402

EXIT_BAD_INPUT = 2   # bad params / missing or corrupt input / full disk: one line on stderr
EXIT_OOM = 3         # CUDA out of memory: the line names the batch size to lower
BATCH_SIZE_SECTIONS = ("pretrain", "finetune", "baseline")   # stage = its params section ...
BATCH_SECTION = {"warmup": "pretrain"}  # ... except the warm-up, which runs on pre-training's loader
DDP_STAGES = ("warmup", *BATCH_SIZE_SECTIONS)   # the training loops, which run under torchrun


class StageError(RuntimeError):
    """Any other condition a stage reports as one line."""


SCRATCH = Path("scratch")  # git- and dvc-ignored: resume state, never a DVC output


def run_dir(name: str) -> Path:
    return Path("runs") / name


def checkpoint_path(name: str, stage: str) -> Path:
    """Resume state of one stage of one setting: scratch/<setting>/<stage>/checkpoint.pt.
    Outside DVC's outputs (a `persist` output would turn DVC's run-cache off) and
    removed once the stage has written its outputs."""
    return SCRATCH / name / stage / "checkpoint.pt"


def setting_from_argv() -> str:
    if len(sys.argv) != 2:
        raise StageError(f"usage: python {sys.argv[0]} <setting name from params.yaml>")
    return sys.argv[1]


def require_device(cfg: dict) -> torch.device:
    """The paper's networks need a GPU: stop at once on a CPU-only machine, with
    directions to the demo, unless SELCL_ALLOW_CPU=1 overrides."""
    if cfg["model"]["arch"] != "small" and not cuda_available() \
            and not env_flag("SELCL_ALLOW_CPU", False):
        if reason := no_cuda_reason():   # a driver but no usable GPU: not a case for the demo
            raise StageError(f"settings.{cfg['name']}.model.arch = {cfg['model']['arch']!r} needs a CUDA GPU: "
                             f"{reason} (SELCL_ALLOW_CPU=1 runs it on the CPU anyway).")
        raise StageError(
            f"settings.{cfg['name']}.model.arch = {cfg['model']['arch']!r} is the paper suite and needs a "
            f"CUDA GPU, and none is visible. Run the CPU demo instead with `make demo` "
            f"(or `dvc exp run -S 'run=[demo_sym40,demo_asym40]'`); set SELCL_ALLOW_CPU=1 to run it on "
            f"the CPU anyway.")
    device = get_device()
    dist.init(device)                   # joins torchrun's process group, if launched by it
    return device


def load(name: str) -> dict:
    """The setting, validated, as this stage sees it: only the params it declares in
    selcl/stage_params.py (its dvc.yaml dependency); reading any other key raises."""
    return stage_view(load_setting(name), Path(sys.argv[0]).stem)


def write_history(path: Path, rows: list[dict]) -> None:
    """Per-epoch history as CSV (DVC plots read it)."""
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    atomic_write_text(path, buf.getvalue())


def live_history(path: Path):
    """A per-epoch callback for the training loops: rewrite the history CSV (atomically)
    after every epoch, so `dvc plots show` draws a run in progress. Under torchrun only
    rank 0 writes."""
    def write(history: list[dict]) -> None:
        if dist.is_main():
            write_history(path, history)
    return write


def _one_line(text: str) -> str:
    """Messages may embed multi-line library errors; the contract is one line."""
    return " ".join(str(text).split())


def relaunch_under_torchrun() -> None:
    """SELCL_NPROC=N (N > 1) runs a training stage as N data-parallel processes:
    the script re-executes itself under `torchrun --standalone --nproc_per_node=N`.
    A machine choice like SELCL_DEVICE, not a param: `SELCL_NPROC=4 dvc repro` works and
    dvc.yaml stays the same. (Starting `torchrun ... stages/pretrain.py <setting>` by
    hand does the same.)"""
    nproc = os.environ.get("SELCL_NPROC", "1")
    if Path(sys.argv[0]).stem not in DDP_STAGES or dist.launched():
        return
    if not nproc.isdigit() or int(nproc) < 1:
        raise StageError(f"SELCL_NPROC={nproc!r}: must be a positive number of processes")
    if int(nproc) > 1:
        # Check what can be checked before starting N processes: bad params then give one
        # line from this process instead of N lines and torchrun's failure report.
        section = BATCH_SECTION.get(Path(sys.argv[0]).stem, Path(sys.argv[0]).stem)
        check_batch_split(load(setting_from_argv()), section, int(nproc))
        if Path(sys.argv[0]).stem == "pretrain":
            check_warmup_processes(setting_from_argv(), int(nproc))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", sys.argv[0], *sys.argv[1:]]
        sys.stdout.flush()
        os.execv(sys.executable, cmd)


def main(fn) -> None:
    """Run `fn(setting_name)`; turn known failures into one line on stderr and exit
    code 2 (bad input, missing/corrupt file, full disk) or 3 (CUDA out of memory).
    Nothing already produced is touched: every output is written atomically."""
    try:
        relaunch_under_torchrun()
        fn(setting_from_argv())
        dist.shutdown()
    except (ConfigError, DataError, NoiseError, CheckpointError, DivergedError, StageError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except torch.cuda.OutOfMemoryError:
        stage = Path(sys.argv[0]).stem
        name = sys.argv[1] if len(sys.argv) > 1 else "<setting>"
        if stage in DDP_STAGES:
            fix = (f"lower `{BATCH_SECTION.get(stage, stage)}.batch_size` in params/{name}.yaml "
                   "(or free the GPU)")
        else:   # e.g. evaluate embeds in fixed chunks: no parameter of its own to lower
            fix = "free GPU memory (other processes on the GPU) and rerun"
        print(f"error: CUDA out of memory in stage {stage}: {fix}", file=sys.stderr)
        sys.exit(EXIT_OOM)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise
        # A full disk while writing an output: the temp file is gone and the previous
        # output (checkpoint) is intact, so the stage can simply be rerun.
        where = f" writing {exc.filename}" if exc.filename else ""
        print(f"error: no space left on device{where} ({os.strerror(exc.errno)}): free disk space and "
              f"rerun; earlier outputs and checkpoints are intact", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def check_batch_split(cfg: dict, section: str, nproc: int) -> None:
    """The global batch of `section` must split evenly over the torchrun processes."""
    bs = cfg[section]["batch_size"]
    if bs % nproc:
        raise StageError(f"settings.{cfg['name']}.{section}.batch_size = {bs}: not divisible by the "
                         f"{nproc} torchrun processes (SELCL_NPROC)")


def check_warmup_processes(name: str, nproc: int) -> None:
    """Pre-training continues the warm-up's random streams, one per process, so a warm-up
    output of another process count is one line here, before torchrun starts N processes
    (inside them it would be N errors and torchrun's report). A missing or corrupt file is
    left to the stage, which names it."""
    path = run_dir(name) / "warmup.pt"
    try:
        saved = checkpoint.saved_processes(checkpoint.load(path, what="warm-up output")["rng"])
    except (CheckpointError, KeyError, TypeError):
        return
    if saved != nproc:
        raise checkpoint.rerun_error(path, f"written by {saved} process(es), read by {nproc}")


def check_sizes(cfg: dict, n_train: int, sections=("pretrain", "finetune", "baseline"), k: bool = True) -> None:
    """Batch sizes and K must fit the training set: say which key, before any work
    (k=False: the warm-up, which reads pre-training's batch size but not its K)."""
    name = cfg["name"]
    for section in sections:
        bs = cfg[section]["batch_size"]
        if bs > n_train:
            raise StageError(f"settings.{name}.{section}.batch_size = {bs}: larger than the "
                             f"{n_train} training images")
        check_batch_split(cfg, section, dist.world_size())
    if k and "pretrain" in sections and cfg["pretrain"]["k"] >= n_train:
        raise StageError(f"settings.{name}.pretrain.k = {cfg['pretrain']['k']}: must be smaller than "
                         f"the {n_train} training images")
