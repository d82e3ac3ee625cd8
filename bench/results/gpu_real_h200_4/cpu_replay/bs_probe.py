"""How far does one pre-training step move the paper's network, by batch size? From a
warm-up state of bench/gpu_real.py's `--subset 500` split, its selection made as
pre-training's first, one Sel-CL step (`Pretrainer.step`, memory read, lr 0.1 as from
epoch 3) is taken from the same state again and again, each time on a fresh batch of B
images (its L_CLS batch, drawn from T, has B images too, as the authors'). The momentum
buffer is zeroed before each step, so the step is lr·(gradient + weight decay) of that
batch alone. Printed per B and loss variant (all three losses; without L_CLS; without
L_SIM): the median and max over draws of how far the trainable weights moved (L2 norm),
of how far the stem's convolution moved, and the step's L_CLS.

Then, is it the images or the call? 16 draws of 8 images from T, one mixed strong view
each: the cross-entropy of their logits and the norm of their features v when the network
(train mode, as in the step) sees them as a call of 8; when it sees them as the first 8
rows of a call of 128 (the other 120 drawn from T too, not mixed); and in eval mode (running
statistics, no batch dependence). No gradient, on a copy: nothing of the state changes.

    python bench/results/gpu_real_h200_4/cpu_replay/bs_probe.py WARMUP_CKPT

(from the repository root; split.py's data and configuration; the checkpoint is the
warmup.pt bench/gpu_real.py leaves in its --workdir)."""
import copy
import statistics
import sys

import torch

from split import C, cfg, data, dev
from selcl import losses
from selcl.pairs import configured_rule
from selcl.train import _views, make_pretrainer, run_selection, set_lr

pc = cfg["pretrain"]
warm = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
tr = make_pretrainer(cfg, C, dev, warm)
sel = run_selection(tr.model, data, pc, epoch=cfg["warmup"]["epochs"])
rule = configured_rule(sel, data.noisy, data.clean, pc)
T_idx = torch.nonzero(rule.examples).squeeze(1)
print(f"T: {len(T_idx)} images, {float((data.noisy == data.clean)[T_idx].float().mean()):.3f} clean", flush=True)
# a copy: state_dict() holds the live tensors, which each step would move
start = copy.deepcopy({k: v for k, v in tr.state_dict().items() if k != "rng"})
named = [(n, p) for n, p in tr.model.named_parameters() if p.requires_grad]
stem = dict(named)["encoder.conv1.weight"]
pick = torch.Generator().manual_seed(1)
variants = {"all losses": {}, "without L_CLS": {"lambda_cls": 0.0}, "without L_SIM": {"sim_loss": False}}
draws = {8: 8, 32: 4, 128: 4}
for B, n in draws.items():
    for name, change in variants.items():
        if B == 32 and change:
            continue
        saved = {k: pc[k] for k in change}
        pc.update(change)
        moved, moved_stem, l_cls = [], [], []
        for _ in range(n):
            tr.load_state_dict(copy.deepcopy(start), rng=False)   # same weights; tr.g runs on (new views)
            for st in tr.opt.state.values():
                st["momentum_buffer"].zero_()
            set_lr(tr.opt, 0.1)
            before = [p.detach().clone() for _, p in named]
            stem0 = stem.detach().clone()
            idx = torch.randperm(data.n, generator=pick)[:B]
            out = tr.step(data, idx, rule, T_idx, read_memory=True)
            moved.append(torch.linalg.vector_norm(torch.stack(
                [torch.linalg.vector_norm(p.detach() - b) for (_, p), b in zip(named, before)])).item())
            moved_stem.append(torch.linalg.vector_norm(stem.detach() - stem0).item())
            l_cls.append(float(out.get("l_cls", float("nan"))))
        pc.update(saved)
        print(f"B {B:3d}, {name:13s}: moved median {statistics.median(moved):.3f} max {max(moved):.3f} | "
              f"stem median {statistics.median(moved_stem):.4f} max {max(moved_stem):.4f} | "
              f"L_CLS median {statistics.median(l_cls):.2f} max {max(l_cls):.2f}", flush=True)

tr.load_state_dict(copy.deepcopy(start), rng=False)
net = copy.deepcopy(tr.model)
ce = {"call of 8": [], "rows of a call of 128": [], "eval mode": []}
vn = {k: [] for k in ce}
with torch.no_grad():
    for _ in range(16):
        ic = T_idx[torch.randint(len(T_idx), (128,), generator=pick)]
        lam, perm = losses.mixup_params(8, tr.g, dev)
        x8 = losses.mix(_views(data.x[ic[:8]], tr.g, data), lam, perm)
        x128 = torch.cat([x8, _views(data.x[ic[8:]], tr.g, data)])
        y, yp = data.noisy[ic[:8]], data.noisy[ic[:8]][perm]
        for key, mode, x in (("call of 8", True, x8), ("rows of a call of 128", True, x128),
                             ("eval mode", False, x8)):
            net.train(mode)
            v = net.encoder(x)[:8]
            ce[key].append(losses.mixup_cross_entropy(net.classifier(v), y, yp, lam).item())
            vn[key].append(torch.linalg.vector_norm(v, dim=1).median().item())
for key in ce:
    print(f"the same 8 images, {key:21s}: CE median {statistics.median(ce[key]):6.2f} max {max(ce[key]):6.2f} | "
          f"feature norm median {statistics.median(vn[key]):7.2f}", flush=True)
