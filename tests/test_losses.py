"""Losses (SPEC §4, §6, §7) against brute-force loops written from the equations.

The pre-training terms of SPEC §10.2 (`term_masks`, `sup_contrastive_term`,
`similarity_term`, `selective_losses`) are checked against an independent re-derivation
of the authors' iteration in tests/test_parity.py; here: their dtype and device contract."""
import math

import pytest
import torch
import torch.nn.functional as F

from selcl.losses import (Candidates, fallback_weights, mix, mixup_bootstrap_loss, mixup_cross_entropy,
                          mixup_params, moco_loss, selective_losses)

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


def ref_moco(q, k, queue, tau):
    """−log exp(q·k/τ) / (exp(q·k/τ) + Σ_n exp(q·n/τ)), one query."""
    pos = math.exp(float(q @ k) / tau)
    neg = sum(math.exp(float(q @ n) / tau) for n in queue)
    return -math.log(pos / (pos + neg))


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


def _selective_problem(device, dtype, B=6, M=20, d=16, C=4, seed=0, then=None):
    """then: a second dtype the `dtype`-rounded inputs are cast to (bf16 values in float32)."""
    g = torch.Generator().manual_seed(seed)
    G = random_G(g, 0.3)
    idx = torch.randperm(N_IDS, generator=g)[:B]
    ids = torch.cat([idx, idx])
    z = unit(torch.randn(2 * B, d, generator=g, dtype=torch.float64))
    p = torch.softmax(torch.randn(2 * B, C, generator=g, dtype=torch.float64), 1)
    mem_ids = torch.cat([torch.randint(N_IDS, (M - 2 * B,), generator=g), ids])
    mem_z = unit(torch.randn(M, d, generator=g, dtype=torch.float64))
    mem_p = torch.softmax(torch.randn(M, C, generator=g, dtype=torch.float64), 1)
    perm = torch.cat([torch.randperm(B, generator=g), torch.randperm(B, generator=g) + B])
    lam = torch.cat([torch.full((B,), 0.7), torch.full((B,), 0.9)]).double()
    u = torch.rand(B, generator=g, dtype=torch.float64)
    to = lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)  # noqa: E731
    if then is not None:
        first = to
        to = lambda t: first(t).to(then) if t.is_floating_point() else first(t)  # noqa: E731
    Gd = G.to(device)
    own = torch.arange(2 * B, device=device)
    cur = torch.zeros(M, dtype=torch.bool)
    cur[M - 2 * B:] = True
    zt = to(z).requires_grad_(True)
    batch = Candidates(zt, to(p), ids.to(device), torch.ones(2 * B, dtype=torch.bool, device=device), own)
    memory = Candidates(to(mem_z), to(mem_p), mem_ids.to(device), cur.to(device), own + M - 2 * B)
    out = selective_losses(zt, to(p), to(u), to(lam), ids.to(device), perm.to(device),
                           lambda i, j: Gd[i][:, j], batch, memory, 0.1)
    return out, zt


@pytest.mark.parametrize("device", DEVICES)
def test_selective_losses_bf16_on_device_match_float64(device):
    """The training-time call pattern (bf16 embeddings on `device`) computes in float32: the
    losses and the anchors' gradient equal a float32 run on the same bf16-rounded values to
    float32 precision (a bf16 matmul or log would be ~1e-2 off), and agree with the float64
    CPU result to bf16 precision."""
    ref, _ = _selective_problem("cpu", torch.float64)
    got, zt = _selective_problem(device, torch.bfloat16)
    f32, zf = _selective_problem(device, torch.bfloat16, then=torch.float32)
    for k in ("l_sel", "l_sim"):
        assert got[k].dtype == torch.float32 and got[k].device.type == device
        torch.testing.assert_close(got[k], f32[k], rtol=1e-5, atol=1e-6)
        assert float(got[k].detach()) == pytest.approx(float(ref[k].detach()), rel=0.03)
    assert torch.equal(got["s"].cpu().bool(), ref["s"].bool())
    got["l_sel"].backward()
    f32["l_sel"].backward()
    assert torch.isfinite(zt.grad).all() and zt.grad.abs().sum() > 0
    # zt feeds the anchors and the batch candidates: its two gradient parts are rounded to
    # bf16 and summed there, so allow a few bf16 ulps of the gradient's scale
    scale = float(zf.grad.abs().max())
    torch.testing.assert_close(zt.grad.float(), zf.grad, rtol=1e-2, atol=2 ** -7 * scale)


def test_fallback_weights_thresholds():
    """s_i: fewer than 1 sup positive in the batch without memory; fewer than 2 over batch
    and memory together with it (the current batch is counted in both)."""
    nb, nm = torch.tensor([0, 1, 0, 1, 2]), torch.tensor([0, 0, 1, 1, 0])
    assert fallback_weights(nb, None).tolist() == [1, 0, 1, 0, 0]
    assert fallback_weights(nb, nm).tolist() == [1, 1, 1, 0, 0]
