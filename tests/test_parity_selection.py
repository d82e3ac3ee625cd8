"""Parity of the selection (SPEC §5, §10.1) with an independent port of the authors'
`pair_selection` (utils/utils_noise.py of ShikunLi/Sel-CL), written from reading it.

The port below works the way their function does: the full N×N similarity matrix, the
k-NN by a sort of each row, both voting passes with one-hot counts, the per-class
agreement counts and their median / quantile, T by per-class ranking of the pass-2 score,
γ by np.quantile over the same-label pairs of T, and G as a dense N×N matrix. It calls
nothing of `selcl`. The project (`selcl.selection.select`) computes the same with faiss,
batched passes and a pair mask built on the fly.

Where the authors' code leaves a tie to torch (topk, sort), the port settles it as
SPEC §5 fixes it: equal similarities → the lower index first, a tied vote → the lowest
class id, equal scores → the lower example index.

Two switches give the authors' choices where the project deliberately differs:
  * `authors_self_mask`: their k-NN "self" mask sets entry (r, r) of each 100-row chunk
    of the similarity matrix to −1, which is the example itself only in the first chunk
    (README "Faithfulness"; SPEC §5.1, §10: the one deliberate difference). Off: the
    example is excluded by index, as SPEC §5.1.
  * `spec_pairs`: the README's "smaller differences" of the pair rule, on the SPEC's
    side: γ's population without the pairs (i, i), G″ by sim > γ (theirs: ≥), and
    (i, i) ∈ G for every i. Off: the authors' rule.

Embeddings are seeded random unit vectors rounded to multiples of 1/64 (d = 16): every
dot product is then exact in float32 and float64 whatever the summation order (faiss,
torch, BLAS blocks), so both sides see the same numbers and the comparison can be
exact; ties in similarity are real and exercise the tie rules.

  * self-mask off, SPEC pair rule: ŷ, T, n_sel, γ and the whole N×N G equal;
  * self-mask on: the k-NN lists differ exactly as documented, and the project fed those
    lists gives the port's ŷ, T and G again (the mask is the only difference);
  * the authors' pair rule: G differs only on the pairs the README lists.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import selcl.selection as selection_module
from selcl.selection import select

CHUNK = 100     # rows per batch of the authors' feature loader (batch_size=100, no shuffle)
C = 10
# CIFAR-10's asymmetric flips: truck → automobile, bird → airplane, deer → horse, cat ↔ dog
ASYM = {9: 1, 2: 0, 4: 7, 3: 5, 5: 3}


# ------------------------------------------------------------------ the authors' selection
def authors_selection(z: torch.Tensor, noisy: torch.Tensor, num_classes: int, k: int, alpha: float,
                      beta: float, *, authors_self_mask: bool, spec_pairs: bool) -> dict:
    """Their pair_selection on embeddings z [N, d] and noisy labels ỹ [N] (int64).

    Returns {"nbr" [N, K] neighbour indices, "y_hat" [N] pass-1 pseudo-labels ŷ,
    "score" [N] float32 pass-2 scores ℓ, "n_sel" (float, as their torch.median /
    quantile gives it), "T" [N] bool, "gamma" float, "G" [N, N] bool, "sim" [N, N]
    float64 similarities}."""
    n = len(noisy)
    sim = z.double() @ z.double().T                     # [N, N] their smiliar_graph_all
    masked = sim.clone()
    if authors_self_mask:       # dist[arange(b), arange(b)] = −1 in every chunk of rows
        for s in range(0, n, CHUNK):
            r = torch.arange(min(CHUNK, n - s))
            masked[s + r, r] = -1.0
    else:                       # SPEC §5.1: the example itself, by index
        masked.fill_diagonal_(-math.inf)
    nbr = torch.sort(masked, dim=1, descending=True, stable=True).indices[:, :k]   # [N, K]

    def vote_share(labels: torch.Tensor) -> torch.Tensor:
        """[N, C] float32: share of i's K neighbours carrying each label (uniform votes)."""
        counts = F.one_hot(labels[nbr], num_classes).sum(1).float()
        return counts / counts.sum(1, keepdim=True)

    # pass 1: ŷ_i = the most voted noisy label among the neighbours (their sort(1, True)[:, 0])
    y_hat = torch.sort(vote_share(noisy), dim=1, descending=True, stable=True).indices[:, 0]
    # pass 2: q̂_i(c) from the neighbours' ŷ; ℓ_i = −log clamp(q̂_i(ỹ_i), 0.01, 0.99)
    q2 = vote_share(y_hat)
    score = -torch.log(q2.gather(1, noisy[:, None]).squeeze(1).clamp(0.01, 0.99))
    agree = (q2.max(1).indices == noisy).float()       # a_i (torch.max: the first maximum)
    # m_c over all classes, n_sel by their four cases
    m = torch.stack([agree[noisy == c].sum() for c in range(num_classes)])
    if alpha == 0.5:
        n_sel = torch.median(m)                          # the lower median
    elif alpha == 1.0:
        n_sel = m.max()
    elif alpha == 0.0:
        n_sel = m.min()
    else:
        n_sel = torch.quantile(m, alpha)
    # T: per class the min(n_sel, |class|) smallest ℓ (their topk(largest=False))
    T = torch.zeros(n, dtype=torch.bool)
    for c in range(num_classes):
        members = (noisy == c).nonzero().squeeze(1)
        take = len(members) if n_sel >= len(members) else int(n_sel)
        T[members[torch.sort(score[members], stable=True).indices[:take]]] = True
    # γ: β-quantile of sim over the same-label pairs of T (theirs: (i, i) included)
    same = noisy[:, None] == noisy[None, :]
    t_idx = T.nonzero().squeeze(1)
    pop = same[t_idx][:, t_idx].clone()
    if spec_pairs:
        pop.fill_diagonal_(False)
    vals = sim[t_idx][:, t_idx][pop].numpy()
    gamma = float(np.quantile(vals, beta)) if vals.size else math.inf
    # G: same label and sim ≥ γ (G″), then the block T×T set to "same label" (G′)
    G = same & ((sim > gamma) if spec_pairs else (sim >= gamma))
    G[t_idx[:, None], t_idx[None, :]] = same[t_idx][:, t_idx]
    if spec_pairs:
        G.fill_diagonal_(True)
    return {"nbr": nbr, "y_hat": y_hat, "score": score, "n_sel": float(n_sel), "T": T,
            "gamma": gamma, "G": G, "sim": sim}


