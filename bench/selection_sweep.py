"""Diagnosis: the selection T that a *trained* Sel-CL encoder gives at other K and α.

Loads a pre-training output (runs/<setting>/pretrain.pt, its data.npz and labels.npz),
embeds the un-augmented training images with the online network, as the stage does
after its last epoch, and runs `selcl.selection.select` for every K × α asked for:
|T|, precision and recall of T, n_sel. Nothing is trained: this says whether the
precision of T is limited by the encoder or by the selection's settings.
`--pseudo-labels true false` scores T both ways on the same encoder: against the
neighbours' pseudo-labels (the method) and against their noisy labels (paper Table 10's
"without"). `--version v1 v2` selects both ways on the same encoder: the SPEC's selection
(the authors' `utils_noise.py`) and their `utils_noise_v2.py` (`selcl.selection`).

--precision fp32 bf16 fp16: also embeds the images under CPU autocast in each dtype
(fp32: none, as the pipeline embeds) and selects at the setting's K, α, β from each: |T|,
precision of T, the members of T and the ŷ that differ from fp32's, γ. bf16 is the CUDA
training passes' autocast (the selection embedded in it before 2026-12-06); fp16 what the
authors' apex O1 embedded in on CIFAR. CPU autocast rounds the convolutions' and linear
layers' inputs as CUDA autocast does, but its kernels are not CUDA's: this measures the
rounding's size, not a GPU's exact numbers.

--per-class: also, for the T the run itself ended with (pretrain.pt's `examples`, what
fine-tuning trained on), |T| and the precision of T by given label, and the true classes
of its wrong labels: which classes the encoder confuses.

    python bench/selection_sweep.py runs/cpu_cifar10_sym50 --k 10 25 50 100 --alpha 0.25 0.5
    python bench/selection_sweep.py runs/cpu_cifar10_sym50 --k 25 --per-class
    python bench/selection_sweep.py runs/cpu_cifar10_asym40 --k 25 --precision fp32 bf16 fp16
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="runs/<setting> of a finished pre-training")
    ap.add_argument("--setting", help="setting name (default: the run folder's name)")
    ap.add_argument("--k", type=int, nargs="+", default=[10, 25, 50, 100])
    ap.add_argument("--alpha", type=float, nargs="+", default=None, help="default: the setting's α")
    ap.add_argument("--pseudo-labels", nargs="+", choices=["true", "false"], default=None,
                    help="score T against the neighbours' pseudo-labels (true) or noisy labels (false); "
                         "default: the setting's")
    ap.add_argument("--version", nargs="+", choices=["v1", "v2"], default=None,
                    help="the selection's version (pretrain.selection_version); default: the setting's")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--per-class", action="store_true", help="the run's own final T class by class")
    ap.add_argument("--precision", nargs="+", choices=list(DTYPES), default=None,
                    help="also select from embeddings under CPU autocast in these dtypes, against fp32's")
    args = ap.parse_args(argv)
    import torch

    from selcl.config import load_params, resolve
    from selcl.evaluate import embed
    from selcl.train import TrainData, make_model

    run = Path(args.run_dir)
    cfg = resolve(load_params(args.params), args.setting or run.name)
    pc, dev = cfg["pretrain"], torch.device("cpu")
    data = TrainData.load(run, dev)
    state = torch.load(run / "pretrain.pt", map_location=dev, weights_only=False)
    model = make_model(cfg["model"], data.num_classes, dev)
    model.load_state_dict(state["model"])
    z, _ = embed(model, data.x, data.mean, data.std, crop=data.crop)
    print(f"{run}: {data.n} examples, labels {float((data.noisy == data.clean).float().mean()):.3f} right; "
          f"the run used K = {pc['k']}, α = {pc['alpha']}, β = {pc['beta']}")
    print("| K | α | n_sel | \\|T\\| | precision of T | recall of T | pseudo-labels | version "
          "| γ | \\|G\\| | precision of G |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    scorings = [v == "true" for v in args.pseudo_labels] if args.pseudo_labels else [pc["pseudo_labels"]]
    for k in args.k:
        for alpha in args.alpha or [pc["alpha"]]:
            for pseudo in scorings:
                for version in args.version or [pc["selection_version"]]:
                    st = _select(z, data, pc, k=k, alpha=alpha, pseudo_labels=pseudo, version=version).stats
                    print(f"| {k} | {alpha:g} | {int(st['n_per_class'])} | {int(st['n_selected'])} | "
                          f"{st['precision_T']:.3f} | {st['recall_T']:.3f} | {'with' if pseudo else 'without'} | "
                          f"{version} | {st['threshold']:.4f} | {int(st['n_pairs'])} | {st['precision_G']:.3f} |",
                          flush=True)
    if args.precision:
        print()
        print(precision_table(model, data, pc, args.precision, z))
    if args.per_class:
        from selcl.data import load_arrays
        names = load_arrays(run / "data.npz").classes
        print()
        print(per_class_table(state["examples"], data.noisy, data.clean, names))
    return 0


DTYPES = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


def _select(z, data, pc: dict, **overrides):
    """`selcl.selection.select` on embeddings z with the setting's selection parameters
    (K, α, pseudo-labels, version replaceable) and γ's sample seeded as its last epoch."""
    from selcl.selection import select
    kw = dict(k=pc["k"], alpha=pc["alpha"], pseudo_labels=pc["pseudo_labels"], version=pc["selection_version"])
    return select(z, data.noisy, data.num_classes, beta=pc["beta"], weighting=pc["knn_weighting"],
                  seed=pc["epochs"], clean_labels=data.clean, **{**kw, **overrides})


