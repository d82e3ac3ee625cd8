"""Parity with the authors' pre-training iteration (SPEC §10.2), by an independent re-derivation.

The reference below is written from *reading* the authors' scripts (`train_sel`,
`supervised_masks_estimation`, `unsupervised_masks_estimation`,
`Supervised_ContrastiveLearning_loss`, `Simi_loss`, `queue_with_pro`), in their dense
form: a full N×N pair matrix G, the four quadrant masks of each kind built with
`repeat(2, 2)` and the mixup permutations, the current batch's block written into the
memory masks at the queue pointer, exp / sum / log as they compute it. It calls nothing
of `selcl.losses` or `selcl.memory`. The project computes the same quantities from
dataset indices, on the fly, with `selcl.losses.selective_losses`.

  * loss level (float64): L_sel, L_SIM and their gradients w.r.t. the anchor embeddings
    and probabilities agree to 1e-9, with and without the memory term, with the memory
    before and after its wrap, with mixup on and off;
  * a perturbed mask changes the reference's value (so the comparison can fail);
  * step level: one whole `Pretrainer.step` on a tiny network (per-view BatchNorm in one
    call, u_i, memory, L_CLS, L_SIM clipped then summed, SGD) equals the reference
    iteration with the authors' separate network calls. The reference shares only torch
    and the network definition with the project: it replays the augmented views the step
    recorded, draws λ, the partners and the L_CLS batch again from the step's generator
    with plain torch, and keeps its own MoCo queue, labelled memory and EMA.

The selection, the Uns-CL warm-up and Sel-CL+ fine-tuning have their own parity files
(tests/test_parity_selection.py, test_parity_warmup.py, test_parity_finetune.py);
docs/parity.md lists them and the seeded bugs each one catches.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from selcl import losses
from selcl.memory import LabelledMemory

TAU = 0.1


# ------------------------------------------------------------------ the reference
class AuthorsQueue:
    """The authors' labelled queue: K slots, initialised to −1; a batch that would pass
    the end goes to the last slots and the pointer restarts at 0; `get` returns all
    slots once the last one holds an index, else the first `ptr`."""

    def __init__(self, K, d, C):
        self.K = K
        self.feats = -torch.ones(K, d, dtype=torch.float64)
        self.pros = -torch.ones(K, C, dtype=torch.float64)
        self.indices = -torch.ones(K, dtype=torch.long)
        self.ptr = 0

    def enqueue_dequeue(self, feats, pros, indices):
        q = len(indices)
        if self.ptr + q > self.K:
            self.feats[-q:], self.pros[-q:], self.indices[-q:] = feats, pros, indices
            self.ptr = 0
        else:
            self.feats[self.ptr:self.ptr + q] = feats
            self.pros[self.ptr:self.ptr + q] = pros
            self.indices[self.ptr:self.ptr + q] = indices
            self.ptr += q

    def get(self):
        if self.indices[-1].item() != -1:
            return self.feats, self.pros, self.indices
        return self.feats[:self.ptr], self.pros[:self.ptr], self.indices[:self.ptr]


def _place(mem_mask, batch_mask, ptr, bsz):
    """Write the current batch's block into a memory mask where the queue put it."""
    if ptr == 0:
        mem_mask[:, -2 * bsz:] = batch_mask
    else:
        mem_mask[:, ptr - 2 * bsz:ptr] = batch_mask
    return mem_mask


