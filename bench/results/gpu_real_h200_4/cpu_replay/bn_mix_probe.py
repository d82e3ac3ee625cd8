"""Why bs_probe.py saw the same 8 images' features with a larger norm in a call of 8
(16.7) than as rows of a call of 128 (13.7): a call of few images, or a call of only
mixup images? Train-mode BatchNorm normalises each call by its own statistics, and
bs_probe's 8 were mixed views (λ·x + (1−λ)·x[perm]: two images averaged, less spread
out) while its other 120 were not. No gradient, on the network as built: nothing trains.

For 48 draws of 8 images of the subset's training set, one strong view each, the median
norm of their features v (train mode) when the network sees them
  mixed, as a call of 8                      (bs_probe's "call of 8")
  mixed, among 120 unmixed views             (bs_probe's "rows of a call of 128")
  mixed, among 120 mixed views               (the same call size, all mixed)
  unmixed, as a call of 8
  unmixed, among 120 unmixed views.
If the mixing is the cause, the first and third agree and the last two agree; if the size
of the call is, the first is above the third and the fourth above the fifth.

    python bench/results/gpu_real_h200_4/cpu_replay/bn_mix_probe.py [WARMUP_CKPT]

(from the repository root; split.py's data and network: the paper's PreAct ResNet-18 at
its initialisation, model.seed's, or a warm-up state of that network if given)."""
import statistics
import sys

import torch

from split import C, cfg, data, dev
from selcl import losses
from selcl.train import _views, make_pretrainer

warm = torch.load(sys.argv[1], map_location="cpu", weights_only=False) if len(sys.argv) > 1 else None
net = make_pretrainer(cfg, C, dev, warm).model
net.train()
g = torch.Generator().manual_seed(2)
DRAWS = 48
norms: dict[str, list[float]] = {}      # call → one median norm per draw, in the order below


def median_norm(x: torch.Tensor) -> float:
    return torch.linalg.vector_norm(net.encoder(x)[:8], dim=1).median().item()


with torch.no_grad():
    for _ in range(DRAWS):
        idx = torch.randperm(data.n, generator=g)[:128]
        v = _views(data.x[idx], g, data)                      # 128 strong views
        lam, perm = losses.mixup_params(8, g, dev)
        m8 = losses.mix(v[:8], lam, perm)                     # the 8, mixed among themselves
        lam2, perm2 = losses.mixup_params(120, g, dev)
        m120 = losses.mix(v[8:], lam2, perm2)                 # the other 120, mixed among themselves
        calls = {"mixed, call of 8": m8, "mixed, among 120 unmixed": torch.cat([m8, v[8:]]),
                 "mixed, among 120 mixed": torch.cat([m8, m120]), "unmixed, call of 8": v[:8],
                 "unmixed, among 120 unmixed": v}
        for k, x in calls.items():
            norms.setdefault(k, []).append(median_norm(x))
state = f"warm-up state {sys.argv[1]}" if warm is not None else f"initialisation, model.seed {cfg['model']['seed']}"
print(f"{cfg['model']['arch']}, {state}: median over {DRAWS} draws of the 8 images' median feature norm (train mode)")
for k, n in norms.items():
    print(f"  {k:28s}: {statistics.median(n):7.2f}  (draws {min(n):.2f} to {max(n):.2f})", flush=True)
