"""Weighted k-NN evaluation (SPEC §8) and test accuracy.

score(c) = Σ_{j ∈ N_K(x)} exp(sim(z_x, z_j)/σ) · [label_j = c], K = 200, σ = 0.1.
The paper's protocol uses the clean training labels; the noisy-label protocol is
what a practitioner can compute. Both are reported, top-1 and top-5.
"""
from __future__ import annotations

import torch

from . import augment
from .device import eval_batch_size, knn_index_for, memory_format
from .knn import knn_search


@torch.no_grad()
def embed(model, x_uint8: torch.Tensor, mean, std, *, batch_size: int | None = None, crop=None,
          autocast_dtype: torch.dtype | None = None):
    """z (L2-normalised, float32) and logits of un-augmented images, eval mode.

    x_uint8: [N,3,H,W] uint8 on the model's device → (z [N,d], logits [N,C]).
    crop: CenterCrop(crop) first (WebVision: 224 of the stored 256; None: whole image).
    batch_size: None → the device's (`device.eval_batch_size`).

    Float32 on every device, outside the training passes' bf16 autocast: these passes feed
    hard cuts (the selection's K-th neighbour, each class's n_sel, T's last member; the
    k-NN; test accuracy). On seven encoders of a CPU preset's run, bf16 embeddings moved
    n_sel in six and 7-31 of 2,000 pseudo-labels against float32 (`bench/selection_sweep.py
    --precision`, docs/performance.md). The authors embedded in fp16 in pre-training
    (apex O1 on CIFAR, an autocast-decorated forward on WebVision), float32 in CIFAR
    fine-tuning's tests; fp16 stayed within 1-4 pseudo-labels of float32 there. On CUDA
    cuDNN may run these float32 convolutions in TF32 (PyTorch's default, fp16's mantissa).
    A pass costs a forward of the training set once an epoch, next to 391 training steps.
    autocast_dtype: the passes under that autocast instead (to measure its rounding)."""
    was_training = model.training
    model.eval()
    device = x_uint8.device
    batch_size = batch_size or eval_batch_size(device)
    zs, logits = [], []
    for start in range(0, x_uint8.shape[0], batch_size):
        x = augment.eval_view(x_uint8[start:start + batch_size], mean, std, crop)
        x = x.contiguous(memory_format=memory_format(device))
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            z, out = model(x)
        zs.append(z.float())
        logits.append(out.float())
    model.train(was_training)
    return torch.cat(zs), torch.cat(logits)


@torch.no_grad()
def weighted_knn_scores(train_z, train_labels, test_z, num_classes: int, *, k: int = 200,
                        sigma: float = 0.1):
    """Class scores [M, C] of the weighted k-NN classifier (float32)."""
    sims, idx = knn_search(test_z, train_z, k, index=knn_index_for(test_z.device))
    weights = torch.exp(sims / sigma)                                   # exp(sim/σ)
    votes = torch.zeros(test_z.shape[0], num_classes, device=test_z.device)
    votes.scatter_add_(1, train_labels[idx], weights)                   # Σ w·[label = c]
    return votes


def topk_accuracy(scores: torch.Tensor, labels: torch.Tensor, ks=(1, 5)) -> dict:
    """Percent of rows whose label is among the top-k scores (ties: lower class id)."""
    out = {}
    order = torch.argsort(-scores, dim=1, stable=True)
    for kk in ks:
        kk_eff = min(kk, scores.shape[1])
        hit = (order[:, :kk_eff] == labels[:, None]).any(dim=1)
        out[f"top{kk}"] = 100.0 * hit.float().mean().item()
    return out


def weighted_knn_accuracy(train_z, train_labels, test_z, test_labels, num_classes: int, *,
                          k: int = 200, sigma: float = 0.1) -> dict:
    scores = weighted_knn_scores(train_z, train_labels, test_z, num_classes, k=k, sigma=sigma)
    return topk_accuracy(scores, test_labels)


def argmax_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Percent of rows whose argmax is the label: a classifier's top-1."""
    return 100.0 * (logits.argmax(1) == labels).float().mean().item()


def test_accuracy(model, x_test, y_test, mean, std, crop=None) -> dict:
    """Classifier accuracy (percent) on un-augmented (centre-cropped) test images:
    {"top1", "top5"} (top-5: the paper's WebVision Table 5; top-1 by argmax)."""
    _, logits = embed(model, x_test, mean, std, crop=crop)
    return {"top1": argmax_accuracy(logits, y_test),
            "top5": topk_accuracy(logits, y_test, ks=(5,))["top5"]}
