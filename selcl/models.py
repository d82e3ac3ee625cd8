"""Networks (SPEC §2): PreAct ResNet-18 (32 px), ResNet-18 (224 px), a small
PreAct net for CPU runs, the two heads, and the EMA ("momentum") copy.

    image x [B, 3, H, W] ──encoder──> v [B, feat_dim]
                                       ├─ classifier Linear(feat_dim, C)          → logits
                                       └─ projector  Linear(feat_dim, proj_dim)
                                                     → L2-normalise               → z (‖z‖=1)

Layout follows the authors' `preact_resnet.py` and SPEC §2: a 3×3 conv stem
followed by BN-ReLU, four stages (strides 1/2/2/2), global average pool; every
block's shortcut, identity included, carries the block's pre-activated input. There is
no extra BN-ReLU after the last pre-activation stage (SPEC §2 puts the BN-ReLU
after the stem; the authors' network does the same). Convolutions get
Kaiming-normal (fan_out, ReLU) init, BatchNorm γ=1 β=0, Linear layers PyTorch's
default U(±1/√fan_in).

All initialisation can draw from an explicit `torch.Generator` (CPU), so the same
seed gives the same weights on any device.
"""
from __future__ import annotations

import contextlib
import copy
import math
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


class _PerGroupBN:
    """BatchNorm with per-group batch statistics (SPEC §10.2: the authors call the network
    once per view, so every view batch is normalised with its own statistics).

    With `groups = G` (set by `bn_groups`), a training-mode input of G·B rows is normalised
    as G separate batches of B, one `F.batch_norm` per group, and the running statistics
    are updated group after group: exactly what G separate calls of the network give, but
    the convolutions still run once on the whole batch (the speed lever). groups = 1, or
    eval mode: plain BatchNorm.

    With `replicas = R` (set by `set_bn_replicas`, `model.bn_replicas`), each call's batch
    (each group's) is further normalised as the R shards `torch.chunk` makes of it, and only
    the first shard updates the running statistics: what `nn.DataParallel` over R GPUs does,
    since its scatter is `chunk` and only replica 0's buffers are the module's own (the
    authors' WebVision-50 scripts: four GPUs, batch 64, shards of 16).
    """
    groups = 1
    replicas = 1

    def _one_call(self, x: torch.Tensor) -> torch.Tensor:
        if self.replicas == 1:
            return super().forward(x)
        first, *rest = x.chunk(self.replicas)
        # replica 0: the module's own buffers (running statistics, batch count) are updated
        out = [super().forward(first)]
        # replicas 1..R-1: batch statistics of their shard; their buffer copies are discarded
        out += [F.batch_norm(c, None, None, self.weight, self.bias, True, 0.0, self.eps) for c in rest]
        return torch.cat(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or (self.groups == 1 and self.replicas == 1):
            return super().forward(x)
        return torch.cat([self._one_call(c) for c in x.chunk(self.groups)])


class BatchNorm2d(_PerGroupBN, nn.BatchNorm2d):
    """nn.BatchNorm2d with per-group statistics on demand (see `bn_groups`)."""


class SyncBatchNorm(_PerGroupBN, nn.SyncBatchNorm):
    """nn.SyncBatchNorm (CUDA DDP) with per-group statistics on demand."""


def per_group_sync_bn(model: nn.Module) -> nn.Module:
    """After `nn.SyncBatchNorm.convert_sync_batchnorm` (CUDA DDP): make its layers
    per-group capable again (same state, our subclass)."""
    for m in model.modules():
        if type(m) is nn.SyncBatchNorm:
            m.__class__ = SyncBatchNorm
    return model


@contextlib.contextmanager
def bn_groups(model: nn.Module, groups: int):
    """Within the block, every BatchNorm of `model` normalises its input as `groups`
    equal, consecutive batches: `net(torch.cat([x1, x2, x3]))` under `bn_groups(model, 3)`
    equals three calls `net(x1)`, `net(x2)`, `net(x3)` (outputs, gradients and running
    statistics). The batch must split evenly."""
    mods = [m for m in model.modules() if isinstance(m, _PerGroupBN)]
    for m in mods:
        m.groups = int(groups)
    try:
        yield
    finally:
        for m in mods:
            m.groups = 1


def set_bn_replicas(model: nn.Module, replicas: int) -> nn.Module:
    """Every BatchNorm of `model` normalises a training-mode call as `replicas` shards
    (see `_PerGroupBN`); 1: the whole batch. An EMA copy made afterwards inherits it."""
    if int(replicas) < 1:
        raise ValueError(f"replicas must be ≥ 1, got {replicas}")
    for m in model.modules():
        if isinstance(m, _PerGroupBN):
            m.replicas = int(replicas)
    return model


@contextlib.contextmanager
def frozen_bn_statistics(model: nn.Module):
    """Within the block, training-mode BatchNorm still normalises with batch statistics,
    but every running mean / variance / batch count of `model` is restored on exit: an
    extra forward pass (Sel-CL's L_SIM recompute) leaves no trace in them."""
    bufs = [b for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
            for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]
    saved = [b.clone() for b in bufs]
    try:
        yield
    finally:
        with torch.no_grad():
            torch._foreach_copy_(bufs, saved)


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


class PreActBlock(nn.Module):
    """Pre-activation basic block: a = ReLU(BN(x)); out = conv(ReLU(BN(conv(a)))) + shortcut(a).

    Both shortcuts read the pre-activated input a, as in the authors' `preact_resnet.py`
    (whose identity shortcut is an empty nn.Sequential applied to a): the identity
    shortcut adds a, not x as in He et al. 2016b / kuangliu's block. The projection
    shortcut is a 1×1 conv without BN. x [B, cin, H, W] → [B, cout, H/stride, W/stride].
    """

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.bn1 = BatchNorm2d(cin)
        self.conv1 = _conv3x3(cin, cout, stride)
        self.bn2 = BatchNorm2d(cout)
        self.conv2 = _conv3x3(cout, cout)
        self.shortcut = (nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
                         if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))                          # a
        short = self.shortcut(out) if self.shortcut is not None else out
        out = self.conv1(out)
        out = self.conv2(F.relu(self.bn2(out)))
        return out + short


