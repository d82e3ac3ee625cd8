"""Training loops: Uns-CL warm-up, Sel-CL pre-training, Sel-CL+ fine-tuning, CE baseline.

Read top to bottom: `TrainData` (GPU-resident uint8 images), the LR schedule, then
one function per stage. Each loop

  * keeps images on the training device as uint8 and augments them there in
    batches (no DataLoader workers, no host↔device copies inside a step);
  * draws every random number from one `torch.Generator` (and a numpy Generator
    for Beta draws), so a run is a pure function of its params and seeds;
  * saves its complete state (models, EMA, optimiser, queues, memory, RNG states,
    last selection, history) every `checkpoint_every` epochs and resumes from it,
    continuing exactly as if never stopped;
  * returns a per-epoch history (list of dicts) that the stage writes for `dvc plots`.

SPEC sections: warm-up §4, selection §5, pre-training §6 with the authors' iteration of
§10.2 (one run and one lr schedule over warm-up + pre-training, §10.3), fine-tuning §7.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import augment, dist, losses
from .checkpoint import Checkpointer
from .device import (autocast, compiled, compiles, eager_step, env_flag, in_eager_step, is_cuda, knn_index_for,
                     memory_format, split_views, synchronize, worth_compiling)
from .evaluate import argmax_accuracy, embed, test_accuracy, weighted_knn_accuracy
from .memory import KeyQueue, LabelledMemory
from .errors import ConfigError, DivergedError
from .models import EMA, bn_groups, build_model, frozen_bn_statistics, per_group_sync_bn, set_bn_replicas
from .pairs import configured_rule, pair_rule
from .selection import Selection, select


# ----------------------------------------------------------------------------- data
@dataclass
class TrainData:
    """Everything a loop needs, resident on the training device."""
    x: torch.Tensor          # uint8 [N,3,H,W]
    noisy: torch.Tensor      # int64 [N]   ỹ
    clean: torch.Tensor      # int64 [N]   y (evaluation only)
    x_test: torch.Tensor     # uint8 [M,3,H,W]
    y_test: torch.Tensor     # int64 [M]
    mean: tuple
    std: tuple
    num_classes: int
    crop: int | None = None             # network input crop (data.crop; None: whole image)
    crop_scale: tuple = (0.08, 1.0)     # strong views' RandomResizedCrop scale (data.crop_scale)
    x_test2: torch.Tensor | None = None  # a second test set (data.extra_test_path), else None
    y_test2: torch.Tensor | None = None

    @classmethod
    def build(cls, arrays: dict, labels: dict, device: torch.device) -> "TrainData":
        t = lambda a, dt=None: torch.as_tensor(np.ascontiguousarray(a), dtype=dt).to(device)  # noqa: E731
        return cls(x=t(arrays["x_train"]), noisy=t(labels["noisy"], torch.int64),
                   clean=t(labels["clean"], torch.int64), x_test=t(arrays["x_test"]),
                   y_test=t(arrays["y_test"], torch.int64), mean=tuple(arrays["mean"]),
                   std=tuple(arrays["std"]), num_classes=int(labels["num_classes"]),
                   crop=arrays.get("crop"), crop_scale=tuple(arrays.get("crop_scale", cls.crop_scale)),
                   x_test2=None if arrays.get("x_test2") is None else t(arrays["x_test2"]),
                   y_test2=None if arrays.get("y_test2") is None else t(arrays["y_test2"], torch.int64))

    @classmethod
    def load(cls, run_dir, device: torch.device) -> "TrainData":
        """Read runs/<setting>/data.npz and labels.npz (outputs of the data and noise stages)."""
        from .checkpoint import CheckpointError
        from .data import load_arrays
        from pathlib import Path
        labels_path = Path(run_dir) / "labels.npz"
        if not labels_path.exists():
            raise CheckpointError(f"{labels_path}: not found (run the noise stage first)")
        arrays = load_arrays(Path(run_dir) / "data.npz")
        try:
            with np.load(labels_path) as f:
                labels = {k: f[k] for k in f.files}
            labels["noisy"], labels["clean"], labels["num_classes"]  # noqa: B018 - all present
        except Exception as exc:  # noqa: BLE001 - any failure to read means corrupt
            raise CheckpointError(f"{labels_path}: corrupt labels file ({type(exc).__name__}); "
                                  f"delete it and rerun the noise stage") from None
        d = {"x_train": arrays.x_train, "y_train": arrays.y_train, "x_test": arrays.x_test,
             "y_test": arrays.y_test, "mean": arrays.mean, "std": arrays.std,
             "crop": arrays.crop, "crop_scale": arrays.crop_scale,
             "x_test2": arrays.x_test2, "y_test2": arrays.y_test2}
        return cls.build(d, labels, device)

    @property
    def n(self) -> int:
        return self.x.shape[0]


def make_model(model_cfg: dict, num_classes: int, device: torch.device):
    torch.manual_seed(model_cfg["seed"])            # paper: initialisation seed 1
    model = build_model(model_cfg["arch"], num_classes, width=model_cfg["width"],
                        blocks=tuple(model_cfg["blocks"]), proj_dim=model_cfg["proj_dim"])
    replicas, ranks = model_cfg["bn_replicas"], dist.world_size()
    if replicas == 1:   # BN over the whole batch (DDP on CUDA: SyncBatchNorm, the global batch)
        model = per_group_sync_bn(dist.sync_batchnorm(model, device))
    else:               # BN per shard, as nn.DataParallel over `replicas` GPUs (models._PerGroupBN);
        if replicas % ranks:  # under DDP a rank's batch holds replicas/ranks shards, not synchronised
            raise ConfigError(f"model.bn_replicas = {replicas}: must be a multiple of the number of "
                              f"processes ({ranks}), each taking bn_replicas / processes of the shards")
        set_bn_replicas(model, replicas // ranks)
    return model.to(device).to(memory_format=memory_format(device))


def training_forward(model, device, unused_heads: bool = False, cuda_graphs: bool = True):
    """What the training loops call for forward passes with gradient: DDP under torchrun,
    else (CUDA) the compiled `model` (CUDA-graphed unless `cuda_graphs` is False: a graph
    back-propagated twice), else `model` itself."""
    if dist.world_size() > 1:
        return dist.wrap(model, device, unused_heads=unused_heads)
    return compiled(model, cuda_graphs=cuda_graphs)


def key_forward(ema: EMA):
    """The EMA network's forward for keys (no gradient, batch statistics): compiled on CUDA
    in one process (under DDP its SyncBatchNorm stays eager)."""
    return compiled(ema.model) if dist.world_size() == 1 else ema.model


def sgd(model, cfg: dict):
    # fused=True on CUDA: the whole update (wd, momentum, step) in one kernel per dtype
    # group instead of several foreach passes; the same arithmetic, fewer launches.
    fused = is_cuda(next(model.parameters()).device)
    return torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"],
                           weight_decay=cfg["weight_decay"], fused=fused or None)


LR_WARMUP_MULTIPLIER = 100   # the ramp starts at lr / 100 (the authors' multiplier)


def lr_at(cfg: dict, epoch: int, it: int, iters: int) -> float:
    """The learning rate of iteration `it` (0-based) of global epoch `epoch` (1-based), the
    authors' GradualWarmupScheduler + MultiStepLR stepped per iteration (SPEC §10.3):
    with t = (epoch − 1)·iters + it and W = lr_warmup_epochs·iters,
      t ≤ W:  lr/100 · (99·t/W + 1)                 (linear from lr/100 to lr)
      t > W:  lr · lr_decay^#{m ∈ lr_decay_epochs : t ≥ m·iters}   (×0.1 *after* epoch m)
    One schedule spans warm-up and pre-training (global epochs), so 250 epochs with
    milestones [125, 200] decay from global epochs 126 and 201."""
    base, mult = cfg["lr"], LR_WARMUP_MULTIPLIER
    t, W = (epoch - 1) * iters + it, cfg.get("lr_warmup_epochs", 0) * iters
    if W > 0 and t <= W:
        return base / mult * ((mult - 1) * t / W + 1)
    return base * cfg.get("lr_decay", 1.0) ** sum(t >= m * iters for m in cfg.get("lr_decay_epochs", []))


def set_lr(opt, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def _views(x_uint8, g, data, strong: bool = True, n: int = 1):
    """`n` independently augmented float views of a uint8 batch, made in ONE call on
    the concatenated batch (every sample draws its own parameters, so this equals n
    separate calls in distribution). On CUDA the eager augmentation is ~300 tiny
    kernels whose cost is per call, not per image: one call for all views and
    torch.compile (`compiled=True`) cut it from ~4×6 ms to ~1 ms per step."""
    x = x_uint8.repeat(n, 1, 1, 1) if n > 1 else x_uint8
    if strong:
        v = augment.strong_augment(x, g, data.mean, data.std, data.crop, scale=data.crop_scale,
                                   # SELCL_COMPILE=0 and an epoch's last, smaller batch: eager
                                   compiled=not in_eager_step() and compiles(x.device))
    else:
        v = augment.weak_augment(x, g, data.mean, data.std, crop=data.crop)
    v = v.contiguous(memory_format=memory_format(x.device))
    return v.chunk(n) if n > 1 else v


def steps_per_epoch(n: int, batch_size: int, drop_last: bool = False) -> int:
    """Mini-batches `_batches` yields per epoch: ⌈n / batch_size⌉ as the authors' loaders
    (DataLoader default drop_last=False: 391 steps per CIFAR epoch, the last of 80), or
    ⌊n / batch_size⌋ with `drop_last`. Under DDP a last batch smaller than the number of
    processes is skipped (see `_batches`)."""
    full, tail = divmod(n, batch_size)
    return full + (not drop_last and tail >= dist.world_size())


def _last_smaller(it: int, n: int, batch_size: int) -> bool:
    """Whether step `it` of `_batches` is the epoch's last, smaller batch (kept unless
    drop_last; it runs eagerly on CUDA: `device.eager_step`). A set smaller than one batch
    has no full batch to compile for, and compiles its one batch."""
    return it == n // batch_size > 0


def _batches(n: int, batch_size: int, g: torch.Generator, device, drop_last: bool = False):
    """Shuffled global index batches of `batch_size`. When `batch_size` does not divide n
    the last one is smaller and kept, as the authors' loaders keep it, so every example is
    seen every epoch; `drop_last` drops it instead (a setting's `drop_last`: on tiny sets a
    last batch of a few images is a loud full-lr SGD step). Under DDP `g` is the order
    generator, seeded alike on every rank, and each rank keeps its shard (`dist.shard`) of
    every batch; a last batch is cut to a multiple of the number of processes."""
    perm = torch.randperm(n, generator=g, device=device)
    full = n // batch_size
    for i in range(steps_per_epoch(n, batch_size, drop_last)):
        idx = perm[i * batch_size:(i + 1) * batch_size]
        if i == full:                             # the last, smaller batch: a multiple of the ranks
            idx = idx[:len(idx) - len(idx) % dist.world_size()]
        yield dist.shard(idx)


class EpochMeans:
    """Per-example means of the step outputs over one epoch, as the authors' meters
    (`AverageMeter.update(loss, batch_size)`): a step's value weighs by its batch size,
    so the short last batch counts for the examples it holds, not as a full one. Sums
    stay on the device (no sync per step); under DDP every rank holds an equal shard,
    so the average of the ranks' means is the mean over all examples."""

    def __init__(self):
        self.sums: dict = {}
        self.seen = 0

    def add(self, out: dict, n: int) -> None:
        for k, v in out.items():
            self.sums[k] = self.sums.get(k, 0.0) + v * n
        self.seen += n

    def means(self) -> dict:
        return {k: float(dist.average(torch.as_tensor(v))) / max(self.seen, 1) for k, v in self.sums.items()}


