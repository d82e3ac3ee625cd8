"""Sel-CL selection (SPEC §5) against a plain float64 brute force written from the steps."""
import functools
import math

import numpy as np
import pytest
import torch

from selcl.errors import DivergedError
from selcl.selection import Selection, class_balanced_count, select

pytest.importorskip("faiss")


# --------------------------------------------------------------------------- data

def unit(x):
    return x / x.norm(dim=1, keepdim=True)


def make_case(name):
    """(z float32 [N,d], noisy ỹ, clean y, C). Small N so the reference can loop."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    rng = np.random.default_rng(sum(map(ord, name)))
    if name in ("large_k", "large_k_clean"):   # K = 150 > 1/0.01: the clamp of q̂ to [0.01, 0.99] merges ℓ values
        n, C, d = 400, 2, 8
        y = torch.randint(0, C, (n,), generator=g)
        z = unit(4 * torch.randn(C, d, generator=g)[y] + torch.randn(n, d, generator=g))
    elif name == "grid":     # entries ±½ in d=4: every sim is exact → ties everywhere
        n, C = 160, 4
        z = torch.from_numpy((rng.integers(0, 2, (n, 4)) * 2 - 1).astype(np.float32) * 0.5)
        y = torch.from_numpy(rng.integers(0, C, n))
    else:                    # clustered by class, with label noise
        n, C, d = (150, 5, 8) if name == "clustered" else (140, 4, 6)
        y = torch.randint(0, C, (n,), generator=g)
        if name == "imbalanced":   # class 3 has 3 examples: fewer than n_sel when α = 1
            y[y == 3] = 0
            y[:3] = 3
        centres = torch.randn(C, d, generator=g)
        z = unit(centres[y] + 1.0 * torch.randn(n, d, generator=g))
        if name == "duplicates":   # copies of some rows: exact ties in sims and in ℓ
            for src in rng.choice(n, 15, replace=False):
                z[torch.from_numpy(rng.choice(n, 3, replace=False))] = z[int(src)].clone()
    noisy = y.clone()
    # large_k_clean: 3 % flips, so first-pass shares of the own label reach 149/150 and 1,
    # which the clamp merges: the case where it decides T without pseudo-labels
    flip = torch.from_numpy(rng.random(len(y)) < (0.03 if name == "large_k_clean" else 0.35))
    noisy[flip] = torch.from_numpy(rng.integers(0, C, int(flip.sum())))
    return z, noisy, y, C


CASES = ["clustered", "duplicates", "imbalanced", "grid", "large_k"]
K_OF = {"large_k": 150, "large_k_clean": 150}     # k of the k-NN per case (default 12)


# --------------------------------------------------------------------------- reference

@functools.lru_cache(maxsize=None)
def reference_scores(name, k, weighting, pseudo=True):
    """Steps 1–4 of SPEC §5 with plain loops in float64. pseudo=False: the paper's Table 10
    "without pseudo-labels", q̂_i = the share of i's neighbours' (weighted) votes for each
    noisy label, the first pass's votes themselves."""
    z, noisy, _, C = make_case(name)
    Z, yt = z.double().numpy(), noisy.numpy()
    n = len(yt)
    S = Z @ Z.T
    # 1. the k most similar other examples, ties to the lower index
    nbrs = [sorted((j for j in range(n) if j != i), key=lambda j: (-S[i, j], j))[:k] for i in range(n)]
    # 2. ŷ: majority noisy label among neighbours, ties → lowest class id
    y_hat, shares = [], []
    for i in range(n):
        votes = [0.0] * C
        for j in nbrs[i]:
            votes[yt[j]] += 1.0 if weighting == "uniform" else math.exp(S[i, j] / 0.1)
        y_hat.append(min(c for c in range(C) if votes[c] == max(votes)))
        shares.append([v / sum(votes) for v in votes])
    # 3. q̂_i(c); 4. ℓ_i and a_i
    loss, agree = [], []
    for i in range(n):
        q = [sum(y_hat[j] == c for j in nbrs[i]) / k for c in range(C)] if pseudo else shares[i]
        loss.append(-math.log(min(max(q[yt[i]], 0.01), 0.99)))
        agree.append(min(c for c in range(C) if q[c] == max(q)) == yt[i])
    return S, np.array(y_hat), np.array(loss), np.array(agree)