# ------------------------------------------------------------------ seeded cases
def case(seed: int, n: int, noise: str, rate: float = 0.4):
    """z [n, 16] float32 on the 1/64 grid (near-unit, clustered by the clean class),
    noisy labels ỹ [n] (symmetric: a uniform class with probability `rate`; asymmetric:
    CIFAR-10's flips with probability `rate`)."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(C, (n,), generator=g)
    means = F.normalize(torch.randn(C, 16, generator=g, dtype=torch.float64), dim=1)
    u = F.normalize(means[clean] + 0.3 * torch.randn(n, 16, generator=g, dtype=torch.float64), dim=1)
    z = (torch.round(u * 64) / 64).float()
    flip = torch.rand(n, generator=g) < rate
    if noise == "sym":
        other = torch.randint(C, (n,), generator=g)
    else:
        other = torch.tensor([ASYM.get(int(c), int(c)) for c in clean])
    return z, torch.where(flip, other, clean)


CASES = [  # (seed, N, noise, K, α, β)
    (0, 300, "sym", 15, 0.5, 0.25),
    (1, 640, "asym", 25, 0.5, 0.25),
    (2, 1000, "sym", 25, 0.75, 0.35),
    (3, 1000, "asym", 30, 0.25, 0.0),
    (4, 640, "asym", 20, 0.5, 1.0),
]
IDS = [f"N{c[1]}-{c[2]}-a{c[4]}-b{c[5]}" for c in CASES]


def project(z, noisy, k, alpha, beta):
    sel = select(z, noisy, C, k=k, alpha=alpha, beta=beta, weighting="uniform", knn_index="flat")
    ar = torch.arange(len(noisy))
    return sel, sel.pair_mask(ar, ar)


@pytest.mark.parametrize("seed,n,noise,k,alpha,beta", CASES, ids=IDS)
def test_selection_equals_the_authors_with_the_self_excluded(seed, n, noise, k, alpha, beta):
    """Self excluded by index and the SPEC pair rule on both sides: ŷ, T, n_sel, γ and
    every entry of G [N, N] equal."""
    z, noisy = case(seed, n, noise)
    ref = authors_selection(z, noisy, C, k, alpha, beta, authors_self_mask=False, spec_pairs=True)
    sel, G = project(z, noisy, k, alpha, beta)
    assert torch.equal(sel.pseudo_labels, ref["y_hat"])
    assert sel.n_per_class == int(ref["n_sel"])
    assert torch.equal(sel.examples, ref["T"]), (sel.examples ^ ref["T"]).nonzero().squeeze(1)
    assert sel.threshold == pytest.approx(ref["gamma"], abs=1e-6)
    assert torch.equal(G, ref["G"]), (G ^ ref["G"]).nonzero()[:10]
    # the case is not degenerate: T is a proper subset, G″ adds pairs outside T×T
    outside = ~(ref["T"][:, None] & ref["T"][None, :])
    assert 0 < int(ref["T"].sum()) < n and bool((ref["G"] & outside & ~torch.eye(n, dtype=torch.bool)).any())


@pytest.mark.parametrize("seed,n,noise,k,alpha,beta", CASES[1:4], ids=IDS[1:4])
def test_the_authors_self_mask_is_the_only_difference(seed, n, noise, k, alpha, beta, monkeypatch):
    """With their mask, the k-NN lists differ as documented (rows of the first chunk
    unchanged; every later row keeps the example itself among its neighbours); fed
    those very lists, the project gives the port's ŷ, T, n_sel and G again."""
    z, noisy = case(seed, n, noise)
    theirs = authors_selection(z, noisy, C, k, alpha, beta, authors_self_mask=True, spec_pairs=True)
    ours = authors_selection(z, noisy, C, k, alpha, beta, authors_self_mask=False, spec_pairs=True)
    rows = torch.arange(n)
    assert torch.equal(theirs["nbr"][:CHUNK], ours["nbr"][:CHUNK])
    assert (theirs["nbr"][CHUNK:] == rows[CHUNK:, None]).any(1).all()
    assert not (ours["nbr"] == rows[:, None]).any()
    # the switch matters here: it changes the selection
    assert not (torch.equal(theirs["T"], ours["T"]) and torch.equal(theirs["y_hat"], ours["y_hat"]))

    def their_knn(queries, keys, kk, **_):
        nbr = theirs["nbr"]
        yield 0, theirs["sim"].gather(1, nbr).float(), nbr

    monkeypatch.setattr(selection_module, "iter_knn", their_knn)
    sel, G = project(z, noisy, k, alpha, beta)
    assert torch.equal(sel.pseudo_labels, theirs["y_hat"])
    assert sel.n_per_class == int(theirs["n_sel"])
    assert torch.equal(sel.examples, theirs["T"])
    assert torch.equal(G, theirs["G"])


