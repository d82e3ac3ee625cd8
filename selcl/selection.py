"""Per-epoch Sel-CL selection: confident examples T and confident pairs G (SPEC §5).

    sel = select(z, noisy_labels, C, k=250, alpha=0.5, beta=0.25)
    sel.examples            # bool [N]   T
    sel.pair_mask(i, j)     # bool [len(i), len(j)]   [(i, j) ∈ G]
    sel.stats               # the per-epoch log of SPEC §5.9

Steps (numbers as in SPEC §5), all batched so nothing N×N ever exists:
 1. k-NN (K = k, cosine, self excluded by index) — `selcl.knn.iter_knn`.
 2. ŷ_i = majority noisy label among the K neighbours (votes uniform, or exp(sim/0.1));
    ties → lowest class id (torch.argmax returns the first maximum).
 3. q̂_i(c) = fraction of i's neighbours with ŷ = c.
    `pseudo_labels=False` (the paper's Table 10 "without pseudo-labels"): no pass 2;
    q̂_i is pass 1's vote share of c among i's neighbours' NOISY labels ỹ (weighted with
    "exp"), so ℓ_i is the authors' `discrepancy_measure1`, which their code computes
    beside the pass-2 score it selects by; their first pass computes no agreement, and
    a_i = [argmax_c q̂_i(c) = ỹ_i] = [ŷ_i = ỹ_i] is its analogue.
 4. ℓ_i = −log clamp(q̂_i(ỹ_i), 0.01, 0.99);  a_i = [argmax_c q̂_i(c) = ỹ_i].
 5. m_c = Σ_{ỹ_i=c} a_i over all C classes;  n_sel as the authors' code (SPEC §5.5,
    §10.1) — `class_balanced_count`: α = 0.5 → the LOWER median of {m_c} (the ⌈C/2⌉-th
    smallest, what torch.median returns; for an even C not the mean of the two middle
    values), α = 0 → min, α = 1 → max, any other α → ⌊linear α-quantile⌋ (numpy default).
 6. T = per class, the min(n_sel, |{ỹ=c}|) smallest ℓ_i, ties → lower index.
 7. γ over the ORDERED pairs of G′ = {(i,j): i≠j, i,j ∈ T, ỹ_i=ỹ_j} (SPEC §5.7, §10.1):
    β = 0 / β = 1 → the exact minimum / maximum sim over ALL of G′, whatever its size
    (per class, in row blocks of its T×T similarity matrix: nothing N×N, no sampling);
    any other β → the β-quantile (linear) of sim over all of G′ when |G′| ≤ max_pairs
    (10⁶), else over a seeded uniform sample (with replacement) of exactly max_pairs.
    G′ empty (every class has ≤ 1 selected example) ⇒ γ = +inf: no G″ pairs.
 8. G = G′ ∪ G″ ∪ {(i,i)},  G″ = {(i,j): ỹ_i=ỹ_j, sim > γ}; never different labels.
    Never materialised: `Selection.pair_mask` rebuilds any block of it from ỹ, T and
    the stored embeddings with one matmul.
 9. stats: |T|, n_sel, γ, |G| counted as ordered pairs with i ≠ j (exact when there
    are ≤ exact_pairs_max same-label pairs, else a seeded Horvitz–Thompson estimate;
    key `n_pairs_estimated` says which), and with clean labels y: precision_T,
    recall_T, precision_G (pairs i ≠ j of G with y_i = y_j), pseudo_label_accuracy.

Where SPEC is silent: {m_c} runs over all `num_classes` classes (a class nobody is
labelled with has m_c = 0); IVF rows with missing hits (id −1) vote and count with the
hits they have (q̂ divides by their number).

`version="v2"` (`pretrain.selection_version`, not the SPEC's): the selection of the
authors' `utils_noise_v2.py`, which their run scripts also run (docs/faithfulness.md):
votes weighted by exp(sim/0.1) in both passes (step 2 and the q̂ and a of steps 3–4), and
γ (step 7) the β-quantile over V2_PAIRS_PER_MEMBER pairs per member i of T, (i, j) with j
drawn uniformly, with replacement, from i's class of T (j = i possible): at β = 0 a sample
minimum. Steps 1, 5, 6, 8 and 9 are v1's.

Similarities that decide membership of G (γ, pair_mask, |G|) are computed with autocast
off, in float32 on CPU and float64 on CUDA (immune to TF32 flags the training loop may
have switched on): G does not depend on bf16 / TF32 speed settings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from selcl.errors import DivergedError
from selcl.knn import KnnIndex, iter_knn

VOTE_TEMPERATURE = 0.1      # weighting="exp": vote weight exp(sim / 0.1)
Q_CLAMP = (0.01, 0.99)      # ℓ_i = −log clamp(q̂_i(ỹ_i), 0.01, 0.99)
ROW_BATCH = 16384           # rows per batch of the vote / q̂ passes
PAIR_CHUNK = 1 << 14        # pairs per chunk when sims are gathered row-wise
BLOCK_ELEMS = 1 << 22       # entries per similarity block of the exact |G| count


@dataclass
class Selection:
    """One epoch's selection. Tensors live on the features' device.

    examples [N] bool (T), pseudo_labels [N] int64 (ŷ, pass 1), threshold γ (float,
    +inf when G′ is empty), n_per_class n_sel, features [N,d] float32 (the z used for
    the selection, needed for sim > γ), labels [N] int64 (ỹ), stats (SPEC §5.9 log),
    agreement [N] float32: q̂_i(ỹ_i) before the clamp of ℓ (the share of i's neighbours whose
    pseudo-label is i's given label; ℓ_i = −log clamp(q̂_i(ỹ_i))). Only exported (the
    per-example verdict of runs/<setting>/label_issues.csv); nothing in training reads it.
    """
    examples: torch.Tensor
    pseudo_labels: torch.Tensor
    threshold: float
    n_per_class: int
    features: torch.Tensor
    labels: torch.Tensor
    stats: dict = field(default_factory=dict)
    agreement: torch.Tensor | None = None

    @property
    def indices(self) -> torch.Tensor:
        """Dataset indices of T, ascending (for sampling the L_CLS batches)."""
        return self.examples.nonzero().squeeze(1)

    def pair_mask(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """[(i_a, j_b) ∈ G] for dataset index tensors i [A], j [B] → bool [A, B].

        G = same noisy label AND (same example OR both in T OR sim > γ). Cost: one
        [A,d]×[d,B] matmul + four elementwise [A,B] passes, no Python loop. Indices may
        live on any device; the result is on i's device.
        """
        dev = self.features.device
        ii, jj = i.to(dev, torch.long).view(-1), j.to(dev, torch.long).view(-1)
        t_i, t_j = self.examples[ii], self.examples[jj]
        if math.isfinite(self.threshold):
            s = _sims(self.features, ii, jj)                                    # [A, B]
            # G′ folded into the same comparison by one rank-1 update: both in T →
            # sim + 4 > γ (sims ≥ −1, γ ≤ 1); every other pair gets + 0.0, exactly,
            # so G″ = [sim > γ] is still decided on the unaltered similarity
            s.addr_(t_i.to(s.dtype), t_j.to(s.dtype), alpha=4.0)
            pos = s > self.threshold                                            # G′ ∪ G″
        else:                                                                   # G′ = ∅
            pos = t_i[:, None] & t_j[None, :]
        # (i, i) ∈ G: only the columns whose index is also an anchor can hold such a pair
        hit = torch.isin(jj, ii).nonzero().squeeze(1)
        if hit.numel():
            pos[:, hit] |= ii[:, None] == jj[hit][None, :]
        pos &= self.labels[ii][:, None] == self.labels[jj][None, :]             # ỹ_i = ỹ_j
        return pos.to(i.device)

    def state_dict(self) -> dict:
        """Everything needed to rebuild this selection (pair_mask included), on CPU."""
        return {"examples": self.examples.cpu(), "pseudo_labels": self.pseudo_labels.cpu(),
                "threshold": float(self.threshold), "n_per_class": int(self.n_per_class),
                "features": self.features.cpu(), "labels": self.labels.cpu(),
                "stats": dict(self.stats),
                **({} if self.agreement is None else {"agreement": self.agreement.cpu()})}

    @classmethod
    def from_state_dict(cls, state: dict, device: torch.device | str | None = None) -> "Selection":
        dev = torch.device(device) if device is not None else state["features"].device
        return cls(examples=state["examples"].to(dev), pseudo_labels=state["pseudo_labels"].to(dev),
                   threshold=float(state["threshold"]), n_per_class=int(state["n_per_class"]),
                   features=state["features"].to(dev), labels=state["labels"].to(dev),
                   stats=dict(state["stats"]),
                   agreement=state["agreement"].to(dev) if "agreement" in state else None)


def _exact_dtype(device: torch.device) -> torch.dtype:
    """dtype of the similarities that decide G: float64 on CUDA, where a float32 matmul
    may silently run in TF32 (set_float32_matmul_precision / allow_tf32, flags we must
    not flip); H100-class fp64 makes it ~free. float32 on CPU, which is IEEE there and
    2.5× faster than float64. Either way the sims are exact to ~1e-7."""
    return torch.float64 if device.type == "cuda" else torch.float32


def _sims(z: torch.Tensor, ii: torch.Tensor, jj: torch.Tensor) -> torch.Tensor:
    """[len(ii), len(jj)] cosine sims of stored embeddings: one matmul, autocast off."""
    dt = _exact_dtype(z.device)
    with torch.autocast(device_type=z.device.type, enabled=False):
        return z[ii].to(dt) @ z[jj].to(dt).T


def _pair_sims(z: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sim(z_a[p], z_b[p]) for index vectors a, b [P], in chunks (memory O(chunk·d))."""
    dt = _exact_dtype(z.device)
    out = torch.empty(a.shape[0], dtype=dt, device=z.device)
    for s in range(0, a.shape[0], PAIR_CHUNK):   # chunk sized for the L2/L3 caches
        za = z.index_select(0, a[s:s + PAIR_CHUNK]).to(dt)
        zb = z.index_select(0, b[s:s + PAIR_CHUNK]).to(dt)
        out[s:s + PAIR_CHUNK] = torch.einsum("pd,pd->p", za, zb)   # no [P,d] product temp
    return out