def reference_n_sel(m, alpha):
    """SPEC §5.5 / §10.1, read literally: α = 0.5 → the ⌈C/2⌉-th smallest m_c (the
    lower median), 0 → min, 1 → max, else ⌊linear α-quantile⌋."""
    m = sorted(int(v) for v in m)
    if alpha == 0.5:
        return m[math.ceil(len(m) / 2) - 1]
    if alpha in (0.0, 1.0):
        return min(m) if alpha == 0.0 else max(m)
    h = (len(m) - 1) * alpha                       # numpy's linear method, by hand
    lo = math.floor(h)
    hi = min(lo + 1, len(m) - 1)
    return math.floor(m[lo] + (h - lo) * (m[hi] - m[lo]))


def reference_select(name, k, alpha, beta, weighting, pseudo=True):
    """Steps 5–8: n_sel, T, γ, and the full N×N G (float64, brute force)."""
    z, noisy, _, C = make_case(name)
    yt = noisy.numpy()
    n = len(yt)
    S, y_hat, loss, agree = reference_scores(name, k, weighting, pseudo)
    m = [sum(agree[i] for i in range(n) if yt[i] == c) for c in range(C)]
    n_sel = reference_n_sel(m, alpha)
    T = np.zeros(n, bool)
    for c in range(C):
        members = sorted((i for i in range(n) if yt[i] == c), key=lambda i: (loss[i], i))
        T[members[:min(n_sel, len(members))]] = True
    g1 = [S[i, j] for i in range(n) for j in range(n) if i != j and T[i] and T[j] and yt[i] == yt[j]]
    gamma = float(np.quantile(g1, beta)) if g1 else math.inf
    G = np.zeros((n, n), bool)
    for i in range(n):
        for j in range(n):
            G[i, j] = yt[i] == yt[j] and (i == j or (T[i] and T[j]) or S[i, j] > gamma)
    return dict(S=S, y_hat=y_hat, n_sel=n_sel, T=T, gamma=gamma, G=G, n_g1=len(g1))


def check_against_reference(sel, ref, name, atol=1e-6):
    z, noisy, y, C = make_case(name)
    n = len(noisy)
    assert sel.n_per_class == ref["n_sel"]
    np.testing.assert_array_equal(sel.pseudo_labels.cpu().numpy(), ref["y_hat"])
    np.testing.assert_array_equal(sel.examples.cpu().numpy(), ref["T"])
    if math.isinf(ref["gamma"]):
        assert sel.threshold == math.inf
    else:
        assert sel.threshold == pytest.approx(ref["gamma"], abs=atol)
    idx = torch.arange(n, device=sel.features.device)
    mask = sel.pair_mask(idx, idx).cpu().numpy()
    assert mask.shape == (n, n) and mask.dtype == bool
    # only a pair whose sim equals γ up to rounding may legitimately disagree
    near = np.abs(ref["S"] - ref["gamma"]) < atol if math.isfinite(ref["gamma"]) else np.zeros_like(mask)
    bad = (mask != ref["G"]) & ~near
    assert not bad.any(), f"{bad.sum()} pairs differ from the brute-force G"
    # stats (SPEC §5.9)
    st, T, G, yt, yc = sel.stats, ref["T"], ref["G"], noisy.numpy(), y.numpy()
    off = G & ~np.eye(n, dtype=bool)
    assert st["n_selected"] == T.sum() and st["n_per_class"] == ref["n_sel"]
    assert st["n_pairs_G_prime"] == ref["n_g1"]
    assert st["n_pairs_estimated"] is False and st["n_pairs"] == off.sum()
    same_clean = yc[:, None] == yc[None, :]
    assert st["precision_T"] == pytest.approx((yt[T] == yc[T]).mean() if T.any() else math.nan, nan_ok=True)
    assert st["recall_T"] == pytest.approx(T[yt == yc].mean())
    if off.any():
        assert st["precision_G"] == pytest.approx((off & same_clean).sum() / off.sum())
    assert st["pseudo_label_accuracy"] == pytest.approx((ref["y_hat"] == yc).mean())


