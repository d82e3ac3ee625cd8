"""Losses of Sel-CL / Sel-CL+ (SPEC §4, §6, §7), as pure functions.

  moco_loss                   Uns-CL, MoCo with a key queue                   (§4)
  mixup_params, mix           mixup: λ ~ Beta(1,1), λ = max(λ, 1−λ), partner  (§6, §7)
  pair_masks                  the [A,M] masks of G shared by L_MIX and L_SIM  (§5.8, §6)
  selective_contrastive_loss  L_MIX: SupCon over the confident pairs G, with
                              mixup weighting and the MoCo fallback           (§6, Eq. 6)
  similarity_loss             L_SIM: BCE between p_i·p_j and [(i, j) ∈ G]     (§6, Eq. 9)
  mixup_cross_entropy         L_CLS and fine-tuning epochs 1–30               (§6, §7)
  mixup_bootstrap_loss        fine-tuning after epoch 30, hard bootstrapping  (§7)

Similarities, log-softmax and cross-entropies are computed in (at least) float32,
whatever the input dtype (bf16 under autocast), by promoting the inputs first.

G is never materialised: the contrastive and similarity losses take a callable
`in_G(i, j) -> bool [len(i), len(j)]` over dataset indices (the selection's pair
mask); (i, i) ∈ G for every i.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

PairMask = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _f32(x: torch.Tensor) -> torch.Tensor:
    """Promote to at least float32 (bf16/fp16 → float32; float64 stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


# ---------------------------------------------------------------------------- §4
def moco_loss(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor,
              temperature: float = 0.1, reduction: str = "mean") -> torch.Tensor:
    """MoCo InfoNCE (SPEC §4).

    q [B,d] online queries, k [B,d] EMA keys (positives), queue [Q,d] EMA keys
    (negatives, Q may be 0); all L2-normalised. logits = [q·k, q·queueᵀ] / τ,
    cross-entropy with the positive at index 0. Returns [B] ("none") or a scalar.
    """
    q = _f32(q)
    k, queue = k.to(q.dtype), queue.to(q.dtype)
    l_pos = (q * k).sum(dim=1, keepdim=True)                 # [B,1]
    l_neg = q @ queue.T                                       # [B,Q]
    logits = torch.cat([l_pos, l_neg], dim=1) / temperature   # [B,1+Q]
    loss = torch.logsumexp(logits, dim=1) - logits[:, 0]      # −log softmax(logits)[0]
    return _reduce(loss, reduction)


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return loss
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    raise ValueError(f"unknown reduction {reduction!r}")


# ------------------------------------------------------------------ mixup (§6, §7)
def mixup_params(batch_size: int, generator: torch.Generator,
                 device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one mixup: λ ~ Beta(1,1) = Uniform(0,1), λ = max(λ, 1−λ) ∈ [0.5, 1], and the
    partner of each example by a random permutation perm [B] (int64, on `device`).

    Both come from `generator` (on its own device), never from the global RNG, so
    training is reproducible and resumable from the generator's state. λ is returned
    as a 0-dim float32 tensor on `device`: keeping it there (no `.item()`) saves a
    host↔device synchronisation per draw on CUDA.
    """
    gdev = generator.device
    dev = device if device is not None else gdev
    lam = torch.rand((), generator=generator, device=gdev)
    lam = torch.maximum(lam, 1.0 - lam)                          # λ = max(λ, 1−λ)
    perm = torch.randperm(batch_size, generator=generator, device=gdev)
    return lam.to(dev), perm.to(dev)


def mix(x: torch.Tensor, lam: float | torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """λ·x + (1−λ)·x[perm]; x [B,...], lam a float (or a tensor broadcastable to x)."""
    return lam * x + (1 - lam) * x[perm]


# ---------------------------------------------------------------------------- §6
def _self_mask(A: int, M: int, device: torch.device, offset: int = 0) -> torch.Tensor:
    """[A,M] bool, True at (a, offset + a): candidate offset + a is anchor a itself
    (cands = cat([anchors, memory]); under DDP the anchors of all ranks come first and
    this rank's start at `offset`)."""
    if M < offset + A:
        raise ValueError(f"candidates {offset}..{offset + A - 1} must be the anchors, got only M={M}")
    if offset == 0:
        return torch.eye(A, M, dtype=torch.bool, device=device)
    mask = torch.zeros(A, M, dtype=torch.bool, device=device)
    rows = torch.arange(A, device=device)
    mask[rows, rows + offset] = True
    return mask


def pair_masks(anchor_ids: torch.Tensor, partner_ids: torch.Tensor, cand_ids: torch.Tensor,
               in_G: PairMask, partner_rows: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The two [A,M] bool masks of G that L_MIX and L_SIM share:
    G_dom[a,c] = (anchor_ids[a], cand_ids[c]) ∈ G,  G_part[a,c] = (partner_ids[a], cand_ids[c]) ∈ G.

    Computing them once and passing `masks=` to both losses halves the in_G evaluations
    (each one gathers stored embeddings and thresholds their similarities). If the partner
    of every anchor is itself an anchor, partner_ids == anchor_ids[partner_rows] (batch
    mixup: partner_rows = cat([perm1, perm2 + B])), G_part is a row gather of G_dom
    instead of a second in_G evaluation.
    """
    anchor_ids = anchor_ids.to(cand_ids.device)
    g_dom = in_G(anchor_ids, cand_ids)
    if partner_rows is not None:
        return g_dom, g_dom[partner_rows.to(g_dom.device)]
    return g_dom, in_G(partner_ids.to(cand_ids.device), cand_ids)


def selective_contrastive_loss(anchors: torch.Tensor, anchor_ids: torch.Tensor,
                               partner_ids: torch.Tensor, lam: torch.Tensor,
                               cands: torch.Tensor, cand_ids: torch.Tensor, in_G: PairMask | None,
                               keys: torch.Tensor, partner_keys: torch.Tensor,
                               queue: torch.Tensor, temperature: float = 0.1,
                               masks: tuple[torch.Tensor, torch.Tensor] | None = None,
                               self_offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """L_MIX (SPEC §6, Eq. 6): supervised contrastive loss over the confident pairs G,
    with mixup weighting and the unsupervised (MoCo) fallback.

    anchors      [A,d]  online embeddings of the mixed views (A = 2B, both views stacked)
    anchor_ids   [A]    dataset index of each anchor's dominant example
    partner_ids  [A]    dataset index of its mixup partner
    lam          [A]    λ_a (weight of the dominant example; views may differ)
    cands        [M,d]  torch.cat([anchors, memory_feats]): candidate a (< A) IS anchor a
    cand_ids     [M]    dataset index of each candidate's (dominant) example
    in_G         (i [n], j [m]) -> bool [n,m]: (i, j) ∈ G, with (i, i) ∈ G always
    keys         [A,d]  EMA embedding of the other, un-mixed view of the dominant example
    partner_keys [A,d]  the same for the partner example
    queue        [Q,d]  MoCo negatives (KeyQueue.keys; Q may be 0)
    masks        optional (G_dom, G_part) from `pair_masks` (then in_G is not called)
    self_offset  row of anchor 0 among the candidates (DDP: this rank's first anchor among
                 the gathered anchors of all ranks; 0 in one process)

    For each anchor a and part x ∈ {dominant (weight λ_a), partner (weight 1−λ_a)}:
      P_x(a) = {c ≠ a : (x, id_c) ∈ G}   — includes the other view of x and memory copies of x
      L_x(a) = −1/|P_x(a)| Σ_{p∈P_x(a)} log[ exp(a·c_p/τ) / Σ_{c≠a} exp(a·c_c/τ) ]
    Fallback ("anchors with no positive from G get the MoCo loss of §4"): since (x, x) ∈ G
    always, "no positive from G" is read as: no c ≠ a with id_c ≠ x and (x, id_c) ∈ G, i.e.
    the only positives would be copies of x itself. Then L_x(a) = moco_loss(a, key_x, queue),
    key_x = keys[a] (dominant) or partner_keys[a] (partner).
      loss[a] = λ_a·L_dom(a) + (1−λ_a)·L_part(a)

    Returns (loss [A] in ≥float32, fraction of the 2A (anchor, part) terms that used the
    fallback, as a 0-dim tensor on the anchors' device). Gradients flow through anchors and cands.
    """
    A, M = anchors.shape[0], cands.shape[0]
    a_emb = _f32(anchors)
    c_emb = _f32(cands).to(a_emb.dtype)
    lam = lam.to(device=a_emb.device, dtype=a_emb.dtype)
    self_mask = _self_mask(A, M, a_emb.device, self_offset)
    if masks is None:
        masks = pair_masks(anchor_ids, partner_ids, cand_ids, in_G)

    # log softmax over all non-self candidates: one [A,M] similarity matrix
    # (1/τ folded into the [A,d] anchors: saves a pass over [A,M]).
    logits = ((a_emb / temperature) @ c_emb.T).masked_fill(self_mask, float("-inf"))
    log_prob = torch.log_softmax(logits, dim=1)

    part_losses, fallbacks = [], []
    for x, key, g in ((anchor_ids, keys, masks[0]), (partner_ids, partner_keys, masks[1])):
        x = x.to(cand_ids.device)
        pos = g.to(self_mask.device) & ~self_mask                     # P_x(a): [A,M]
        n_pos = pos.sum(dim=1)
        # −(1/|P|) Σ_p log softmax; masked with where (not ×) so that −inf·0 never appears.
        l_sup = -torch.where(pos, log_prob, 0.0).sum(dim=1) / n_pos.clamp(min=1)
        has_G = (pos & (cand_ids[None, :] != x[:, None])).any(dim=1)  # a positive other than x's copies
        l_moco = moco_loss(anchors, key, queue, temperature, reduction="none").to(l_sup.dtype)
        part_losses.append(torch.where(has_G, l_sup, l_moco))
        fallbacks.append(~has_G)

    loss = lam * part_losses[0] + (1 - lam) * part_losses[1]   # λ·L_dom + (1−λ)·L_part
    # a 0-dim tensor, not .item(): the training loop sums it on the device (no sync per step)
    used_fallback = torch.stack(fallbacks).float().mean()
    return loss, used_fallback


def similarity_loss(p_anchor: torch.Tensor, p_cands: torch.Tensor, anchor_ids: torch.Tensor,
                    partner_ids: torch.Tensor, lam: torch.Tensor, cand_ids: torch.Tensor,
                    in_G: PairMask | None, eps: float = 1e-7,
                    masks: tuple[torch.Tensor, torch.Tensor] | None = None,
                    self_offset: int = 0) -> torch.Tensor:
    """L_SIM (SPEC §6, Eq. 9): BCE between s = p_a·p_c and the pair indicator, mixup-weighted.

    p_anchor [A,C] softmax probabilities of the anchors (mixed views); p_cands [M,C] =
    torch.cat([p_anchor, memory EMA probabilities]) (candidate a < A is anchor a);
    anchor_ids / partner_ids / lam [A], cand_ids [M], in_G / masks as in
    selective_contrastive_loss (self_offset too).

      s_ac = clamp(p_a·p_c, eps, 1−eps)
      ℓ_ac = λ_a·BCE(s_ac, [(dom_a, c) ∈ G]) + (1−λ_a)·BCE(s_ac, [(partner_a, c) ∈ G])
    averaged over all A·(M−1) non-self pairs (c ≠ a). Returns a scalar.
    """
    A, M = p_anchor.shape[0], p_cands.shape[0]
    pa = _f32(p_anchor)
    pc = _f32(p_cands).to(pa.dtype)
    lam = lam.to(device=pa.device, dtype=pa.dtype)[:, None]
    self_mask = _self_mask(A, M, pa.device, self_offset)
    if masks is None:
        masks = pair_masks(anchor_ids, partner_ids, cand_ids, in_G)

    s = (pa @ pc.T).clamp(eps, 1 - eps)                                  # [A,M]
    t_dom, t_part = (g.to(device=pa.device, dtype=pa.dtype) for g in masks)
    # BCE is linear in its target, so λ·BCE(s,t_dom) + (1−λ)·BCE(s,t_part) = BCE(s, t):
    t = lam * t_dom + (1 - lam) * t_part
    bce = -(t * torch.log(s) + (1 - t) * torch.log1p(-s))
    # masked sum / count instead of bce[mask].mean(): no data-dependent shape, no GPU sync
    return bce.masked_fill(self_mask, 0.0).sum() / (A * (M - 1))


# ---------------------------------------------------------------------- §6, §7
def mixup_cross_entropy(logits: torch.Tensor, y_a: torch.Tensor, y_b: torch.Tensor,
                        lam: float | torch.Tensor) -> torch.Tensor:
    """λ·CE(logits, y_a) + (1−λ)·CE(logits, y_b), mean over the batch.

    logits [B,C], y_a / y_b [B] class ids (y_b = y_a[perm]), lam a float or [B].
    Used by L_CLS (§6) and fine-tuning epochs 1–30 (§7).
    """
    logits = _f32(logits)
    if torch.is_tensor(lam):
        lam = lam.to(device=logits.device, dtype=logits.dtype)
    ce_a = F.cross_entropy(logits, y_a, reduction="none")
    ce_b = F.cross_entropy(logits, y_b, reduction="none")
    return (lam * ce_a + (1 - lam) * ce_b).mean()


def mixup_bootstrap_loss(logits: torch.Tensor, y_a: torch.Tensor, y_b: torch.Tensor,
                         z_a: torch.Tensor, z_b: torch.Tensor, lam: float | torch.Tensor,
                         bootstrap: float = 0.2) -> torch.Tensor:
    """Mixup with hard bootstrapping (SPEC §7, fine-tuning after epoch 30), mean over batch:

      λ·[(1−B)·CE(p, y_a) + B·CE(p, z_a)] + (1−λ)·[(1−B)·CE(p, y_b) + B·CE(p, z_b)]

    logits [B,C]; y_a, y_b [B] noisy labels of the dominant / partner example; z_a, z_b [B]
    argmax of the model's prediction on their un-augmented images (computed by the caller
    without gradient); lam a float or [B]; B = `bootstrap`.
    """
    logits = _f32(logits)
    if torch.is_tensor(lam):
        lam = lam.to(device=logits.device, dtype=logits.dtype)
    ce = lambda y: F.cross_entropy(logits, y, reduction="none")  # noqa: E731
    part_a = (1 - bootstrap) * ce(y_a) + bootstrap * ce(z_a)
    part_b = (1 - bootstrap) * ce(y_b) + bootstrap * ce(z_b)
    return (lam * part_a + (1 - lam) * part_b).mean()