def _progress(iterable, desc: str, total=None, initial=0):
    return tqdm(iterable, desc=desc, total=total, initial=initial, dynamic_ncols=True, leave=True)


def _rng_state(g: torch.Generator, np_rng: np.random.Generator, order=None) -> dict:
    """Every generator's state; under DDP every rank's (a collective: all ranks call it)."""
    state = {"torch": g.get_state(), "numpy": np_rng.bit_generator.state}
    if order is not None and order is not g:
        state["order"] = order.get_state()
    return {"ranks": dist.all_objects(state)} if dist.world_size() > 1 else state


def _set_rng_state(g, np_rng, state, order=None, source: str | None = None) -> None:
    """Continue every generator from `state`. It must come from as many processes on the same
    kind of device; otherwise one error naming `source` (a stage output) or the checkpoint."""
    from .checkpoint import CheckpointError, rerun_error, saved_processes
    saved = saved_processes(state)
    mine = state["ranks"][dist.rank()] if "ranks" in state and saved == dist.world_size() else state
    if saved != dist.world_size():
        wrong = f"written by {saved} process(es), read by {dist.world_size()}"
    elif mine["torch"].numel() != g.get_state().numel():       # a CPU generator's state is 5,056 bytes, CUDA's 16
        wrong = f"its random state is not for a {g.device.type} generator (another device)"
    else:
        wrong = None
    if wrong and source is None:
        raise CheckpointError(f"checkpoint {wrong}: resume with the same number of processes "
                              f"(SELCL_NPROC) and device (or delete the checkpoint to start over)")
    if wrong:
        raise rerun_error(source, wrong)
    state = mine
    g.set_state(state["torch"])
    np_rng.bit_generator.state = state["numpy"]
    if order is not None and "order" in state:
        order.set_state(state["order"])


def _generators(seed: int, device):
    """(g, np_rng, order): augmentation/mixup draws and the batch order. Under DDP each
    rank draws its own augmentations (seed offset by rank) while `order` is seeded
    alike everywhere, so all ranks shard the same global batches; in one process
    `order` is `g` itself (one stream, as before DDP existed)."""
    r = dist.rank()
    g = torch.Generator(device=device)
    g.manual_seed(seed + 100_003 * r)
    order = g
    if dist.world_size() > 1:
        order = torch.Generator(device=device)
        order.manual_seed(seed)
    return g, np.random.default_rng(seed + 100_003 * r), order