# --------------------------------------------------------------------------- tests

# every (α, β) with uniform votes; the exp weighting only changes ŷ (steps 1–2), so it
# gets every α at one β. β = 0.35: counting ordered (not unordered) pairs matters.
# large_k: one setting (its reference is the slow one); grid: exp-weighted votes on
# exactly tied sims would be decided by float summation order, so not checked there.
GRID = [(name, a, b, "uniform") for name in CASES if name != "large_k"
        for a in (0.0, 0.5, 1.0) for b in (0.0, 0.35, 0.5, 1.0)]
GRID += [(name, a, 0.35, "exp") for name in CASES if name not in ("large_k", "grid")
         for a in (0.0, 0.5, 1.0)]
GRID += [("large_k", 0.5, b, "uniform") for b in (0.0, 0.35)]


@pytest.mark.parametrize("name,alpha,beta,weighting", GRID)
def test_select_matches_bruteforce(name, alpha, beta, weighting):
    z, noisy, y, C = make_case(name)
    k = K_OF.get(name, 12)
    sel = select(z, noisy, C, k=k, alpha=alpha, beta=beta, weighting=weighting, clean_labels=y)
    ref = reference_select(name, k, alpha, beta, weighting)
    check_against_reference(sel, ref, name)


# Table 10's "without pseudo-labels": T scored against the neighbours' noisy labels
# (large_k_clean: the clamp of the share decides T, see test_cases_exercise_the_edge_cases)
@pytest.mark.parametrize("name,weighting", [(n, "uniform") for n in CASES + ["large_k_clean"]]
                         + [("clustered", "exp"), ("imbalanced", "exp")])
def test_select_without_pseudo_labels_matches_bruteforce(name, weighting):
    z, noisy, y, C = make_case(name)
    k = K_OF.get(name, 12)
    sel = select(z, noisy, C, k=k, alpha=0.5, beta=0.35, weighting=weighting, clean_labels=y,
                 pseudo_labels=False)
    check_against_reference(sel, reference_select(name, k, 0.5, 0.35, weighting, pseudo=False), name)


def test_pseudo_labels_switch_changes_the_selection():
    """The two scorings really differ on these cases (else the test above proves nothing
    the default's does): the scores, and T on at least one case."""
    differs = []
    for name in ("clustered", "duplicates", "imbalanced"):
        _, _, loss_with, _ = reference_scores(name, 12, "uniform", True)
        _, _, loss_without, _ = reference_scores(name, 12, "uniform", False)
        assert not np.allclose(loss_with, loss_without), name
        differs.append((reference_select(name, 12, 0.5, 0.35, "uniform", True)["T"]
                        != reference_select(name, 12, 0.5, 0.35, "uniform", False)["T"]).any())
    assert any(differs)


