"""`make gpu-check`: every CUDA path of the pipeline once, on a small real run, before a
paper run (in the container: `docker/run.sh make gpu-check`). Meant to take under 5 min on
one GPU, mostly compiling (not yet timed on one). One PASS / FAIL line per item, then the
measured pre-training step and the full CIFAR-10 epoch and setting it projects to. Exit
status 1 if any item fails.

    python tools/gpu_check.py                    # the device `dvc repro` would use
    SELCL_DEVICE=cpu python tools/gpu_check.py   # the CPU form (CI): the CUDA items say SKIP

Items, each through the library code the stages run (selcl.train, selcl.augment,
selcl.selection, selcl.device):
  data + augmentation   CIFAR-shaped uint8 images resident on the device, strong and weak
                        views made there (`train._views`)
  short real run        Uns-CL warm-up (eager, as CIFAR's), Sel-CL pre-training (memory read,
                        selection, L_CLS) and fine-tuning compiled as a paper run's
                        (`device.COMPILE_MIN_STEPS` set to 0: these loops are too short to
                        compile otherwise); losses finite
  compiled forwards     torch.compile's forward agrees with the eager network (CUDA)
  CUDA graphs           the compiled training forwards replay as CUDA graphs: no graph skipped
  bf16 autocast         the training passes compute in bf16 and agree with float32 (CUDA)
  selection (faiss)     k-NN selection of 50,000 embeddings with the faiss GPU index (CUDA)
  one DDP process       a one-process NCCL (gloo on the CPU) group: SyncBatchNorm + DDP give
                        the plain network's gradients
"""
from __future__ import annotations

import copy
import math
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from selcl import checkpoint, device as selcl_device  # noqa: E402
from selcl.config import load_params, resolve  # noqa: E402
from selcl.device import (autocast, compile_failure, compiled, compiles, describe, env_flag, faiss_gpu_available,  # noqa: E402
                          get_device, is_cuda, knn_index_for, synchronize)
from selcl.evaluate import embed  # noqa: E402
from selcl.train import TrainData, _views, finetune, make_model, pretrain, run_selection, warmup  # noqa: E402

CIFAR_N, CIFAR_STEPS = 50_000, 391          # training images; steps of batch 128 per epoch
PRETRAIN_EPOCHS, FINETUNE_EPOCHS = 250, 70  # a paper setting: warm-up included in the 250
SETTING = "cifar10_sym20"


class Report:
    """One line per item: PASS / FAIL / SKIP, what was checked, how it came out."""

    def __init__(self):
        self.failed = 0
        self.skipped: list[str] = []

    def line(self, status: str, item: str, detail: str) -> None:
        self.failed += status == "FAIL"
        if status == "SKIP":
            self.skipped.append(item)
        print(f"{status:4}  {item}: {detail}", flush=True)

    def check(self, item: str, fn) -> object:
        """Run `fn()` → (ok, detail[, value]); an exception is a FAIL with its first line."""
        try:
            ok, detail, *value = fn()
        except Exception as exc:  # noqa: BLE001 - every failure becomes one FAIL line
            msg = next((ln for ln in str(exc).splitlines() if ln.strip()), "")
            self.line("FAIL", item, f"{type(exc).__name__}: {msg}"[:300])
            return None
        self.line("PASS" if ok else "FAIL", item, detail)
        return value[0] if value else None


