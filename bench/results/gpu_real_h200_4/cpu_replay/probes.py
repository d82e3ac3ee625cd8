"""Eval-mode k-NN of the paper's network on bench/gpu_real.py's `--subset 500` split: freshly
initialised, after the CPU replay's warm-up, and after that warm-up network has made five
train-mode calls (a step's: query, two mixed views, two L_CLS views; no gradient, no
optimiser step) on 8 mixed strong views (an epoch's last batch here: 5,000 = 39 × 128 + 8)
or on 128. Does the last batch spoil BatchNorm's running statistics?

    python bench/results/gpu_real_h200_4/cpu_replay/probes.py /tmp/r4/w/selcl/warmup.pt

(from the repository root, data/cifar10-jpeg.tar.gz in place; the data and configuration
are split.py's; the checkpoint is the one bench/gpu_real.py leaves in its --workdir)."""
import copy
import sys

import torch

from split import C, cfg, data, dev, score
from selcl import augment
from selcl.train import make_model


score(make_model(cfg["model"], C, dev).state_dict(), "freshly initialised (model.seed)")
warm = torch.load(sys.argv[1], map_location="cpu", weights_only=False)["model"]
score(warm, "after the warm-up")
g = torch.Generator().manual_seed(0)
for b in (8, 128):
    m = make_model(cfg["model"], C, dev)
    m.load_state_dict(copy.deepcopy(warm))
    m.train()
    with torch.no_grad():
        for _ in range(5):
            idx = torch.randint(0, data.n, (b,), generator=g)
            x = augment.strong_augment(data.x[idx], g, data.mean, data.std)
            lam, perm = 0.7, torch.randperm(b, generator=g)
            m(lam * x + (1 - lam) * x[perm])
    score(m.state_dict(), f"then 5 train-mode calls of {b} mixed strong views")