def reference_masks(G, index, mix1, mix2, queue=None):
    """The authors' four mask kinds for the batch (and, with `queue`, the memory)."""
    bsz = len(index)
    eye_b, eye_2b = torch.eye(bsz) == 1, torch.eye(2 * bsz) == 1
    # unsupervised: the label of an example is its position in the mini-batch
    lab = torch.arange(bsz)[:, None]
    mU = torch.eye(bsz, dtype=torch.float64).repeat(2, 2)
    mU[eye_2b] = 0
    q1 = (lab[mix1] == lab.T).double()
    q3 = (lab[mix2] == lab.T).double()
    m2U = torch.cat([torch.cat([q1, q1], 1), torch.cat([q3, q3], 1)], 0)
    m2U[eye_2b] = 0
    # supervised: rows / columns of G for the batch (a copy: its diagonal stays)
    tg = G[index][:, index].double()
    mS = tg.clone()
    mS[eye_b] = 0
    mS = mS.repeat(2, 2)
    mS[eye_2b] = 0
    m2S = torch.cat([torch.cat([tg[mix1], tg[mix1]], 1), torch.cat([tg[mix2], tg[mix2]], 1)], 0)
    m2S[eye_2b] = 0
    out = {"batch": (mS, m2S, mU, m2U, (1 - torch.eye(2 * bsz, dtype=torch.float64)))}
    if queue is not None:
        _, _, qidx = queue.get()
        K = len(qidx)
        tgm = G[index][:, qidx].double()
        mSm = _place(tgm.repeat(2, 1), mS, queue.ptr, bsz)
        m2Sm = _place(torch.cat([tgm[mix1], tgm[mix2]], 0), m2S, queue.ptr, bsz)
        mUm = _place(torch.zeros(2 * bsz, K, dtype=torch.float64), mU, queue.ptr, bsz)
        m2Um = _place(torch.zeros(2 * bsz, K, dtype=torch.float64), m2U, queue.ptr, bsz)
        lm = _place(torch.ones(2 * bsz, K, dtype=torch.float64), out["batch"][4], queue.ptr, bsz)
        out["memory"] = (mSm, m2Sm, mUm, m2Um, lm)
    return out


def reference_sup_loss(P, masks, lam1, lam2, bsz):
    """Their supervised contrastive loss for one term (aprox = 1)."""
    mS, m2S, mU, m2U, lm = masks
    logits = P / TAU
    log_prob = logits - torch.log((torch.exp(logits) * lm).sum(1, keepdim=True))
    den1, den2 = mS.sum(1) + mU.sum(1), m2S.sum(1) + m2U.sum(1)
    sup, uns = (mS * log_prob).sum(1) / den1, (mU * log_prob).sum(1) / den1
    sup2, uns2 = (m2S * log_prob).sum(1) / den2, (m2U * log_prob).sum(1) / den2
    h = bsz
    loss1 = torch.cat([-lam1 * uns[:h] - lam1 * sup[:h], -lam2 * uns[h:] - lam2 * sup[h:]])
    loss2 = torch.cat([-(1 - lam1) * uns2[:h] - (1 - lam1) * sup2[:h],
                       -(1 - lam2) * uns2[h:] - (1 - lam2) * sup2[h:]])
    loss = (loss1 + loss2).view(2, bsz).mean(0)
    return ((mS[:bsz].sum(1) > 0) * loss).mean()


def reference_simi_loss(S, masks, lam1, lam2):
    """Their similarity loss for one term."""
    mS, m2S, mU, m2U, lm = masks
    l1 = lm * (-(mS + mU) * torch.log(S + 1e-7) - (1 - mS - mU) * torch.log(1 - S + 1e-7))
    l2 = lm * (-(m2S + m2U) * torch.log(S + 1e-7) - (1 - m2S - m2U) * torch.log(1 - S + 1e-7))
    h = len(l1) // 2
    return torch.cat([lam1 * l1[:h] + (1 - lam1) * l2[:h], lam2 * l1[h:] + (1 - lam2) * l2[h:]]).mean()


def reference_losses(G, index, zA, zB, pA, pB, mix1, mix2, lam1, lam2, u, queue=None):
    """L_sel and L_SIM of `train_sel`, queue already holding this batch (or None)."""
    bsz = len(index)
    m = reference_masks(G, index, mix1, mix2, queue)
    emb, pro = torch.cat([zA, zB]), torch.cat([pA, pB])
    l_sup = reference_sup_loss(emb @ emb.T, m["batch"], lam1, lam2, bsz)
    l_sim = reference_simi_loss(pro @ pro.T, m["batch"], lam1, lam2)
    if queue is not None:
        qf, qp, _ = queue.get()
        l_sup = l_sup + reference_sup_loss(emb @ qf.T, m["memory"], lam1, lam2, bsz)
        l_sim = l_sim + reference_simi_loss(pro @ qp.T, m["memory"], lam1, lam2)
        sel_mask = (m["batch"][0][:bsz].sum(1) + m["memory"][0][:bsz].sum(1)) < 2
    else:
        sel_mask = m["batch"][0][:bsz].sum(1) < 1
    return (sel_mask * u).mean() + l_sup, l_sim