# ------------------------------------------------------------------- warm-up (§4)
def warmup(cfg: dict, data: TrainData, device, ckpt: Checkpointer, on_epoch=None):
    """Global epochs 1..warmup.epochs of the one pre-training run (SPEC §4, §10.3).

    uns_cl (paper): MoCo only, query from view 1 (online), key from view 2 (EMA), negatives
    from a queue of EMA keys, τ = 0.1; as in the authors' code the labelled memory is
    already filled with the EMA embeddings of the two mixed views. sup_cl (Table 7):
    the supervised term on all same-noisy-label pairs (no mixup) + L_CLS on all examples,
    the memory term included from global epoch memory_start_epoch, as in pre-training.
    Optimiser, EMA, queue and memory carry over into pre-training (one run, one schedule)."""
    wc, pc = cfg["warmup"], cfg["pretrain"]
    tr = make_pretrainer(cfg, data.num_classes, device, ema_momentum=wc["ema"])
    history, start = [], 1
    state = ckpt.load()
    if state is not None:
        tr.load_state_dict(state)
        history, start = state["history"], state["epoch"] + 1
    iters = steps_per_epoch(data.n, pc["batch_size"], pc["drop_last"])
    short = not worth_compiling((wc["epochs"] - start + 1) * iters)   # CUDA: eager (CIFAR's one epoch)
    everyone = torch.arange(data.n, device=device)
    same_label = pair_rule(None, data.noisy, data.clean, selected_sets="all")
    for epoch in _progress(range(start, wc["epochs"] + 1), "warm-up", total=wc["epochs"], initial=start - 1):
        read_memory = reads_memory(pc, epoch)   # Sup-CL: only a warm-up over 3 epochs reaches it
        tr.model.train(); tr.ema.model.train()
        means = EpochMeans()
        for it, idx in enumerate(_batches(data.n, pc["batch_size"], tr.order, device, pc["drop_last"])):
            set_lr(tr.opt, lr_at(pc, epoch, it, iters))
            with eager_step(short or _last_smaller(it, data.n, pc["batch_size"])):
                if wc["method"] == "uns_cl":
                    out = tr.uns_step(data, idx)
                else:
                    out = tr.step(data, idx, same_label, everyone, read_memory, supervised_warmup=True)
            means.add(out, len(idx))
        row = {"epoch": epoch, "lr": tr.opt.param_groups[0]["lr"], **means.means()}
        history.append(row)
        if on_epoch:
            on_epoch(history)           # live history (the stage rewrites its CSV)
        ckpt.maybe_save(epoch, wc["epochs"], lambda: {**tr.state_dict(), "history": history, "epoch": epoch})
    return {**tr.state_dict(), "history": history}


# ------------------------------------------------------------- selection (§5)
def run_selection(model, data: TrainData, pc: dict, epoch: int, z=None) -> Selection:
    """Select T and G from z of the online network on un-augmented training images."""
    if z is None:
        dist.sync_buffers(model)
        z, _ = embed(model, data.x, data.mean, data.std, crop=data.crop)
    try:
        return select(z, data.noisy, data.num_classes, k=pc["k"], alpha=pc["alpha"], beta=pc["beta"],
                      weighting=pc["knn_weighting"], seed=epoch, clean_labels=data.clean,
                      knn_index=knn_index_for(z.device, pc["knn_index"]), pseudo_labels=pc["pseudo_labels"],
                      version=pc["selection_version"])
    except DivergedError as exc:
        raise DivergedError(f"pre-training diverged by epoch {epoch}: {exc} (nothing written before is "
                            f"touched; a smaller pretrain.lr is the usual fix)") from None


def _selection_log(sel: Selection) -> dict:
    return {k: (float(v) if isinstance(v, (int, float, np.floating, np.integer)) else v)
            for k, v in sel.stats.items() if not isinstance(v, (list, dict, np.ndarray, torch.Tensor))}