def random_images(n: int, num_classes: int, device, seed: int = 0) -> TrainData:
    """CIFAR-shaped training data on `device`: n uint8 3×32×32 images, labels with 20 %
    symmetric noise, a 256-image test set. Noise around one colour per class, so that even
    a barely trained encoder groups a class and the selection keeps most clean examples:
    what is checked here is that every path runs and how fast, not what it learns."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, num_classes, (n + 256,), generator=g)
    colour = torch.randint(48, 208, (num_classes, 3, 1, 1), generator=g).float()
    x = (colour[y] + 40 * torch.randn(n + 256, 3, 32, 32, generator=g)).clamp(0, 255).to(torch.uint8)
    flip = torch.rand(n, generator=g) < 0.2
    noisy = torch.where(flip, torch.randint(0, num_classes, (n,), generator=g), y[:n])
    return TrainData(x=x[:n].to(device), noisy=noisy.to(device), clean=y[:n].to(device),
                     x_test=x[n:].to(device), y_test=y[n:].to(device),
                     mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616), num_classes=num_classes)


def config(cuda: bool, n: int) -> dict:
    """The paper's CIFAR-10 setting, shortened: one warm-up epoch, two pre-training epochs
    (the second reads the memory), two fine-tuning epochs. On the CPU the CPU presets'
    small network and batch 64."""
    cfg = copy.deepcopy(resolve(load_params(ROOT / "params.yaml"), SETTING))
    if not cuda:
        cfg["model"].update(arch="small", width=16, blocks=[1, 1, 1, 1])
        for section in ("pretrain", "finetune"):
            cfg[section]["batch_size"] = 64
    per_class = n // 10                          # the memory holds at most the data set
    cfg["warmup"].update(epochs=1, queue_size=min(cfg["warmup"]["queue_size"], n))
    # k: the paper's 250 neighbours need classes of 250 images or more (the 50,000-image
    # selection check uses it); the short run's classes have 50-250
    cfg["pretrain"].update(epochs=3, memory_start_epoch=3, lr_warmup_epochs=1, lr_decay_epochs=[],
                           queue_per_class=min(cfg["pretrain"]["queue_per_class"], per_class), k=20)
    cfg["finetune"].update(epochs=2, bootstrap_start=0, eval_last=1)
    return cfg


def max_rel_diff(a, b) -> float:
    """max |a − b| / max |b| over the tensors of two network outputs."""
    ta = [t for t in (a if isinstance(a, (tuple, list)) else [a]) if isinstance(t, torch.Tensor)]
    tb = [t for t in (b if isinstance(b, (tuple, list)) else [b]) if isinstance(t, torch.Tensor)]
    return max(float((x.detach().float() - y.detach().float()).abs().max()
                     / y.detach().float().abs().max().clamp_min(1e-12)) for x, y in zip(ta, tb))


def check_data(dev, data: TrainData, batch: int):
    g = torch.Generator(device=dev).manual_seed(0)
    strong = _views(data.x[:batch], g, data, strong=True, n=2)
    weak = _views(data.x[:batch], g, data, strong=False)
    views = [*strong, weak]
    ok = all(v.device.type == dev.type and v.dtype == torch.float32 and v.shape == (batch, 3, 32, 32)
             and bool(torch.isfinite(v).all()) for v in views) and data.x.device.type == dev.type
    return ok, f"{data.n} uint8 images on {data.x.device}; 2 strong + 1 weak views of {batch} made there, finite"


def short_run(dev, cfg: dict, data: TrainData, work: Path):
    """warm-up → pre-training → fine-tuning through selcl.train, as the stages call them."""
    ck = lambda name: checkpoint.Checkpointer(work / f"{name}.pt", f"gpu-check-{name}", 10_000)  # noqa: E731
    t0 = time.perf_counter()
    warm = warmup(cfg, data, dev, ck("warmup"))  # eager, as CIFAR's one warm-up epoch (worth_compiling)
    selcl_device.COMPILE_MIN_STEPS = 0           # compile the short loops that follow as a paper run's
    pre = pretrain(cfg, data, warm, dev, ck("pretrain"))
    ft_marks = [time.perf_counter()]
    ft = finetune(cfg, data, pre, dev, ck("finetune"), on_epoch=lambda h: ft_marks.append(time.perf_counter()))
    synchronize(dev)
    rows = pre["history"] + ft["history"]
    finite = all(math.isfinite(v) for r in rows for k, v in r.items() if isinstance(v, float) and "loss" in k)
    b = cfg["pretrain"]["batch_size"]
    step_s = pre["timing"][-1]["train_s"] / math.ceil(data.n / b)    # the last epoch: compiled, warm
    ft_step_s = (ft_marks[-1] - ft_marks[-2]) / max(1, math.ceil(ft["n_train"] / cfg["finetune"]["batch_size"]))
    detail = (f"warm-up 1 + pre-training 2 + fine-tuning 2 epochs on {data.n} images in "
              f"{time.perf_counter() - t0:.0f} s, losses finite" if finite else "a loss is not finite")
    return finite, detail, (pre, step_s, ft_step_s)


def check_compiled(dev, cfg: dict, data: TrainData, batch: int):
    """The compiled training forward (CUDA graphs) against the eager network on one batch."""
    model = make_model(cfg["model"], data.num_classes, dev)
    x = _views(data.x[:batch], torch.Generator(device=dev).manual_seed(1), data)
    fwd = compiled(model)
    if fwd is model:
        return False, f"nothing compiles: {compile_failure(dev.type) or 'device.compiles says no'}"
    graphed = [fwd(x) for _ in range(3)][-1]               # record, then replay
    graphed = [t.detach().clone() for t in (graphed if isinstance(graphed, (tuple, list)) else [graphed])]
    eager = model(x)
    diff = max_rel_diff(graphed, eager)
    reason = compile_failure(dev.type)
    if reason:
        return False, f"fell back to eager: {reason}"
    return diff < 1e-2, f"compiled {cfg['model']['arch']} forward of {batch} rows, max rel. diff to eager {diff:.1e}"


def check_cuda_graphs(dev):
    from torch._dynamo.utils import counters
    if not compiles(dev):
        return False, f"nothing compiles: {compile_failure(dev.type)}"
    skips = dict(counters["inductor"]).get("cudagraph_skips", 0)
    return skips == 0, ("every compiled training graph replayed as a CUDA graph" if skips == 0
                        else f"{skips} compiled graph(s) ran without CUDA graphs (TORCH_LOGS=perf_hints says why)")


def check_bf16(dev, cfg: dict, data: TrainData, batch: int):
    """The convolutions compute in bf16 under `device.autocast` (the bulk of the arithmetic;
    the network keeps some heads and its outputs in float32), and the outputs agree with
    float32's."""
    model = make_model(cfg["model"], data.num_classes, dev)
    x = _views(data.x[:batch], torch.Generator(device=dev).manual_seed(2), data)
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append(o.dtype)) for m in model.modules()
             if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        ref = model(x)
        seen.clear()
        with autocast(dev):
            out = model(x)
    for h in hooks:
        h.remove()
    diff = max_rel_diff(out, ref)
    n_bf16 = seen.count(torch.bfloat16)
    return seen and n_bf16 == len(seen) and diff < 0.1, (f"{n_bf16} of {len(seen)} convolutions in bf16, outputs' "
                                                         f"max rel. diff to float32 {diff:.1e}")


