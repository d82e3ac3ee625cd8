"""Stage `cleanlab_baseline@<setting>`: cleanlab's verdict on every training example, from
K-fold out-of-fold probabilities of the CE baseline's network and recipe
(selcl/cleanlab_baseline.py) → runs/<setting>/cleanlab_issues.csv (most suspicious first,
the form of label_issues.csv) and cleanlab.json (counts, seconds). `cleanlab.enabled: false`
writes an empty table and {"enabled": false}.

(Not `stages/cleanlab.py`: run as a script, its folder comes first on sys.path and the
file would shadow the cleanlab package.)"""
import time

import numpy as np
from common import check_sizes, checkpoint_path, load, main, require_device, run_dir

from selcl import checkpoint
from selcl.cleanlab_baseline import find_issues, fold_config, folds_of, train_fold
from selcl.data import load_arrays
from selcl.dataset_files import train_files
from selcl.label_issues import CLEANLAB_COLUMNS, class_names, suspicion_order, write_table
from selcl.sources import output_digest
from selcl.train import TrainData


def run(name: str) -> None:
    cfg = load(name)
    device = require_device(cfg)
    out = run_dir(name)
    cc = cfg["cleanlab"]
    if not cc["enabled"]:
        write_table(out / "cleanlab_issues.csv", CLEANLAB_COLUMNS, {c: [] for c in CLEANLAB_COLUMNS}, [])
        checkpoint.write_json(out / "cleanlab.json", {"enabled": False})
        print(f"[cleanlab] {name}: disabled (cleanlab.enabled: false)")
        return
    data = TrainData.load(out, device)
    check_sizes(cfg, data.n, ("baseline",), k=False)
    classes = load_arrays(out / "data.npz").classes
    given = data.noisy.cpu().numpy()
    fold = folds_of(given, cc["folds"], cc["seed"], name)
    base_fp = (fold_config(cfg), checkpoint.file_digest(out / "labels.npz"), output_digest(out / "data.npz"),
               fold.tobytes().hex())
    probs = np.zeros((data.n, data.num_classes), dtype=np.float64)
    fold_s, ckpts = [], []
    for k in range(cc["folds"]):
        t0 = time.perf_counter()
        ckpt = checkpoint.Checkpointer(checkpoint_path(name, "cleanlab_baseline").with_name(f"fold{k}.pt"),
                                       checkpoint.fingerprint("cleanlab", k, *base_fp),
                                       cfg["baseline"]["checkpoint_every"])
        probs[fold == k] = train_fold(cfg, data, device, fold, k, ckpt)
        fold_s.append(time.perf_counter() - t0)
        ckpts.append(ckpt)
    t0 = time.perf_counter()
    flags, quality = find_issues(given, probs, cc["filter_by"])
    find_s = time.perf_counter() - t0
    pred = probs.argmax(1)
    prob_given = probs[np.arange(len(given)), given]
    values = {"index": np.arange(len(given)), "file": train_files(cfg["data"], len(given)),
              "given_label": given, "given_class": class_names(classes, given),
              "cleanlab_label": pred, "cleanlab_class": class_names(classes, pred),
              "cleanlab_score": 1.0 - quality, "cleanlab_flag": flags, "cleanlab_prob": probs.max(1),
              "cleanlab_prob_given": prob_given}
    # score = 1 − self-confidence = 1 − p(ỹ); ties broken by the flag (flagged first)
    write_table(out / "cleanlab_issues.csv", CLEANLAB_COLUMNS, values,
                suspicion_order(1.0 - quality, (~flags).astype(np.float64)))
    checkpoint.write_json(out / "cleanlab.json", {
        "enabled": True, "folds": cc["folds"], "filter_by": cc["filter_by"], "flagged": int(flags.sum()),
        "n": int(len(given)), "seconds_folds": [round(s, 1) for s in fold_s], "seconds_find": round(find_s, 2),
        "seconds_total": round(sum(fold_s) + find_s, 1)})
    for ckpt in ckpts:          # outputs written: the folds' resume state is no longer needed
        ckpt.discard()
    print(f"[cleanlab] {name}: {int(flags.sum())} of {len(given)} flagged ({cc['folds']}-fold CE, {cc['filter_by']})")


if __name__ == "__main__":
    main(run)