# ------------------------------------------------------------------ the project
def project_losses(G, index, zA, zB, pA, pB, mix1, mix2, lam1, lam2, u, memory=None):
    bsz = len(index)
    in_G = lambda i, j: G[i][:, j]  # noqa: E731
    anchor_ids = torch.cat([index, index])
    own = torch.arange(2 * bsz)
    batch = losses.Candidates(torch.cat([zA, zB]), torch.cat([pA, pB]), anchor_ids,
                              torch.ones(2 * bsz, dtype=torch.bool), own)
    mem = None
    if memory is not None:
        mem = losses.Candidates(memory.feats.double(), memory.probs.double(), memory.ids,
                                memory.current_mask(), memory.current[0] + own)
    lam = torch.tensor([lam1] * bsz + [lam2] * bsz, dtype=torch.float64)
    out = losses.selective_losses(torch.cat([zA, zB]), torch.cat([pA, pB]), u, lam, anchor_ids,
                                  torch.cat([mix1, mix2 + bsz]), in_G, batch, mem, TAU)
    return out["l_sel"], out["l_sim"]


# ------------------------------------------------------------------ random states
def random_case(seed, N=40, B=7, C=5, d=6, K=40, n_prior=0, mixup=True):
    """Random float64 embeddings / probabilities, a random G (symmetric, diagonal in G),
    and a memory (reference queue + project memory) that received `n_prior` random
    batches of 2B entries before this one."""
    g = torch.Generator().manual_seed(seed)
    G = torch.rand(N, N, generator=g) < 0.35
    G = G | G.T | torch.eye(N, dtype=torch.bool)
    index = torch.randperm(N, generator=g)[:B]
    unit = lambda *s: F.normalize(torch.randn(*s, generator=g, dtype=torch.float64), dim=-1)  # noqa: E731
    soft = lambda *s: torch.softmax(2 * torch.randn(*s, generator=g, dtype=torch.float64), -1)  # noqa: E731
    zA, zB, pA, pB = unit(B, d), unit(B, d), soft(B, C), soft(B, C)
    if mixup:
        mix1, mix2 = torch.randperm(B, generator=g), torch.randperm(B, generator=g)
        lam1, lam2 = (0.5 + 0.5 * torch.rand(2, generator=g, dtype=torch.float64)).tolist()
    else:
        mix1 = mix2 = torch.arange(B)
        lam1 = lam2 = 1.0
    u = 3 * torch.rand(B, generator=g, dtype=torch.float64)
    queue, memory = AuthorsQueue(K, d, C), LabelledMemory(K, d, C)
    memory._feats, memory._probs = memory._feats.double(), memory._probs.double()
    for _ in range(n_prior):
        f, p, i = unit(2 * B, d), soft(2 * B, C), torch.randint(N, (2 * B,), generator=g)
        queue.enqueue_dequeue(f, p, i)
        memory.enqueue(f, p, i)
    # this batch's EMA entries (of the mixed views), enqueued before the loss
    f, p = unit(2 * B, d), soft(2 * B, C)
    queue.enqueue_dequeue(f, p, torch.cat([index, index]))
    memory.enqueue(f, p, torch.cat([index, index]))
    return dict(G=G, index=index, zA=zA, zB=zB, pA=pA, pB=pB, mix1=mix1, mix2=mix2,
                lam1=lam1, lam2=lam2, u=u), queue, memory