class BasicBlock(nn.Module):
    """Standard (post-activation) ResNet basic block; shortcut 1×1 conv + BN."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = _conv3x3(cin, cout, stride)
        self.bn1 = BatchNorm2d(cout)
        self.conv2 = _conv3x3(cout, cout)
        self.bn2 = BatchNorm2d(cout)
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                       BatchNorm2d(cout))
                         if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        short = self.shortcut(x) if self.shortcut is not None else x
        return F.relu(out + short)


class ResNetEncoder(nn.Module):
    """conv3×3(3→w) stride 1 → BN-ReLU → stages → global average pool → v [B, feat_dim].

    block: PreActBlock (PreAct ResNet-18 / small) or BasicBlock (ResNet-18).
    widths of stage k: w·2^k; stride 1 for the first stage, 2 afterwards.
    No max-pool (CIFAR layout, also used at 224 px for WebVision-50 per SPEC §2).
    """

    def __init__(self, block: type[nn.Module], width: int = 64,
                 blocks: Sequence[int] = (2, 2, 2, 2)):
        super().__init__()
        self.conv1 = _conv3x3(3, width)
        self.bn1 = BatchNorm2d(width)
        stages, cin = [], width
        for k, n in enumerate(blocks):
            cout = width * 2 ** k
            layers = []
            for b in range(n):
                layers.append(block(cin, cout, stride=2 if (k > 0 and b == 0) else 1))
                cin = cout
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.feat_dim = cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.stages(out)
        return torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)   # v [B, feat_dim]


def _init_linear(m: nn.Linear, generator: torch.Generator | None) -> None:
    """PyTorch's default Linear init, U(±1/√fan_in) for weight and bias, from `generator`."""
    bound = 1.0 / math.sqrt(m.in_features)
    nn.init.uniform_(m.weight, -bound, bound, generator=generator)
    if m.bias is not None:
        nn.init.uniform_(m.bias, -bound, bound, generator=generator)


def init_weights(module: nn.Module, generator: torch.Generator | None = None) -> None:
    """Kaiming-normal (fan_out, ReLU) convs, BN γ=1 β=0, default Linear init (SPEC §2).

    Modules are visited in registration order, so a seeded generator gives the
    same weights every time.
    """
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu",
                                        generator=generator)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                _init_linear(m, generator)


