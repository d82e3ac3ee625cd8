"""Losses of Sel-CL / Sel-CL+ (SPEC §4, §6, §7), as pure functions.

  moco_loss                   Uns-CL, MoCo with a key queue                   (§4)
  mixup_params, mix           mixup: λ ~ Beta(1,1), λ = max(λ, 1−λ), partner  (§6, §7)
  term_masks                  the [A,M] masks of one term (batch or memory)    (§10.2.4)
  sup_contrastive_term        one term of L_sel: SupCon over G, mixup-weighted  (§10.2.4, Eq. 6)
  similarity_term             one term of L_SIM: BCE of p_i·p_j vs the targets  (§10.2.6, Eq. 9)
  fallback_weights            s_i: which examples get the Uns-CL loss          (§10.2.5)
  selective_losses            L_sel and L_SIM of one iteration from the above  (§10.2.4–6)

The pre-training iteration (SPEC §10.2, the authors' structure) sums a *batch* term and
a *memory* term, each with its own softmax and masks:
  L_sel = mean_i(s_i·u_i) + Σ_terms mean_i ℓ_i,   L_SIM = Σ_terms mean(BCE)
(u_i: MoCo loss of the un-mixed view 1): `selective_losses`; `selcl.train.Pretrainer.step`
makes its inputs.
  mixup_cross_entropy         L_CLS and fine-tuning epochs 1–30               (§6, §7)
  mixup_bootstrap_loss        fine-tuning after epoch 30, hard bootstrapping  (§7)

Similarities, log-softmax and cross-entropies are computed in (at least) float32,
whatever the input dtype (bf16 under autocast), by promoting the inputs first.

G is never materialised: the contrastive and similarity losses take a callable
`in_G(i, j) -> bool [len(i), len(j)]` over dataset indices (the selection's pair
mask); (i, i) ∈ G for every i.
"""
from __future__ import annotations

from dataclasses import dataclass
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


# ----------------------------------------------------------------- §6, §10.2
@dataclass
class TermMasks:
    """The five [A,M] bool masks of one term (batch or memory) of SPEC §10.2.4, for A
    anchors (rows: view-1 anchors of the B examples, then their view-2 anchors) against
    M candidates. With a = the anchor, i its dominant example, p its mixup partner:

      keep[a,c]       c is not a's own entry (the only candidate left out of the softmax)
      sup_dom[a,c]    (i, id_c) ∈ G, except i's own entries of the current batch
      unsup_dom[a,c]  c is the other view of i in the current batch
      sup_part[a,c]   (p, id_c) ∈ G   (p's own current views included: (p, p) ∈ G)
      unsup_part[a,c] c is a view of p in the current batch
    so p's current views are in both of its sets and count twice, as in the authors'
    masks. Older memory copies of i are "sup" positives of i ((i, i) ∈ G).
    """
    keep: torch.Tensor
    sup_dom: torch.Tensor
    unsup_dom: torch.Tensor
    sup_part: torch.Tensor
    unsup_part: torch.Tensor


def term_masks(anchor_ids: torch.Tensor, partner_ids: torch.Tensor, cand_ids: torch.Tensor,
               current: torch.Tensor, own: torch.Tensor, in_G: PairMask,
               partner_rows: torch.Tensor | None = None) -> TermMasks:
    """Build one term's masks (see TermMasks).

    anchor_ids [A]   dataset index of each anchor's dominant example
    partner_ids [A]  dataset index of its mixup partner
    cand_ids [M]     dataset index of each candidate
    current [M]      bool: the candidate is an entry of the current (global) batch
    own [A]          column of each anchor's own entry among the candidates
    in_G             (i [n], j [m]) -> bool [n,m], (i, i) ∈ G
    partner_rows [A] optional: partner_ids == anchor_ids[partner_rows], so the partner's G
                     rows are a row gather of the dominant ones (one in_G call, not two)
    Dataset indices are unique within a batch (an epoch is a permutation), so "same
    index and current" is exactly "a view of the same example in this batch".
    """
    A, M = anchor_ids.shape[0], cand_ids.shape[0]
    dev = cand_ids.device
    anchor_ids, partner_ids = anchor_ids.to(dev), partner_ids.to(dev)
    keep = torch.ones(A, M, dtype=torch.bool, device=dev)
    keep[torch.arange(A, device=dev), own.to(dev)] = False
    g_dom = in_G(anchor_ids, cand_ids).to(dev)
    g_part = g_dom[partner_rows.to(dev)] if partner_rows is not None else in_G(partner_ids, cand_ids).to(dev)
    cur = current.to(dev)[None, :]
    same_dom = cur & (anchor_ids[:, None] == cand_ids[None, :])     # i's views in this batch
    same_part = cur & (partner_ids[:, None] == cand_ids[None, :])   # p's views in this batch
    return TermMasks(keep=keep, sup_dom=g_dom & ~same_dom, unsup_dom=same_dom & keep,
                     sup_part=g_part & keep, unsup_part=same_part & keep)