def test_cases_exercise_the_edge_cases():
    """The cases above really contain what they are meant to test."""
    z, noisy, _, C = make_case("imbalanced")
    ref = reference_select("imbalanced", 12, 1.0, 0.5, "uniform")
    assert (np.bincount(noisy.numpy(), minlength=C) < ref["n_sel"]).any()   # class < n_sel
    _, _, loss, _ = reference_scores("duplicates", 12, "uniform")
    assert len(np.unique(loss)) < len(loss) // 4                            # many equal ℓ
    S, *_ = reference_scores("grid", 12, "uniform")
    assert len(np.unique(S)) == 5                                           # all sims tied
    # large_k: T contains examples whose q̂(ỹ) differ but clamp to the same ℓ, and T
    # cuts through that tied group (so the clamp and the index tie-break decide T)
    S, y_hat, loss, agree = reference_scores("large_k", 150, "uniform")
    ref = reference_select("large_k", 150, 0.5, 0.35, "uniform")
    top = loss == loss.min()
    assert top.sum() > ref["n_sel"] and (top & ~ref["T"]).any()
    # large_k_clean, scored without pseudo-labels: the same, for the first pass's shares
    _, _, loss, _ = reference_scores("large_k_clean", 150, "uniform", False)
    ref = reference_select("large_k_clean", 150, 0.5, 0.35, "uniform", pseudo=False)
    top = loss == loss.min()
    assert top.sum() > ref["n_sel"] and (top & ~ref["T"]).any()


@pytest.mark.parametrize("name,index", [("duplicates", "torch"), ("clustered", "ivf")])
def test_knn_backends_agree(name, index):
    # (IVF resolves no boundary ties, so it is compared on data without duplicates)
    z, noisy, y, C = make_case(name)
    a = select(z, noisy, C, k=12, alpha=0.5, beta=0.25, knn_index="flat")
    o = select(z, noisy, C, k=12, alpha=0.5, beta=0.25, knn_index=index,
               knn_kwargs=dict(nlist=2, nprobe=2) if index == "ivf" else None)  # all lists
    assert torch.equal(a.examples, o.examples) and torch.equal(a.pseudo_labels, o.pseudo_labels)
    assert a.threshold == pytest.approx(o.threshold, abs=1e-12) and a.stats == o.stats


def test_empty_G_prime_gives_infinite_threshold():
    z, noisy, y, C = make_case("clustered")
    sel = select(z, noisy, C + 1, k=12, alpha=0.0, beta=0.5, clean_labels=y)   # class C is empty: m_C = 0
    assert sel.n_per_class == 0 and not sel.examples.any() and sel.threshold == math.inf
    # an empty T has no precision (not 0.000 in the report) and recalls nothing
    assert math.isnan(sel.stats["precision_T"]) and sel.stats["recall_T"] == 0.0
    idx = torch.arange(len(noisy))
    assert torch.equal(sel.pair_mask(idx, idx), torch.eye(len(noisy), dtype=torch.bool))
    assert sel.stats["n_pairs"] == 0


def test_threshold_sampling_and_pair_estimate():
    """γ from a seeded sample of G′ and |G| from a sample of same-label pairs."""
    g = torch.Generator().manual_seed(0)
    n, C = 2000, 3
    y = torch.randint(0, C, (n,), generator=g)
    z = unit(torch.randn(C, 16, generator=g)[y] + 0.7 * torch.randn(n, 16, generator=g))
    noisy = y.clone()
    noisy[:400] = torch.randint(0, C, (400,), generator=g)
    exact = select(z, noisy, C, k=20, alpha=0.5, beta=0.3, clean_labels=y, max_pairs=10 ** 7)
    assert exact.stats["threshold_sampled"] is False and exact.stats["n_pairs_estimated"] is False
    kw = dict(k=20, alpha=0.5, beta=0.3, clean_labels=y, max_pairs=40_000,
              exact_pairs_max=0, pair_samples=300_000)
    s1 = select(z, noisy, C, seed=1, **kw)
    s2 = select(z, noisy, C, seed=1, **kw)
    s3 = select(z, noisy, C, seed=2, **kw)
    assert s1.stats["threshold_sampled"] and s1.stats["n_pairs_estimated"]
    assert s1.threshold == s2.threshold and s1.stats == s2.stats          # seeded
    assert s1.threshold != s3.threshold
    assert torch.equal(s1.examples, exact.examples)
    assert s1.threshold == pytest.approx(exact.threshold, abs=0.01)
    assert s1.stats["n_pairs"] == pytest.approx(exact.stats["n_pairs"], rel=0.02)
    assert s1.stats["precision_G"] == pytest.approx(exact.stats["precision_G"], abs=0.01)


