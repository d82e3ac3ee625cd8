"""The one device helper: every CUDA-specific choice lives here.

Nothing else in `selcl` calls `.cuda()` or checks `torch.cuda.is_available()`;
it asks this module. CUDA paths (bf16 autocast for the training passes, CUDA graphs,
faiss GPU index) are chosen automatically and never change a stage's tracked params.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from .errors import ConfigError


def get_device(preference: str = "auto") -> torch.device:
    """'auto' → CUDA when available, else CPU. 'cpu' / 'cuda' force a device.

    The environment variable SELCL_DEVICE overrides 'auto' (handy for tests and
    for `dvc queue` workers pinned to one GPU via CUDA_VISIBLE_DEVICES).
    'auto' with several GPUs visible: under torchrun, the GPU of LOCAL_RANK; otherwise
    the first GPU no other selcl process holds (`claim_gpu`), so that the workers of
    `dvc queue start -j N` spread over N GPUs with no configuration.
    """
    if preference == "auto":
        preference = os.environ.get("SELCL_DEVICE", "auto")
    if preference == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    if preference.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"SELCL_DEVICE={preference}: CUDA is not available on this machine"
                          + (f" ({reason})" if (reason := no_cuda_reason()) else ""))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and preference.startswith(("auto", "cuda")):
        if preference not in ("auto", "cuda"):     # one index for every rank: they would share one GPU
            raise ConfigError(f"SELCL_DEVICE={preference} under torchrun (SELCL_NPROC): every process "
                              f"would take that one GPU; set SELCL_DEVICE=cuda or leave it unset (each "
                              f"process takes the GPU of its LOCAL_RANK; CUDA_VISIBLE_DEVICES picks the GPUs)")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))   # torchrun: one GPU per rank
    if preference == "auto":
        count = torch.cuda.device_count()
        return torch.device("cuda", claim_gpu(count)) if count > 1 else torch.device("cuda")
    return torch.device(preference)


_CLAIMED: dict = {}     # the claimed GPU's lock file stays open for the process lifetime


def claim_gpu(count: int, lock_dir: str | os.PathLike | None = None, poll_s: float = 5.0) -> int:
    """One GPU per process among `count` visible ones, for parallel workers
    (`dvc queue start -j N`: every stage is a process of its own).

    Takes the first GPU whose lock file `<lock_dir>/gpu<i>.lock` nobody holds, with an
    exclusive fcntl lock that the OS drops when the process ends (crash included); when
    all are taken, waits for one. lock_dir: $SELCL_GPU_LOCK_DIR, else
    <tmp>/selcl-gpu-locks-<uid> (shared by the queue's temporary workspaces). Idempotent
    within a process.
    """
    if "gpu" in _CLAIMED:
        return _CLAIMED["gpu"][0]
    lock_dir = Path(lock_dir or os.environ.get("SELCL_GPU_LOCK_DIR")
                    or Path(tempfile.gettempdir()) / f"selcl-gpu-locks-{os.getuid()}")
    lock_dir.mkdir(parents=True, exist_ok=True)
    said = False
    while True:
        for i in range(count):
            f = open(lock_dir / f"gpu{i}.lock", "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            f.seek(0); f.truncate(); f.write(f"{os.getpid()}\n"); f.flush()
            _CLAIMED["gpu"] = (i, f)
            return i
        if not said:
            print(f"[device] all {count} GPUs are held by other selcl processes ({lock_dir}); "
                  f"waiting for one", file=sys.stderr, flush=True)
            said = True
        time.sleep(poll_s)


def env_flag(name: str, default: bool) -> bool:
    """An on/off switch from the environment (SELCL_COMPILE, SELCL_CHANNELS_LAST,
    SELCL_SIM_RECOMPUTE, SELCL_SPLIT_VIEWS, SELCL_CPU_BF16, SELCL_ALLOW_CPU): unset or empty →
    `default`; 1 / true / yes / on and 0 / false / no / off, in any case; anything else is
    one clear error (a typo such as `SELCL_COMPILE=of` must not silently mean "on")."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={os.environ[name]!r}: expected 1 / true / yes / on or 0 / false / no / off")


