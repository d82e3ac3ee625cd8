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

SPEC sections: warm-up §4, selection §5, pre-training loss §6, fine-tuning §7.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import augment, dist, losses
from .checkpoint import Checkpointer
from .device import autocast, compiled, is_cuda, knn_index_for, memory_format, synchronize
from .evaluate import embed, test_accuracy, weighted_knn_accuracy
from .memory import KeyQueue, LabelledMemory
from .models import EMA, build_model
from .pairs import pair_rule
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

    @classmethod
    def build(cls, arrays: dict, labels: dict, device: torch.device) -> "TrainData":
        t = lambda a, dt=None: torch.as_tensor(np.ascontiguousarray(a), dtype=dt).to(device)  # noqa: E731
        return cls(x=t(arrays["x_train"]), noisy=t(labels["noisy"], torch.int64),
                   clean=t(labels["clean"], torch.int64), x_test=t(arrays["x_test"]),
                   y_test=t(arrays["y_test"], torch.int64), mean=tuple(arrays["mean"]),
                   std=tuple(arrays["std"]), num_classes=int(labels["num_classes"]))

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
             "y_test": arrays.y_test, "mean": arrays.mean, "std": arrays.std}
        return cls.build(d, labels, device)

    @property
    def n(self) -> int:
        return self.x.shape[0]


def make_model(model_cfg: dict, num_classes: int, device: torch.device):
    torch.manual_seed(model_cfg["seed"])            # paper: initialisation seed 1
    model = build_model(model_cfg["arch"], num_classes, width=model_cfg["width"],
                        blocks=tuple(model_cfg["blocks"]), proj_dim=model_cfg["proj_dim"])
    model = dist.sync_batchnorm(model, device)      # DDP on CUDA: BN over the global batch
    return model.to(device).to(memory_format=memory_format(device))


def training_forward(model, device, unused_heads: bool = False):
    """What the training loops call for forward passes with gradient: DDP under torchrun,
    else (CUDA) the CUDA-graphed compile of `model`, else `model` itself."""
    if dist.world_size() > 1:
        return dist.wrap(model, device, unused_heads=unused_heads)
    return compiled(model)


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


def lr_at(cfg: dict, epoch: int, it: int, iters: int) -> float:
    """Linear warm-up from lr/100 over `lr_warmup_epochs` (per iteration), then ×lr_decay
    at each epoch in `lr_decay_epochs` (epochs are 1-based)."""
    base, warm = cfg["lr"], cfg.get("lr_warmup_epochs", 0)
    t = (epoch - 1) + it / iters                    # fractional epochs done
    if t < warm:
        return base / 100 + (base - base / 100) * t / warm
    return base * cfg.get("lr_decay", 1.0) ** sum(epoch >= m for m in cfg.get("lr_decay_epochs", []))


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
        v = augment.strong_augment(x, g, data.mean, data.std, compiled=is_cuda(x.device))
    else:
        v = augment.weak_augment(x, g, data.mean, data.std)
    v = v.contiguous(memory_format=memory_format(x.device))
    return v.chunk(n) if n > 1 else v


def _batches(n: int, batch_size: int, g: torch.Generator, device):
    """Shuffled global index batches, last incomplete batch dropped (as the authors'
    loaders). Under DDP `g` is the order generator, seeded alike on every rank, and
    each rank keeps its shard (`dist.shard`) of every batch."""
    perm = torch.randperm(n, generator=g, device=device)
    for start in range(0, n - batch_size + 1, batch_size):
        yield dist.shard(perm[start:start + batch_size])


def _progress(iterable, desc: str, total=None, initial=0):
    return tqdm(iterable, desc=desc, total=total, initial=initial, dynamic_ncols=True, leave=True)


def _rng_state(g: torch.Generator, np_rng: np.random.Generator, order=None) -> dict:
    """Every generator's state; under DDP every rank's (a collective: all ranks call it)."""
    state = {"torch": g.get_state(), "numpy": np_rng.bit_generator.state}
    if order is not None and order is not g:
        state["order"] = order.get_state()
    return {"ranks": dist.all_objects(state)} if dist.world_size() > 1 else state