# ---------------------------------------------------- pre-training (§6, §10.2)
@dataclass
class Pretrainer:
    """The mutable state of Sel-CL pre-training (and of the warm-up, its first epoch).
    `step` is one iteration of SPEC §10.2, `uns_step` one Uns-CL warm-up iteration."""
    model: torch.nn.Module
    ema: EMA
    opt: torch.optim.Optimizer
    queue: KeyQueue                 # MoCo keys: negatives of u_i
    memory: LabelledMemory          # EMA embeddings + probabilities + dataset index (mixed views)
    g: torch.Generator
    np_rng: np.random.Generator
    pc: dict
    net: Callable | None = None      # training forward of `model` (DDP / CUDA graphs); None: model
    ema_net: Callable | None = None  # forward of the EMA network; None: ema.model
    order: torch.Generator | None = None  # batch order (DDP: same on all ranks); None: `g`
    uns_temperature: float = 0.1    # τ of the MoCo loss u_i (warmup.temperature; the authors' uns_t)
    sim_recompute: bool = False     # L_SIM's gradient from its own forward (see `step`; SELCL_SIM_RECOMPUTE)

    def __post_init__(self):
        # one call per view (CPU), decided once; under DDP the concatenated call, whose
        # forwards the reducer expects
        self.split_views = split_views(next(self.model.parameters()).device) and dist.world_size() == 1
        self.net = self.net if self.net is not None else self.model
        self.ema_net = self.ema_net if self.ema_net is not None else self.ema.model
        self.order = self.order if self.order is not None else self.g
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def mixup(self, B: int, device, on: bool = True):
        """λ ~ Beta(1,1), λ = max(λ, 1−λ), partner by random permutation (λ = 1 and the
        identity when mixup is off: the partner part then weighs 0)."""
        if on and self.pc["mixup"]:
            return losses.mixup_params(B, self.g, device)
        return torch.ones((), device=device), torch.arange(B, device=device)

    def _online(self, parts: list):
        """The online network (with gradient) on `parts`, each part its own BatchNorm
        batch, exactly as the authors' separate calls. CUDA: one call on the concatenation
        with per-part statistics (models.bn_groups), the convolutions run once on the
        whole batch; CPU: one call per part (`device.split_views`: cache-sized calls)."""
        return self._forward(self.net, self.model, parts)

    @torch.no_grad()
    def _ema(self, parts: list):
        """The same for the EMA network, without gradient (BatchNorm: batch statistics)."""
        return self._forward(self.ema_net, self.ema.model, parts)

    def _forward(self, net, model, parts: list) -> tuple[list, list]:
        """Per part, its embeddings z and its logits (float32). Per part, not concatenated:
        on the CPU's call per view a loss that reads some parts (L_SIM: the mixed views)
        then back-propagates through their calls only; a slice of a concatenation would
        run the other calls' backward too, on zero gradients (an eighth of a step's
        convolution backward, for the same bits)."""
        device = parts[0].device
        if len(parts) > 1 and self.split_views:
            with autocast(device):
                outs = [net(p) for p in parts]
            return [o[0].float() for o in outs], [o[1].float() for o in outs]
        with autocast(device), bn_groups(model, len(parts)):
            z, logits = net(torch.cat(parts) if len(parts) > 1 else parts[0])
        sizes = [p.shape[0] for p in parts]
        return list(z.float().split(sizes)), list(logits.float().split(sizes))

    def _remember(self, z_ema_mix: torch.Tensor, p_ema_mix: torch.Tensor, idx: torch.Tensor) -> None:
        # Queue and memory get the whole global batch, in rank order, on every rank.
        self.memory.enqueue(dist.gather(z_ema_mix), dist.gather(p_ema_mix), dist.gather(torch.cat([idx, idx])))

    def uns_step(self, data: "TrainData", idx: torch.Tensor) -> dict:
        """Uns-CL warm-up iteration (SPEC §4; the authors' `train_uns`): MoCo on the
        un-mixed views; the memory receives the EMA entries of the two mixed views."""
        B, device = idx.shape[0], idx.device
        v1, v2 = _views(data.x[idx], self.g, data, n=2)
        (lam1, p1), (lam2, p2) = self.mixup(B, device), self.mixup(B, device)
        m1, m2 = losses.mix(v1, lam1, p1), losses.mix(v2, lam2, p2)
        (q,), _ = self._online([v1])
        (k, *zk_mix), (_, *logits_k_mix) = self._ema([v2, m1, m2])
        loss = losses.moco_loss(q, k, self.queue.keys, self.uns_temperature)
        self._apply(loss)
        self.queue.enqueue(dist.gather(k))
        self._remember(torch.cat(zk_mix), torch.cat(logits_k_mix).softmax(1), idx)
        return {"loss": loss.detach()}

    def step(self, data: "TrainData", idx: torch.Tensor, rule, T_idx: torch.Tensor,
             read_memory: bool, supervised_warmup: bool = False) -> dict:
        """One Sel-CL iteration, SPEC §10.2 (the authors' `train_sel`):

          u_i    MoCo loss of the un-mixed view 1 against the key queue            (1)
          L_sel  mean_i(s_i·u_i) + batch term + memory term                        (4, 5)
          L_SIM  batch term + memory term; its gradient clipped to norm 0.25       (6)
          L_CLS  mixup CE on a batch drawn with replacement from T, λ per view     (7)
          update g = clip(∇λ_s·L_SIM) + ∇(L_sel + λ_c·L_CLS), then the EMA
                 (sim_grad_clip null, grad_clip c: g = clip_c(∇(L_sel + λ_c·L_CLS + λ_s·L_SIM)),
                 the authors' WebVision step)

        supervised_warmup: the Sup-CL warm-up of Table 7 (the authors' `train_sup`): no
        mixup, no u_i, no L_SIM; `rule` = all same-label pairs, T = everyone."""
        pc, device = self.pc, idx.device
        B = idx.shape[0]
        mixup_on = not supervised_warmup
        v1, v2 = _views(data.x[idx], self.g, data, n=2)
        (lam1, p1), (lam2, p2) = self.mixup(B, device, mixup_on), self.mixup(B, device, mixup_on)
        m1, m2 = losses.mix(v1, lam1, p1), losses.mix(v2, lam2, p2)
        use_cls = pc["classifier"] and pc["lambda_cls"] > 0 and len(T_idx) > 0
        if use_cls:   # L_CLS batch: drawn with replacement from T, two strong views, mixup per view
            ic = T_idx[torch.randint(len(T_idx), (B,), generator=self.g, device=device)]
            c1, c2 = _views(data.x[ic], self.g, data, n=2)
            (lc1, pc1), (lc2, pc2) = self.mixup(B, device, mixup_on), self.mixup(B, device, mixup_on)
        use_sim = _uses_sim(pc) and not supervised_warmup
        lam = torch.cat([lam1.expand(B), lam2.expand(B)]).float()
        anchor_ids = torch.cat([idx, idx])                  # dominant example of each anchor
        partner_rows = torch.cat([p1, p2 + B])
        # EMA: un-mixed v2 (the MoCo key), mixed view 1, mixed view 2 (no gradient; its own
        # BatchNorm statistics, so its place among the online calls changes nothing).
        (k, *zk_mix), (_, *logits_k_mix) = self._ema([v2, m1, m2])
        # k is read after the L_SIM recompute pass, whose backward ends a CUDA-graph
        # generation: the EMA graph's output buffer may then be reused (seen on an H200),
        # so k gets memory of its own (B×d, nothing next to a step).
        k, z_ema_mix, p_ema_mix = k.clone(), torch.cat(zk_mix), torch.cat(logits_k_mix).softmax(1)
        self._remember(z_ema_mix, p_ema_mix, idx)           # (3) the memory holds the current batch
        g_sim = None
        # The authors' CIFAR step clips ∇λ_s·L_SIM alone (sim_grad_clip 0.25, below); their
        # WebVision step has one backward of the whole loss, L_SIM in it, and clips the total
        # gradient (grad_clip 1; `_apply`). Read only here: the Sup-CL warm-up has neither.
        sim_own_clip = use_sim and _clips_sim(pc)
        total_clip = None if supervised_warmup else pc["grad_clip"]
        if sim_own_clip and self.sim_recompute:
            # L_SIM's clipped gradient from its own online pass over the mixed views, freed
            # before the main pass: every online graph is then back-propagated once (CUDA
            # graphs allowed) for one extra 2B-row forward. Same values as the retained
            # graph below up to float rounding; BatchNorm running statistics untouched.
            with frozen_bn_statistics(self.model):      # restored after this pass's backward
                _, logits_s = self._online([m1, m2])
                p_s = torch.cat(logits_s).softmax(1)
                batch_s, memory_s = self._candidates(None, p_s, anchor_ids, read_memory)
                l_sim_s = losses.selective_losses(None, p_s, None, lam, anchor_ids, partner_rows, rule.in_G,
                                                  batch_s, memory_s, pc["temperature"])["l_sim"]
                g_sim = self._clipped_sim_grad(pc["lambda_sim"] * l_sim_s, pc["sim_grad_clip"], retain=False)
            l_sim_s = l_sim_s.detach()
            del logits_s, p_s, batch_s, memory_s     # a CUDA graph's outputs: dead before it replays
        # Online: v1 (for u_i), mixed view 1, mixed view 2 in one call, then the two L_CLS
        # views in another (the authors' order of BatchNorm updates). Two calls, not one:
        # the separate gradient of L_SIM then only runs back through the first (3B rows;
        # on the CPU's call per view, through the mixed views' two calls only, as theirs).
        (q, *z_mix), (_, *logits_mix) = self._online([v1, m1, m2])
        if use_cls:
            _, logits_cls = self._online([losses.mix(c1, lc1, pc1), losses.mix(c2, lc2, pc2)])
            logits_cls = torch.cat(logits_cls)
        z_mix, logits_mix = torch.cat(z_mix), torch.cat(logits_mix)
        # (1), with the queue as it was before this batch
        u = losses.moco_loss(q, k, self.queue.keys, self.uns_temperature, reduction="none")
        p_mix = logits_mix.softmax(1)
        batch, memory = self._candidates(z_mix, p_mix, anchor_ids, read_memory)
        L = losses.selective_losses(z_mix, p_mix, None if supervised_warmup else u, lam, anchor_ids,
                                    partner_rows, rule.in_G, batch, memory,
                                    pc["temperature"], similarity=use_sim and g_sim is None)
        loss, l_sim = L["l_sel"], (l_sim_s if g_sim is not None else L["l_sim"])
        out = {"l_sel": loss.detach(), "fallback": L["s"].mean()}
        if use_cls:                                                               # (7)
            yc = data.noisy[ic]
            lc = torch.cat([lc1.expand(B), lc2.expand(B)]).float()
            l_cls = losses.mixup_cross_entropy(logits_cls, torch.cat([yc, yc]),
                                               torch.cat([yc[pc1], yc[pc2]]), lc)
            loss = loss + pc["lambda_cls"] * l_cls
            out["l_cls"] = l_cls.detach()
        if g_sim is None and sim_own_clip:
            g_sim = self._clipped_sim_grad(pc["lambda_sim"] * l_sim, pc["sim_grad_clip"], retain=True)
        elif use_sim and not sim_own_clip:
            loss = loss + pc["lambda_sim"] * l_sim           # one backward (the authors' WebVision step)
        self._apply(loss, g_sim, total_clip)
        self.queue.enqueue(dist.gather(k))                  # (1) after the step: u_i saw the old keys
        if use_sim:
            out["l_sim"] = l_sim.detach()
        out["loss"] = loss.detach()
        return out

    def _candidates(self, z_mix, p_mix, anchor_ids, read_memory: bool):
        """(4) The two terms' candidates: the batch term's are the 2B online mixed rows of
        the (global) batch; the memory term's the whole memory (EMA), read from
        memory_start_epoch (None before, or without a memory). z_mix None: L_SIM only."""
        device, n = anchor_ids.device, anchor_ids.shape[0]
        own = dist.offset(n) + torch.arange(n, device=device)
        cand_ids = dist.gather(anchor_ids)
        batch = losses.Candidates(None if z_mix is None else dist.gather_with_grad(z_mix),
                                  dist.gather_with_grad(p_mix), cand_ids,
                                  torch.ones_like(cand_ids, dtype=torch.bool), own)
        memory = None
        if read_memory and self.pc["memory"] and len(self.memory) > 0:
            memory = losses.Candidates(self.memory.feats, self.memory.probs, self.memory.ids,
                                       self.memory.current_mask(), self.memory.current[0] + own)
        return batch, memory

    def _clipped_sim_grad(self, sim: torch.Tensor, max_norm: float, retain: bool) -> list:
        """∇λ_s·L_SIM over the parameters, averaged over ranks, clipped to a total norm of
        `max_norm` (as `clip_grad_norm_`; 0.25, SPEC §10.2.6). autograd.grad, not backward: the DDP
        reducer sees only the main backward. `retain`: the graph is back-propagated again."""
        g = torch.autograd.grad(sim, self.params, retain_graph=retain, allow_unused=True)
        unused = [gi is None for gi in g]     # the same on every rank: one graph, one model
        g = [torch.zeros_like(p) if gi is None else gi for p, gi in zip(self.params, g)]
        dist.average_(g)
        # ‖∇λ_s·L_SIM‖ over all parameters: _foreach_norm is one fused kernel on CUDA where a
        # per-tensor vector_norm launched ~60 (the profile's 59 norm calls a step); on the CPU
        # the same per-tensor norms, the same bits. The norm stays on the device: no sync.
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(g)))
        # Out of place: with the L_SIM recompute these gradients are outputs of a CUDA-graphed
        # backward, whose memory the next graph generation (the main pass) reuses (seen on an
        # H200); the scaled copies are ours. Same arithmetic as the in-place product.
        g = torch._foreach_mul(g, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return [None if u else gi for u, gi in zip(unused, g)]

    def _apply(self, loss: torch.Tensor, g_sim: list | None = None, max_norm: float | None = None) -> None:
        """One SGD step: the gradient of `loss` plus `g_sim` (L_SIM's clipped gradient,
        `_clipped_sim_grad`), the whole clipped to a total norm of `max_norm` if given (the
        authors' WebVision step: `clip_grad_norm_` after unscaling), then the EMA update."""
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if g_sim is not None:
            grads, adds = [], []
            for p, g in zip(self.params, g_sim):
                if g is None:
                    continue
                if p.grad is None:
                    p.grad = g                 # reached by L_SIM alone (ours: out of place)
                else:
                    grads.append(p.grad); adds.append(g)
            if grads:
                torch._foreach_add_(grads, adds)   # one fused kernel for ∇L + clipped ∇L_SIM
        if max_norm is not None:     # after DDP's reducer: the global batch's gradient
            torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        # A parameter neither loss reaches (the classifier in the Uns-CL warm-up) keeps no
        # gradient, and SGD skips it: no weight decay, no momentum buffer, as in the authors'
        # loop, where zero_grad leaves a missing gradient missing.
        self.opt.step()
        self.ema.update(self.model)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "ema": self.ema.state_dict(),
                "opt": self.opt.state_dict(), "queue": self.queue.state_dict(),
                "memory": self.memory.state_dict(), "rng": _rng_state(self.g, self.np_rng, self.order)}

    def load_state_dict(self, state: dict, rng: bool = True, source: str | None = None) -> None:
        if rng:       # first: a state from another process count or device is one clear error
            _set_rng_state(self.g, self.np_rng, state["rng"], self.order, source=source)
        self.model.load_state_dict(state["model"]); self.ema.load_state_dict(state["ema"])
        self.opt.load_state_dict(state["opt"]); self.queue.load_state_dict(state["queue"])
        self.memory.load_state_dict(state["memory"])


