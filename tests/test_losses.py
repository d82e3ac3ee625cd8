"""Losses (SPEC §4, §6, §7) against brute-force per-anchor loops written from the equations."""
import math

import pytest
import torch
import torch.nn.functional as F

from selcl.losses import (mix, mixup_bootstrap_loss, mixup_cross_entropy, mixup_params,
                          moco_loss, pair_masks, selective_contrastive_loss, similarity_loss)

N_IDS = 30
ISOLATED = (0, 1, 2)  # ids whose only pair in G is themselves


def unit(x):
    return x / x.norm(dim=1, keepdim=True)


def random_G(gen, density=0.12):
    """Symmetric bool [N_IDS, N_IDS] with True diagonal; ISOLATED ids pair only with themselves."""
    u = torch.rand(N_IDS, N_IDS, generator=gen, dtype=torch.float64) < density
    G = u | u.T
    G[list(ISOLATED), :] = False
    G[:, list(ISOLATED)] = False
    G.fill_diagonal_(True)
    return G


def make_problem(seed, B=6, n_mem=10, d=8, Q=7, C=5):
    """A mixed batch of 2 views (A = 2B anchors) + a memory, float64."""
    gen = torch.Generator().manual_seed(seed)
    G = random_G(gen)
    ids = torch.cat([torch.tensor([0, 1]), 3 + torch.randperm(N_IDS - 3, generator=gen)[:B - 2]])
    perm = torch.randperm(B, generator=gen)
    lam1, lam2 = 0.5 + 0.5 * torch.rand(2, generator=gen, dtype=torch.float64)
    A = 2 * B
    anchor_ids = torch.cat([ids, ids])
    partner_ids = torch.cat([ids[perm], ids[perm]])
    lam = torch.cat([lam1.repeat(B), lam2.repeat(B)])
    # memory: random ids plus copies of batch examples (an isolated one among them)
    mem_ids = torch.cat([torch.randint(0, N_IDS, (n_mem - 3,), generator=gen), ids[[0, 2, 3]]])
    anchors = unit(torch.randn(A, d, generator=gen, dtype=torch.float64))
    mem = unit(torch.randn(n_mem, d, generator=gen, dtype=torch.float64))
    keys = unit(torch.randn(A, d, generator=gen, dtype=torch.float64))
    partner_keys = keys[torch.cat([perm, perm + B])]  # partner's un-mixed other view, per view
    queue = unit(torch.randn(Q, d, generator=gen, dtype=torch.float64))
    p_anchor = torch.softmax(2 * torch.randn(A, C, generator=gen, dtype=torch.float64), 1)
    p_mem = torch.softmax(2 * torch.randn(n_mem, C, generator=gen, dtype=torch.float64), 1)
    p_mem[0] = F.one_hot(torch.tensor(1), C).double()  # exact 0 / 1 products → the eps clamp
    p_anchor[0] = F.one_hot(torch.tensor(1), C).double()
    p_anchor[1] = F.one_hot(torch.tensor(3), C).double()
    return dict(G=G, in_G=lambda i, j: G[i][:, j], anchors=anchors, mem=mem, anchor_ids=anchor_ids,
                partner_ids=partner_ids, lam=lam, mem_ids=mem_ids, keys=keys,
                partner_keys=partner_keys, queue=queue, p_anchor=p_anchor, p_mem=p_mem,
                partner_rows=torch.cat([perm, perm + B]))


# ------------------------------------------------------------------- references
def ref_moco(q, k, queue, tau):
    """−log exp(q·k/τ) / (exp(q·k/τ) + Σ_n exp(q·n/τ)), one query."""
    pos = math.exp(float(q @ k) / tau)
    neg = sum(math.exp(float(q @ n) / tau) for n in queue)
    return -math.log(pos / (pos + neg))


def ref_selective(P, cands, cand_ids, queue, tau=0.1):
    anchors, G = P["anchors"], P["G"]
    A, M = anchors.shape[0], cands.shape[0]
    losses, n_fallback = [], 0
    for a in range(A):
        total = 0.0
        parts = [(int(P["anchor_ids"][a]), float(P["lam"][a]), P["keys"][a]),
                 (int(P["partner_ids"][a]), 1 - float(P["lam"][a]), P["partner_keys"][a])]
        for x, w, key in parts:
            positives = [c for c in range(M) if c != a and G[x, int(cand_ids[c])]]
            from_G = [c for c in positives if int(cand_ids[c]) != x]
            if from_G:
                denom = sum(math.exp(float(anchors[a] @ cands[c]) / tau) for c in range(M) if c != a)
                L = -sum(math.log(math.exp(float(anchors[a] @ cands[p]) / tau) / denom)
                         for p in positives) / len(positives)
            else:
                n_fallback += 1
                L = ref_moco(anchors[a], key, queue, tau)
            total += w * L
        losses.append(total)
    return torch.tensor(losses, dtype=torch.float64), n_fallback / (2 * A)