def _set_rng_state(g, np_rng, state, order=None) -> None:
    from .checkpoint import CheckpointError
    saved = len(state["ranks"]) if "ranks" in state else 1
    if saved != dist.world_size():
        raise CheckpointError(f"checkpoint written by {saved} process(es), resumed with "
                              f"{dist.world_size()}: resume with the same number of processes "
                              f"(or delete the checkpoint to start over)")
    if "ranks" in state:
        state = state["ranks"][dist.rank()]
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
    """Uns-CL (MoCo): query from view 1 (online), key from view 2 (EMA), negatives
    from a queue of EMA keys, τ = 0.1. Option `sup_cl`: Sup-CL on all noisy pairs + CE."""
    wc = cfg["warmup"]
    model = make_model(cfg["model"], data.num_classes, device)
    ema = EMA(model, wc["ema"])
    opt = sgd(model, wc)
    net = training_forward(model, device, unused_heads=wc["method"] == "uns_cl")
    ema_net = key_forward(ema)
    queue = KeyQueue(wc["queue_size"], cfg["model"]["proj_dim"], device)
    g, np_rng, order = _generators(cfg["model"]["seed"] * 1000 + 1, device)
    history, start = [], 1
    state = ckpt.load()
    if state is not None:
        model.load_state_dict(state["model"]); ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["opt"]); queue.load_state_dict(state["queue"])
        _set_rng_state(g, np_rng, state["rng"], order); history = state["history"]; start = state["epoch"] + 1
    iters = data.n // wc["batch_size"]
    ramp = {"lr": wc["lr"], "lr_warmup_epochs": wc["epochs"]}   # linear ramp over the warm-up
    same_label = lambda i, j: data.noisy[i][:, None] == data.noisy[j][None, :]  # noqa: E731
    for epoch in _progress(range(start, wc["epochs"] + 1), "warm-up", total=wc["epochs"], initial=start - 1):
        model.train(); ema.model.train()
        sums = {"loss": torch.zeros((), device=device)}
        for it, idx in enumerate(_batches(data.n, wc["batch_size"], order, device)):
            set_lr(opt, lr_at(ramp, epoch, it, iters))
            x = data.x[idx]
            v1, v2 = _views(x, g, data, n=2)
            with autocast(device):
                q, logits = net(v1)
                with torch.no_grad():
                    k, _ = ema_net(v2)
            q, k = q.float(), k.float().detach()
            if wc["method"] == "uns_cl":
                loss = losses.moco_loss(q, k, queue.keys, wc["temperature"])
            else:  # Sup-CL warm-up (Table 7): all same-noisy-label pairs + CE
                with autocast(device):
                    q2, logits2 = net(v2)
                anchors = torch.cat([q, q2.float()])
                ids = torch.cat([idx, idx])
                lam = torch.ones(len(ids), device=device)
                per_anchor, _ = losses.selective_contrastive_loss(
                    anchors, ids, ids, lam, dist.gather_with_grad(anchors), dist.gather(ids), same_label,
                    torch.cat([k, k]), torch.cat([k, k]), queue.keys, wc["temperature"],
                    self_offset=dist.offset(len(ids)))
                loss = per_anchor.mean() + 0.5 * (F.cross_entropy(logits.float(), data.noisy[idx])
                                                  + F.cross_entropy(logits2.float(), data.noisy[idx]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            ema.update(model)
            queue.enqueue(dist.gather(k))         # the whole global batch's keys, on every rank
            sums["loss"] += loss.detach()
        history.append({"epoch": epoch, "loss": float(dist.average(sums["loss"])) / max(iters, 1),
                        "lr": opt.param_groups[0]["lr"]})
        if on_epoch:
            on_epoch(history)           # live history (the stage rewrites its CSV)
        ckpt.maybe_save(epoch, wc["epochs"], lambda: {
            "model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
            "queue": queue.state_dict(), "rng": _rng_state(g, np_rng, order), "history": history,
            "epoch": epoch})
    return {"model": model.state_dict(), "ema": ema.state_dict(), "queue": queue.state_dict(),
            "history": history}


# ------------------------------------------------------------- selection (§5)
def run_selection(model, data: TrainData, pc: dict, epoch: int, z=None) -> Selection:
    """Select T and G from z of the online network on un-augmented training images."""
    if z is None:
        dist.sync_buffers(model)
        z, _ = embed(model, data.x, data.mean, data.std)
    return select(z, data.noisy, data.num_classes, k=pc["k"], alpha=pc["alpha"], beta=pc["beta"],
                  weighting=pc["knn_weighting"], seed=epoch, clean_labels=data.clean,
                  knn_index=knn_index_for(z.device, pc["knn_index"]))


def _selection_log(sel: Selection) -> dict:
    return {k: (float(v) if isinstance(v, (int, float, np.floating, np.integer)) else v)
            for k, v in sel.stats.items() if not isinstance(v, (list, dict, np.ndarray, torch.Tensor))}


# -------------------------------------------------------------- pre-training (§6)
@dataclass
class Pretrainer:
    """The mutable state of Sel-CL pre-training; `step` is one iteration of SPEC §6."""
    model: torch.nn.Module
    ema: EMA
    opt: torch.optim.Optimizer
    queue: KeyQueue                 # MoCo keys for the unsupervised fallback
    memory: LabelledMemory          # EMA embeddings + probabilities + dataset index
    g: torch.Generator
    np_rng: np.random.Generator
    pc: dict
    net: torch.nn.Module | None = None   # training forward of `model` (DDP / CUDA graphs); None: model
    ema_net: torch.nn.Module | None = None  # forward of the EMA network; None: ema.model
    order: torch.Generator | None = None  # batch order (DDP: same on all ranks); None: `g`

    def __post_init__(self):
        self.net = self.net if self.net is not None else self.model
        self.ema_net = self.ema_net if self.ema_net is not None else self.ema.model
        self.order = self.order if self.order is not None else self.g

    def mixup(self, B: int, device):
        """λ ~ Beta(1,1), λ = max(λ, 1−λ), partner by random permutation (identity if off)."""
        if self.pc["mixup"]:
            return losses.mixup_params(B, self.g, device)
        return 1.0, torch.arange(B, device=device)

    def step(self, data: "TrainData", idx: torch.Tensor, rule, T_idx: torch.Tensor,
             use_memory: bool) -> dict:
        """L = L_MIX + λ_c·L_CLS + λ_s·L_SIM on the batch `idx`; returns detached parts."""
        pc, net, g, device = self.pc, self.net, self.g, idx.device
        B = idx.shape[0]
        x = data.x[idx]
        v1, v2 = _views(x, g, data, n=2)
        # Mixup on each view separately (own λ and partner per view).
        (lam1, p1), (lam2, p2) = self.mixup(B, device), self.mixup(B, device)
        m1, m2 = losses.mix(v1, lam1, p1), losses.mix(v2, lam2, p2)
        with autocast(device):
            z_q, logits_q = net(torch.cat([m1, m2]))              # anchors: online, mixed views
            with torch.no_grad():
                z_k, logits_k = self.ema_net(torch.cat([v1, v2]))  # keys: EMA, un-mixed views
        z_q, z_k, logits_q = z_q.float(), z_k.float().detach(), logits_q.float()
        k1, k2 = z_k[:B], z_k[B:]
        anchor_ids = torch.cat([idx, idx])                        # dominant example of each anchor
        partner_rows = torch.cat([p1, p2 + B])                    # the partner is itself an anchor
        partner_ids = anchor_ids[partner_rows]
        lam = torch.cat([torch.as_tensor(lam1, dtype=torch.float32, device=device).expand(B),
                         torch.as_tensor(lam2, dtype=torch.float32, device=device).expand(B)])
        keys = torch.cat([k2, k1])                                # positive key: the other, un-mixed view
        partner_keys = keys[partner_rows]
        mem = use_memory and len(self.memory.ids) > 0
        # Candidates: the anchors of the whole (global) batch, then the memory. Under DDP
        # this rank's anchors start at row `off` of the gathered anchors.
        z_all, ids_all, off = dist.gather_with_grad(z_q), dist.gather(anchor_ids), dist.offset(2 * B)
        cands = torch.cat([z_all, self.memory.feats]) if mem else z_all
        cand_ids = torch.cat([ids_all, self.memory.ids]) if mem else ids_all
        # (i, j) ∈ G for dominant and partner rows, built once for L_MIX and L_SIM.
        masks = losses.pair_masks(anchor_ids, partner_ids, cand_ids, rule.in_G, partner_rows)
        per_anchor, fallback = losses.selective_contrastive_loss(
            z_q, anchor_ids, partner_ids, lam, cands, cand_ids, None, keys, partner_keys,
            self.queue.keys, pc["temperature"], masks=masks, self_offset=off)
        l_mix = per_anchor.mean()
        loss, out = l_mix, {"l_mix": l_mix.detach(), "fallback": fallback}
        if pc["classifier"] and pc["lambda_cls"] > 0 and len(T_idx):
            # L_CLS: a separate mini-batch drawn with replacement from T, two strong views, mixup.
            ic = T_idx[torch.randint(len(T_idx), (B,), generator=g, device=device)]
            xc = data.x[ic]
            c1, c2 = _views(xc, g, data, n=2)
            lc, pcm = self.mixup(B, device)
            with autocast(device):
                _, logits_c = net(losses.mix(torch.cat([c1, c2]), lc, torch.cat([pcm, pcm + B])))
            yc = data.noisy[ic]
            l_cls = losses.mixup_cross_entropy(logits_c.float(), torch.cat([yc, yc]),
                                               torch.cat([yc[pcm], yc[pcm]]), lc)
            loss = loss + pc["lambda_cls"] * l_cls
            out["l_cls"] = l_cls.detach()
        if pc["classifier"] and pc["sim_loss"] and pc["lambda_sim"] > 0:
            # L_SIM: BCE between p_i·p_j and [(i,j) ∈ G] over batch and memory (EMA probabilities).
            p_anchor = logits_q.softmax(1)
            p_all = dist.gather_with_grad(p_anchor)
            p_cands = torch.cat([p_all, self.memory.probs]) if mem else p_all
            l_sim = losses.similarity_loss(p_anchor, p_cands, anchor_ids, partner_ids, lam, cand_ids,
                                           None, masks=masks, self_offset=off)
            loss = loss + pc["lambda_sim"] * l_sim
            out["l_sim"] = l_sim.detach()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.ema.update(self.model)
        # queue and memory get the whole global batch, in rank order, on every rank
        self.queue.enqueue(dist.gather(torch.cat([k1, k2])))
        self.memory.enqueue(dist.gather(z_k), dist.gather(logits_k.float().softmax(1)), ids_all)
        out["loss"] = loss.detach()
        return out

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "ema": self.ema.state_dict(),
                "opt": self.opt.state_dict(), "queue": self.queue.state_dict(),
                "memory": self.memory.state_dict(), "rng": _rng_state(self.g, self.np_rng, self.order)}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"]); self.ema.load_state_dict(state["ema"])
        self.opt.load_state_dict(state["opt"]); self.queue.load_state_dict(state["queue"])
        self.memory.load_state_dict(state["memory"])
        _set_rng_state(self.g, self.np_rng, state["rng"], self.order)


def make_pretrainer(cfg: dict, num_classes: int, device, warm: dict | None = None) -> Pretrainer:
    pc = cfg["pretrain"]
    model = make_model(cfg["model"], num_classes, device)
    if warm is not None:
        model.load_state_dict(warm["model"])
    ema = EMA(model, pc["ema"])
    if warm is not None:
        ema.load_state_dict(warm["ema"])
    queue = KeyQueue(cfg["warmup"]["queue_size"], cfg["model"]["proj_dim"], device)
    if warm is not None:
        queue.load_state_dict(warm["queue"])
    memory = LabelledMemory(pc["queue_per_class"] * num_classes * 2, cfg["model"]["proj_dim"],
                            num_classes, device)
    g, np_rng, order = _generators(cfg["model"]["seed"] * 1000 + 2, device)
    return Pretrainer(model, ema, sgd(model, pc), queue, memory, g, np_rng, pc,
                      net=training_forward(model, device, unused_heads=not _classifier_every_step(pc)),
                      ema_net=key_forward(ema), order=order)


def _classifier_every_step(pc: dict) -> bool:
    """L_SIM uses the classifier head in every step (L_CLS may skip a step when T is empty)."""
    return bool(pc["classifier"] and pc["sim_loss"] and pc["lambda_sim"] > 0)


def pretrain(cfg: dict, data: TrainData, warm: dict, device, ckpt: Checkpointer, on_epoch=None):
    """Sel-CL pre-training: L = L_MIX + λ_c·L_CLS + λ_s·L_SIM, selection after every epoch."""
    pc, C = cfg["pretrain"], data.num_classes
    tr = make_pretrainer(cfg, C, device, warm)
    history, timing, start = [], [], 1
    state = ckpt.load()
    if state is not None:
        tr.load_state_dict(state)
        history, start = state["history"], state["epoch"] + 1
        selection = Selection.from_state_dict(state["selection"], device=device)
    else:
        selection = run_selection(tr.model, data, pc, epoch=0)   # selection after the warm-up
    iters = data.n // pc["batch_size"]
    bar = _progress(range(start, pc["epochs"] + 1), "pre-train", total=pc["epochs"], initial=start - 1)
    for epoch in bar:
        rule = pair_rule(selection, data.noisy, data.clean, selected_sets=pc["selected_sets"],
                         use_selection=pc["selection"])
        T_idx = torch.nonzero(rule.examples).squeeze(1)
        use_memory = pc["memory"] and epoch >= pc["memory_start_epoch"]
        tr.model.train(); tr.ema.model.train()     # EMA BatchNorm: batch statistics (§2)
        sums: dict = {}
        t0 = time.perf_counter()
        for it, idx in enumerate(_batches(data.n, pc["batch_size"], tr.order, device)):
            set_lr(tr.opt, lr_at(pc, epoch, it, iters))
            for k, v in tr.step(data, idx, rule, T_idx, use_memory).items():
                sums[k] = sums.get(k, 0.0) + v     # tensors stay on the device: no sync per step
        synchronize(device)
        t1 = time.perf_counter()
        # Per-epoch selection from the online network (§5), then the log.
        dist.sync_buffers(tr.model)             # gloo DDP: same BN statistics on every rank
        z_tr, _ = embed(tr.model, data.x, data.mean, data.std)
        selection = run_selection(tr.model, data, pc, epoch, z=z_tr)
        if dist.world_size() > 1:     # T, ŷ and γ equal on every rank: a guard, once per epoch
            dist.check_same(f"the selection of epoch {epoch}",
                            torch.cat([selection.examples.long(), selection.pseudo_labels.long(),
                                       torch.tensor([selection.threshold], dtype=torch.float64)
                                       .view(torch.int64).to(selection.examples.device)]))
        synchronize(device)
        t2 = time.perf_counter()
        row = {"epoch": epoch, "lr": tr.opt.param_groups[0]["lr"]}
        row.update({k: float(dist.average(torch.as_tensor(v))) / max(iters, 1) for k, v in sums.items()})
        row.update(_selection_log(selection))
        z_te, _ = embed(tr.model, data.x_test, data.mean, data.std)
        knn = weighted_knn_accuracy(z_tr, data.clean, z_te, data.y_test, C,
                                    k=min(cfg["evaluate"]["k"], data.n), sigma=cfg["evaluate"]["sigma"])
        row["knn_top1"] = knn["top1"]
        history.append(row)
        if on_epoch:
            on_epoch(history)           # live history (the stage rewrites its CSV)
        # wall-clock seconds, kept apart from the (bit-reproducible) history and out of
        # the checkpoint (after a resume it lists the epochs run since)
        timing.append({"epoch": epoch, "train_s": t1 - t0, "select_s": t2 - t1,
                       "knn_s": time.perf_counter() - t2})
        bar.set_postfix(loss=f"{row['loss']:.3f}", T=int(row.get("n_selected", 0)),
                        precT=f"{row.get('precision_T', float('nan')):.3f}", knn=f"{knn['top1']:.1f}")
        ckpt.maybe_save(epoch, pc["epochs"], lambda: {
            **tr.state_dict(), "selection": selection.state_dict(), "history": history, "epoch": epoch})
    final_rule = pair_rule(selection, data.noisy, data.clean, selected_sets=pc["selected_sets"],
                           use_selection=pc["selection"])
    return {"model": tr.model.state_dict(), "ema": tr.ema.state_dict(), "selection": selection.state_dict(),
            "examples": final_rule.examples.cpu(), "history": history, "timing": timing}


# ------------------------------------------------------- classifier training (§7)
def _train_classifier(model, data: TrainData, idx_pool: torch.Tensor, tc: dict, device, ckpt, *,
                      desc: str, seed: int, mixup_alpha: float | None, bootstrap: float = 0.0,
                      bootstrap_start: int | None = None, strong: bool = False, on_epoch=None):
    """Shared loop of Sel-CL+ fine-tuning and the CE baseline: SGD on `idx_pool`
    with noisy labels, test accuracy after every epoch."""
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
    iters = max(n // B, 1)
    bar = _progress(range(start, tc["epochs"] + 1), desc, total=tc["epochs"], initial=start - 1)
    for epoch in bar:
        model.train()
        loss_sum = torch.zeros((), device=device)
        for it, b in enumerate(_batches(n, B, order, device)):
            set_lr(opt, lr_at(tc, epoch, it, iters))
            idx = idx_pool[b]                             # this rank's shard of the batch
            x = data.x[idx]
            y = data.noisy[idx]
            v = _views(x, g, data, strong=strong)
            if mixup_alpha is None:                       # plain CE (baseline)
                with autocast(device):
                    _, logits = net(v)
                loss = F.cross_entropy(logits.float(), y)
            else:
                lam = float(np_rng.beta(mixup_alpha, mixup_alpha))
                perm = torch.randperm(len(idx), generator=g, device=device)
                with autocast(device):
                    _, logits = net(losses.mix(v, lam, perm))
                logits = logits.float()
                if bootstrap > 0 and bootstrap_start is not None and epoch > bootstrap_start:
                    # hard bootstrapping: z = argmax of the prediction on the un-augmented image
                    with torch.no_grad():
                        model.eval()
                        with autocast(device):
                            _, clean_logits = model(augment.normalize(x, data.mean, data.std)
                                                    .contiguous(memory_format=memory_format(device)))
                        model.train()
                    zb = clean_logits.float().argmax(1)
                    loss = losses.mixup_bootstrap_loss(logits, y, y[perm], zb, zb[perm], lam, bootstrap)
                else:
                    loss = losses.mixup_cross_entropy(logits, y, y[perm], lam)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
        dist.sync_buffers(model)
        acc = test_accuracy(model, data.x_test, data.y_test, data.mean, data.std)
        history.append({"epoch": epoch, "loss": float(dist.average(loss_sum)) / iters, "test_acc": acc,
                        "lr": opt.param_groups[0]["lr"]})
        bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", acc=f"{acc:.2f}")
        if on_epoch:
            on_epoch(history)           # live history (the stage rewrites its CSV)
        ckpt.maybe_save(epoch, tc["epochs"], lambda: {
            "model": model.state_dict(), "opt": opt.state_dict(), "rng": _rng_state(g, np_rng, order),
            "history": history, "epoch": epoch})
    return history


def summarise(history: list, eval_last: int) -> dict:
    accs = [h["test_acc"] for h in history]
    return {"test_acc_last": accs[-1], f"test_acc_mean_last{eval_last}": float(np.mean(accs[-eval_last:])),
            "test_acc_mean_last": float(np.mean(accs[-eval_last:])), "test_acc_best": max(accs)}


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
                         "(lower pretrain.alpha or pretrain.k for this setting)")
    tc = dict(fc, lr_warmup_epochs=0, lr_decay_epochs=[])   # constant lr 0.001
    history = _train_classifier(model, data, T_idx, tc, device, ckpt, desc="fine-tune",
                                seed=cfg["model"]["seed"] * 1000 + 3, mixup_alpha=fc["mixup_alpha"],
                                bootstrap=fc["bootstrap"], bootstrap_start=fc["bootstrap_start"],
                                strong=fc["augment"] == "strong", on_epoch=on_epoch)
    return {"model": model.state_dict(), "history": history, "n_train": int(len(T_idx))}


def baseline(cfg: dict, data: TrainData, device, ckpt: Checkpointer, on_epoch=None):
    """Standard cross-entropy on all noisy labels, same network and weak augmentation."""
    bc = cfg["baseline"]
    model = make_model(cfg["model"], data.num_classes, device)
    tc = dict(bc, lr_warmup_epochs=0)
    everyone = torch.arange(data.n, device=device)
    history = _train_classifier(model, data, everyone, tc, device, ckpt, desc="CE baseline",
                                seed=cfg["model"]["seed"] * 1000 + 4, mixup_alpha=None, on_epoch=on_epoch)
    return {"model": model.state_dict(), "history": history}


def knn_report(model_state: dict, cfg: dict, data: TrainData, device) -> dict:
    """Weighted k-NN (§8) of the pre-trained encoder's z, clean- and noisy-label protocols."""
    model = make_model(cfg["model"], data.num_classes, device)
    model.load_state_dict(model_state)
    z_tr, _ = embed(model, data.x, data.mean, data.std)
    z_te, _ = embed(model, data.x_test, data.mean, data.std)
    ec, C = cfg["evaluate"], data.num_classes
    k = min(ec["k"], data.n)
    out = {}
    for protocol, labels in (("clean", data.clean), ("noisy", data.noisy)):
        acc = weighted_knn_accuracy(z_tr, labels, z_te, data.y_test, C, k=k, sigma=ec["sigma"])
        out[f"knn_{protocol}_top1"], out[f"knn_{protocol}_top5"] = acc["top1"], acc["top5"]
    return out, z_te


def is_finite(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x)
