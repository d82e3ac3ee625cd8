"""Test images the presets were not chosen on.

The CPU presets (`cpu_cifar10_asym40`, `cpu_cifar10_sym50`) score every epoch on the first
`data.subset_test` test images per class, and were chosen, among the configurations tried,
on those same images. This scores one finished run's final networks on the rest of the
test set too, so that the margin over CE can be read on images no choice has seen:

    SELCL_KEEP_CHECKPOINTS=1 dvc exp run -f -S 'run=[cpu_cifar10_asym40]'
    python bench/heldout.py cpu_cifar10_asym40 --run-dir runs/cpu_cifar10_asym40 \\
        --ce-checkpoint scratch/cpu_cifar10_asym40/baseline/checkpoint.pt [--out FILE]

SETTING's params (params.yaml in the working directory) give the network, the data path
and the subsets. The networks scored are the run's own: Sel-CL+ (finetune.pt), the Sel-CL
classifier (pretrain.pt) and CE, whose network no stage output keeps: its last resume state
does, which the baseline stage deletes once done unless SELCL_KEEP_CHECKPOINTS=1 (an
environment switch, not a DVC dependency: -f makes the stages run even where DVC has their
outputs already). Before any held-out number is printed, the archive is checked to be the
one the run's data stage read (its sha256 in data.json), the run's own test images to be the
first `subset_test` per class, and each network's accuracy there to equal its history's last
epoch. The margin comes with its paired standard error (the sd of the per-image difference
of the two networks' hits over √n): it covers the sampling of test images, not the spread
between training seeds.
"""
import argparse
import csv
import json
import math
from pathlib import Path

import numpy as np
import torch

from selcl import checkpoint
from selcl.config import load_setting
from selcl.data import first_per_class, load_arrays, load_dataset, sha256_file
from selcl.evaluate import embed
from selcl.train import make_model


def last_test_acc(history_csv: Path) -> float:
    with open(history_csv) as f:
        return float(list(csv.DictReader(f))[-1]["test_acc"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("setting")
    ap.add_argument("--run-dir", type=Path, required=True, help="runs/<setting> of the finished run")
    ap.add_argument("--ce-checkpoint", type=Path, required=True, help="the CE baseline's last-epoch state")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--data", default=None, help="the image-folder archive (default: the setting's data.path)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()
    torch.set_num_threads(2)

    cfg = load_setting(args.setting, args.params)
    dc = cfg["data"]
    if dc["dataset"] != "imagefolder" or dc["subset_test"] is None:
        raise SystemExit(f"{args.setting}: data.dataset must be imagefolder with data.subset_test set "
                         f"(there is no held-out part of the test set otherwise)")
    run = args.run_dir
    path = args.data or dc["path"]
    read = json.loads((run / "data.json").read_text()).get("source_sha256")
    if read not in (None, "folder") and sha256_file(path) != read:
        raise SystemExit(f"{path}: not the archive {run / 'data.json'} records (sha256 {read[:12]}…)")
    arrays = load_arrays(run / "data.npz")
    full = load_dataset("imagefolder", path=path, subset=dc["subset"], subset_test=None, image_size=dc["image_size"])
    seen = first_per_class(full.y_test, dc["subset_test"])
    held = np.setdiff1d(np.arange(len(full.y_test)), seen)
    if len(held) == 0:
        raise SystemExit(f"data.subset_test={dc['subset_test']} takes every test image of {path}: none is held out")
    # the run scored its epochs on exactly these images
    if not (np.array_equal(full.x_test[seen], arrays.x_test) and np.array_equal(full.y_test[seen], arrays.y_test)):
        raise SystemExit(f"{run / 'data.npz'}: its test images are not the first {dc['subset_test']} per class "
                         f"of {path}")
    mean, std, crop = arrays.mean, arrays.std, arrays.crop          # the run's normalisation
    num_classes = len(np.unique(full.y_train))
    parts = {"scored every epoch": seen, "held out": held}
    x_all, y_all = torch.as_tensor(full.x_test), torch.as_tensor(full.y_test, dtype=torch.int64)

    nets = [("Sel-CL+", run / "finetune.pt", run / "finetune_history.csv"),
            ("Sel-CL classifier", run / "pretrain.pt", run / "pretrain_history.csv"),
            ("CE", args.ce_checkpoint, run / "baseline_history.csv")]
    rows, right = {}, {}
    for name, ckpt, history in nets:
        model = make_model(cfg["model"], num_classes, torch.device("cpu"))
        model.load_state_dict(checkpoint.load(ckpt)["model"])
        right[name] = {p: (embed(model, x_all[i], mean, std, crop=crop)[1].argmax(1) == y_all[i]).double()
                       for p, i in parts.items()}
        right[name]["all"] = torch.cat([right[name]["scored every epoch"], right[name]["held out"]])
        accs = {p: 100 * float(r.mean()) for p, r in right[name].items()}
        recorded = last_test_acc(history)
        if abs(accs["scored every epoch"] - recorded) > 0.01:
            raise SystemExit(f"{ckpt}: {accs['scored every epoch']:.2f} % on the run's test images, but "
                             f"{history} ends at {recorded:.2f} %: not that run's last epoch")
        rows[name] = accs

    n = {p: len(r) for p, r in right["CE"].items()}
    lines = [f"| final network | scored every epoch ({n['scored every epoch']:,}) | held out ({n['held out']:,}) "
             f"| all ({n['all']:,}) |", "|---|---|---|---|"]
    lines += [f"| {name} | {a['scored every epoch']:.2f} | {a['held out']:.2f} | {a['all']:.2f} |"
              for name, a in rows.items()]
    # the margin on the same images, with its paired standard error: the per-image
    # difference of the two networks' hits (1, 0 or -1), sd/√n
    cells = []
    for p in n:
        d = right["Sel-CL+"][p] - right["CE"][p]
        cells.append(f"{100 * float(d.mean()):+.2f} ± {100 * float(d.std()) / math.sqrt(len(d)):.2f}")
    lines.append(f"| Sel-CL+ − CE (± paired s.e.) | {' | '.join(cells)} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(f"{args.setting}, model.seed {cfg['model']['seed']} ({run}): final networks, "
                            f"top-1 %\n\n{table}\n")


if __name__ == "__main__":
    main()
