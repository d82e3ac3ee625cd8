"""Is the CPU float32 replay's collapse at epoch 6 in the weights or in BatchNorm's running
statistics? For each pre-training checkpoint given (bench/gpu_real.py's state after an
epoch), the eval-mode k-NN of the encoder and the Sel-CL classifier's test accuracy:

* as recorded: the online network with its own running statistics;
* recalibrated on clean images: the same weights, the running statistics replaced by the
  exact mean / variance of the 5,000 un-augmented training images (train-mode passes,
  cumulative averaging, no gradient);
* recalibrated on training views: the same, from mixed strong views of those images (what
  the running statistics average during pre-training);
* the EMA network (its weights, the online network's running statistics, as it is kept).

Then, per BatchNorm layer, how far the running statistics sit from the clean images':
log10 of running variance / clean variance, and the running mean's distance from the clean
mean in clean standard deviations (median and max over channels).

    python bench/results/gpu_real_h200_4/cpu_replay/bn_probes.py CKPT [CKPT ...]

(from the repository root; split.py's data and configuration)."""
import sys

import torch

from split import C, cfg, data, dev, score
from selcl import augment
from selcl.train import make_model


def batch_norms(model) -> list:
    """(name, module) of every BatchNorm of `model`, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def recalibrated(state: dict, views):
    """A model with `state`'s weights whose running statistics are the exact average over
    `views` (train-mode passes, no gradient); its momentum is restored afterwards."""
    model = make_model(cfg["model"], C, dev)
    model.load_state_dict(state)
    bns = [m for _, m in batch_norms(model)]
    momenta = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None                      # cumulative average over the passes
    model.train()
    with torch.no_grad():
        for x in views:
            model(x)
    for m, mom in zip(bns, momenta):
        m.momentum = mom
    return model


def clean_views():
    for s in range(0, data.n, 128):
        yield augment.eval_view(data.x[s:s + 128], data.mean, data.std, data.crop)


def mixed_views(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for s in range(0, data.n, 128):
        x = augment.strong_augment(data.x[s:s + 128], g, data.mean, data.std)
        lam = float(torch.rand((), generator=g))      # mixup's λ ~ Beta(1, 1), folded as the authors'
        lam = max(lam, 1 - lam)
        yield lam * x + (1 - lam) * x[torch.randperm(len(x), generator=g)]


def bn_gap(state: dict, clean) -> None:
    """Per BatchNorm: `state`'s running statistics against those of `clean`, the same
    weights recalibrated on the clean images."""
    print("  BN layer | log10 var ratio: median / max |.| | mean gap in clean sd: median / max")
    for name, b in batch_norms(clean):
        lv = torch.log10(state[f"{name}.running_var"] / b.running_var)
        dm = (state[f"{name}.running_mean"] - b.running_mean).abs() / b.running_var.sqrt()
        print(f"  {name} | {lv.median().item():+.2f} / {lv.abs().max().item():.2f} | "
              f"{dm.median().item():.2f} / {dm.max().item():.2f}")


for path in sys.argv[1:]:
    st = torch.load(path, map_location="cpu", weights_only=False)
    print(f"{path}: epoch {st['epoch']}, recorded k-NN {st['history'][-1]['knn_top1']:.2f} %, "
          f"classifier {st['history'][-1]['test_acc']:.2f} %", flush=True)
    online = st["model"]
    score(online, "as recorded (online, its running statistics)", "  ")
    clean = recalibrated(online, clean_views())
    score(clean.state_dict(), "recalibrated on clean images", "  ")
    score(recalibrated(online, mixed_views()).state_dict(), "recalibrated on mixed strong views", "  ")
    score(st["ema"]["model"], "EMA weights", "  ")
    bn_gap(online, clean)