# The oldest Linux driver each CUDA major version of a torch wheel runs on (NVIDIA's CUDA
# release notes, "minor version compatibility": 13.x needs 580, 12.x 525, 11.x 450).
MIN_DRIVER = {13: 580, 12: 525, 11: 450}
NVIDIA_PROC = Path("/proc/driver/nvidia/version")


def nvidia_driver() -> str | None:
    """The installed NVIDIA driver's version ("550.54.14"), or None where there is none:
    from /proc/driver/nvidia/version (the kernel module), else `nvidia-smi`."""
    try:
        for word in NVIDIA_PROC.read_text().split():
            if word[:1].isdigit() and "." in word:           # "... Kernel Module  550.54.14  Thu ..."
                return word
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        import subprocess
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.split()
        except (OSError, subprocess.SubprocessError):
            out = []
        if out and out[0][:1].isdigit():
            return out[0]
    return None


def no_cuda_reason() -> str | None:
    """Why torch sees no CUDA GPU although an NVIDIA driver is installed (one sentence, for
    the stages' error lines), or None where there is no driver: then there is no GPU to
    use, and the CPU demo is the way. The usual case is a driver older than the torch
    wheel's CUDA needs (torch 2.14.1+cu130: driver 580 or newer)."""
    driver = nvidia_driver()
    if driver is None:
        return None
    wheel = f"torch {torch.__version__}"
    if not torch.version.cuda:
        return f"NVIDIA driver {driver} is installed, but {wheel} is a CPU-only build: install the CUDA wheel"
    major = int(torch.version.cuda.split(".")[0])
    need = MIN_DRIVER.get(major)
    if need is not None and int(driver.split(".")[0]) < need:
        return (f"NVIDIA driver {driver} is installed, but {wheel} (CUDA {torch.version.cuda}) needs driver "
                f">= {need}: update the host's driver")
    return (f"NVIDIA driver {driver} is installed (>= {need or '?'}, as {wheel} needs), but no GPU is "
            f"visible: check CUDA_VISIBLE_DEVICES, `nvidia-smi`, and `docker run --gpus all`")


def is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


def cuda_available() -> bool:
    return torch.cuda.is_available()


def autocast(device: torch.device):
    """bf16 autocast for the training passes on CUDA (buys ~2x matmul throughput
    on tensor cores); on CPU a no-op, so CPU results stay exact float32, unless
    SELCL_CPU_BF16=1 (cpu_bf16). Similarities, softmax and losses are computed in
    float32 by the callers, and the embedding passes (`evaluate.embed`) run without it."""
    if is_cuda(device):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if cpu_bf16():
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def cpu_bf16() -> bool:
    """SELCL_CPU_BF16=1: the CPU's training passes under bf16 autocast too, as on CUDA
    (the embedding passes stay float32 on both).
    Opt-in, because it changes CPU results (every CPU number recorded here is float32).
    On a CPU with AMX (Intel Sapphire Rapids and later) oneDNN runs bf16 convolutions on
    its tile units: on 2 cores of such a Xeon a CPU preset's Sel-CL step took 0.87× and
    its CE step 0.76× the float32 time (`bench/cpu_bf16.py`); on a CPU without AMX bf16
    can be slower than float32."""
    return env_flag("SELCL_CPU_BF16", False)


def precision(device: torch.device) -> str:
    """What the training passes compute in (`autocast`), for the report; the embedding
    passes (`evaluate.embed`) are float32 on every device."""
    return "bf16 autocast" if is_cuda(device) or cpu_bf16() else "float32"


def memory_format(device: torch.device) -> torch.memory_format:
    """channels_last (NHWC) for images and conv weights, on every device: cuDNN's NHWC
    convolutions avoid layout transposes, and on the CPU oneDNN runs NHWC natively where
    NCHW costs a reorder per call (a Sel-CL step of the CPU presets: 0.357 → 0.268 s on 2
    cores). The layout changes float summation order, not the arithmetic: a run stays
    bit-reproducible on the same machine and thread count. SELCL_CHANNELS_LAST=0: the
    NCHW layout (to compare, e.g. `bench/step.py`; results before 2026-11-26 used it on CPU)."""
    return torch.channels_last if env_flag("SELCL_CHANNELS_LAST", True) else torch.contiguous_format


