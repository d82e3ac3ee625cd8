"""Every seed on the held-out test images: Sel-CL+ against CE, stopped early or not, with the mean over seeds.

`bench/heldout_epochs.py` reads one run's two histories (each scored every epoch on a
second, held-out test set: `bench/heldout_set.py`, `data.extra_test_path`). This reads
them for every seed of a preset, saved under DIR as

    <preset>-seed<N>-ce/baseline_history.csv     <preset>-seed<N>-selcl/finetune_history.csv
    (or both in <preset>-seed<N>/)

and prints, on the held-out images only (they took no part in any choice):

* per seed, for Sel-CL+ and for CE: the mean of the last `eval_last` epochs (the presets'
  metric), the final epoch, and the run stopped early at its best epoch on the images
  scored every epoch (the first of equal ones), as `bench/heldout_epochs.py` stops it;
* four margins, Sel-CL+ − CE: mean of the last epochs against mean of the last epochs,
  final against final, Sel-CL+'s final network against CE stopped early, and both stopped
  early on the same validation images;
* for each margin over the seeds: its mean, standard deviation, 95 % t-interval, how many
  seeds end under --bar points, and the one-sided t-test of "the mean margin is over the
  bar" (its p-value).

A seed with only one of the two histories is left out, and named on stderr.

    python bench/heldout_seeds.py bench/results/cpu_real_histories/heldout_epochs asym40 [--bar 3] [--out FILE]
"""
import argparse
import math
import re
import sys
from pathlib import Path

from scipy import stats

from heldout_epochs import mean, read, stopped_early

MARGINS = ("last 5 − last 5", "final − final", "final − CE stopped early", "stopped early − stopped early")


def history(root: Path, preset: str, seed: int, own: str, name: str) -> Path | None:
    """`<preset>-seed<N>-<own>/<name>`, else `<preset>-seed<N>/<name>`; None where neither exists."""
    for d in (f"{preset}-seed{seed}-{own}", f"{preset}-seed{seed}"):
        if (root / d / name).exists():
            return root / d / name
    return None


def summary(h: list[dict], eval_last: int) -> dict:
    """The held-out accuracy of the mean of the last epochs, the final epoch, and the run stopped early."""
    stop = stopped_early(h)
    return {"last": mean([r["test2_acc"] for r in h[-eval_last:]]), "final": h[-1]["test2_acc"],
            "stop_epoch": int(stop["epoch"]), "stop": stop["test2_acc"]}


def margins(ours: dict, ce: dict) -> tuple[float, ...]:
    """Sel-CL+ − CE, in the order of MARGINS."""
    return (ours["last"] - ce["last"], ours["final"] - ce["final"], ours["final"] - ce["stop"],
            ours["stop"] - ce["stop"])


def spread(xs: list[float], bar: float) -> dict:
    """Mean, sd, 95 % t-interval, seeds under `bar`, and the one-sided p of "the mean is over `bar`"."""
    n, m = len(xs), mean(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    se = sd / math.sqrt(n)
    half = stats.t.ppf(0.975, n - 1) * se
    p = float(stats.t.sf((m - bar) / se, n - 1)) if se > 0 else float(m <= bar)
    return {"mean": m, "sd": sd, "lo": m - half, "hi": m + half, "under": sum(x < bar for x in xs), "p": p}


def tables(rows: dict[int, tuple[dict, dict]], eval_last: int, bar: float) -> str:
    """Per-seed table, then the margins over the seeds; `rows`: seed -> (Sel-CL+, CE) summaries."""
    def cells(s):
        return f"{s['last']:.2f} | {s['final']:.2f} | {s['stop_epoch']}: {s['stop']:.2f}"

    head = (f"| seed | Sel-CL+: last {eval_last} | final | stopped early (epoch: acc) "
            f"| CE: last {eval_last} | final | stopped early (epoch: acc) | "
            + " | ".join(m.replace("last 5", f"last {eval_last}") for m in MARGINS) + " |")
    lines = [head, "|" + "---|" * (7 + len(MARGINS))]
    for seed, (ours, ce) in sorted(rows.items()):
        lines.append(f"| {seed} | {cells(ours)} | {cells(ce)} | "
                     + " | ".join(f"{d:+.2f}" for d in margins(ours, ce)) + " |")
    by_margin = list(zip(*(margins(*pair) for pair in rows.values())))
    lines += ["", f"| Sel-CL+ − CE, held out ({len(rows)} seeds) | mean | sd | 95 % t-interval "
                  f"| seeds under {bar:g} | one-sided p, mean over {bar:g} |", "|---|---|---|---|---|---|"]
    for name, xs in zip(MARGINS, by_margin):
        s = spread(list(xs), bar)
        lines.append(f"| {name.replace('last 5', f'last {eval_last}')} | {s['mean']:+.2f} | {s['sd']:.2f} "
                     f"| {s['lo']:+.2f} to {s['hi']:+.2f} | {s['under']} | {s['p']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path, help="the folder holding <preset>-seed<N>[-ce|-selcl]/")
    ap.add_argument("preset", help="the name's prefix, e.g. asym40")
    ap.add_argument("--eval-last", type=int, default=5, help="the setting's finetune/baseline eval_last")
    ap.add_argument("--bar", type=float, default=3.0, help="the margin to clear, in points")
    ap.add_argument("--out", type=Path, default=None, help="also write the tables here")
    args = ap.parse_args()
    seeds = sorted({int(m.group(1)) for p in args.root.glob(f"{args.preset}-seed*")
                    if (m := re.fullmatch(re.escape(args.preset) + r"-seed(\d+)(-ce|-selcl)?", p.name))})
    rows, missing = {}, []
    for seed in seeds:
        ft = history(args.root, args.preset, seed, "selcl", "finetune_history.csv")
        ce = history(args.root, args.preset, seed, "ce", "baseline_history.csv")
        if ft is None or ce is None:
            missing.append(f"seed {seed} ({'fine-tuning' if ft is None else 'CE'} history)")
            continue
        hs = read(ft), read(ce)
        if min(map(len, hs)) < args.eval_last:
            raise SystemExit(f"--eval-last {args.eval_last}: seed {seed}'s histories have "
                             f"{len(hs[0])} and {len(hs[1])} epochs")
        rows[seed] = tuple(summary(h, args.eval_last) for h in hs)
    if missing:
        print("left out, no " + ", ".join(missing), file=sys.stderr)
    if len(rows) < 2:
        raise SystemExit(f"{args.root}: {len(rows)} seed(s) of {args.preset} with both histories; "
                         f"the mean over seeds needs two")
    md = tables(rows, args.eval_last, args.bar)
    print(md)
    if args.out:
        args.out.write_text(f"{args.preset}, held out ({args.root}): top-1 %\n\n{md}\n")


if __name__ == "__main__":
    main()
