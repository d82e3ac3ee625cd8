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

--per-class: also, for the T the run itself ended with (pretrain.pt's `examples`, what
fine-tuning trained on), |T| and the precision of T by given label, and the true classes
of its wrong labels: which classes the encoder confuses.

    python bench/selection_sweep.py runs/cpu_cifar10_sym50 --k 10 25 50 100 --alpha 0.25 0.5
    python bench/selection_sweep.py runs/cpu_cifar10_sym50 --k 25 --per-class
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
    args = ap.parse_args(argv)
    import torch

    from selcl.config import load_params, resolve
    from selcl.evaluate import embed
    from selcl.selection import select
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
                    st = select(z, data.noisy, data.num_classes, k=k, alpha=alpha, beta=pc["beta"],
                                weighting=pc["knn_weighting"], seed=pc["epochs"], clean_labels=data.clean,
                                pseudo_labels=pseudo, version=version).stats
                    print(f"| {k} | {alpha:g} | {int(st['n_per_class'])} | {int(st['n_selected'])} | "
                          f"{st['precision_T']:.3f} | {st['recall_T']:.3f} | {'with' if pseudo else 'without'} | "
                          f"{version} | {st['threshold']:.4f} | {int(st['n_pairs'])} | {st['precision_G']:.3f} |",
                          flush=True)
    if args.per_class:
        from selcl.data import load_arrays
        names = load_arrays(run / "data.npz").classes
        print()
        print(per_class_table(state["examples"], data.noisy, data.clean, names))
    return 0


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