def split_views(device: torch.device) -> bool:
    """Whether the views of a Sel-CL step go through the network one call each (CPU) or
    concatenated in one call with per-view BatchNorm (`models.bn_groups`; CUDA: fewer,
    larger kernels). Both are exact (per-sample convolutions, per-view statistics); only
    the float order of the weight-gradient sums differs. On the CPU a 64-row call keeps
    its activations in cache where a 192-row one spills: a small-net step (batch 64)
    0.27 → 0.23 s on 2 cores (bench/results/step_cpu_split.md). SELCL_SPLIT_VIEWS=0 / 1
    forces one or the other."""
    return env_flag("SELCL_SPLIT_VIEWS", not is_cuda(device))


def eval_batch_size(device: torch.device) -> int:
    """Rows per evaluation-mode forward (embedding, test accuracy): 1,024 on CUDA; 128 on
    the CPU, where a 1,024-row batch's activations (67 MB in the first stage of the small
    net) overflow the cache: embedding 3,000 test images 1.08 → 0.34 s on 2 cores, the
    same bits (each row's arithmetic does not depend on the batch)."""
    return 1024 if is_cuda(device) else 128


# The device types whose training forwards run under torch.compile: CUDA only (on the CPU
# a compiled step was no faster: bench/cpu_compile.py). Tests add "cpu" to exercise the
# CUDA path's decisions and its fallback on this machine.
COMPILE_ON = ("cuda",)


def compiles(device: torch.device) -> bool:
    """Whether the training forwards run under torch.compile: on CUDA, unless SELCL_COMPILE=0
    or torch.compile cannot work here (`compile_failure`: no C compiler, no Triton, a failed
    compilation), in which case everything runs eagerly after one warning line.
    Decided once per process; step by step, `compiled`'s forwards and the callers of
    `in_eager_step` (the augmentation) also run eagerly inside `eager_step`."""
    device = torch.device(device)
    if device.type not in COMPILE_ON or not env_flag("SELCL_COMPILE", True):
        return False
    return compile_failure(device.type) is None


# Why torch.compile does not work on a device type ({} until checked; None: it works). Set
# once per process by the check before the first compilation, or by a compilation that
# failed (`run_compiled`); from then on that device type runs eagerly.
_COMPILE_FAILURE: dict[str, str | None] = {}


def compile_failure(kind: str) -> str | None:
    """Why torch.compile cannot work on device type `kind` in this process, or None.
    Checked once, before the first compiled call: a C compiler (Triton builds every
    kernel's launcher with one at run time; Inductor's CPU kernels are C++), Triton
    (CUDA), then one tiny forward and backward compiled for real (`_probe`). The
    stages' images and hosts may lack any of these: the answer is to run eagerly, with
    one warning line (`_give_up`), never to crash mid-stage."""
    if kind not in _COMPILE_FAILURE:
        reason = None
        if kind == "cuda" and c_compiler() is None:
            reason = "no C compiler (Triton builds its kernel launchers with $CC, gcc or clang; none found)"
        elif kind == "cpu" and cxx_compiler() is None:
            reason = "no C++ compiler (Inductor's CPU kernels need $CXX or g++; none found)"
        elif kind == "cuda" and not _importable("triton"):
            reason = "Triton is not installed"
        else:
            try:
                _probe(kind)
            except Exception as exc:   # whatever broke, compiled steps would break the same way
                reason = f"a test compilation failed ({_why(exc)})"
        _COMPILE_FAILURE[kind] = None
        if reason:
            _give_up(kind, reason)
    return _COMPILE_FAILURE[kind]