def reads_memory(pc: dict, epoch: int) -> bool:
    """Whether global epoch `epoch` reads the labelled memory: from memory_start_epoch, in
    the Sup-CL warm-up as in pre-training (the authors' `train_sup` and `train_sel` both
    test `epoch > sup_queue_begin`)."""
    return bool(pc["memory"] and epoch >= pc["memory_start_epoch"])


def _uses_sim(pc: dict) -> bool:
    """The Sel-CL step has an L_SIM term (the classifier on, its switch on, λ_s > 0)."""
    return bool(pc["classifier"] and pc["sim_loss"] and pc["lambda_sim"] > 0)


def _clips_sim(pc: dict) -> bool:
    """L_SIM is on with a clip of its own, so each step back-propagates the online graph
    twice (retain_graph)."""
    return _uses_sim(pc) and pc["sim_grad_clip"] is not None


def sim_recompute_enabled(device) -> bool:
    """SELCL_SIM_RECOMPUTE=1: L_SIM's gradient from its own online pass instead of a
    retained graph (`Pretrainer.step`), so that the online network can replay as CUDA
    graphs. Off by default; one process only (under DDP an extra forward would confuse the
    reducer). Never changes a tracked param.

    On CUDA, where the path was meant to pay, it is refused: on an H200
    (bench/results/gpu_real_h200_4/call1_recompute/) its benchmark step (47.9 ms) was no faster than the
    default path's step in real epochs on that machine (47.8 ms), and its one real run
    diverged (L_CLS 10.6 in the first pre-training epoch against 3.9 on the default path,
    the same data and seed; non-finite embeddings two epochs later). On the CPU, where it
    is exact (tests/test_switches.py, with the CUDA-graph memory pool emulated), it stays
    for those tests."""
    on = env_flag("SELCL_SIM_RECOMPUTE", False) and dist.world_size() == 1
    if on and is_cuda(device):
        raise ConfigError("SELCL_SIM_RECOMPUTE=1 is refused on CUDA: measured no faster than the default "
                          "step there, and its one run diverged (bench/results/gpu_real_h200_4/call1_recompute/); "
                          "unset it")
    return on


