"""One setting end to end in one process (warm-up, pre-training, Sel-CL+, CE baseline), one
JSON line of results: for before/after comparisons of the method code (docs/parity.md).

Uses only the library's stage functions, so the same file runs against an older checkout:

    python bench/parity_runs.py --root . --setting demo_sym40 >> results.jsonl
    python bench/parity_runs.py --root ../old --setting cpu_cifar10_asym40 --path c10.tar.gz

Diagnosis from a finished run (issue 11): `--from-run runs/<setting>` (or `--rev <experiment>`:
that experiment's runs/<setting>/ from DVC's cache) skips the warm-up and pre-training and
fine-tunes its pre-trained encoder again, with `--oracles` on T with the clean labels and
on every example; `--no-finetune` leaves out the plain Sel-CL+ fine-tune (the run has it).
`--rev` reads the experiment's own params.yaml (its seed and overrides, so the same fine-tuning
draws); with `--from-run` the params are --root's, and a run's seed must be passed with `--set`:

    python bench/parity_runs.py --setting cpu_cifar10_asym40 --rev cpu_cifar10_asym40-keeplast-seed3 \\
        --oracles --no-ce --label oracles-seed3

Encoder or fine-tuning set? `--swap FILE` crosses this run with another pre-training of the
same data (a `pretrain.pt` stage output, or the final resume checkpoint a run leaves beside
it, e.g. `pretrain.selected_sets=all`, Table 4): this encoder on FILE's final T, FILE's encoder
on this run's T, and FILE's encoder on its own T, all with the given labels. `--pretrained
FILE` takes warm-up and pre-training from such a file instead of running them:

    python bench/parity_runs.py --setting cpu_cifar10_asym40 --path c10.tar.gz --set model.seed=1 \\
        --pretrained selcl-seed1.pt --swap all-seed1.pt --no-finetune --no-ce

Pre-training, or Sel-CL+'s second stage? `--finetune-baseline` fine-tunes the CE baseline's
trained network with Sel-CL+'s recipe (classifier re-initialised, mixup, bootstrapping, its lr
and epochs) on every example with its noisy labels: a two-stage baseline with nothing of
Sel-CL in it. `--save-baseline FILE` writes the baseline's network and history, and
`--baseline-from FILE` reads it back instead of training the baseline (e.g. to fine-tune it
again with `--set finetune.bootstrap=0`). `--finetune-baseline-on-T` fine-tunes the same network
on the pre-training's final T instead (start crossed with fine-tuning set), and
`--finetune-baseline-on-own-T` on a T that Sel-CL's selection (SPEC §5: the preset's K, α, β)
picks from the baseline network's own backbone features: Sel-CL's selection and fine-tune
without its contrastive pre-training (it needs none, so it runs with `--ce-only` too):

    python bench/parity_runs.py --setting cpu_cifar10_asym40 --path c10.tar.gz --set model.seed=1 \\
        --set baseline.mixup_alpha=1 --ce-only --finetune-baseline
    python bench/parity_runs.py --setting cpu_cifar10_sym50 --path c10.tar.gz --set model.seed=2 \\
        --pretrained selcl-seed2.pt --no-finetune --baseline-from mixup-seed2.pt --finetune-baseline-on-T
    python bench/parity_runs.py --setting cpu_cifar10_asym40 --path c10.tar.gz --set model.seed=1 \\
        --set baseline.mixup_alpha=1 --ce-only --baseline-from mixup-seed1.pt --finetune-baseline-on-own-T
"""
from __future__ import annotations

import argparse
import atexit
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path