def check_selection(dev, cfg: dict, n: int, model_state: dict):
    data = random_images(n, 10, dev, seed=3)
    cfg = copy.deepcopy(cfg)
    cfg["pretrain"]["k"] = resolve(load_params(ROOT / "params.yaml"), SETTING)["pretrain"]["k"]   # the paper's
    model = make_model(cfg["model"], 10, dev)
    model.load_state_dict(model_state)
    backend = knn_index_for(dev, cfg["pretrain"]["knn_index"])
    run_selection(model, data, cfg["pretrain"], epoch=1)               # once to warm up
    synchronize(dev); t0 = time.perf_counter()
    z, _ = embed(model, data.x, data.mean, data.std)
    synchronize(dev); t1 = time.perf_counter()
    sel = run_selection(model, data, cfg["pretrain"], epoch=2, z=z)
    synchronize(dev); t2 = time.perf_counter()
    gpu = faiss_gpu_available()
    where = "faiss GPU index" if gpu and backend == "flat" else ("torch brute force on the GPU" if backend == "torch"
                                                                  else "faiss-cpu")
    ok = sel is not None and (gpu or not is_cuda(dev))
    detail = (f"embed {t1 - t0:.2f} s + select (k = {cfg['pretrain']['k']}) {t2 - t1:.2f} s of {n} images, "
              f"{where}, |T| = {int(sel.examples.sum())}")
    if is_cuda(dev) and not gpu:
        detail += " (the installed faiss has no GPU support: install faiss-gpu, docker/requirements-gpu.txt)"
    return ok, detail, (t1 - t0, t2 - t1)