def _leaves(case):
    case = dict(case)
    for k in ("zA", "zB", "pA", "pB"):
        case[k] = case[k].clone().requires_grad_(True)
    return case


def _value_and_grads(fn, case, extra):
    c = _leaves(case)
    l_sel, l_sim = fn(**c, **extra)
    leaves = [c[k] for k in ("zA", "zB", "pA", "pB")]
    g_sel = torch.autograd.grad(l_sel, leaves, retain_graph=True, allow_unused=True)
    g_sim = torch.autograd.grad(l_sim, leaves, allow_unused=True)
    z = lambda gs: [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, gs)]  # noqa: E731
    return l_sel.detach(), l_sim.detach(), z(g_sel), z(g_sim)


CASES = [  # (seed, n_prior batches before this one, memory read, mixup)
    (0, 0, False, True),      # no memory term
    (1, 0, True, True),       # memory read, holds only this batch
    (2, 1, True, True),       # partly filled
    (3, 2, True, True),       # wrapped: 3·14 > 40, last slots + ptr = 0
    (4, 5, True, True),       # several wraps, older copies of batch examples in it
    (5, 3, True, False),      # mixup off: λ = 1, identity partners
    (6, 0, False, False),
]


@pytest.mark.parametrize("seed,n_prior,read,mixup", CASES)
def test_losses_and_gradients_match_the_reference(seed, n_prior, read, mixup):
    case, queue, memory = random_case(seed, n_prior=n_prior, mixup=mixup)
    ref = _value_and_grads(reference_losses, case, {"queue": queue if read else None})
    got = _value_and_grads(project_losses, case, {"memory": memory if read else None})
    assert abs(ref[0] - got[0]) < 1e-9 and abs(ref[1] - got[1]) < 1e-9, (ref[:2], got[:2])
    for r, g in zip(ref[2] + ref[3], got[2] + got[3]):
        assert torch.allclose(r, g, atol=1e-9, rtol=0), (r - g).abs().max()
    assert ref[0] > 0 and ref[1] > 0 and any(g.abs().sum() > 0 for g in ref[2])


def test_memory_follows_the_authors_queue():
    """Same contents, pointer and filled part as the reference queue, through several wraps."""
    case, queue, memory = random_case(7, n_prior=6)
    qf, qp, qi = queue.get()
    assert memory.ptr == queue.ptr and len(memory) == len(qi)
    assert torch.equal(memory.ids, qi) and torch.allclose(memory.feats.double(), qf)
    # the current batch sits where the reference's masks put it
    start = queue.K - 14 if queue.ptr == 0 else queue.ptr - 14
    assert memory.current == (start, start + 14)


def test_a_perturbed_mask_changes_the_reference():
    """The re-derivation can fail: one flipped pair (i, j) of G among the batch changes
    L_sel and L_SIM, so equality above is not vacuous."""
    case, queue, _ = random_case(2, n_prior=1)
    l_sel, l_sim = reference_losses(**case, queue=queue)
    G = case["G"].clone()
    i, j = case["index"][0], case["index"][1]
    G[i, j] = G[j, i] = ~G[i, j]
    l_sel2, l_sim2 = reference_losses(**dict(case, G=G), queue=queue)
    assert abs(l_sel - l_sel2) > 1e-6 and abs(l_sim - l_sim2) > 1e-6
    # and the project follows the perturbation too
    p_sel, p_sim = project_losses(**dict(case, G=G), memory=random_case(2, n_prior=1)[2])
    assert abs(p_sel - l_sel2) < 1e-9 and abs(p_sim - l_sim2) < 1e-9


# ------------------------------------------------------------------ one whole step
def _moco_per_example(q, k, negatives):
    """MoCo's NCE softmax loss per example: positive logit first, then the negatives."""
    out = torch.cat([(q * k).sum(1, keepdim=True), q @ negatives.T], 1) / TAU
    return F.cross_entropy(out, torch.zeros(len(q), dtype=torch.long), reduction="none")