def _sample_pairs(sizes: np.ndarray, starts: np.ndarray, m: int, rng: np.random.Generator):
    """m ordered pairs (p, q), p ≠ q, drawn uniformly (with replacement) from the union
    over groups g of {positions starts[g] .. starts[g]+sizes[g]-1}², diagonal excluded.

    A group is picked with probability ∝ sizes·(sizes−1), then two distinct members.
    Returns positions (int64 numpy) into the array the groups index."""
    w = sizes.astype(np.float64) * (sizes - 1)
    g = rng.choice(len(sizes), size=m, p=w / w.sum())
    a = rng.integers(0, sizes[g])
    b = rng.integers(0, sizes[g] - 1)
    b = b + (b >= a)                        # skip the diagonal: b uniform over the others
    return starts[g] + a, starts[g] + b


V2_PAIRS_PER_MEMBER = 500  # v2's γ: random same-class partners drawn per member of T


def _v2_pair_population(t_c: np.ndarray, starts: np.ndarray, rng: np.random.Generator):
    """The pairs v2's γ is the quantile of (the authors' `utils_noise_v2.py`): for each
    class c, every member of T_c paired V2_PAIRS_PER_MEMBER times with a partner drawn
    uniformly, with replacement, from T_c itself (so (i, i) can be drawn, sim 1). A
    class then weighs ∝ |T_c| where G′'s exact population weighs it ∝ |T_c|(|T_c| − 1).
    Classes with an empty T_c add nothing. Returns positions (int64 numpy) into the
    array the groups index (class c's T_c: starts[c] .. starts[c] + t_c[c] − 1)."""
    a, b = [], []
    for c in np.flatnonzero(t_c >= 1):
        first = np.tile(np.arange(t_c[c]), V2_PAIRS_PER_MEMBER)
        a.append(starts[c] + first)
        b.append(starts[c] + rng.integers(0, t_c[c], size=first.size))
    if not a:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(a).astype(np.int64), np.concatenate(b).astype(np.int64)