def sup_contrastive_term(anchors: torch.Tensor, cands: torch.Tensor, lam: torch.Tensor,
                         masks: TermMasks, temperature: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """One supervised contrastive term of L_sel (SPEC §10.2.4; Eq. 6 with mixup).

    anchors [A,d] (A = 2B: view-1 rows then view-2 rows), cands [M,d], lam [A].
      log p(a,c) = a·c/τ − log Σ_{c' : keep} exp(a·c'/τ)
      m_x(a)     = (Σ_{sup_x} log p + Σ_{unsup_x} log p) / (|sup_x(a)| + |unsup_x(a)|),  x ∈ {dom, part}
      ℓ(a)       = −λ_a·m_dom(a) − (1−λ_a)·m_part(a)
      ℓ_i        = [|sup_dom(view-1 anchor of i)| > 0] · (ℓ(i) + ℓ(i+B)) / 2
    Returns (ℓ_i [B], |sup_dom| of the view-1 anchors [B] (for the fallback rule)).
    Every row has ≥ 1 "unsup" positive (the other view), so no denominator is 0.
    """
    a_emb = _f32(anchors)
    c_emb = _f32(cands).to(a_emb.dtype)
    lam = lam.to(device=a_emb.device, dtype=a_emb.dtype)
    logits = (a_emb / temperature) @ c_emb.T                          # [A,M]
    log_prob = logits - torch.logsumexp(logits.masked_fill(~masks.keep, float("-inf")), dim=1, keepdim=True)

    def mean_log_prob(sup, unsup):
        # where, not ×: no −inf·0. sup and unsup may overlap (the partner's views): summed apart.
        total = torch.where(sup, log_prob, 0.0).sum(1) + torch.where(unsup, log_prob, 0.0).sum(1)
        return total / (sup.sum(1) + unsup.sum(1)).clamp(min=1)

    loss = -lam * mean_log_prob(masks.sup_dom, masks.unsup_dom) \
        - (1 - lam) * mean_log_prob(masks.sup_part, masks.unsup_part)   # ℓ(a) [A]
    B = anchors.shape[0] // 2
    n_sup = masks.sup_dom[:B].sum(1)                                   # view-1 anchors
    return (n_sup > 0) * loss.view(2, B).mean(0), n_sup


def similarity_term(p_anchor: torch.Tensor, p_cands: torch.Tensor, lam: torch.Tensor,
                    masks: TermMasks, eps: float = 1e-7) -> torch.Tensor:
    """One term of L_SIM (SPEC §10.2.6; Eq. 9): BCE between s = p_a·p_c and the pair targets.

    p_anchor [A,C] softmax of the anchors, p_cands [M,C] (online for the batch term, EMA
    for the memory term), lam [A], masks of the same term.
      t_x[a,c] = sup_x + unsup_x  (2 at the partner's own current views, as the authors')
      ℓ[a,c]   = λ_a·BCE(s, t_dom) + (1−λ_a)·BCE(s, t_part),
      BCE(s,t) = −t·log(s+ε) − (1−t)·log(1−s+ε)
    Returns the mean of ℓ over all A·M entries with the `keep`-excluded ones set to 0.
    """
    pa = _f32(p_anchor)
    pc = _f32(p_cands).to(pa.dtype)
    lam = lam.to(device=pa.device, dtype=pa.dtype)[:, None]
    s = pa @ pc.T                                                     # [A,M]
    f = lambda m: m.to(pa.dtype)  # noqa: E731
    # BCE is linear in its target: λ·BCE(s,t_dom) + (1−λ)·BCE(s,t_part) = BCE(s, λ·t_dom + (1−λ)·t_part)
    t = lam * (f(masks.sup_dom) + f(masks.unsup_dom)) + (1 - lam) * (f(masks.sup_part) + f(masks.unsup_part))
    bce = -(t * torch.log(s + eps) + (1 - t) * torch.log(1 - s + eps))
    return (bce * f(masks.keep)).mean()


def fallback_weights(n_sup_batch: torch.Tensor, n_sup_memory: torch.Tensor | None) -> torch.Tensor:
    """s_i of SPEC §10.2.5: 1 when example i's view-1 anchor has fewer than 2 "sup"
    positives over batch and memory together (fewer than 1 when the memory is not read),
    else 0. (The current batch is also in the memory, so its positives count twice.)"""
    if n_sup_memory is None:
        return (n_sup_batch < 1).float()
    return (n_sup_batch + n_sup_memory < 2).float()


@dataclass
class Candidates:
    """One term's candidates: embeddings z [M,d], class probabilities p [M,C], dataset
    indices ids [M], current [M] (entry of the current batch), own [A] (column of each
    anchor's own entry)."""
    z: torch.Tensor
    p: torch.Tensor
    ids: torch.Tensor
    current: torch.Tensor
    own: torch.Tensor


def selective_losses(z_mix: torch.Tensor, p_mix: torch.Tensor, u: torch.Tensor | None, lam: torch.Tensor,
                     anchor_ids: torch.Tensor, partner_rows: torch.Tensor, in_G: PairMask,
                     batch: Candidates, memory: Candidates | None = None, temperature: float = 0.1,
                     similarity: bool = True) -> dict:
    """L_sel and L_SIM of one iteration, SPEC §10.2.4–6 (the authors' structure).

    z_mix [2B,d], p_mix [2B,C]  online embeddings / softmax of the mixed views (view 1, view 2)
    u [B] or None               MoCo loss of the un-mixed view 1 (None: no Uns-CL term)
    lam [2B]                    λ of each anchor's view
    anchor_ids [2B]             dataset index of each anchor's dominant example
    partner_rows [2B]           row of its mixup partner's anchor (cat([perm1, perm2 + B]))
    batch / memory              the two terms' candidates (memory None: not read)

      L_sel = mean_i(s_i·u_i) + Σ_terms mean_i ℓ_i          L_SIM = Σ_terms mean BCE
    Returns {"l_sel", "l_sim" (0 if not `similarity`), "s" [B] (fallback weights)}.
    z_mix None: L_SIM alone ({"l_sim"}; the candidates' z may be None too).
    """
    partner_ids = anchor_ids[partner_rows]
    l_sel, l_sim, n_sup = 0.0, 0.0, []
    for c in (batch, memory):
        if c is None:
            continue
        masks = term_masks(anchor_ids, partner_ids, c.ids, c.current, c.own, in_G, partner_rows)
        if z_mix is not None:
            l_i, n_i = sup_contrastive_term(z_mix, c.z, lam, masks, temperature)
            l_sel, n_sup = l_sel + l_i.mean(), n_sup + [n_i]
        if similarity:
            l_sim = l_sim + similarity_term(p_mix, c.p, lam, masks)
    if z_mix is None:
        return {"l_sim": l_sim}
    s = fallback_weights(n_sup[0], n_sup[1] if memory is not None else None)
    if u is not None:
        l_sel = l_sel + (s * _f32(u)).mean()
    return {"l_sel": l_sel, "l_sim": l_sim, "s": s}


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