def run_selective(P, use_memory=True, queue=None, tau=0.1):
    cands = torch.cat([P["anchors"], P["mem"]]) if use_memory else P["anchors"]
    cand_ids = torch.cat([P["anchor_ids"], P["mem_ids"]]) if use_memory else P["anchor_ids"]
    queue = P["queue"] if queue is None else queue
    out = selective_contrastive_loss(P["anchors"], P["anchor_ids"], P["partner_ids"], P["lam"],
                                     cands, cand_ids, P["in_G"], P["keys"], P["partner_keys"],
                                     queue, temperature=tau)
    return out, ref_selective(P, cands, cand_ids, queue, tau)


# ------------------------------------------------------------------------ MoCo
@pytest.mark.parametrize("Q", [0, 1, 9])
def test_moco_matches_loop(Q):
    gen = torch.Generator().manual_seed(100 + Q)
    q, k = (unit(torch.randn(5, 6, generator=gen, dtype=torch.float64)) for _ in range(2))
    queue = unit(torch.randn(Q, 6, generator=gen, dtype=torch.float64))
    got = moco_loss(q, k, queue, temperature=0.2, reduction="none")
    ref = torch.tensor([ref_moco(q[i], k[i], queue, 0.2) for i in range(5)], dtype=torch.float64)
    assert got.shape == (5,)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(moco_loss(q, k, queue, 0.2), ref.mean(), rtol=1e-10, atol=1e-12)
    if Q == 0:  # only the positive: softmax is 1, loss 0
        assert torch.all(got.abs() < 1e-12)


def test_moco_bf16_computes_in_float32():
    gen = torch.Generator().manual_seed(7)
    q, k, queue = (unit(torch.randn(n, 16, generator=gen)) for n in (4, 4, 10))
    got = moco_loss(q.bfloat16(), k.bfloat16(), queue.bfloat16(), reduction="none")
    assert got.dtype == torch.float32
    ref = moco_loss(q.bfloat16().float(), k.bfloat16().float(), queue.bfloat16().float(), reduction="none")
    torch.testing.assert_close(got, ref)


# ----------------------------------------------------------------------- mixup
def test_mixup_params_range_perm_determinism_no_global_rng():
    state = torch.get_rng_state()
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    draws = [mixup_params(17, g1, "cpu") for _ in range(400)]
    again = [mixup_params(17, g2, "cpu") for _ in range(400)]
    assert torch.equal(torch.get_rng_state(), state), "global RNG was used"
    lams = torch.tensor([float(lam) for lam, _ in draws], dtype=torch.float64)
    assert all(torch.is_tensor(lam) and lam.dim() == 0 for lam, _ in draws)
    assert lams.min() >= 0.5 and lams.max() <= 1.0
    # max(U, 1−U) with U ~ Uniform(0,1) is Uniform(0.5, 1): mean 0.75, sd 0.144/sqrt(400) ≈ 0.007
    assert abs(lams.mean().item() - 0.75) < 0.03
    assert (lams < 0.625).float().mean().item() == pytest.approx(0.25, abs=0.07)
    for (lam, perm), (lam2, perm2) in zip(draws, again):
        assert perm.dtype == torch.int64 and torch.equal(perm.sort().values, torch.arange(17))
        assert torch.equal(lam, lam2) and torch.equal(perm, perm2)
    other = [mixup_params(17, torch.Generator().manual_seed(6), "cpu")]
    assert other[0][0] != draws[0][0]
    assert len({tuple(p.tolist()) for _, p in draws}) > 300  # permutations actually vary


def test_mix():
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(6, 3, 4, 4, generator=gen, dtype=torch.float64)
    lam, perm = mixup_params(6, gen)
    got = mix(x, lam, perm)
    for i in range(6):
        torch.testing.assert_close(got[i], lam * x[i] + (1 - lam) * x[int(perm[i])])


# ------------------------------------------------------------ selective SupCon
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_selective_matches_loop(seed):
    P = make_problem(seed)
    (loss, frac), (ref, ref_frac) = run_selective(P)
    frac = float(frac)
    assert loss.shape == (12,) and loss.dtype == torch.float64
    torch.testing.assert_close(loss, ref, rtol=1e-9, atol=1e-10)
    assert float(frac) == pytest.approx(float(ref_frac))
    assert 0 < ref_frac < 1  # both the supervised branch and the fallback are exercised