@pytest.mark.parametrize("seed,n,noise,k,alpha,beta", CASES[:2], ids=IDS[:2])
def test_the_authors_pair_rule_differs_only_where_documented(seed, n, noise, k, alpha, beta):
    """Their pair rule (γ's population with the pairs (i, i), G″ by sim ≥ γ, (i, i) by
    the same test) against ours: G differs only on same-label pairs outside T×T whose
    similarity lies between the two γ (ends included), and on (i, i) outside T."""
    z, noisy = case(seed, n, noise)
    theirs = authors_selection(z, noisy, C, k, alpha, beta, authors_self_mask=False, spec_pairs=False)
    sel, G = project(z, noisy, k, alpha, beta)
    assert torch.equal(sel.examples, theirs["T"])
    lo, hi = sorted((sel.threshold, theirs["gamma"]))
    assert theirs["gamma"] > sel.threshold          # (i, i), sim ≈ 1, lift the quantile
    T2 = theirs["T"][:, None] & theirs["T"][None, :]
    eye = torch.eye(n, dtype=torch.bool)
    between = (theirs["sim"] >= lo - 1e-9) & (theirs["sim"] <= hi + 1e-9)
    allowed = (between & ~T2) | (eye & ~T2)
    diff = G ^ theirs["G"]
    assert not (diff & ~allowed).any()