def materialise(root: Path, setting: str, rev: str) -> Path:
    """runs/<setting>/{data.npz, labels.npz, pretrain.pt} and params.yaml of DVC experiment
    (name) or commit `rev`, read through `dvc.api` (git for params.yaml, DVC's cache for the
    outputs) into a temporary folder removed at exit, so a finished run's pre-trained encoder
    can be fine-tuned again with the parameters it ran with (its queued `-S` overrides
    included) without `dvc exp apply` touching the workspace."""
    import dvc.api
    out = Path(tempfile.mkdtemp(prefix=f"parity_{setting}_"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    for path in ("params.yaml", f"runs/{setting}/data.npz", f"runs/{setting}/labels.npz",
                 f"runs/{setting}/pretrain.pt"):
        with dvc.api.open(path, repo=str(root), rev=rev, mode="rb") as f:
            (out / Path(path).name).write_bytes(f.read())
    try:       # the setting's own file (params/<name>.yaml); older revisions had it inline
        with dvc.api.open(f"params/{setting}.yaml", repo=str(root), rev=rev, mode="rb") as f:
            (out / "params").mkdir()
            (out / "params" / f"{setting}.yaml").write_bytes(f.read())
    except FileNotFoundError:
        pass
    return out


def fill_new_defaults(params: dict, today: dict) -> list[str]:
    """Default keys added since an experiment ran (e.g. `model.bn_replicas`) are missing from
    its params.yaml, so its resolved config lacks keys today's code reads (`make_model`):
    take them from today's `defaults`, in place, and return their names (section.key) so
    the caller can say so."""
    filled = []
    for section, values in today["defaults"].items():
        mine = params["defaults"].setdefault(section, {})
        for key, value in values.items():
            if key not in mine:
                mine[key] = value
                filled.append(f"{section}.{key}")
    return filled


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=".", help="checkout whose selcl/ and params.yaml to use")
    ap.add_argument("--setting", required=True)
    ap.add_argument("--path", default=None, help="imagefolder path override (data.path)")
    ap.add_argument("--label", default="")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override one resolved parameter (YAML value), e.g. pretrain.epochs=41")
    ap.add_argument("--history", default=None, help="also write every per-epoch history to this JSON file")
    ap.add_argument("--no-ce", action="store_true", help="skip the CE baseline")
    ap.add_argument("--ce-only", action="store_true",
                    help="the CE baseline alone (no warm-up, pre-training or fine-tune), e.g. a baseline "
                         "variant such as --set baseline.mixup_alpha=1 beside runs that have Sel-CL+")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--from-run", default=None, metavar="DIR",
                     help="a finished run's folder (data.npz, labels.npz, pretrain.pt): no warm-up or pre-training")
    src.add_argument("--rev", default=None, metavar="EXPERIMENT",
                     help="as --from-run, with runs/<setting>/ and params.yaml of this DVC experiment (name or commit)")
    ap.add_argument("--pretrained", default=None, metavar="FILE",
                    help="a pretrain.pt (stage output or final resume checkpoint) of this setting: "
                         "its encoder and selection instead of warm-up and pre-training (with --from-run / "
                         "--rev: instead of the run's, on the run's data)")
    ap.add_argument("--no-finetune", action="store_true",
                    help="with --from-run / --rev / --pretrained: skip the plain Sel-CL+ fine-tune (oracles only)")
    ap.add_argument("--save-pretrain", default=None, metavar="FILE",
                    help="write the pre-training's output (encoder, selection, examples, history) to FILE, "
                         "for a later --pretrained or --swap")
    ap.add_argument("--swap", default=None, metavar="FILE",
                    help="another pre-training of the same data (as --pretrained): fine-tune this encoder on "
                         "its final T, its encoder on this run's final T, and its encoder on its own T")
    ap.add_argument("--finetune-baseline", action="store_true",
                    help="then fine-tune the CE baseline's network with Sel-CL+'s recipe on every example "
                         "with its noisy labels (no Sel-CL pre-training or selection)")
    ap.add_argument("--finetune-baseline-on-T", action="store_true",
                    help="also fine-tune the CE baseline's network with Sel-CL+'s recipe on the pre-training's "
                         "final T (its given labels): the baseline's start with Sel-CL's fine-tuning set")
    ap.add_argument("--finetune-baseline-on-own-T", action="store_true",
                    help="also select T with Sel-CL's selection (the preset's K, alpha, beta) on the CE "
                         "baseline network's own backbone features and fine-tune that network on it with "
                         "Sel-CL+'s recipe: Sel-CL's selection and fine-tune, no contrastive pre-training")
    ap.add_argument("--save-baseline", default=None, metavar="FILE",
                    help="write the CE baseline's network and history to FILE")
    ap.add_argument("--baseline-from", default=None, metavar="FILE",
                    help="the CE baseline from a --save-baseline FILE of this setting instead of training it")
    ap.add_argument("--oracles", nargs="*", default=None, metavar="NAME",
                    choices=["T_clean_labels", "all_noisy_labels", "all_clean_labels", "T_given_labels"],
                    help="diagnosis: also fine-tune the pre-trained encoder on T with the clean labels, "
                         "on every example with the noisy labels, and on every example with the clean labels "
                         "(and on T with its noisy labels where the run fine-tuned on other examples, e.g. "
                         "pretrain.selected_sets=all); all of these without a NAME, else the ones named")
    args = ap.parse_args()
    if args.no_finetune and not (args.from_run or args.rev or args.pretrained):
        ap.error("--no-finetune needs --from-run, --rev or --pretrained (a run that has its fine-tune)")
    if args.no_ce and (args.finetune_baseline or args.finetune_baseline_on_T or args.finetune_baseline_on_own_T
                       or args.save_baseline or args.baseline_from):
        ap.error("--finetune-baseline(-on-T, -on-own-T), --save-baseline and --baseline-from need the CE baseline: "
                 "not with --no-ce")
    if args.ce_only and (args.no_ce or args.from_run or args.rev or args.pretrained or args.oracles is not None
                         or args.swap or args.save_pretrain or args.finetune_baseline_on_T):
        ap.error("--ce-only runs the CE baseline alone: it takes none of --no-ce, --from-run, --rev, "
                 "--pretrained, --oracles, --swap, --save-pretrain, --finetune-baseline-on-T")
    root = Path(args.root).resolve()
    sys.path.insert(0, str(root))
    import numpy as np
    import torch

    from selcl import checkpoint
    from selcl.config import load_params, resolve
    from selcl.data import load_dataset
    from selcl.noise import make_noisy_labels
    from selcl.train import TrainData, baseline, finetune, pretrain, summarise, warmup

    torch.set_num_threads(int(__import__('os').environ.get('SELCL_THREADS', '2')))
    dev = torch.device("cpu")
    params = root / "params.yaml"
    if args.rev:               # the experiment's files and the params it ran with
        args.from_run = str(materialise(root, args.setting, args.rev))
        params = Path(args.from_run) / "params.yaml"
    raw = load_params(params)
    if args.rev:
        for key in fill_new_defaults(raw, load_params(root / "params.yaml")):
            print(f"parity_runs: {args.rev}'s params.yaml has no {key}; using today's default", file=sys.stderr)
    cfg = resolve(raw, args.setting)
    import yaml
    for item in args.set:
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        if not isinstance(cfg.get(section), dict) or name not in cfg[section]:
            # a typo would run the default under the variant's label
            sys.exit(f"parity_runs: --set {item}: {args.setting} has no param {key}")
        cfg[section][name] = yaml.safe_load(value)
    if args.from_run:          # a finished run: its data, labels and pre-trained encoder
        data = TrainData.load(args.from_run, dev)
    else:
        d, nc = cfg["data"], cfg["noise"]
        # the data stage's call (subset of any dataset, digits' split seed, ...), less the keys
        # an older checkout's load_dataset does not take yet
        import inspect
        kw = {"root": d.get("root"), "path": args.path or d.get("path"), "subset": d.get("subset"),
              "subset_test": d.get("subset_test"), "seed": d.get("seed"), "download": d.get("download"),
              "image_size": d.get("image_size")}
        takes = inspect.signature(load_dataset).parameters
        ds = load_dataset(d["dataset"], **{k: v for k, v in kw.items() if k in takes and (k in d or k == "path")})
        C = len(ds.classes)
        try:                      # the noise stage's labels
            from selcl.noise import labels_from_config
            noisy, _ = labels_from_config(ds.y_train, C, nc, d["dataset"])
        except ImportError:       # an older checkout: one generator and no key, maybe
            try:
                from selcl.noise import resolve_generator
                gen = {"generator": resolve_generator(nc.get("generator", "auto"), d["dataset"])}
            except ImportError:
                gen = {}
            noisy = make_noisy_labels(ds.y_train, C, nc["kind"], nc["rate"], nc["seed"],
                                      dataset=nc["asym_map"] if nc["asym_map"] != "auto" else d["dataset"],
                                      include_true_class=nc["include_true_class"], **gen)
        data = TrainData.build({"x_train": ds.x_train, "y_train": ds.y_train, "x_test": ds.x_test, "y_test": ds.y_test,
                                "mean": ds.mean, "std": ds.std},
                               {"noisy": noisy, "clean": ds.y_train, "num_classes": C}, torch.device("cpu"))
    # the loops' checkpoints (a run resumes nothing): a temporary folder, removed at exit
    tmp = Path(tempfile.mkdtemp(prefix=f"parity_{args.label}_{args.setting}_"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    ck = lambda name: checkpoint.Checkpointer(tmp / f"{name}.pt", name, 10_000)  # noqa: E731
    t0 = time.perf_counter()
    warm = pre = None
    if args.ce_only:
        pass
    elif args.pretrained:
        pre = load_pretrained(args.pretrained, cfg, data)
    elif args.from_run:
        pre = checkpoint.load(Path(args.from_run) / "pretrain.pt", what="pre-training output")
    else:
        warm = warmup(cfg, data, dev, ck("warmup"))
        pre = pretrain(cfg, data, warm, dev, ck("pretrain"))
    if args.save_pretrain:           # whichever source gave it, so a later --pretrained / --swap can read it
        checkpoint.save(pre, Path(args.save_pretrain))
    t_pre = time.perf_counter() - t0
    ft = None if args.no_finetune or args.ce_only else finetune(cfg, data, pre, dev, ck("finetune"))
    t_ft = time.perf_counter() - t0 - t_pre
    t1 = time.perf_counter()
    if args.baseline_from:           # a baseline an earlier run saved: not trained again
        ce = checkpoint.load(Path(args.baseline_from), what="CE baseline")
        if not isinstance(ce, dict) or "model" not in ce or "history" not in ce:
            raise SystemExit(f"parity_runs: {args.baseline_from}: not a --save-baseline file (no model or history)")
    else:
        ce = None if args.no_ce else baseline(cfg, data, dev, ck("baseline"))
    t_ce = time.perf_counter() - t1
    if args.save_baseline:
        checkpoint.save(ce, Path(args.save_baseline))
    # the baseline's network through Sel-CL+'s fine-tuning recipe, on every example
    ce_ft = (finetune(cfg, data, {"model": ce["model"], "examples": np.ones(data.n, dtype=bool)}, dev,
                      ck("baseline_finetune")) if args.finetune_baseline else None)
    t_ce_ft = time.perf_counter() - t1 - t_ce
    # T is the final selection's, whatever the run trained on: with pretrain.selected_sets
    # `all` (paper Table 4) the run fine-tunes on every example
    final_T = lambda p: torch.as_tensor(p["selection"]["examples"]).bool().cpu()  # noqa: E731
    # the baseline's network through the same recipe on Sel-CL's final T: with the two fine-tunes
    # above, start (Sel-CL's encoder or the baseline's network) crossed with set (T or every example)
    t2 = time.perf_counter()
    ce_ft_T = (finetune(cfg, data, {"model": ce["model"], "examples": final_T(pre)}, dev,
                        ck("baseline_finetune_T")) if args.finetune_baseline_on_T else None)
    t_ce_ft_T = time.perf_counter() - t2
    # Sel-CL's selection without its pre-training: the final selection (§5, the preset's K, α,
    # β, vote weighting and pseudo-labels; seeded as the pre-training's last epoch) run on the
    # baseline network's backbone features, then the same fine-tune on that T. Backbone, not z:
    # the CE baseline never trains the projection head, so its z is a random projection.
    t3 = time.perf_counter()
    ce_ft_own, own_T, ce_train_z = None, {}, None
    if args.finetune_baseline_on_own_T:
        from selcl.pairs import configured_rule
        from selcl.train import run_selection
        pc = cfg["pretrain"]
        ce_train_z = backbone_features(trained_network(ce["model"], cfg, data, dev), data, data.x)
        sel = run_selection(None, data, pc, pc["epochs"], z=ce_train_z)
        T_own = configured_rule(sel, data.noisy, data.clean, pc).examples.cpu()
        own_T = {k: sel.stats.get(k) for k in ("n_selected", "precision_T", "recall_T", "pseudo_label_accuracy")}
        if pre:                      # how much of it Sel-CL's own final T holds
            own_T["n_in_selcl_T"] = int((T_own & final_T(pre)).sum())
        ce_ft_own = finetune(cfg, data, {"model": ce["model"], "examples": T_own}, dev, ck("baseline_finetune_own_T"))
    t_ce_ft_own = time.perf_counter() - t3
    oracles, oracle_histories, oracle_fits, not_run = {}, {}, {}, {}

    def refinetune(name: str, d_, p_) -> float:
        """One more fine-tune (Sel-CL+'s recipe) of p_'s encoder on p_'s examples, with d_'s labels."""
        r = finetune(cfg, d_, p_, dev, ck(f"oracle_{name}"))
        h = oracle_histories[name] = r["history"]
        oracle_fits[name] = label_fit(r["model"], cfg, data, dev)     # against the run's given labels
        return summarise(h, cfg["finetune"]["eval_last"])["test_acc_mean_last"]

    T = final_T(pre) if args.oracles is not None or args.swap else None   # an older checkout may have none
    if args.oracles is not None:     # what limits Sel-CL+: the selection, its labels, or the encoder?
        import dataclasses
        # T on its given labels is then one more fine-tune (the Sel-CL+ one for T_G1_G2,
        # which the plain fine-tune is)
        on_T = {**pre, "examples": T}
        every = {**pre, "examples": np.ones(data.n, dtype=bool)}
        clean = dataclasses.replace(data, noisy=data.clean)
        runs = {"T_clean_labels": (clean, on_T), "all_noisy_labels": (data, every),
                "all_clean_labels": (clean, every)}
        if not torch.equal(torch.as_tensor(pre["examples"]).bool().cpu(), T):
            runs["T_given_labels"] = (data, on_T)
        for name in set(args.oracles) - set(runs):   # named, yet the same as the run's own fine-tune
            not_run[name] = "the run fine-tuned on T with its given labels: its Sel-CL+ is this oracle"
            print(f"parity_runs: --oracles {name} not run: {not_run[name]}", file=sys.stderr)
        for name, (d_, p_) in runs.items():
            if not args.oracles or name in args.oracles:
                oracles[name] = refinetune(name, d_, p_)
    swaps = {}
    if args.swap:                    # the encoder, or the examples it is fine-tuned on?
        other = load_pretrained(args.swap, cfg, data)
        T_other = final_T(other)
        runs = {"this_encoder_on_swap_T": {**pre, "examples": T_other},
                "swap_encoder_on_this_T": {**other, "examples": T},
                "swap_encoder_on_swap_T": {**other, "examples": T_other}}
        for name, p_ in runs.items():
            swaps[name] = refinetune(name, data, p_)
        swaps["n_T"] = {"this": int(T.sum()), "swap": int(T_other.sum()), "both": int((T & T_other).sum())}
        swaps["swap_knn_top1"] = other["history"][-1].get("knn_top1")
    # Diagnosis (issue 11): weighted k-NN (clean train labels, §8) on the encoders' features
    # (backbone output, L2-normalised): Sel-CL's pre-trained encoder against the CE network's.
    enc_knn = {"selcl": encoder_knn(pre["model"], cfg, data, dev)} if pre else {}
    if ce is not None:
        enc_knn["ce"] = encoder_knn(ce["model"], cfg, data, dev, train_z=ce_train_z)  # own T's, not again
    # How much of the noisy labels each trained network fits (memorisation): its predictions
    # on the un-augmented training images, split by whether the given label is wrong.
    fits = {name: label_fit(r["model"], cfg, data, dev)
            for name, r in {"selcl_plus": ft, "ce": ce, "ce_then_finetune": ce_ft,
                            "ce_then_finetune_on_T": ce_ft_T, "ce_then_finetune_on_own_T": ce_ft_own}.items()
            if r is not None}
    last = pre["history"][-1] if pre else {}
    try:                             # the host (two of one model name can round one float apart)
        from selcl.device import cpu_id, cpu_name
        host = f"{cpu_name()}; {cpu_id()}"
    except ImportError:              # an older checkout
        host = None
    s_ft = summarise(ft["history"], cfg["finetune"]["eval_last"]) if ft else {}
    s_ce = summarise(ce["history"], cfg["baseline"]["eval_last"]) if ce else {}
    s_ce_ft = summarise(ce_ft["history"], cfg["finetune"]["eval_last"]) if ce_ft else {}
    s_ce_ft_T = summarise(ce_ft_T["history"], cfg["finetune"]["eval_last"]) if ce_ft_T else {}
    s_ce_ft_own = summarise(ce_ft_own["history"], cfg["finetune"]["eval_last"]) if ce_ft_own else {}
    print(json.dumps({
        "label": args.label, "setting": args.setting, "host": host, "n_train": int(data.n),
        "realised_noise": float((data.noisy != data.clean).float().mean()),
        "epochs": {"warmup": cfg["warmup"]["epochs"], "pretrain": cfg["pretrain"]["epochs"],
                   "finetune": cfg["finetune"]["epochs"], "ce": cfg["baseline"]["epochs"]},
        "from_run": args.rev or args.from_run, "overrides": list(args.set),
        "selcl_plus_mean_last": s_ft.get("test_acc_mean_last"), "selcl_plus_final": s_ft.get("test_acc_last"),
        "ce_mean_last": s_ce.get("test_acc_mean_last"), "ce_final": s_ce.get("test_acc_last"),
        "ce_best": s_ce.get("test_acc_best"),
        "ce_then_finetune_mean_last": s_ce_ft.get("test_acc_mean_last"),
        "ce_then_finetune_final": s_ce_ft.get("test_acc_last"),
        "ce_then_finetune_on_T_mean_last": s_ce_ft_T.get("test_acc_mean_last"),
        "ce_then_finetune_on_T_final": s_ce_ft_T.get("test_acc_last"),
        "ce_then_finetune_on_own_T_mean_last": s_ce_ft_own.get("test_acc_mean_last"),
        "ce_then_finetune_on_own_T_final": s_ce_ft_own.get("test_acc_last"), "baseline_own_T": own_T,
        "encoder_knn_top1": enc_knn,
        "train_label_fit": {**fits, **oracle_fits}, "finetune_oracles": oracles,
        "oracles_not_run": not_run, "swap": swaps,
        "n_T": last.get("n_selected"), "precision_T": last.get("precision_T"), "recall_T": last.get("recall_T"),
        "precision_G": last.get("precision_G"), "knn_top1": last.get("knn_top1"),
        "precision_T_by_epoch": [round(h["precision_T"], 3) for h in (pre["history"] if pre else []) if "precision_T" in h],
        "seconds": {"warmup+pretrain": round(t_pre), "finetune": round(t_ft), "ce": round(t_ce),
                    **({"ce_then_finetune": round(t_ce_ft)} if ce_ft else {}),
                    **({"ce_then_finetune_on_T": round(t_ce_ft_T)} if ce_ft_T else {}),
                    **({"ce_then_finetune_on_own_T": round(t_ce_ft_own)} if ce_ft_own else {})}}), flush=True)
    if args.history:
        Path(args.history).write_text(json.dumps({
            "cfg": cfg, "warmup": warm["history"] if warm else None, "pretrain": pre["history"] if pre else None,
            "finetune": ft["history"] if ft else None, "ce": ce["history"] if ce else None,
            "ce_then_finetune": ce_ft["history"] if ce_ft else None,
            "ce_then_finetune_on_T": ce_ft_T["history"] if ce_ft_T else None,
            "ce_then_finetune_on_own_T": ce_ft_own["history"] if ce_ft_own else None,
            "oracles": oracle_histories}, default=float))


def load_pretrained(path: str, cfg: dict, data) -> dict:
    """A pre-training's encoder and final selection: a `pretrain.pt` stage output, or the
    resume checkpoint of a finished pre-training (the same state at its last epoch; the
    examples it fine-tunes on then follow from its selection, as at the end of `pretrain`)."""
    import torch

    from selcl import checkpoint
    from selcl.pairs import configured_rule
    from selcl.selection import Selection
    pre = checkpoint.load(Path(path), what="pre-training output")
    if not isinstance(pre, dict) or "selection" not in pre or "model" not in pre:
        raise SystemExit(f"parity_runs: {path}: not a pre-training output or checkpoint (no model or selection)")
    n = len(pre["selection"]["examples"])
    if n != data.n:
        raise SystemExit(f"parity_runs: {path}: its selection covers {n} examples, this setting has {data.n}")
    if "examples" not in pre:                # a resume checkpoint
        pc = cfg["pretrain"]
        if "epoch" in pre and pre["epoch"] != pc["epochs"]:
            raise SystemExit(f"parity_runs: {path}: a checkpoint of epoch {pre['epoch']}, "
                             f"not of the last ({pc['epochs']})")
        sel = Selection.from_state_dict(pre["selection"], torch.device("cpu"))
        pre["examples"] = configured_rule(sel, data.noisy.cpu(), data.clean.cpu(), pc).examples.cpu()
    return pre


def trained_network(state: dict, cfg: dict, data, dev):
    """The setting's network with a trained state loaded, in eval mode."""
    from selcl.train import make_model
    model = make_model(cfg["model"], data.num_classes, dev)
    model.load_state_dict(state)
    return model.eval()


def label_fit(state: dict, cfg: dict, data, dev) -> dict:
    """Predictions (eval mode, un-augmented) of a trained network on its training images:
    of the examples whose given label is wrong, the fraction predicted as that given label
    (memorised) and as the true one; of the rest, the fraction predicted as their label.
    NaN where a part is empty (no wrong labels)."""
    from selcl.evaluate import embed
    _, logits = embed(trained_network(state, cfg, data, dev), data.x, data.mean, data.std, crop=data.crop)
    pred = logits.argmax(1).cpu()
    given, true = data.noisy.cpu(), data.clean.cpu()
    wrong = given != true
    frac = lambda hit, part: float(hit[part].float().mean()) if part.any() else float("nan")  # noqa: E731
    return {"wrong_as_given": frac(pred == given, wrong), "wrong_as_true": frac(pred == true, wrong),
            "right_as_given": frac(pred == given, ~wrong), "n_wrong": int(wrong.sum())}


def encoder_knn(state: dict, cfg: dict, data, dev, train_z=None) -> float:
    """Top-1 weighted k-NN accuracy of the backbone's features (clean training labels);
    `train_z`: the training images' features when already computed from this state."""
    from selcl.evaluate import weighted_knn_accuracy
    model = trained_network(state, cfg, data, dev)
    k = min(cfg["evaluate"]["k"], data.n)
    if train_z is None:
        train_z = backbone_features(model, data, data.x)
    return weighted_knn_accuracy(train_z, data.clean,
                                 backbone_features(model, data, data.x_test), data.y_test, data.num_classes,
                                 k=k, sigma=cfg["evaluate"]["sigma"])["top1"]


def backbone_features(model, data, x):
    """The backbone's output (L2-normalised) on un-augmented images, eval mode."""
    import torch
    import torch.nn.functional as F

    from selcl import augment
    with torch.no_grad():
        return torch.cat([F.normalize(model.encode(augment.eval_view(x[i:i + 1024], data.mean, data.std, data.crop)),
                                      dim=1) for i in range(0, len(x), 1024)])


if __name__ == "__main__":
    main()