def precision_table(model, data, pc: dict, precisions: list, z0) -> str:
    """Markdown: the selection (the setting's K, α, β, epoch seed) from embeddings computed
    under CPU autocast in each dtype, each row against fp32's (z0, the float32 embeddings):
    which members of T and which pseudo-labels ŷ differ, and how far the embeddings moved
    (max |z − z_fp32|, max 1 − cos)."""
    import torch

    from selcl.evaluate import embed

    def run(name):
        z = embed(model, data.x, data.mean, data.std, crop=data.crop,
                  autocast_dtype=getattr(torch, DTYPES[name]))[0] if DTYPES[name] else z0
        return z, _select(z, data, pc)

    _, ref = run("fp32")
    rows = ["| embedding | \\|T\\| | precision of T | T: members not in fp32's / fp32's not in it | "
            "ŷ differing from fp32's | γ | max \\|z − z_fp32\\| | max 1 − cos(z, z_fp32) |",
            "|---|---|---|---|---|---|---|---|"]
    for name in precisions:
        z, sel = (z0, ref) if name == "fp32" else run(name)
        st = sel.stats
        extra, missing = int((sel.examples & ~ref.examples).sum()), int((ref.examples & ~sel.examples).sum())
        flips = int((sel.pseudo_labels != ref.pseudo_labels).sum())
        cos = float((1 - (z * z0).sum(1)).max())
        rows.append(f"| {name} | {int(st['n_selected'])} | {st['precision_T']:.4f} | {extra} / {missing} | "
                    f"{flips} | {st['threshold']:.5f} | {float((z - z0).abs().max()):.2e} | {cos:.2e} |")
    return "\n".join(rows)


def per_class_table(examples, noisy, clean, names: list, top: int = 3) -> str:
    """Markdown: for each given (noisy) label c, how many of T carry it, the fraction of
    those whose true class is c, and the commonest true classes among the wrong ones."""
    import torch
    T = torch.as_tensor(examples, dtype=torch.bool)
    noisy, clean = torch.as_tensor(noisy), torch.as_tensor(clean)
    rows = ["| given label | \\|T\\| | precision | wrong labels: true class (count) |", "|---|---|---|---|"]
    for c, name in enumerate(names):
        mine = T & (noisy == c)
        n = int(mine.sum())
        wrong = torch.bincount(clean[mine & (clean != c)], minlength=len(names))
        worst = [f"{names[t]} ({int(wrong[t])})" for t in wrong.argsort(descending=True, stable=True)[:top]
                 if wrong[t] > 0]
        prec = f"{float((clean[mine] == c).float().mean()):.3f}" if n else "–"
        rows.append(f"| {name} | {n} | {prec} | {', '.join(worst) or '–'} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