class SelCLNet(nn.Module):
    """Encoder + classifier head + projection head.

    forward(x [B,3,H,W]) → (z [B, proj_dim] float32, unit L2 norm; logits [B, C] float32).
    encode(x) → v [B, feat_dim] float32.

    The heads run outside autocast in float32: under bf16 autocast the encoder is
    bf16 (the expensive part), but z feeds the similarities/softmax of the losses
    and the k-NN, which SPEC wants in float32; the two small Linears cost nothing.
    """

    def __init__(self, encoder: nn.Module, feat_dim: int, num_classes: int, proj_dim: int = 128):
        super().__init__()
        self.encoder = encoder
        self.feat_dim, self.num_classes, self.proj_dim = feat_dim, num_classes, proj_dim
        self.classifier = nn.Linear(feat_dim, num_classes)
        self.projector = nn.Linear(feat_dim, proj_dim)

    def _heads(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(device_type=v.device.type, enabled=False):
            v = v.float()
            z = F.normalize(self.projector(v), dim=1)     # z = g(v)/‖g(v)‖
            logits = self.classifier(v)
        return z, logits

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._heads(self.encoder(x))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x).float()

    def heads(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(z, logits) from features v [B, feat_dim] (e.g. from `encode`)."""
        return self._heads(v)

    def reset_classifier(self, generator: torch.Generator | None = None) -> None:
        """Re-initialise only the classifier (Sel-CL+ fine-tuning, SPEC §7).

        generator must live on the classifier's device (or be None: global RNG).
        """
        with torch.no_grad():
            _init_linear(self.classifier, generator)


ARCHS = ("preact_resnet18", "resnet18", "small")


def build_model(arch: str, num_classes: int, *, width: int = 64,
                blocks: Sequence[int] = (2, 2, 2, 2), proj_dim: int = 128,
                generator: torch.Generator | None = None) -> SelCLNet:
    """Build a SelCLNet on the CPU (move it with `.to(device)` afterwards).

    arch: "preact_resnet18" (SPEC §2, CIFAR 32 px), "resnet18" (WebVision-50,
    224 px, 3×3 stride-1 stem, no max-pool), "small" (PreAct, `width`/`blocks`
    used; e.g. width 16, blocks (1,1,1,1) for CPU runs). For the two ResNet-18s
    width/blocks are fixed at 64/(2,2,2,2).
    generator: a CPU torch.Generator for the initial weights (None: global RNG).
    """
    if arch == "preact_resnet18":
        encoder = ResNetEncoder(PreActBlock, 64, (2, 2, 2, 2))
    elif arch == "resnet18":
        encoder = ResNetEncoder(BasicBlock, 64, (2, 2, 2, 2))
    elif arch == "small":
        encoder = ResNetEncoder(PreActBlock, int(width), tuple(int(b) for b in blocks))
    else:
        raise ValueError(f"unknown arch '{arch}'; valid: {', '.join(ARCHS)}")
    model = SelCLNet(encoder, encoder.feat_dim, num_classes, proj_dim)
    init_weights(model, generator)
    return model


class EMA:
    """Exponential moving average ("momentum") copy of a model (SPEC §2, MoCo keys).

    θ_ema ← m·θ_ema + (1−m)·θ for parameters after every optimiser step;
    buffers (BN running stats) are copied from the online model.

    The EMA model is meant to be *called in train() mode*: SPEC §2 says its
    BatchNorm uses batch statistics (as MoCo's key encoder), so `__call__` puts it
    in train mode and runs without gradients. Its running stats are never used
    for the keys (and are overwritten by `update`).
    """

    def __init__(self, model: nn.Module, momentum: float = 0.999):
        self.momentum = float(momentum)
        self.model = copy.deepcopy(model)
        self.model.train()
        for p in self.model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        m = self.momentum
        ema_p = list(self.model.parameters())
        new_p = [p.detach() for p in model.parameters()]
        # _foreach_*: one fused kernel per op over all ~60 tensors instead of a
        # Python loop of 120 small kernels (matters on GPU, where this runs every step).
        torch._foreach_mul_(ema_p, m)
        torch._foreach_add_(ema_p, new_p, alpha=1.0 - m)
        # BN running stats (and counters): one foreach copy instead of ~60 copy kernels
        torch._foreach_copy_(list(self.model.buffers()), [b.detach() for b in model.buffers()])

    @torch.no_grad()
    def __call__(self, *args, **kwargs):
        self.model.train()
        return self.model(*args, **kwargs)

    def to(self, *args, **kwargs) -> "EMA":
        self.model.to(*args, **kwargs)
        return self

    def state_dict(self) -> dict:
        return {"momentum": self.momentum, "model": self.model.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.momentum = float(state["momentum"])
        self.model.load_state_dict(state["model"])