def make_pretrainer(cfg: dict, num_classes: int, device, warm: dict | None = None,
                    ema_momentum: float | None = None) -> Pretrainer:
    """The pre-training state: fresh (warm-up), or continued from the warm-up's output
    (model, EMA, optimiser, queue, memory: one run, as the authors' script)."""
    pc = cfg["pretrain"]
    recompute = sim_recompute_enabled(device)
    model = make_model(cfg["model"], num_classes, device)
    ema = EMA(model, pc["ema"] if ema_momentum is None else ema_momentum)
    queue = KeyQueue(cfg["warmup"]["queue_size"], cfg["model"]["proj_dim"], device)
    size = pc["queue_per_class"] * num_classes * 2
    if size < 2 * pc["batch_size"]:      # every step enqueues the 2B mixed views (even with memory off)
        raise ConfigError(f"settings.{cfg['name']}.pretrain.queue_per_class = {pc['queue_per_class']}: "
                          f"the memory (queue_per_class·C·2 = {size} entries, C = {num_classes}) must hold "
                          f"a step's 2 × batch_size = {2 * pc['batch_size']} mixed views")
    memory = LabelledMemory(size, cfg["model"]["proj_dim"], num_classes, device)
    g, np_rng, order = _generators(cfg["model"]["seed"] * 1000 + 2, device)
    tr = Pretrainer(model, ema, sgd(model, pc), queue, memory, g, np_rng, pc,
                    # unused heads under DDP: the classifier in the Uns-CL warm-up or when off
                    net=training_forward(model, device, unused_heads=warm is None or not pc["classifier"]
                                         or pc["lambda_cls"] == 0,
                                         cuda_graphs=not _clips_sim(pc) or recompute),
                    ema_net=key_forward(ema), order=order, uns_temperature=cfg["warmup"]["temperature"],
                    sim_recompute=recompute)
    if warm is not None:
        # random streams continue too: one run (dvc repro -f warmup@<setting> redoes the warm-up)
        tr.load_state_dict(warm, source=f"runs/{cfg['name']}/warmup.pt")
        tr.ema.momentum = float(pc["ema"])
    else:
        queue.fill_random(g)              # the authors' MoCo queue starts full of random keys
    return tr


def pretrain(cfg: dict, data: TrainData, warm: dict, device, ckpt: Checkpointer, on_epoch=None):
    """Sel-CL pre-training, global epochs warmup.epochs + 1 .. pretrain.epochs (SPEC §10.3),
    selection after every epoch (the first one from the warm-up's network)."""
    pc, C = cfg["pretrain"], data.num_classes
    first = cfg["warmup"]["epochs"] + 1
    # before make_pretrainer: make_model seeds the global RNG, make_pretrainer seeds it again
    knn_init = fresh_knn(cfg, data, device)
    tr = make_pretrainer(cfg, C, device, warm)
    history, timing, start = [], [], first
    state = ckpt.load()
    if state is not None:
        tr.load_state_dict(state)
        history, start = state["history"], state["epoch"] + 1
        selection = Selection.from_state_dict(state["selection"], device=device)
    else:
        selection = run_selection(tr.model, data, pc, epoch=first - 1)   # selection after the warm-up
    iters = steps_per_epoch(data.n, pc["batch_size"], pc["drop_last"])
    short = not worth_compiling((pc["epochs"] - start + 1) * iters)   # CUDA: too few steps to compile
    bar = _progress(range(start, pc["epochs"] + 1), "pre-train", total=pc["epochs"] - first + 1,
                    initial=start - first)
    for epoch in bar:
        rule = configured_rule(selection, data.noisy, data.clean, pc)
        T_idx = torch.nonzero(rule.examples).squeeze(1)
        if len(T_idx) == 0 and pc["classifier"] and pc["lambda_cls"] > 0 and dist.world_size() > 1:
            # one process skips L_CLS for the epoch; DDP's reducer would wait for the classifier
            raise ConfigError(f"settings.{cfg['name']}.pretrain.alpha = {pc['alpha']}: the selection T is "
                              f"empty after epoch {epoch - 1}, which SELCL_NPROC > 1 cannot train through "
                              f"(no L_CLS gradient for the classifier); raise alpha or run one process")
        read_memory = reads_memory(pc, epoch)
        tr.model.train(); tr.ema.model.train()     # EMA BatchNorm: batch statistics (§2)
        means = EpochMeans()
        t0 = time.perf_counter()
        for it, idx in enumerate(_batches(data.n, pc["batch_size"], tr.order, device, pc["drop_last"])):
            set_lr(tr.opt, lr_at(pc, epoch, it, iters))
            with eager_step(short or _last_smaller(it, data.n, pc["batch_size"])):
                means.add(tr.step(data, idx, rule, T_idx, read_memory), len(idx))
        synchronize(device)
        t1 = time.perf_counter()
        # Per-epoch selection from the online network (§5), then the log.
        dist.sync_buffers(tr.model)             # gloo DDP: same BN statistics on every rank
        z_tr, _ = embed(tr.model, data.x, data.mean, data.std, crop=data.crop)
        selection = run_selection(tr.model, data, pc, epoch, z=z_tr)
        if dist.world_size() > 1:     # T, ŷ and γ equal on every rank: a guard, once per epoch
            dist.check_same(f"the selection of epoch {epoch}",
                            torch.cat([selection.examples.long(), selection.pseudo_labels.long(),
                                       torch.tensor([selection.threshold], dtype=torch.float64)
                                       .view(torch.int64).to(selection.examples.device)]))
        synchronize(device)
        t2 = time.perf_counter()
        row = {"epoch": epoch, "lr": tr.opt.param_groups[0]["lr"], **means.means()}
        row.update(_selection_log(selection))
        z_te, logits_te = embed(tr.model, data.x_test, data.mean, data.std, crop=data.crop)
        knn = weighted_knn_accuracy(z_tr, data.clean, z_te, data.y_test, C,
                                    k=min(cfg["evaluate"]["k"], data.n), sigma=cfg["evaluate"]["sigma"])
        row["knn_top1"] = knn["top1"]
        # the Sel-CL classifier (trained by L_CLS) on the test set, eval mode: the authors'
        # per-epoch test_eval, Table 6's "Sel-CL test acc"; free, the logits came with z_te
        row["test_acc"] = argmax_accuracy(logits_te, data.y_test)
        history.append(row)
        if on_epoch:
            on_epoch(history)           # live history (the stage rewrites its CSV)
        # wall-clock seconds, kept apart from the (bit-reproducible) history and out of
        # the checkpoint (after a resume it lists the epochs run since)
        timing.append({"epoch": epoch, "train_s": t1 - t0, "select_s": t2 - t1,
                       "knn_s": time.perf_counter() - t2, "steps": iters})
        bar.set_postfix(loss=f"{row['loss']:.3f}", T=int(row.get("n_selected", 0)),
                        precT=f"{row.get('precision_T', float('nan')):.3f}", knn=f"{knn['top1']:.1f}")
        ckpt.maybe_save(epoch, pc["epochs"], lambda: {
            **tr.state_dict(), "selection": selection.state_dict(), "history": history, "epoch": epoch})
    final_rule = configured_rule(selection, data.noisy, data.clean, pc)
    check = encoder_check(history[-1], knn_init, pc, len(tr.queue), len(tr.memory)) if history else None
    return {"model": tr.model.state_dict(), "ema": tr.ema.state_dict(), "selection": selection.state_dict(),
            "examples": final_rule.examples.cpu(), "history": history, "timing": timing,
            "encoder_check": check}


