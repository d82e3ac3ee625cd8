"""Every epoch on the held-out test images: the presets' metric, and CE stopped early.

A run given the held-out images as its second test set (`bench/heldout_set.py`,
`data.extra_test_path`) records `test2_acc` beside `test_acc` after every fine-tuning and
CE epoch. This reads the two histories and prints, on the images scored every epoch and
on the held-out ones:

* the presets' metric, the mean of the last `eval_last` epochs, and the final epoch, for
  Sel-CL+ and CE;
* CE stopped early: the epoch with CE's best accuracy on the images scored every epoch
  (the first of equal ones), as a researcher with those images as a validation set would
  stop it, read on the held-out images, which took no part in choosing it;
* CE's best held-out epoch (an oracle: chosen on the images it is read on);
* Sel-CL+'s margin over each;
* with a fine-tuning history, Sel-CL+ stopped early the same way, and its margin over CE
  stopped early: both methods given the same validation set.

A run of CE alone (the `baseline` stage and its upstream, whose Sel-CL+ network is an
earlier run's) has no fine-tuning history: pass that network's accuracies on the two sets
instead (`--selcl-final SCORED HELD`, e.g. from `bench/heldout.py`), and the margins are
its final network's.

    python bench/heldout_epochs.py runs/cpu_cifar10_asym40 --eval-last 5 [--out FILE]
    python bench/heldout_epochs.py runs/cpu_cifar10_sym50 --selcl-final 61.73 62.50   # CE alone
"""
import argparse
import csv
from pathlib import Path


def read(path: Path) -> list[dict]:
    with open(path) as f:
        rows = [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]
    if not rows or "test2_acc" not in rows[-1]:
        raise SystemExit(f"{path}: no test2_acc column; run with data.extra_test_path set to the held-out "
                         f"archive (bench/heldout_set.py)")
    return rows


def mean(xs: list) -> float:
    return sum(xs) / len(xs)


def stopped_early(h: list[dict]) -> dict:
    """The epoch with the best accuracy on the images scored every epoch, the first of equal ones."""
    return max(h, key=lambda r: r["test_acc"])


def table(finetune: list[dict] | None, ce: list[dict], eval_last: int,
          selcl_final: tuple[float, float] | None = None) -> str:
    """The markdown table: each row on (the images scored every epoch, the held-out ones).

    `finetune` None: Sel-CL+ is `selcl_final`, its final network's accuracies."""
    def last(h):
        return mean([r["test_acc"] for r in h[-eval_last:]]), mean([r["test2_acc"] for r in h[-eval_last:]])

    def at(row):
        return row["test_acc"], row["test2_acc"]

    def minus(p, q):
        return p[0] - q[0], p[1] - q[1]

    stop = stopped_early(ce)
    oracle = max(ce, key=lambda r: r["test2_acc"])
    ce_last = last(ce)
    # like with like: a final network against CE's final epoch, the mean of the last epochs against CE's
    if finetune is None:
        ours, name = selcl_final, "Sel-CL+ (final network)"
        accs = {"Sel-CL+, final network (given)": ours}
        first = ("final epoch", at(ce[-1]))
        both_stopped = {}
    else:
        ours, name = last(finetune), f"Sel-CL+ (last {eval_last})"
        accs = {f"Sel-CL+, mean of the last {eval_last} epochs": ours, "Sel-CL+, final epoch": at(finetune[-1])}
        first = (f"mean of the last {eval_last}", ce_last)
        ft_stop = stopped_early(finetune)
        accs[f"Sel-CL+ stopped early (epoch {int(ft_stop['epoch'])}, best on the images scored every epoch)"] = \
            at(ft_stop)
        # both stopped early on the same validation set
        both_stopped = {"Sel-CL+ stopped early − CE stopped early": minus(at(ft_stop), at(stop))}
    accs |= {
        f"CE, mean of the last {eval_last} epochs": ce_last,
        "CE, final epoch": at(ce[-1]),
        f"CE stopped early (epoch {int(stop['epoch'])}, best on the images scored every epoch)": at(stop),
        f"CE's best held-out epoch (epoch {int(oracle['epoch'])}; an oracle)": at(oracle),
    }
    margins = {f"{name} − CE, {label}": minus(ours, other)
               for label, other in (first, ("CE stopped early", at(stop)), ("CE's best held-out epoch", at(oracle)))}
    margins |= both_stopped
    lines = ["| | scored every epoch | held out |", "|---|---|---|"]
    lines += [f"| {k} | {a:.2f} | {b:.2f} |" for k, (a, b) in accs.items()]
    lines += [f"| {k} | {a:+.2f} | {b:+.2f} |" for k, (a, b) in margins.items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path, help="runs/<setting> of a run with data.extra_test_path set")
    ap.add_argument("--eval-last", type=int, default=5, help="the setting's finetune/baseline eval_last")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    ap.add_argument("--selcl-final", type=float, nargs=2, metavar=("SCORED", "HELD"), default=None,
                    help="a run of CE alone: Sel-CL+'s final network's top-1 %% on the scored and held-out "
                         "images (bench/heldout.py); the fine-tuning history is then not read")
    args = ap.parse_args()
    ft = None if args.selcl_final else read(args.run_dir / "finetune_history.csv")
    ce = read(args.run_dir / "baseline_history.csv")
    lengths = [len(h) for h in (ft, ce) if h is not None]
    if min(lengths) < args.eval_last:
        raise SystemExit(f"--eval-last {args.eval_last}: the histories have {' and '.join(map(str, lengths))} epochs")
    md = table(ft, ce, args.eval_last, tuple(args.selcl_final) if args.selcl_final else None)
    print(md)
    if args.out:
        args.out.write_text(f"{args.run_dir}: top-1 % of every epoch\n\n{md}\n")


if __name__ == "__main__":
    main()
