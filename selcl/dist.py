"""Data parallelism over `torchrun` (DDP): the one place that talks to torch.distributed.

    torchrun --nproc_per_node=4 stages/pretrain.py cifar10_sym20

Every stage runs unchanged in one process; under torchrun (WORLD_SIZE > 1) the
warm-up, pre-training, fine-tuning and CE loops split each global batch of
`batch_size` examples into equal per-rank shards and average gradients with
DistributedDataParallel, so the params (batch size, lr, epochs) mean the same as
on one device. What the method shares across the batch is gathered:

  * the candidates of L_sel / L_SIM (online embeddings and probabilities of every
    rank's anchors) with `gather_with_grad`: each rank's loss is the mean over its own
    anchors, the gather passes gradients back to the rank that produced a candidate,
    and DDP's average of the rank gradients is then exactly the gradient of the
    single-process loss (mean over all anchors);
  * the MoCo key queue and the labelled memory (`gather`): every rank enqueues the
    same global batch, so their contents are identical on all ranks;
  * BatchNorm: SyncBatchNorm on CUDA (statistics over the global batch, as one
    device). The gloo/CPU backend has no SyncBatchNorm; there each rank normalises
    its own shard and the running statistics are averaged before every embedding.

Selection needs no communication of its own: the weights (and BN statistics) are
identical on every rank, so each rank embeds the training set (a fraction of a second
on a GPU) and runs the same deterministic selection — a test checks that
every rank computes the same selection. Only rank 0 writes checkpoints and outputs.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def launched() -> bool:
    """True when started by torchrun (or any launcher that sets WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(device: torch.device) -> None:
    """Join the process group torchrun describes (NCCL on CUDA, gloo on CPU); a no-op
    in a plain single process. Call once, after choosing the device."""
    if not launched() or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend)


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def shard(idx: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous share of a global index batch (len divisible by the world size)."""
    w = world_size()
    if w == 1:
        return idx
    if len(idx) % w:
        raise ValueError(f"batch of {len(idx)} does not split evenly over {w} processes: "
                         f"choose a batch_size divisible by the number of processes")
    n = len(idx) // w
    return idx[rank() * n:(rank() + 1) * n]


@torch.no_grad()
def gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate `x` from all ranks along dim 0, in rank order (no gradient)."""
    if world_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather forward; backward: sum every rank's gradient of the gathered rows
    (each rank's loss uses all of them) and keep this rank's own rows. Uses only
    all_gather/all_reduce, which every backend (gloo included) supports."""

    @staticmethod
    def forward(ctx, x):
        ctx.n = x.shape[0]
        parts = [torch.empty_like(x) for _ in range(world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)                        # Σ_r ∂L_r/∂(gathered rows)
        return grad[rank() * ctx.n:(rank() + 1) * ctx.n]


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Like `gather`, but gradients flow back to the rank that produced each row."""
    if world_size() == 1:
        return x
    return _GatherWithGrad.apply(x)


def average(x: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over ranks (for logged sums; once per epoch, not per step)."""
    if world_size() == 1:
        return x
    x = x.detach().clone()
    dist.all_reduce(x)
    return x / world_size()


def average_(tensors: list) -> None:
    """Average a list of tensors over ranks, in place (one all-reduce of their
    concatenation); a no-op in one process."""
    if world_size() == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat.div_(world_size())
    torch._foreach_copy_(tensors, [c.view_as(t) for c, t in zip(flat.split([t.numel() for t in tensors]), tensors)])


def offset(n_local: int) -> int:
    """Row of this rank's first local item in a `gather`ed tensor of n_local rows per rank."""
    return rank() * n_local


def wrap(model: torch.nn.Module, device: torch.device, unused_heads: bool = False) -> torch.nn.Module:
    """DistributedDataParallel around `model` when running under torchrun, else `model`.
    Call after loading weights; keep the unwrapped module for state_dict().
    unused_heads: a head takes no part in the loss (the classifier in Uns-CL, the
    projection in fine-tuning): DDP must then look for parameters without gradient."""
    if world_size() == 1:
        return model
    import inspect
    from torch.nn.parallel import DistributedDataParallel
    ids = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else None
    # No buffer broadcast at each forward: BN statistics are synchronised by SyncBatchNorm
    # (CUDA) or averaged by `sync_buffers` before each embedding (gloo).
    no_sync = ({"forward_sync_buffers": False}
               if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
               else {"broadcast_buffers": False})
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=unused_heads, **no_sync)


def sync_batchnorm(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """SyncBatchNorm on CUDA under torchrun (BN statistics over the global batch)."""
    if world_size() > 1 and device.type == "cuda":
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


@torch.no_grad()
def sync_buffers(model: torch.nn.Module) -> None:
    """Average floating-point buffers (BN running statistics) over ranks, so that every
    rank's eval-mode network, hence its embedding and selection, is the same."""
    if world_size() == 1:
        return
    for b in model.buffers():
        if b.is_floating_point():
            dist.all_reduce(b)
            b.div_(world_size())


def all_objects(obj) -> list:
    """Every rank's picklable `obj`, in rank order (e.g. RNG states for a checkpoint)."""
    if world_size() == 1:
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def check_same(what: str, x: torch.Tensor) -> None:
    """Raise unless every rank holds the same `x` (bitwise): a cheap guard, once per epoch,
    that the ranks agree, e.g. on the selection."""
    if world_size() == 1:
        return
    import hashlib
    digest = hashlib.sha256(x.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
    digests = all_objects(digest)
    if len(set(digests)) > 1:
        raise RuntimeError(f"DDP ranks disagree on {what}: {digests}")


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