def fresh_knn(cfg: dict, data: TrainData, device) -> float:
    """Weighted k-NN top-1 (clean labels, as the history's knn_top1) of a freshly
    initialised network: what an encoder that learned nothing scores (31 % on CIFAR-10).
    One embedding of the training and test sets, no training state touched."""
    fresh = make_model(cfg["model"], data.num_classes, device)
    z_tr, _ = embed(fresh, data.x, data.mean, data.std, crop=data.crop)
    z_te, _ = embed(fresh, data.x_test, data.mean, data.std, crop=data.crop)
    return weighted_knn_accuracy(z_tr, data.clean, z_te, data.y_test, data.num_classes,
                                 k=min(cfg["evaluate"]["k"], data.n), sigma=cfg["evaluate"]["sigma"])["top1"]


def no_information_l_sel(pc: dict, epoch: int, fallback: float, queue_size: int, memory_size: int) -> float:
    """L_sel of an encoder that learned nothing: every similarity alike, so each term's
    log-softmax is uniform over the candidates left in its denominator (`keep`: all but the
    anchor's own entry), and an anchor with positives in a term scores log(candidates − 1)
    there, whatever the positives; an anchor that falls back (s_i = 1) scores u_i instead,
    the MoCo InfoNCE with Q queued negatives. With s̄ the mean of s_i (the history's
    `fallback`):
      (1 − s̄)·[log(2B − 1)  +  log(|memory| − 1)]  +  s̄·log(Q + 1)
               batch term     memory term, from memory_start_epoch
    Exact when every anchor that does not fall back has positives in both terms (without
    the memory, always). About 13.1 for the 5,000-image H200 run (B = 128, memory 2,000,
    s̄ ≈ 0) whose encoder learned nothing; its L_sel ended at 12.7."""
    terms = math.log(2 * pc["batch_size"] - 1)
    if reads_memory(pc, epoch) and memory_size > 1:
        terms += math.log(memory_size - 1)
    return (1 - fallback) * terms + fallback * math.log(queue_size + 1)


def encoder_check(last: dict, knn_init: float, pc: dict, queue_size: int, memory_size: int) -> dict:
    """Whether pre-training's encoder learned anything, from its last epoch: its k-NN above
    a freshly initialised network's, and its L_sel below the no-information value
    (`no_information_l_sel`). The report flags a run where either fails."""
    nil = no_information_l_sel(pc, int(last["epoch"]), float(last.get("fallback", 0.0)), queue_size, memory_size)
    l_sel = float(last.get("l_sel", float("nan")))
    return {"knn_top1_init": float(knn_init), "l_sel": l_sel, "l_sel_no_information": nil,
            "encoder_learned": bool(last["knn_top1"] > knn_init and l_sel < nil)}


# ------------------------------------------------------- classifier training (§7)
def _train_classifier(model, data: TrainData, idx_pool: torch.Tensor, tc: dict, device, ckpt, *,
                      desc: str, seed: int, mixup_alpha: float | None, bootstrap: float = 0.0,
                      bootstrap_start: int | None = None, strong: bool = False, on_epoch=None,
                      timing: list | None = None):
    """Shared loop of Sel-CL+ fine-tuning and the CE baseline: SGD on `idx_pool`
    with noisy labels, test accuracy after every epoch. `timing`, if given, receives one
    row of wall-clock seconds per epoch (training steps, test evaluation) and the steps."""
    opt = sgd(model, tc)
    g, np_rng, order = _generators(seed, device)
    history, start = [], 1
    state = ckpt.load()
    if state is not None:
        model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
        _set_rng_state(g, np_rng, state["rng"], order); history, start = state["history"], state["epoch"] + 1
    net = training_forward(model, device, unused_heads=True)   # the projection head is not trained here
    n = len(idx_pool)
    B = min(tc["batch_size"], n)
    B -= B % dist.world_size()                        # global batch, split evenly over ranks
    if B == 0:
        raise ConfigError(f"{desc}: {n} training example(s) cannot be split over the {dist.world_size()} "
                          f"processes (SELCL_NPROC); run fewer processes")
    iters = steps_per_epoch(n, B, tc["drop_last"])
    short = not worth_compiling((tc["epochs"] - start + 1) * iters)   # CUDA: too few steps to compile
    bar = _progress(range(start, tc["epochs"] + 1), desc, total=tc["epochs"], initial=start - 1)
    for epoch in bar:
        model.train()
        means = EpochMeans()
        t0 = time.perf_counter()
        for it, b in enumerate(_batches(n, B, order, device, tc["drop_last"])):
            set_lr(opt, lr_at(tc, epoch, it, iters))
            idx = idx_pool[b]                             # this rank's shard of the batch
            x = data.x[idx]
            y = data.noisy[idx]
            with eager_step(short or _last_smaller(it, n, B)):
                v = _views(x, g, data, strong=strong)
                if mixup_alpha is None:                   # plain CE (baseline)
                    with autocast(device):
                        _, logits = net(v)
                    loss = F.cross_entropy(logits.float(), y)
                else:
                    # λ ~ Beta(α, α). The authors fold it to max(λ, 1−λ): (1−λ, π) mixes the batch
                    # of (λ, π⁻¹) in another row order, so the loss has the same distribution.
                    lam = float(np_rng.beta(mixup_alpha, mixup_alpha))
                    perm = torch.randperm(len(idx), generator=g, device=device)
                    with autocast(device):
                        _, logits = net(losses.mix(v, lam, perm))
                    logits = logits.float()
                    if bootstrap > 0:
                        # Bootstrapping target: a train-mode forward of the un-augmented image at
                        # every iteration, after the mixed one (the authors' loop; it also updates
                        # the BatchNorm running statistics), z = argmax, no gradient (SPEC §10.3).
                        # The eager `model` (same weights): a CUDA-graph replay between the
                        # graphed forward and its backward would force cudagraph trees off.
                        with torch.no_grad(), autocast(device):
                            _, clean_logits = model(augment.eval_view(x, data.mean, data.std, data.crop)
                                                    .contiguous(memory_format=memory_format(device)))
                        zb = clean_logits.float().argmax(1)
                    if bootstrap > 0 and bootstrap_start is not None and epoch > bootstrap_start:
                        loss = losses.mixup_bootstrap_loss(logits, y, y[perm], zb, zb[perm], lam, bootstrap)
                    else:
                        loss = losses.mixup_cross_entropy(logits, y, y[perm], lam)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            means.add({"loss": loss.detach()}, len(idx))
        if timing is not None:
            synchronize(device)
        t1 = time.perf_counter()
        dist.sync_buffers(model)
        scores = test_accuracy(model, data.x_test, data.y_test, data.mean, data.std, data.crop)
        acc = scores["top1"]
        row = {"epoch": epoch, "loss": means.means()["loss"], "test_acc": acc,
               "test_top5": scores["top5"], "lr": opt.param_groups[0]["lr"]}
        if data.x_test2 is not None:                  # the second test set (WebVision-50: ILSVRC12 val)
            s2 = test_accuracy(model, data.x_test2, data.y_test2, data.mean, data.std, data.crop)
            row.update(test2_acc=s2["top1"], test2_top5=s2["top5"])
        history.append(row)
        if timing is not None:      # wall-clock, kept apart from the (bit-reproducible) history
            timing.append({"epoch": epoch, "train_s": t1 - t0, "eval_s": time.perf_counter() - t1, "steps": iters})
        bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", acc=f"{acc:.2f}")
        if on_epoch:
            on_epoch(history)           # live history (the stage rewrites its CSV)
        ckpt.maybe_save(epoch, tc["epochs"], lambda: {
            "model": model.state_dict(), "opt": opt.state_dict(), "rng": _rng_state(g, np_rng, order),
            "history": history, "epoch": epoch})
    return history


