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

from split import C, cfg, data, dev
from selcl import augment
from selcl.train import knn_report, make_model


def recalibrate(model, views) -> None:
    """Running statistics := the exact average over `views` (batches of 128)."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None                      # cumulative average over the passes
    model.train()
    with torch.no_grad():
        for x in views:
            model(x)
    for m in bns:
        m.momentum = 0.1


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


def score(state, tag) -> None:
    out, _ = knn_report(state, cfg, data, dev)
    print(f"  {tag}: k-NN {out['knn_clean_top1']:.2f} %, classifier {out['selcl_test_top1']:.2f} %", flush=True)


def bn_gap(state) -> None:
    """Per BatchNorm: running statistics against the clean images' exact ones."""
    m = make_model(cfg["model"], C, dev)
    m.load_state_dict(state)
    ref = make_model(cfg["model"], C, dev)
    ref.load_state_dict(state)
    recalibrate(ref, clean_views())
    rows = []
    for (name, a), b in zip(((n, x) for n, x in m.named_modules()
                             if isinstance(x, torch.nn.modules.batchnorm._BatchNorm)),
                            (x for x in ref.modules() if isinstance(x, torch.nn.modules.batchnorm._BatchNorm))):
        lv = torch.log10(a.running_var / b.running_var)
        dm = (a.running_mean - b.running_mean).abs() / b.running_var.sqrt()
        rows.append((name, lv.median().item(), lv.abs().max().item(), dm.median().item(), dm.max().item()))
    print("  BN layer | log10 var ratio: median / max |.| | mean gap in clean sd: median / max")
    for r in rows:
        print(f"  {r[0]} | {r[1]:+.2f} / {r[2]:.2f} | {r[3]:.2f} / {r[4]:.2f}")


for path in sys.argv[1:]:
    st = torch.load(path, map_location="cpu", weights_only=False)
    print(f"{path}: epoch {st['epoch']}, recorded k-NN {st['history'][-1]['knn_top1']:.2f} %, "
          f"classifier {st['history'][-1]['test_acc']:.2f} %", flush=True)
    online = st["model"]
    score(online, "as recorded (online, its running statistics)")
    for tag, views in (("recalibrated on clean images", clean_views), ("recalibrated on mixed strong views", mixed_views)):
        m = make_model(cfg["model"], C, dev)
        m.load_state_dict(online)
        recalibrate(m, views())
        score(m.state_dict(), tag)
    ema = st["ema"]
    ema = ema.get("model", ema) if isinstance(ema, dict) else ema
    score(ema, "EMA weights")
    bn_gap(online)