def test_selective_partner_parts_counted_separately():
    """Partners whose only pair is themselves (not in the batch): the partner parts fall
    back while the dominant parts need not, and the fallback fraction counts both."""
    P = make_problem(6)
    P["partner_ids"] = torch.tensor(ISOLATED)[torch.arange(12) % 3]
    (loss, frac), (ref, ref_frac) = run_selective(P)
    frac = float(frac)
    torch.testing.assert_close(loss, ref, rtol=1e-9, atol=1e-10)
    assert frac == pytest.approx(ref_frac) and ref_frac > 0.5


@pytest.mark.parametrize("seed", [4, 5])
def test_selective_without_memory_and_empty_queue(seed):
    P = make_problem(seed)
    (loss, frac), (ref, ref_frac) = run_selective(P, use_memory=False)
    frac = float(frac)
    torch.testing.assert_close(loss, ref, rtol=1e-9, atol=1e-10)
    assert float(frac) == pytest.approx(float(ref_frac))
    empty = P["queue"][:0]
    (loss, frac), (ref, ref_frac) = run_selective(P, queue=empty)
    frac = float(frac)
    torch.testing.assert_close(loss, ref, rtol=1e-9, atol=1e-10)
    assert 0 < ref_frac < 1


def test_selective_isolated_anchor_uses_moco_even_with_own_copies():
    """Anchor 0's dominant example (id 0) pairs only with itself; its other view and a
    memory copy of it exist, yet its dominant part is the MoCo loss with keys[0]."""
    P = make_problem(9)
    P["lam"] = torch.ones(12, dtype=torch.float64)  # dominant part only
    assert int(P["anchor_ids"][0]) == 0 and 0 in P["mem_ids"].tolist()
    (loss, _), _ = run_selective(P)
    expected = moco_loss(P["anchors"][:1], P["keys"][:1], P["queue"], reduction="none")
    torch.testing.assert_close(loss[0], expected[0])


def test_selective_all_fallback_equals_moco():
    P = make_problem(12)
    G = torch.eye(N_IDS, dtype=torch.bool)  # G = {(i, i)}: nobody has a positive from G
    P["G"], P["in_G"] = G, lambda i, j: G[i][:, j]
    (loss, frac), _ = run_selective(P)
    frac = float(frac)
    lam = P["lam"]
    expected = (lam * moco_loss(P["anchors"], P["keys"], P["queue"], reduction="none")
                + (1 - lam) * moco_loss(P["anchors"], P["partner_keys"], P["queue"], reduction="none"))
    torch.testing.assert_close(loss, expected)
    assert frac == 1.0


def test_selective_identity_partner_equals_unmixed():
    """partner == dominant ⇒ the λ weighting cannot matter."""
    P = make_problem(13)
    P["partner_ids"], P["partner_keys"] = P["anchor_ids"].clone(), P["keys"].clone()
    (l1, _), _ = run_selective(P)
    P["lam"] = torch.ones(12, dtype=torch.float64)
    (l2, _), _ = run_selective(P)
    torch.testing.assert_close(l1, l2)


def test_selective_gradients():
    P = make_problem(21, B=4, n_mem=5, d=5, Q=4)
    cand_ids = torch.cat([P["anchor_ids"], P["mem_ids"]])

    def f(anchors, mem):
        loss, _ = selective_contrastive_loss(anchors, P["anchor_ids"], P["partner_ids"], P["lam"],
                                             torch.cat([anchors, mem]), cand_ids, P["in_G"],
                                             P["keys"], P["partner_keys"], P["queue"])
        return loss

    anchors = P["anchors"].clone().requires_grad_(True)
    mem = P["mem"].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (anchors, mem))
    f(anchors, mem).mean().backward()
    for g in (anchors.grad, mem.grad):
        assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_selective_bf16_inputs():
    P = make_problem(3)
    for k in ("anchors", "mem", "keys", "partner_keys", "queue"):
        P[k] = P[k].float()
    P["lam"] = P["lam"].float()
    cands = torch.cat([P["anchors"], P["mem"]])
    cand_ids = torch.cat([P["anchor_ids"], P["mem_ids"]])
    bf = {k: P[k].bfloat16() for k in ("anchors", "keys", "partner_keys", "queue")}
    loss, _ = selective_contrastive_loss(bf["anchors"], P["anchor_ids"], P["partner_ids"], P["lam"],
                                         cands.bfloat16(), cand_ids, P["in_G"], bf["keys"],
                                         bf["partner_keys"], bf["queue"])
    assert loss.dtype == torch.float32
    ref, _ = selective_contrastive_loss(bf["anchors"].float(), P["anchor_ids"], P["partner_ids"],
                                        P["lam"], cands.bfloat16().float(), cand_ids, P["in_G"],
                                        bf["keys"].float(), bf["partner_keys"].float(), bf["queue"].float())
    torch.testing.assert_close(loss, ref)