def summarise(history: list, eval_last: int) -> dict:
    """The paper's number (mean top-1 of the last `eval_last` epochs), the final and the best
    epoch's; with top-5 (and a second test set) in the history, the final epoch's and the
    best top-1 epoch's too (the authors' WebVision script prints its best epoch)."""
    accs = [h["test_acc"] for h in history]
    out = {"test_acc_last": accs[-1], f"test_acc_mean_last{eval_last}": float(np.mean(accs[-eval_last:])),
           "test_acc_mean_last": float(np.mean(accs[-eval_last:])), "test_acc_best": max(accs)}
    for p in ("test", "test2"):
        if f"{p}_top5" not in history[-1]:
            continue
        best = max(history, key=lambda h: h[f"{p}_acc"])          # the first of equal epochs
        out.update({f"{p}_top5_last": history[-1][f"{p}_top5"], f"{p}_top5_at_best": best[f"{p}_top5"]})
        if p == "test2":
            t2 = [h["test2_acc"] for h in history]
            out.update(test2_acc_last=t2[-1], test2_acc_mean_last=float(np.mean(t2[-eval_last:])),
                       test2_acc_best=max(t2))
    return out


def finetune(cfg: dict, data: TrainData, pre: dict, device, ckpt: Checkpointer, on_epoch=None):
    """Sel-CL+: keep the encoder, re-initialise the classifier, train everything on T
    with noisy labels: mixup CE (epochs 1–30), then mixup + hard bootstrapping (B = 0.2)."""
    fc = cfg["finetune"]
    model = make_model(cfg["model"], data.num_classes, device)
    model.load_state_dict(pre["model"])
    if fc["reinit_classifier"]:
        g0 = torch.Generator(device=device).manual_seed(cfg["model"]["seed"] + 7)
        model.reset_classifier(generator=g0)
    T_idx = torch.nonzero(torch.as_tensor(pre["examples"], device=device)).squeeze(1)
    if len(T_idx) == 0:
        raise ValueError("the final selection T is empty: nothing to fine-tune on "
                         "(raise pretrain.alpha, or lower pretrain.k if it is near the images per class)")
    tc = dict(fc, lr_warmup_epochs=0, lr_decay_epochs=[])   # constant lr 0.001
    timing: list = []
    history = _train_classifier(model, data, T_idx, tc, device, ckpt, desc="fine-tune",
                                seed=cfg["model"]["seed"] * 1000 + 3, mixup_alpha=fc["mixup_alpha"],
                                bootstrap=fc["bootstrap"], bootstrap_start=fc["bootstrap_start"],
                                strong=fc["augment"] == "strong", on_epoch=on_epoch, timing=timing)
    return {"model": model.state_dict(), "history": history, "n_train": int(len(T_idx)), "timing": timing}


def baseline(cfg: dict, data: TrainData, device, ckpt: Checkpointer, on_epoch=None,
             idx_pool: torch.Tensor | None = None, desc: str | None = None):
    """Standard cross-entropy on all noisy labels, same network and weak augmentation;
    with `baseline.mixup_alpha` set, mixup cross-entropy instead (the paper's "Mixup" row).
    idx_pool: train on these examples only (the cleanlab stage's K folds); None: all."""
    bc = cfg["baseline"]
    model = make_model(cfg["model"], data.num_classes, device)
    tc = dict(bc, lr_warmup_epochs=0)
    pool = torch.arange(data.n, device=device) if idx_pool is None else idx_pool.to(device)
    desc = desc or ("CE baseline" if bc["mixup_alpha"] is None else "mixup baseline")
    timing: list = []
    history = _train_classifier(model, data, pool, tc, device, ckpt, desc=desc,
                                seed=cfg["model"]["seed"] * 1000 + 4, mixup_alpha=bc["mixup_alpha"], on_epoch=on_epoch,
                                timing=timing)
    return {"model": model.state_dict(), "history": history, "timing": timing}


def knn_report(model_state: dict, cfg: dict, data: TrainData, device) -> dict:
    """Weighted k-NN (§8) of the pre-trained encoder's z, clean- and noisy-label protocols,
    and the test accuracy of the pre-trained (Sel-CL) classifier."""
    model = make_model(cfg["model"], data.num_classes, device)
    model.load_state_dict(model_state)
    z_tr, _ = embed(model, data.x, data.mean, data.std, crop=data.crop)
    z_te, logits_te = embed(model, data.x_test, data.mean, data.std, crop=data.crop)
    ec, C = cfg["evaluate"], data.num_classes
    k = min(ec["k"], data.n)
    out = {"selcl_test_top1": argmax_accuracy(logits_te, data.y_test)}   # the Sel-CL classifier (Table 6)
    for protocol, labels in (("clean", data.clean), ("noisy", data.noisy)):
        acc = weighted_knn_accuracy(z_tr, labels, z_te, data.y_test, C, k=k, sigma=ec["sigma"])
        out[f"knn_{protocol}_top1"], out[f"knn_{protocol}_top5"] = acc["top1"], acc["top5"]
    return out, z_te


def is_finite(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x)