def _give_up(kind: str, reason: str) -> None:
    """From now on `kind` runs eagerly: say so once, in one line on stderr."""
    if _COMPILE_FAILURE.get(kind):
        return
    _COMPILE_FAILURE[kind] = reason
    print(f"[device] torch.compile cannot run on {kind}: {reason}; this process runs eagerly, as with "
          f"SELCL_COMPILE=0 (slower steps; set SELCL_COMPILE=0 to skip this check)", file=sys.stderr, flush=True)


def _why(exc: BaseException) -> str:
    """The root of a compilation error in one short line: Dynamo wraps the backend's
    exception (`inner_exception`), whose first line names what broke."""
    while (inner := getattr(exc, "inner_exception", None) or exc.__cause__) is not None:
        exc = inner
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else 'no message'}"[:240]


def c_compiler() -> str | None:
    """The C compiler Triton would use: $CC, else gcc, else clang (triton's `_build`)."""
    return next((p for p in map(shutil.which, (os.environ.get("CC") or "gcc", "clang")) if p), None)


def cxx_compiler() -> str | None:
    """The C++ compiler Inductor's CPU backend would use: $CXX, else g++."""
    return shutil.which(os.environ.get("CXX") or "g++")


def _importable(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def _probe(kind: str) -> None:
    """Compile one tiny function the way the loops do (Inductor, static shapes) and run its
    forward and backward, so that a compiler, Triton or toolchain that is present but
    broken shows here (seconds), not in the first training step."""
    x = torch.linspace(-1.0, 1.0, 64, device=kind, requires_grad=True)
    fn = torch.compile(lambda t: (t.sin() * t).sum(), dynamic=False)
    fn(x).backward()
    synchronize(torch.device(kind))
    if x.grad is None or not torch.isfinite(x.grad).all():
        raise RuntimeError("the compiled test function gave no finite gradient")


def _compile_errors() -> tuple[type, ...]:
    """Errors of a compilation (Dynamo's tracing, Inductor, Triton inside Inductor): raised
    before the compiled graph runs, so the same call can rerun eagerly with nothing applied
    twice. (Looked up when needed: importing torch._dynamo costs every stage a second.)"""
    return (torch._dynamo.exc.TorchDynamoException,)


def run_compiled(kind: str, graph, eager, *args, **kwargs):
    """graph(*args), or eager(*args) once torch.compile failed on device type `kind`: the
    first compilation that raises (`_compile_errors`) makes this call and every later one
    eager (one warning line), so a stage never stops for it and computes what it would
    with SELCL_COMPILE=0."""
    if _COMPILE_FAILURE.get(kind):
        return eager(*args, **kwargs)
    try:
        return graph(*args, **kwargs)
    except Exception as exc:
        if not isinstance(exc, _compile_errors()):
            raise
        _give_up(kind, f"compiling {getattr(eager, '__name__', type(eager).__name__)} failed "
                       f"({_why(exc)})")
        return eager(*args, **kwargs)


_eager_step = False   # set by `eager_step`: this step's compiled parts run eagerly


@contextlib.contextmanager
def eager_step(on: bool = True):
    """Within it, the compiled training forwards (`compiled`) and augmentation
    (`in_eager_step`) run eagerly. The loops use it for every step of a loop too short to
    repay compilation (`worth_compiling`) and for an epoch's last, smaller batch (the
    authors' loaders keep it: 391 CIFAR steps, the last of 80). Static graphs are one per
    shape, so that one step in 391 would compile a second graph of every call site,
    forward and backward, and of the augmentation: half the graphs a fresh process
    compiles (a fresh H200 took 272 s to the end of the first pre-training epoch,
    2026-12-04, nearly all compiling; the saving is not yet timed on a GPU), for a step
    that eager runs in tens of milliseconds. Same arithmetic, up to float rounding (the
    kernels differ)."""
    global _eager_step
    before, _eager_step = _eager_step, on
    try:
        yield
    finally:
        _eager_step = before


def in_eager_step() -> bool:
    return _eager_step


# A training loop compiles (CUDA) only when it has at least this many steps left in the
# process. Compiling a loop's graphs costs tens of seconds to minutes (the fresh H200 of
# 2026-12-04: 117 s for the one-epoch Uns-CL warm-up, 391 steps, nearly all of it
# compiling) and saves about 15 ms a step (an H200's pre-training step: 39.6 ms eager,
# 24.6 ms graphed, compile_check_h200.md): 30 s of compilation pays after 2,000 steps,
# 100 s after ~6,700. So 2,000 errs towards compiling. On the paper's settings only
# CIFAR's one warm-up epoch falls under it (WebVision's five: ~5,150 steps); so do
# shortened runs and a loop resumed near its end.
COMPILE_MIN_STEPS = 2000


def worth_compiling(steps: int) -> bool:
    """Whether a loop with `steps` training steps left in this process compiles: its steps
    run inside `eager_step` otherwise (a no-op off CUDA and with SELCL_COMPILE=0, where
    nothing compiles)."""
    return steps >= COMPILE_MIN_STEPS


class _Compiled:
    """The compiled forward of `module`, or `module` itself inside `eager_step`."""

    def __init__(self, module: torch.nn.Module, graph):
        self.module, self.graph = module, graph
        self.kind = next(module.parameters()).device.type

    def __call__(self, x):
        if _eager_step:
            return self.module(x)
        return run_compiled(self.kind, self.graph, self.module, x)


RECOMPILE_LIMIT = 64   # Dynamo graphs per compiled function: headroom over its default, 8 (`compiled`)


def compiled(model: torch.nn.Module, cuda_graphs: bool = True):
    """The callable for a model's *training* forward passes: on CUDA,
    torch.compile(mode="reduce-overhead"), so the forward and backward of each
    fixed-shape training batch replay as CUDA graphs (one launch instead of hundreds).
    The eager step is launch-bound (~1,000 small kernels per pre-training step);
    graphs cut it from 19.1 to 11.4 ms on an H200 (bench/step.py, bench/compile_check.py).
    Shares `model`'s parameters and state_dict; evaluation and other shapes call `model`
    itself, and so does every call inside `eager_step` (an epoch's last, smaller batch).
    Each (rows, BatchNorm groups, grad mode) gets its own static graph. Identity on the
    CPU, with SELCL_COMPILE=0 and where torch.compile cannot work (`compiles`); a compilation
    that fails at a call makes that call and the rest eager (`run_compiled`); never changes
    a tracked param.

    cuda_graphs=False: Inductor's fused kernels ("default" mode) without CUDA graphs, for a network whose
    graph is back-propagated twice (Sel-CL's clipped L_SIM gradient uses retain_graph,
    which graph replay does not support)."""
    if not compiles(next(model.parameters()).device):
        return model
    if not cuda_graphs:
        # AOTAutograd donates saved buffers to the backward by default, which forbids a
        # second backward through the same graph (retain_graph): turn that reuse off.
        import torch._functorch.config as functorch_config
        functorch_config.donated_buffer = False
    # dynamic=False: every call site has one fixed shape (batch × views, BatchNorm groups),
    # but one process calls the network with B, 2B and 3B rows (warm-up, L_CLS, the main
    # pass). By default Dynamo then recompiles every graph after the first as a
    # dynamic-shape graph (symbolic batch size: slower kernels, longer compilation), and
    # which graphs turn dynamic depends on call order (bench/step.py compiled static ones,
    # the real loop dynamic ones; tests/test_compile.py). Static: one graph per call site.
    # Static graphs are one per (rows, groups, grad mode, module): one process running all
    # four loops (bench/gpu_real.py) needs ~6 graphs of the forward, ~12 if the last,
    # smaller batch of each epoch were compiled too (it runs eagerly: `eager_step`). Past
    # Dynamo's default recompile limit (8) it would run the rest eagerly, silently; 64
    # leaves room (a caller's other batch size, DDP-free benchmarks).
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    return _Compiled(model, torch.compile(model, mode="reduce-overhead" if cuda_graphs else "default",
                                          dynamic=False))


def synchronize(device: torch.device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)


def faiss_gpu_available() -> bool:
    """True when the installed faiss has GPU support and a GPU is visible."""
    try:
        import faiss  # noqa: F401
    except ImportError:  # pragma: no cover - faiss is a hard dependency
        return False
    return bool(torch.cuda.is_available() and hasattr(faiss, "StandardGpuResources")
                and faiss.get_num_gpus() > 0)


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_name() -> str:
    """The host CPU's model ("Intel(R) Xeon(R) Processor", "AMD EPYC 7B13"): CPU timings
    differ ~1.6x between this project's 2-core hosts, so a time needs its host."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_id() -> str:
    """What picks the CPU's kernels, beyond the model name: family, model and stepping, the
    vector extensions ATen and oneDNN dispatch on (`torch.backends.cpu.get_cpu_capability`,
    AMX, AVX-512 FP16 / BF16) and the per-core L2 that sizes their blocking, e.g. "family 6
    model 167 stepping 1; AVX512 + amx_tile avx512_bf16 avx512_fp16; L2 2048K". Two hosts that
    both call themselves "Intel(R) Xeon(R) Processor" ran the same seed bit for bit until one
    float rounded differently (docs/evidence.md): a run records which kind it had."""
    fields = _cpuinfo()
    flags = set(fields.get("flags", "").split())
    try:
        l2 = Path("/sys/devices/system/cpu/cpu0/cache/index2/size").read_text().strip()
    except OSError:
        l2 = "?"
    model = " ".join(f"{k.split()[-1]} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields)
    extra = " ".join(sorted(flags & {"amx_tile", "avx512_bf16", "avx512_fp16"}))
    isa = torch.backends.cpu.get_cpu_capability() + (f" + {extra}" if extra else "")
    blas = faiss_blas_core()
    return "; ".join(part for part in (model or platform.machine(), isa, f"L2 {l2}",
                                       blas and f"faiss OpenBLAS {blas}") if part)


def faiss_blas_core() -> str | None:
    """The kernel set the OpenBLAS bundled with faiss-cpu chose for this CPU ("SkylakeX",
    "Haswell", …; the environment variable OPENBLAS_CORETYPE overrides it), or None where
    faiss has no such library. Its float32 GEMM computes the flat k-NN search's
    similarities, and kernels round differently: two hosts whose torch kernels agree kept
    different 25th neighbours of one example at a 1.7e-7 near-tie (docs/evidence.md,
    "One pseudo-label of 2,000")."""
    try:
        import ctypes
        import faiss
    except ImportError:  # pragma: no cover - faiss is a hard dependency
        return None
    libs = sorted((Path(faiss.__file__).parent.parent / "faiss_cpu.libs").glob("libopenblas*.so*"))
    if not libs:
        return None
    try:
        get = ctypes.CDLL(str(libs[0])).openblas_get_corename   # the copy faiss has loaded
    except (OSError, AttributeError):
        return None
    get.restype = ctypes.c_char_p
    return get().decode()


def describe(device: torch.device) -> dict:
    """Versions and device for the report (issue: record torch, CUDA, faiss, device),
    and the host CPU with the threads torch uses."""
    info = {"torch": torch.__version__, "cuda": torch.version.cuda or "none",
            "device": str(device), "cpu": f"{cpu_name()}, {torch.get_num_threads()} threads",
            "cpu_id": cpu_id(),
            "precision": precision(device)}
    try:
        import faiss
        info["faiss"] = getattr(faiss, "__version__", "unknown")
    except ImportError:  # pragma: no cover
        info["faiss"] = "missing"
    if is_cuda(device):
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def knn_index_for(device: torch.device | str, index: str = "flat") -> str:
    """The k-NN backend for embeddings on `device`: a faiss GPU index where faiss has
    GPU support; on CUDA without it (e.g. a pip faiss-cpu), the exact torch brute force
    on the GPU ("torch": batched matmul + top-k, far faster than copying to a CPU
    index); faiss on the CPU otherwise. Approximate "ivf" is always faiss."""
    if index == "flat" and is_cuda(device) and not faiss_gpu_available():
        return "torch"
    return index