def _v2_threshold(z, perm, t_c, starts, beta: float, seed: int) -> float:
    """γ as v2 computes it: the linear β-quantile of sim over `_v2_pair_population`
    (at β = 0 its sample minimum); +inf when T is empty (no G″ pairs, as v1)."""
    a, b = _v2_pair_population(t_c, starts, np.random.default_rng([seed, 8]))
    if a.size == 0:
        return math.inf
    a, b = (perm[torch.from_numpy(x).to(z.device)] for x in (a, b))
    return float(np.quantile(_pair_sims(z, a, b).cpu().numpy(), beta))


def class_balanced_count(m_c, alpha: float) -> int:
    """n_sel from the per-class agreement counts {m_c} (SPEC §5.5, amended §10.1), as
    the authors' code computes it: α = 0.5 → the lower median (the ⌈C/2⌉-th smallest,
    torch.median's choice), α = 0 → min, α = 1 → max, else ⌊linear α-quantile⌋."""
    m = np.sort(np.asarray(m_c, dtype=np.int64).ravel())
    if m.size == 0:
        raise ValueError("class_balanced_count needs at least one class")
    if alpha == 0.5:
        return int(m[(m.size - 1) // 2])
    if alpha == 0.0:
        return int(m[0])
    if alpha == 1.0:
        return int(m[-1])
    return int(math.floor(np.quantile(m.astype(np.float64), alpha)))


def _extreme_pair_sim(z: torch.Tensor, groups, largest: bool) -> float:
    """min (largest=False) or max of sim(z_i, z_j) over the ordered pairs i ≠ j within
    each index group (G′: one group per class, T ∩ {ỹ = c}), exactly: row blocks of each
    group's own similarity matrix, O(BLOCK_ELEMS) memory, the diagonal masked out."""
    best = -math.inf if largest else math.inf
    fill = -math.inf if largest else math.inf
    for members in groups:
        m = len(members)
        rows = max(1, BLOCK_ELEMS // m)
        for r in range(0, m, rows):
            s = _sims(z, members[r:r + rows], members)               # [rows, m]
            k = torch.arange(s.shape[0], device=s.device)
            s[k, k + r] = fill                                       # i ≠ j
            v = float(s.max() if largest else s.min())
            best = max(best, v) if largest else min(best, v)
    return best


def select(features: torch.Tensor, noisy_labels: torch.Tensor, num_classes: int, *,
           k: int, alpha: float, beta: float, weighting: str = "uniform", seed: int = 0,
           clean_labels: torch.Tensor | None = None, knn_index: str | KnnIndex = "flat",
           pseudo_labels: bool = True, max_pairs: int = 10 ** 6, exact_pairs_max: int = 3 * 10 ** 7,
           pair_samples: int = 10 ** 7, knn_kwargs: dict | None = None, version: str = "v1") -> Selection:
    """Sel-CL selection of confident examples T and pairs G (SPEC §5, steps 1–9).

    features [N,d] float32 L2-normalised z; noisy_labels [N] int64 ỹ; clean_labels [N]
    (y, evaluation only: precision/recall stats). k: K of the k-NN; alpha, beta: the
    fractiles α, β; weighting "uniform" | "exp" (votes exp(sim/0.1)); knn_index
    "flat" | "ivf" | "torch" or a prebuilt `selcl.knn.build_index(features, ...)` (see
    selcl.knn; knn_kwargs go to it, e.g. nprobe, nlist, batch_size, use_gpu).
    pseudo_labels: True (the method) scores ℓ, a against the neighbours' pseudo-labels ŷ
    (pass 2); False (paper Table 10, "without") against their noisy labels ỹ (pass 1's votes).
    max_pairs: G′ pairs used for γ (all of them if |G′| ≤ max_pairs, else a sample of
    max_pairs; β = 0 / 1 always use all of G′: the exact min / max). |G| is counted
    exactly when the same-label ordered pairs number ≤ exact_pairs_max, else estimated
    from ≈ `pair_samples` same-label pairs (all pairs of a seeded random subset of anchor
    rows per class; see `_count_pairs`).
    seed seeds every sample (IVF training subsample, γ sample, |G| sample).
    version: "v1" (SPEC §5, the authors' `utils_noise.py`) or "v2" (their
    `utils_noise_v2.py`, not the SPEC; see the module's docstring): exp(sim/0.1) votes in
    both passes (`weighting` is not read) and γ from V2_PAIRS_PER_MEMBER random partners
    per member of T (see `_v2_pair_population`).
    """
    if version not in ("v1", "v2"):
        raise ValueError(f"version must be 'v1' or 'v2', not {version!r}")
    v2 = version == "v2"
    if v2:
        weighting = "exp"
    if weighting not in ("uniform", "exp"):
        raise ValueError(f"weighting must be 'uniform' or 'exp', not {weighting!r}")
    dev = features.device
    n, C = features.shape[0], int(num_classes)
    # own copy of z: pair_mask must not change if the caller reuses its feature buffer
    z = features.detach().float().clone()
    # A NaN row would make the k-NN return fewer than k neighbours for every query (NaN
    # compares false), leaving rows of ŷ unset: on CUDA a device-side assert far from the
    # cause (seen on an H200 after a diverged run), on the CPU an index error. Say it here.
    finite = torch.isfinite(z).all(1)
    if not bool(finite.all()):
        bad = (~finite).nonzero().squeeze(1)
        raise DivergedError(f"{len(bad)} of {n} feature rows are not finite (NaN / inf; first: row "
                            f"{int(bad[0])}): the network that embedded them has diverged, and the "
                            f"k-NN selection cannot rank them")
    y_noisy = noisy_labels.to(dev, torch.long)                      # ỹ
    arange = lambda a, b: torch.arange(a, b, device=dev)            # noqa: E731

    # ---- 1+2: k-NN, pass-1 votes per search batch (the [N,K] sims are never kept) ----
    # neighbour ids as int32 (K·N·4 bytes: 50 MB at N=50k, 1 GB at N=10⁶, K=250)
    nbr = torch.empty(n, k, dtype=torch.int32, device=dev) if pseudo_labels else None
    nbr_w = torch.empty(n, k, dtype=torch.float64, device=dev) if pseudo_labels and v2 else None
    y_hat = torch.empty(n, dtype=torch.long, device=dev)            # ŷ
    loss = torch.empty(n, dtype=torch.float64, device=dev)          # ℓ
    agree = torch.empty(n, dtype=torch.bool, device=dev)            # a
    q_given = torch.empty(n, dtype=torch.float64, device=dev)       # q̂_i(ỹ_i), unclamped (exported)
    for s, sims_b, idx_b in iter_knn(z, z, k, exclude_self=True, index=knn_index, seed=seed,
                                     **(knn_kwargs or {})):
        idx_b = idx_b.to(dev)
        valid = idx_b >= 0                                          # IVF may return −1
        lab = y_noisy[idx_b.clamp_min(0)]                           # ỹ of the neighbours
        if weighting == "uniform":
            w = valid.to(torch.int32)
            votes = torch.zeros(idx_b.shape[0], C, dtype=torch.int32, device=dev)
        else:   # exp(sim/0.1) ∈ [e⁻¹⁰, e¹⁰]: float64 sums keep the totals exact to ~1e-15
            w = torch.exp(sims_b.to(dev, torch.float64) / VOTE_TEMPERATURE) * valid
            votes = torch.zeros(idx_b.shape[0], C, dtype=torch.float64, device=dev)
        votes.scatter_add_(1, lab, w)
        rows = slice(s, s + idx_b.shape[0])
        y_hat[rows] = votes.argmax(1)                               # first max: lowest id
        if pseudo_labels:                                           # pass 2 reads them
            nbr[rows] = idx_b.to(torch.int32)
            if v2:                                                  # and v2 its weights
                nbr_w[rows] = w
        else:   # Table 10 "without": q̂_i = ỹ_i's share of the votes, a_i = [ŷ_i = ỹ_i]
            share = votes.gather(1, y_noisy[rows, None]).squeeze(1).double() / votes.sum(1).double()
            q_given[rows] = share.nan_to_num(0.0)
            loss[rows] = -torch.log(q_given[rows].clamp(*Q_CLAMP))
            agree[rows] = y_hat[rows] == y_noisy[rows]

    # ---- 3+4: q̂_i(ỹ_i), ℓ_i, a_i (pass 2, batched over rows; the method's pseudo-labels) ----
    for s in range(0, n, ROW_BATCH) if pseudo_labels else ():
        nb = nbr[s:s + ROW_BATCH].long()
        valid = nb >= 0
        if v2:      # v2: q̂_i(c) = the exp(sim/0.1)-weighted share of the votes for c
            counts = torch.zeros(nb.shape[0], C, dtype=torch.float64, device=dev)
            counts.scatter_add_(1, y_hat[nb.clamp_min(0)], nbr_w[s:s + ROW_BATCH])
            total = counts.sum(1).clamp_min(torch.finfo(torch.float64).tiny)  # 0 only with no hits
        else:
            counts = torch.zeros(nb.shape[0], C, dtype=torch.int32, device=dev)
            counts.scatter_add_(1, y_hat[nb.clamp_min(0)], valid.to(torch.int32))  # K·q̂_i(c)
            total = valid.sum(1).clamp_min(1)
        own = y_noisy[s:s + ROW_BATCH]
        q_own = counts.gather(1, own[:, None]).squeeze(1).double() / total
        q_given[s:s + ROW_BATCH] = q_own
        loss[s:s + ROW_BATCH] = -torch.log(q_own.clamp(*Q_CLAMP))
        agree[s:s + ROW_BATCH] = counts.argmax(1) == own            # argmax ties → lowest id
    del nbr, nbr_w

    # ---- 5: class-balanced count n_sel ----
    m_c = torch.bincount(y_noisy[agree], minlength=C)[:C]           # m_c over all C classes
    n_sel = class_balanced_count(m_c.cpu().numpy(), alpha)

    # ---- 6: T = per class the n_sel smallest ℓ, ties → lower index ----
    # two stable sorts = lexicographic order by (ỹ, ℓ, index)
    perm = torch.sort(loss, stable=True).indices
    perm = perm[torch.sort(y_noisy[perm], stable=True).indices]
    n_c = torch.bincount(y_noisy, minlength=C)[:C]                  # |{ỹ = c}|
    start_c = torch.cumsum(n_c, 0) - n_c
    rank = arange(0, n) - start_c[y_noisy[perm]]                    # position within class
    examples = torch.zeros(n, dtype=torch.bool, device=dev)
    examples[perm[rank < n_sel]] = True                              # T

    # ---- 7: γ = β-quantile of sim over ordered pairs of G′ ----
    t_c = torch.clamp(n_c, max=n_sel).cpu().numpy()                  # |T ∩ {ỹ=c}|
    start_np = start_c.cpu().numpy()
    n_gprime = int((t_c * (t_c - 1)).sum())                          # |G′| (ordered)
    if v2:                          # v2: quantile of the sampled population, β = 0 included
        gamma, gamma_sampled = _v2_threshold(z, perm, t_c, start_np, beta, seed), True
    elif n_gprime == 0:
        gamma, gamma_sampled = math.inf, False                      # documented: no G″
    elif beta in (0.0, 1.0):                                         # exact min / max of G′
        blocks = ((perm[start_np[c]:start_np[c] + t_c[c]]) for c in np.flatnonzero(t_c >= 2))
        gamma, gamma_sampled = _extreme_pair_sim(z, blocks, largest=beta == 1.0), False
    elif n_gprime <= max_pairs:                                      # every ordered pair
        vals = []
        for c in np.flatnonzero(t_c >= 2):
            members = perm[start_np[c]:start_np[c] + t_c[c]]        # T ∩ class c
            s_c = _sims(z, members, members)
            vals.append(s_c[~torch.eye(len(members), dtype=torch.bool, device=dev)])
        gamma, gamma_sampled = float(np.quantile(torch.cat(vals).cpu().numpy(), beta)), False
    else:                                                            # seeded sample
        rng = np.random.default_rng([seed, 7])
        a, b = _sample_pairs(t_c, start_np, max_pairs, rng)          # T of class c = first
        a, b = (perm[torch.from_numpy(x).to(dev)] for x in (a, b))  # t_c of its block
        gamma = float(np.quantile(_pair_sims(z, a, b).cpu().numpy(), beta))
        gamma_sampled = True

    sel = Selection(examples=examples, pseudo_labels=y_hat, threshold=gamma,
                    n_per_class=n_sel, features=z, labels=y_noisy, agreement=q_given.float())

    # ---- 9: stats ----
    stats = {"n_selected": int(examples.sum()), "n_per_class": n_sel, "threshold": gamma,
             "threshold_sampled": gamma_sampled, "n_pairs_G_prime": n_gprime,
             "agreement_rate": float(agree.double().mean())}
    y = clean_labels.to(dev, torch.long) if clean_labels is not None else None
    n_c_np = n_c.cpu().numpy().astype(np.int64)
    n_same = int((n_c_np * (n_c_np - 1)).sum())                        # same-label pairs
    estimated = n_same > exact_pairs_max
    n_g, n_g_clean = _count_pairs(sel, perm, n_c_np, start_np, y,
                                  row_frac=pair_samples / n_same if estimated else 1.0,
                                  rng=np.random.default_rng([seed, 9]))
    stats.update(n_pairs=n_g if estimated else int(n_g), n_pairs_estimated=estimated,
                 n_same_label_pairs=n_same)
    if y is not None:
        clean = y_noisy == y
        n_t = int(examples.sum())
        stats.update(                 # an empty T has no precision: NaN ("—"), as G's below
            precision_T=float((examples & clean).sum()) / n_t if n_t else float("nan"),   # ỹ = y within T
            recall_T=float((examples & clean).sum()) / max(int(clean.sum()), 1),
            precision_G=(n_g_clean / n_g) if n_g > 0 else float("nan"),
            pseudo_label_accuracy=float((y_hat == y).double().mean()))
    # plain Python scalars: JSON-loggable and loadable by torch.load(weights_only=True)
    sel.stats = {key: (v.item() if isinstance(v, (np.generic, torch.Tensor)) else v)
                 for key, v in stats.items()}
    return sel


def _count_pairs(sel: Selection, perm, n_c, starts, y, row_frac: float, rng):
    """|G| (ordered pairs, i ≠ j) and, with clean labels y, how many have y_i = y_j.

    row_frac = 1: exact — every same-label pair, per class in row blocks of the
    class's own similarity matrix (O(BLOCK_ELEMS) memory). row_frac < 1: per class a
    seeded simple random sample (without replacement) of r_c = ⌈row_frac·n_c⌉ anchor
    rows, all their same-label pairs counted and scaled by n_c / r_c — the
    Horvitz–Thompson estimate, unbiased for |G|; precision_G is then the (consistent)
    ratio of two such estimates. Rows of pairs, not scattered pairs, so the sample is
    computed with matmuls: 10⁷ sampled pairs cost about 0.05 s."""
    dev = sel.features.device
    n_g, n_clean = 0.0, 0.0
    for c in np.flatnonzero(n_c >= 2):
        mem = perm[starts[c]:starts[c] + n_c[c]]                     # all examples ỹ = c
        if row_frac >= 1:
            pos = torch.arange(n_c[c], device=dev)
        else:
            r_c = min(int(n_c[c]), int(math.ceil(row_frac * n_c[c])))
            pos = torch.from_numpy(np.sort(rng.choice(n_c[c], r_c, replace=False))).to(dev)
        scale = float(n_c[c]) / len(pos)
        rows = max(1, BLOCK_ELEMS // len(mem))
        for r in range(0, len(pos), rows):
            p = pos[r:r + rows]
            in_g = sel.pair_mask(mem[p], mem)                        # same label: all true
            in_g[torch.arange(len(p), device=dev), p] = False         # i ≠ j
            n_g += scale * int(in_g.sum())
            if y is not None:
                n_clean += scale * int((in_g & (y[mem[p]][:, None] == y[mem][None, :])).sum())
    return n_g, n_clean