def test_pair_mask_blocks_and_state_dict(tmp_path):
    name = "duplicates"
    z, noisy, y, C = make_case(name)
    sel = select(z, noisy, C, k=12, alpha=0.5, beta=0.5, clean_labels=y)
    G = reference_select(name, 12, 0.5, 0.5, "uniform")["G"]
    g = torch.Generator().manual_seed(3)
    i = torch.randint(0, len(noisy), (37,), generator=g)                   # repeats allowed
    j = torch.randint(0, len(noisy), (53,), generator=g)
    np.testing.assert_array_equal(sel.pair_mask(i, j).numpy(), G[i.numpy()][:, j.numpy()])
    path = tmp_path / "sel.pt"
    torch.save(sel.state_dict(), path)
    back = Selection.from_state_dict(torch.load(path))
    assert torch.equal(back.pair_mask(i, j), sel.pair_mask(i, j))
    assert back.threshold == sel.threshold and back.n_per_class == sel.n_per_class
    assert torch.equal(back.examples, sel.examples) and back.stats == sel.stats
    assert torch.equal(back.indices, sel.examples.nonzero().squeeze(1))


def test_pair_mask_ignores_autocast():
    z, noisy, y, C = make_case("clustered")
    sel = select(z, noisy, C, k=12, alpha=0.5, beta=0.5)
    idx = torch.arange(len(noisy))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m = sel.pair_mask(idx, idx)
    assert torch.equal(m, sel.pair_mask(idx, idx))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_reference():
    name = "duplicates"
    z, noisy, y, C = make_case(name)
    gpu = select(z.cuda(), noisy.cuda(), C, k=12, alpha=0.5, beta=0.5, clean_labels=y.cuda())
    assert gpu.examples.is_cuda and gpu.pseudo_labels.is_cuda
    check_against_reference(gpu, reference_select(name, 12, 0.5, 0.5, "uniform"), name)
    i = torch.arange(len(noisy), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        m = gpu.pair_mask(i, i)
    assert m.is_cuda and torch.equal(m, gpu.pair_mask(i, i))
    cpu = Selection.from_state_dict(gpu.state_dict(), device="cpu")
    assert cpu.pair_mask(i, i).is_cuda                                     # CPU store, CUDA ids


# --------------------------------------------------------------------------- n_sel, γ extremes

# CIFAR-10 asymmetric pattern: five untouched classes agree almost everywhere, the five
# source classes much less. Sorted: 3000 3100 3200 3300 3400 | 4900 4920 4940 4960 4980.
M_ASYM = [4900, 3000, 3100, 3200, 4920, 3300, 4940, 4960, 3400, 4980]


@pytest.mark.parametrize("alpha,expected", [
    (0.5, 3400),               # the 5th smallest (lower median), not (3400 + 4900) / 2 = 4150
    (0.0, 3000),
    (1.0, 4980),
    (0.25, 3225),              # h = 9·0.25 = 2.25: ⌊3200 + 0.25·(3300 − 3200)⌋
])
def test_n_sel_rule(alpha, expected):
    assert class_balanced_count(M_ASYM, alpha) == expected
    assert reference_n_sel(M_ASYM, alpha) == expected
    if alpha == 0.5:           # the authors' torch.median
        assert int(torch.median(torch.tensor(M_ASYM))) == expected


def test_n_sel_lower_median_and_quantile_floor():
    assert class_balanced_count([7, 1, 4, 10], 0.5) == 4          # even C: 2nd of 4
    assert class_balanced_count([7, 1, 4], 0.5) == 4              # odd C: the median
    assert class_balanced_count([5], 0.5) == 5
    assert class_balanced_count([0, 10, 20, 31], 0.4) == 12       # 10 + 0.2·10 = 12
    assert class_balanced_count([0, 10, 20, 31], 0.75) == 22      # 20 + 0.25·11 = 22.75
    rng = np.random.default_rng(0)
    for _ in range(50):
        m = rng.integers(0, 500, rng.integers(1, 12))
        for a in (0.0, 0.1, 0.25, 0.4, 0.5, 0.75, 0.9, 1.0):
            assert class_balanced_count(m, a) == reference_n_sel(m, a)
        assert class_balanced_count(m, 0.5) == int(torch.median(torch.from_numpy(m)))


def test_select_uses_lower_median_for_even_classes():
    """End to end: 10 classes, five agreeing much more than the other five (the
    asymmetric-noise shape of SPEC §10.1); at α = 0.5 n_sel is the 5th smallest m_c."""
    g = torch.Generator().manual_seed(5)
    C, d = 10, 16
    sizes = [60] * 5 + [60] * 5
    y = torch.cat([torch.full((s,), c) for c, s in enumerate(sizes)])
    z = unit(6 * torch.randn(C, d, generator=g)[y] + torch.randn(len(y), d, generator=g))
    noisy = y.clone()
    rng = np.random.default_rng(5)
    for c in range(5):                     # classes 0-4: 20–28 of 60 relabelled at random
        idx = np.flatnonzero(y.numpy() == c)[: 20 + 2 * c]
        noisy[idx] = torch.from_numpy((c + 1 + rng.integers(0, C - 1, len(idx))) % C)
    sel = select(z, noisy, C, k=10, alpha=0.5, beta=0.25)
    # m_c recomputed from the agreement the selection saw: classes' T sizes bound it
    _, _, loss, agree = _scores(z, noisy, C, 10)
    m = np.bincount(noisy.numpy()[agree], minlength=C)
    lo, hi = np.sort(m)[4], np.sort(m)[5]
    assert hi - lo >= 2, m                 # two groups: the mean would differ
    assert sel.n_per_class == lo == sel.stats["n_per_class"]
    assert sel.n_per_class != math.floor((lo + hi) / 2)


def _scores(z, noisy, C, k):
    """ℓ and a of SPEC §5 steps 1–4 (uniform votes), vectorised float64 brute force."""
    Z = z.double().numpy()
    yt = noisy.numpy()
    n = len(yt)
    S = Z @ Z.T
    np.fill_diagonal(S, -np.inf)
    order = np.lexsort((np.broadcast_to(np.arange(n), (n, n)), -S), axis=1)[:, :k]
    votes = np.zeros((n, C))
    np.add.at(votes, (np.repeat(np.arange(n), k), yt[order].ravel()), 1)
    y_hat = votes.argmax(1)
    q = np.zeros((n, C))
    np.add.at(q, (np.repeat(np.arange(n), k), y_hat[order].ravel()), 1)
    q /= k
    loss = -np.log(np.clip(q[np.arange(n), yt], 0.01, 0.99))
    return S, y_hat, loss, q.argmax(1) == yt


def cap_points(m):
    """m unit vectors spread evenly (Fibonacci lattice) over the cap of the 2-sphere
    within 60° of the pole, in the first 3 of 4 dims: sims in [−0.5, ≈0.999]."""
    i = np.arange(m) + 0.5
    h = 1 - 0.5 * i / m                                 # uniform in height = uniform in area
    phi = i * math.pi * (3 - math.sqrt(5))
    r = np.sqrt(1 - h ** 2)
    pts = np.stack([r * np.cos(phi), r * np.sin(phi), h, np.zeros(m)], 1)
    return torch.from_numpy(pts).float()


@pytest.mark.parametrize("max_pairs", [10 ** 6, 1000])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_extreme_beta_is_exact_over_large_G_prime(beta, max_pairs):
    """β = 0 / 1 with |G′| > 10⁶: γ is the exact min / max over every ordered pair, not
    the extreme of a sample. One class of 1,500 examples (2,248,500 ordered pairs), all
    selected (α = 1). One pair (two ordered pairs) holds the unique extreme similarity:
    a sample of 10⁶ would miss it with probability ≈ e^(−0.9) ≈ 0.4, one of 1,000 almost
    surely; the exact rule never does."""
    n = 1500
    z = torch.zeros(n, 4)
    a, b = 100, 1200                                     # the special pair, inside the data
    keep = torch.ones(n, dtype=torch.bool)
    keep[[a, b]] = False
    z[keep] = cap_points(n - 2)
    z[a] = torch.tensor([0.0, 0.0, 0.0, 1.0])            # orthogonal to the cap
    if beta == 0.0:
        z[b] = -z[a]                                     # sim −1; every other sim ≥ −0.5
    else:
        z[b] = unit(torch.tensor([[0.03, 0.0, 0.0, 1.0]]))[0]   # sim ≈ 0.99955 > cap's max
    noisy = torch.zeros(n, dtype=torch.long)
    sel = select(z, noisy, 1, k=10, alpha=1.0, beta=beta, max_pairs=max_pairs)
    assert sel.examples.all() and sel.stats["n_pairs_G_prime"] == n * (n - 1) > 10 ** 6
    assert sel.stats["threshold_sampled"] is False
    # independent check: the full float64 N×N matrix (fine at this size)
    S = z.double() @ z.double().T
    off = S[~torch.eye(n, dtype=torch.bool)]
    exact = float(off.min() if beta == 0.0 else off.max())
    assert float(S[a, b]) == exact and (off == exact).sum() == 2     # unique extreme pair
    runner_up = off[(off - exact).abs() > 1e-9]
    runner_up = float(runner_up.min() if beta == 0.0 else runner_up.max())
    assert abs(runner_up - exact) > 1e-4                              # a sample's extreme would be this
    assert sel.threshold == pytest.approx(exact, abs=1e-6)


# ------------------------------------------------------- v2 (the authors' utils_noise_v2.py)

def reference_select_v2(name, k, alpha, beta, seed):
    """The authors' v2 selection, by plain loops in float64: exp(sim/0.1) votes in both
    passes; n_sel and T as v1; γ the linear β-quantile over 500 pairs per member i of
    T_c, (i, j) with j drawn with replacement from T_c (the draws: numpy's default_rng
    seeded [seed, 8], per class in ascending order, rng.integers(0, |T_c|, 500·|T_c|),
    the members of T_c in T's order, by (ℓ, index), tiled 500 times)."""
    z, noisy, _, C = make_case(name)
    Z, yt = z.double().numpy(), noisy.numpy()
    n = len(yt)
    S = Z @ Z.T
    nbrs = [sorted((j for j in range(n) if j != i), key=lambda j: (-S[i, j], j))[:k] for i in range(n)]
    w = lambda i, j: math.exp(S[i, j] / 0.1)  # noqa: E731
    y_hat = []
    for i in range(n):                                       # pass 1: weighted vote of ỹ
        votes = [sum(w(i, j) for j in nbrs[i] if yt[j] == c) for c in range(C)]
        y_hat.append(min(c for c in range(C) if votes[c] == max(votes)))
    loss, agree = [], []
    for i in range(n):                                       # pass 2: weighted share of ŷ
        votes = [sum(w(i, j) for j in nbrs[i] if y_hat[j] == c) for c in range(C)]
        q = [v / sum(votes) for v in votes]
        loss.append(-math.log(min(max(q[yt[i]], 0.01), 0.99)))
        agree.append(min(c for c in range(C) if q[c] == max(q)) == yt[i])
    m = [sum(agree[i] for i in range(n) if yt[i] == c) for c in range(C)]
    n_sel = reference_n_sel(m, alpha)
    T = np.zeros(n, bool)
    members_T = []
    for c in range(C):
        members = sorted((i for i in range(n) if yt[i] == c), key=lambda i: (loss[i], i))
        members_T.append(members[:min(n_sel, len(members))])
        T[members_T[-1]] = True
    rng, sims = np.random.default_rng([seed, 8]), []
    for mem in members_T:
        if not mem:
            continue
        partners = rng.integers(0, len(mem), size=500 * len(mem))
        sims += [S[mem[p % len(mem)], mem[q]] for p, q in enumerate(partners)]
    gamma = float(np.quantile(sims, beta)) if sims else math.inf
    G = np.zeros((n, n), bool)
    for i in range(n):
        for j in range(n):
            G[i, j] = yt[i] == yt[j] and (i == j or (T[i] and T[j]) or S[i, j] > gamma)
    n_g1 = sum(len(mem) * (len(mem) - 1) for mem in members_T)
    return dict(S=S, y_hat=np.array(y_hat), n_sel=n_sel, T=T, gamma=gamma, G=G, n_g1=n_g1)


@pytest.mark.parametrize("name,alpha,beta", [("clustered", 0.5, 0.25), ("clustered", 0.0, 0.0),
                                             ("imbalanced", 1.0, 0.35), ("duplicates", 0.5, 1.0)])
def test_select_v2_matches_bruteforce(name, alpha, beta):
    """`version="v2"`: the authors' second selection, step for step, whatever `weighting`."""
    z, noisy, y, C = make_case(name)
    sel = select(z, noisy, C, k=12, alpha=alpha, beta=beta, weighting="uniform", seed=3,
                 clean_labels=y, version="v2")
    ref = reference_select_v2(name, 12, alpha, beta, seed=3)
    check_against_reference(sel, ref, name)
    assert sel.stats["threshold_sampled"] is True


def test_select_v2_differs_from_v1_where_it_should():
    """Both of v2's changes are visible on these cases: its pass-2 weighting moves T, and
    its γ population (self pairs possible, classes ∝ |T_c|, a sample) moves γ; at β = 0
    its γ is a sample minimum, never under G′'s exact minimum."""
    moved_T = []
    for name in ("clustered", "duplicates", "imbalanced"):
        z, noisy, y, C = make_case(name)
        v1 = select(z, noisy, C, k=12, alpha=0.5, beta=0.35, weighting="exp")
        v2 = select(z, noisy, C, k=12, alpha=0.5, beta=0.35, version="v2")
        assert torch.equal(v1.pseudo_labels, v2.pseudo_labels)   # pass 1 is v1's "exp"
        moved_T.append(not torch.equal(v1.examples, v2.examples))
        if torch.equal(v1.examples, v2.examples):
            assert v1.threshold != v2.threshold
        lo1 = select(z, noisy, C, k=12, alpha=0.5, beta=0.0, weighting="exp")
        lo2 = select(z, noisy, C, k=12, alpha=0.5, beta=0.0, version="v2")
        if torch.equal(lo1.examples, lo2.examples):
            assert lo2.threshold >= lo1.threshold
    assert any(moved_T)


def test_select_rejects_an_unknown_version():
    z, noisy, y, C = make_case("clustered")
    with pytest.raises(ValueError, match="version"):
        select(z, noisy, C, k=12, alpha=0.5, beta=0.25, version="v3")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_select_names_non_finite_features(bad):
    """A diverged network's NaN / inf rows are one clear error, not a k-NN that silently
    returns fewer neighbours and leaves pseudo-labels unset (a device assert on CUDA)."""
    z, noisy, y, C = make_case("clustered")
    select(z, noisy, C, k=12, alpha=0.5, beta=0.25)            # the finite case runs
    z = z.clone()
    z[7, 3] = bad
    with pytest.raises(DivergedError, match=r"1 of \d+ feature rows are not finite .*first: row 7"):
        select(z, noisy, C, k=12, alpha=0.5, beta=0.25)