def _mixup_draw(g: torch.Generator, B: int):
    """The step's mixup draw, in plain torch: λ = max(u, 1 − u), u ~ U(0, 1), then the
    partners' permutation [B] (the authors' mix_data_lab, from the step's generator)."""
    lam = torch.rand((), generator=g)
    return torch.maximum(lam, 1 - lam), torch.randperm(B, generator=g)


@pytest.mark.parametrize("clip", ["sim", "total"])   # the authors' CIFAR step / their WebVision step
@pytest.mark.parametrize("split", [False, True], ids=["one-call", "call-per-view"])
@pytest.mark.parametrize("lambda_sim", [0.01, 3.0])   # 3.0: the clipping of ∇L_SIM is active
def test_one_step_matches_the_reference_iteration(lambda_sim, split, clip, monkeypatch):
    """One `Pretrainer.step` (per-view BatchNorm statistics in one network call, or one call
    per view, the CPU default; u_i on the
    un-mixed view, memory written before the loss, L_CLS per-view λ, the L_SIM gradient
    clipped to norm 0.25 and then summed, SGD) gives the same parameters, BatchNorm
    statistics and memory as the reference iteration, which calls the network once per
    view as the authors do.
    The reference calls no project helper: the augmented views are recorded as the step's
    `_views` returns them (with the generator's state before and after), and the rest of
    the step's draws (λ and partners per view, the L_CLS batch) are drawn again from the
    generator with plain torch, in the order the step makes them; its MoCo queue (their
    MemoryMoCo), labelled memory (`AuthorsQueue`) and EMA (their moment_update) are its own.
    Compared: each parameter's update (so a term with a small share of it still shows), and
    a reference without L_SIM must not match (the comparison sees L_SIM at λ_s = 0.01).
    After the step, the EMA parameters are m·EMA + (1 − m)·the updated parameters, and
    MoCo's queue holds this step's keys, embedded by the EMA before its update.
    clip "total" (the authors' WebVision step, `sim_grad_clip: null`, `grad_clip` set): one
    backward of L_sel + λ_c·L_CLS + λ_s·L_SIM, the whole gradient clipped to grad_clip."""
    from conftest import random_images_and_net
    from test_parity_finetune import Recorder

    from selcl.memory import KeyQueue
    from selcl.models import EMA
    from selcl.train import Pretrainer, set_lr

    torch.manual_seed(0)
    N, B, C, D, K_MOCO = 24, 6, 3, 8, 10
    data, model, gen = random_images_and_net(N, C)
    x, noisy = data.x, data.noisy
    ema_state = copy.deepcopy(model.state_dict())
    with torch.no_grad():     # an EMA that differs from the online network
        for name, p in model.named_parameters():
            ema_state[name] = p + 0.05 * torch.randn(p.shape, generator=gen)
    pc = {"mixup": True, "classifier": True, "lambda_cls": 1.0, "sim_loss": True, "lambda_sim": lambda_sim,
          "memory": True, "temperature": TAU, "sim_grad_clip": 0.25, "grad_clip": None}
    TOTAL = 0.05                   # under the tiny net's gradient norm: the clip is active
    if clip == "total":
        pc.update(sim_grad_clip=None, grad_clip=TOTAL)
    G = torch.rand(N, N, generator=gen) < 0.4
    G = G | G.T | torch.eye(N, dtype=torch.bool)
    rule = type("Rule", (), {"in_G": staticmethod(lambda i, j: G[i][:, j])})
    T_idx = torch.arange(0, N, 2)
    idx = torch.randperm(N, generator=gen)[:B]
    K = 4 * B
    keys0 = F.normalize(torch.randn(K_MOCO, D, generator=torch.Generator().manual_seed(3)), dim=1)
    g0 = torch.Generator().manual_seed(4)   # an older memory (wraps at the third batch of 2B = 12 into 24)
    older = [(F.normalize(torch.randn(2 * B, D, generator=g0), dim=1),
              torch.softmax(torch.randn(2 * B, C, generator=g0), 1), torch.randint(N, (2 * B,), generator=g0))
             for _ in range(3)]

    # --- the project
    m = copy.deepcopy(model)
    e = EMA(m, 0.99)
    e.model.load_state_dict(ema_state)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    q = KeyQueue(K_MOCO, D)
    q.enqueue(keys0)                                         # full, pointer back at 0
    mem = LabelledMemory(K, D, C)
    for f, p, i in older:
        mem.enqueue(f, p, i)
    tr = Pretrainer(m, e, opt, q, mem, torch.Generator().manual_seed(5), np.random.default_rng(0), pc)
    tr.split_views = split
    set_lr(opt, 0.05)
    rec = Recorder(monkeypatch)
    tr.step(data, idx, rule, T_idx, read_memory=True)
    assert len(rec.views) == 2

    # --- the reference, on the same draws
    def reference(with_sim: bool):
        g = torch.Generator().manual_seed(5)
        rm = copy.deepcopy(model)
        re_ = copy.deepcopy(model)
        re_.load_state_dict(ema_state)
        for p_ in re_.parameters():
            p_.requires_grad_(False)
        ropt = torch.optim.SGD(rm.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
        moco = keys0.clone()                                 # their MemoryMoCo, index at 0
        aq = AuthorsQueue(K, D, C)
        for f, p_, i in older:
            aq.enqueue_dequeue(f.double(), p_.double(), i)

        recorded = iter(rec.views)

        def views():
            before, out, after = next(recorded)
            assert torch.equal(g.get_state(), before)        # the views come next in the stream
            g.set_state(after)
            return out

        v1, v2 = views()
        (l1, p1), (l2, p2) = _mixup_draw(g, B), _mixup_draw(g, B)
        ic = T_idx[torch.randint(len(T_idx), (B,), generator=g)]
        c1, c2 = views()
        (lc1, pc1), (lc2, pc2) = _mixup_draw(g, B), _mixup_draw(g, B)
        rm.train(); re_.train()
        feat_q, _ = rm(v1)                                   # Uns-CL on the un-mixed views
        with torch.no_grad():
            feat_k, _ = re_(v2)
        u = _moco_per_example(feat_q, feat_k, moco.clone())
        moco[(torch.arange(B)) % K_MOCO] = feat_k            # contrast(..., update=True), index 0
        m1, m2 = l1 * v1 + (1 - l1) * v1[p1], l2 * v2 + (1 - l2) * v2[p2]
        zA, logA = rm(m1)
        zB, logB = rm(m2)
        with torch.no_grad():
            zkA, lkA = re_(m1)
            zkB, lkB = re_(m2)
        aq.enqueue_dequeue(torch.cat([zkA, zkB]).double(), torch.cat([lkA, lkB]).softmax(1).double(),
                           torch.cat([idx, idx]))
        l_sel, l_sim = reference_losses(G, idx, zA.double(), zB.double(), logA.softmax(1).double(),
                                        logB.softmax(1).double(), p1, p2, float(l1), float(l2), u.double(), aq)
        _, lcA = rm(lc1 * c1 + (1 - lc1) * c1[pc1])
        _, lcB = rm(lc2 * c2 + (1 - lc2) * c2[pc2])
        yc = noisy[ic]
        ce = lambda lo, y: F.cross_entropy(lo, y, reduction="none")  # noqa: E731
        l_cls = torch.cat([lc1 * ce(lcA, yc) + (1 - lc1) * ce(lcA, yc[pc1]),
                           lc2 * ce(lcB, yc) + (1 - lc2) * ce(lcB, yc[pc2])]).mean()
        rm.zero_grad()
        if clip == "total":
            (l_sel + 1.0 * l_cls + (lambda_sim * l_sim if with_sim else 0)).backward()
            norm = torch.nn.utils.clip_grad_norm_(rm.parameters(), max_norm=TOTAL)
            assert norm > TOTAL
        else:
            if with_sim:
                (lambda_sim * l_sim).backward(retain_graph=True)
                norm = torch.nn.utils.clip_grad_norm_(rm.parameters(), max_norm=0.25)
                assert (norm > 0.25) == (lambda_sim > 1)
            (l_sel + 1.0 * l_cls).backward()
        ropt.step()
        with torch.no_grad():      # the authors' moment_update, after the step, parameters only
            for pe, pn in zip(re_.parameters(), rm.parameters()):
                pe.mul_(0.99).add_(pn, alpha=0.01)
        return rm, aq, l_sel, l_sim, re_, moco

    rm, aq, l_sel, l_sim, re_, moco = reference(with_sim=True)

    def matches(net) -> bool:
        """Every parameter's update equals the project's to float32 rounding, and every
        buffer (BatchNorm running statistics, steps tracked) its value."""
        start = {n: p.detach() for n, p in model.named_parameters()}
        for (name, a), b in zip(m.state_dict().items(), net.state_dict().values()):
            if name in start:
                da, db = (a - start[name]).double(), (b - start[name]).double()
                assert db.abs().max() > 0, name                       # every parameter moved
                # float32 holds the parameters, so an update is known to ~2 ulps of the value
                ulps = 2 * torch.finfo(torch.float32).eps * float(start[name].abs().max())
                if not torch.allclose(da, db, rtol=1e-3, atol=1e-4 * float(db.abs().max()) + ulps):
                    return False
            elif not torch.allclose(a.double(), b.double(), atol=2e-6, rtol=1e-4):
                return False
        return True

    assert matches(rm)
    if clip == "sim" or lambda_sim > 1:    # under the total clip λ_s = 0.01's share is too small to see
        assert not matches(reference(with_sim=False)[0])   # L_SIM's share of the step is seen
    assert torch.equal(mem.ids, aq.get()[2]) and mem.ptr == aq.ptr
    assert torch.allclose(mem.feats.double(), aq.get()[0], atol=1e-6)
    for (name, a), b in zip(e.model.named_parameters(), re_.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), name               # the EMA update
    assert len(q.keys) == K_MOCO and torch.allclose(q.keys, moco, atol=1e-6)
    assert math.isfinite(float(l_sel.detach())) and float(l_sim.detach()) > 0


# ------------------------------------------------------------------ the lr schedule
class _GradualWarmup(torch.optim.lr_scheduler.LRScheduler):
    """The authors' warm-up scheduler as read: lr = base/m·((m−1)·t/W + 1) for t ≤ W, then
    the wrapped scheduler stepped with t − W."""

    def __init__(self, opt, multiplier, warmup_iters, after):
        self.multiplier, self.warmup_iters, self.after = multiplier, warmup_iters, after
        super().__init__(opt)

    def get_lr(self):
        t = self.last_epoch
        return [b / self.multiplier * ((self.multiplier - 1) * t / self.warmup_iters + 1) for b in self.base_lrs]

    def step(self, epoch=None):
        t = self.last_epoch + 1 if epoch is None else epoch
        self.last_epoch = t
        if t > self.warmup_iters:
            self.after.step(t - self.warmup_iters)
        else:
            super().step(t)


@pytest.mark.parametrize("iters,warm,milestones", [(7, 5, [125, 200]), (3, 1, [20, 26]), (5, 0, [10])])
def test_lr_at_every_iteration_equals_the_authors_schedule(iters, warm, milestones):
    """250 global epochs (warm-up epoch included), the lr of every iteration."""
    import warnings

    from selcl.train import lr_at
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # step(epoch) is deprecated, but it is what they call
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, [(m - warm) * iters for m in milestones], gamma=0.1)
        if warm:
            sched = _GradualWarmup(opt, 100, warm * iters, sched)
        cfg = {"lr": 0.1, "lr_warmup_epochs": warm, "lr_decay_epochs": milestones, "lr_decay": 0.1}
        for epoch in range(1, 251):
            for it in range(iters):
                assert lr_at(cfg, epoch, it, iters) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12), (epoch, it)
                opt.step()
                sched.step()
    assert lr_at(cfg, 126, 0, iters) == pytest.approx(0.1 * 0.1 ** sum(m < 126 for m in milestones))