def test_shared_masks_and_partner_rows():
    """pair_masks (with and without the partner_rows gather) reproduces the in_G path of both losses."""
    P = make_problem(14)
    cand_ids = torch.cat([P["anchor_ids"], P["mem_ids"]])
    assert torch.equal(P["partner_ids"], P["anchor_ids"][P["partner_rows"]])
    m1 = pair_masks(P["anchor_ids"], P["partner_ids"], cand_ids, P["in_G"])
    m2 = pair_masks(P["anchor_ids"], P["partner_ids"], cand_ids, P["in_G"], partner_rows=P["partner_rows"])
    for g1, g2 in zip(m1, m2):
        assert torch.equal(g1, g2)
    for a in range(12):
        for c in range(len(cand_ids)):
            assert bool(m1[1][a, c]) == bool(P["G"][P["partner_ids"][a], cand_ids[c]])
    (ref, ref_frac), _ = run_selective(P)
    cands = torch.cat([P["anchors"], P["mem"]])
    loss, frac = selective_contrastive_loss(P["anchors"], P["anchor_ids"], P["partner_ids"], P["lam"],
                                            cands, cand_ids, None, P["keys"], P["partner_keys"],
                                            P["queue"], masks=m2)
    assert torch.equal(loss, ref) and float(frac) == float(ref_frac)
    p_cands = torch.cat([P["p_anchor"], P["p_mem"]])
    args = (P["p_anchor"], p_cands, P["anchor_ids"], P["partner_ids"], P["lam"], cand_ids)
    assert torch.equal(similarity_loss(*args, None, masks=m2), similarity_loss(*args, P["in_G"]))


# ---------------------------------------------------------------------- L_SIM
def ref_similarity(P, p_cands, cand_ids, eps=1e-7):
    G, pa = P["G"], P["p_anchor"]
    A, M = pa.shape[0], p_cands.shape[0]
    total, count = 0.0, 0

    def bce(s, t):
        return -(t * math.log(s) + (1 - t) * math.log(1 - s))

    for a in range(A):
        lam = float(P["lam"][a])
        dom, part = int(P["anchor_ids"][a]), int(P["partner_ids"][a])
        for c in range(M):
            if c == a:
                continue
            s = min(max(float(pa[a] @ p_cands[c]), eps), 1 - eps)
            j = int(cand_ids[c])
            total += lam * bce(s, float(G[dom, j])) + (1 - lam) * bce(s, float(G[part, j]))
            count += 1
    return total / count


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_similarity_matches_loop(seed):
    P = make_problem(seed)
    p_cands = torch.cat([P["p_anchor"], P["p_mem"]])
    cand_ids = torch.cat([P["anchor_ids"], P["mem_ids"]])
    got = similarity_loss(P["p_anchor"], p_cands, P["anchor_ids"], P["partner_ids"], P["lam"],
                          cand_ids, P["in_G"])
    assert got.dim() == 0 and got.dtype == torch.float64
    assert got.item() == pytest.approx(ref_similarity(P, p_cands, cand_ids), rel=1e-10)
    # without memory: candidates are the anchors only
    got = similarity_loss(P["p_anchor"], P["p_anchor"], P["anchor_ids"], P["partner_ids"],
                          P["lam"], P["anchor_ids"], P["in_G"])
    assert got.item() == pytest.approx(ref_similarity(P, P["p_anchor"], P["anchor_ids"]), rel=1e-10)


def test_similarity_gradients():
    P = make_problem(8)
    logits = torch.randn(12, 5, dtype=torch.float64, requires_grad=True)
    pa = torch.softmax(logits, 1)
    loss = similarity_loss(pa, torch.cat([pa, P["p_mem"]]), P["anchor_ids"], P["partner_ids"],
                           P["lam"], torch.cat([P["anchor_ids"], P["mem_ids"]]), P["in_G"])
    loss.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


# ------------------------------------------------------- classification losses
def ref_ce(logits_row, y):
    return -math.log(math.exp(float(logits_row[y])) / sum(math.exp(float(v)) for v in logits_row))