def check_ddp(dev, cfg: dict, data: TrainData, batch: int):
    """DistributedDataParallel in a process group of one (NCCL on CUDA): one forward and
    backward give the plain network's gradients."""
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if is_cuda(dev) else "gloo"
    tdist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        plain = make_model(cfg["model"], data.num_classes, dev)
        net = copy.deepcopy(plain)
        if is_cuda(dev):
            net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)
        ddp = DistributedDataParallel(net, device_ids=[dev.index or 0] if is_cuda(dev) else None,
                                      find_unused_parameters=False)
        x = _views(data.x[:batch], torch.Generator(device=dev).manual_seed(4), data)
        for m in (plain, ddp):
            out = m(x)
            sum(t.float().square().mean() for t in (out if isinstance(out, (tuple, list)) else [out])).backward()
        synchronize(dev)
        diff = max(float((a.grad - b.grad).abs().max() / b.grad.abs().max().clamp_min(1e-12))
                   for a, b in zip(net.parameters(), plain.parameters()) if b.grad is not None)
    finally:
        tdist.destroy_process_group()
    return diff < 1e-3, f"{backend} group of one, {'SyncBatchNorm + ' if is_cuda(dev) else ''}DDP: gradients " \
                        f"match the plain network's (max rel. diff {diff:.1e})"


def main() -> int:
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    dev = get_device()
    cuda = is_cuda(dev)
    torch.backends.cudnn.benchmark = True
    info = describe(dev)
    print(f"gpu-check on {info.get('gpu', info['device'])} ({dev}; torch {info['torch']}, CUDA {info['cuda']}, "
          f"faiss {info['faiss']}; compile {'on' if compiles(dev) else 'off'})", flush=True)
    cfg = config(cuda, n=2560 if cuda else 512)
    batch = cfg["pretrain"]["batch_size"]
    data = random_images(2560 if cuda else 512, 10, dev)
    r = Report()
    r.check("data + augmentation on the device", lambda: check_data(dev, data, batch))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        run = r.check("short real run", lambda: short_run(dev, cfg, data, Path(work)))
    cuda_only = f"CUDA only, not checked on {dev}"
    if cuda and env_flag("SELCL_COMPILE", True):
        r.check("compiled forwards (torch.compile)", lambda: check_compiled(dev, cfg, data, batch))
        r.check("CUDA graphs", lambda: check_cuda_graphs(dev))
    else:
        for item in ("compiled forwards (torch.compile)", "CUDA graphs"):
            r.line("SKIP", item, "SELCL_COMPILE=0 is set" if cuda else cuda_only)
    if cuda:
        r.check("bf16 autocast", lambda: check_bf16(dev, cfg, data, batch))
    else:
        r.line("SKIP", "bf16 autocast", cuda_only)
    sel_n = CIFAR_N if cuda else 2000
    sel_s = r.check(f"selection ({'faiss-gpu' if cuda else 'faiss-cpu'})",
                    lambda: check_selection(dev, cfg, sel_n, run[0]["model"] if run else
                                            make_model(cfg["model"], 10, dev).state_dict()))
    if not cuda:
        r.skipped.append("selection with faiss-gpu")
    r.check("one DDP process", lambda: check_ddp(dev, cfg, data, batch))

    if run and sel_s is not None:
        _, step_s, ft_step_s = run
        # to 50,000 images (a factor 1 on CUDA): embedding grows with n, flat k-NN with n²
        sel_full = sel_s[0] * CIFAR_N / sel_n + sel_s[1] * (CIFAR_N / sel_n) ** 2
        epoch_s = CIFAR_STEPS * step_s + sel_full
        setting_min = (PRETRAIN_EPOCHS * epoch_s + FINETUNE_EPOCHS * CIFAR_STEPS * ft_step_s) / 60
        print(f"time  pre-training step {step_s * 1e3:.1f} ms ({cfg['model']['arch']}, batch {batch}); "
              f"projected CIFAR-10 pre-training epoch {epoch_s:.1f} s ({CIFAR_STEPS} steps + selection "
              f"{sel_full:.2f} s{'' if cuda else ', scaled from ' + str(sel_n) + ' images'}); fine-tuning step "
              f"{ft_step_s * 1e3:.1f} ms; projected setting ({PRETRAIN_EPOCHS} + {FINETUNE_EPOCHS} epochs) "
              f"{setting_min:.0f} min", flush=True)
    if r.skipped:
        print(f"not checked on {dev}: {', '.join(r.skipped)}" + ("" if cuda else "; run `make gpu-check` on a "
              "CUDA machine (in the container: docker/run.sh make gpu-check)"), flush=True)
    print(f"gpu-check: {'FAILED (' + str(r.failed) + ' item' + 's' * (r.failed > 1) + ')' if r.failed else 'all checked items PASS'}",
          flush=True)
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