@pytest.mark.parametrize("lam_kind", ["float", "tensor"])
def test_mixup_cross_entropy_and_bootstrap(lam_kind):
    gen = torch.Generator().manual_seed(31)
    B, C = 7, 4
    logits = 3 * torch.randn(B, C, generator=gen, dtype=torch.float64)
    y_a, z_a, z_b = (torch.randint(0, C, (B,), generator=gen) for _ in range(3))
    perm = torch.randperm(B, generator=gen)
    y_b = y_a[perm]
    lam = 0.7 if lam_kind == "float" else 0.5 + 0.5 * torch.rand(B, generator=gen, dtype=torch.float64)
    lam_i = (lambda i: lam) if lam_kind == "float" else (lambda i: float(lam[i]))

    ref = sum(lam_i(i) * ref_ce(logits[i], int(y_a[i])) + (1 - lam_i(i)) * ref_ce(logits[i], int(y_b[i]))
              for i in range(B)) / B
    assert mixup_cross_entropy(logits, y_a, y_b, lam).item() == pytest.approx(ref, rel=1e-10)

    Bt = 0.2
    ref = sum(lam_i(i) * ((1 - Bt) * ref_ce(logits[i], int(y_a[i])) + Bt * ref_ce(logits[i], int(z_a[i])))
              + (1 - lam_i(i)) * ((1 - Bt) * ref_ce(logits[i], int(y_b[i])) + Bt * ref_ce(logits[i], int(z_b[i])))
              for i in range(B)) / B
    got = mixup_bootstrap_loss(logits, y_a, y_b, z_a, z_b, lam, bootstrap=Bt)
    assert got.item() == pytest.approx(ref, rel=1e-10)
    # B = 0 is plain mixup cross-entropy
    torch.testing.assert_close(mixup_bootstrap_loss(logits, y_a, y_b, z_a, z_b, lam, bootstrap=0.0),
                               mixup_cross_entropy(logits, y_a, y_b, lam))


def test_mixup_cross_entropy_bf16():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 3, generator=gen).bfloat16()
    y = torch.randint(0, 3, (5,), generator=gen)
    got = mixup_cross_entropy(logits, y, y.flip(0), 0.6)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, mixup_cross_entropy(logits.float(), y, y.flip(0), 0.6))


# ------------------------------------------------------------- device agnostic
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_losses_on_device_bf16_match_float64(device):
    """The training-time call pattern (bf16 embeddings, shared masks, generator on the
    device) on `device` agrees with the float64 CPU result to bf16 precision."""
    P = make_problem(40, B=8, n_mem=16, d=32)
    gen = torch.Generator(device=device).manual_seed(0)
    lam_v, perm = mixup_params(8, gen, device)
    assert perm.device.type == device and 0.5 <= lam_v <= 1
    cand_ids = torch.cat([P["anchor_ids"], P["mem_ids"]])
    Gd = P["G"].to(device)
    in_G_dev = lambda i, j: Gd[i][:, j]  # noqa: E731
    to = lambda k, dt=None: P[k].to(device=device, dtype=dt) if dt else P[k].to(device)  # noqa: E731
    masks = pair_masks(to("anchor_ids"), to("partner_ids"), cand_ids.to(device), in_G_dev,
                       partner_rows=to("partner_rows"))
    anchors = to("anchors", torch.bfloat16).requires_grad_(True)
    loss, frac = selective_contrastive_loss(
        anchors, to("anchor_ids"), to("partner_ids"), to("lam", torch.float32),
        torch.cat([anchors, to("mem", torch.bfloat16)]), cand_ids.to(device), None,
        to("keys", torch.bfloat16), to("partner_keys", torch.bfloat16), to("queue", torch.bfloat16),
        masks=masks)
    assert loss.dtype == torch.float32 and loss.device.type == device
    (ref, ref_frac), _ = run_selective(P)
    torch.testing.assert_close(loss.double().cpu(), ref, rtol=0.03, atol=0.03)
    assert float(frac) == pytest.approx(float(ref_frac))
    loss.mean().backward()
    assert torch.isfinite(anchors.grad).all() and anchors.grad.abs().sum() > 0
    p_cands = torch.cat([to("p_anchor", torch.bfloat16), to("p_mem", torch.bfloat16)])
    ls = similarity_loss(to("p_anchor", torch.bfloat16), p_cands, to("anchor_ids"), to("partner_ids"),
                         to("lam"), cand_ids.to(device), None, masks=masks)
    ref_ls = similarity_loss(P["p_anchor"], torch.cat([P["p_anchor"], P["p_mem"]]), P["anchor_ids"],
                             P["partner_ids"], P["lam"], cand_ids, P["in_G"])
    assert ls.item() == pytest.approx(ref_ls.item(), rel=0.03)
