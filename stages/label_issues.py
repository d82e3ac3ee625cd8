"""Stage `label_issues@<setting>`: Sel-CL's and Sel-CL+'s verdict on every training example
→ runs/<setting>/label_issues.csv (most suspicious first), cleaned_labels.npy (usable as
`noise: {kind: file, file: …}`) and label_issues.json (counts and the detectors' times).
Definitions: selcl/label_issues.py and docs/label_issues.md."""
import csv
import json
import time

import numpy as np
import torch
from common import StageError, load, main, require_device, run_dir

from selcl import checkpoint
from selcl.data import load_arrays
from selcl.dataset_files import train_files
from selcl.evaluate import embed
from selcl.label_issues import (SELCL_COLUMNS, class_names, cleaned_labels, save_labels, suspicion_order,
                                write_table)
from selcl.train import TrainData, make_model


def _pretrain_seconds(path) -> float | None:
    """Wall-clock of pre-training (every epoch's training, selection and evaluation)."""
    if not path.exists():
        return None
    with open(path, newline="") as f:
        return sum(float(r["train_s"]) + float(r["select_s"]) + float(r["knn_s"]) for r in csv.DictReader(f))


def run(name: str) -> None:
    cfg = load(name)
    device = require_device(cfg)
    out = run_dir(name)
    data = TrainData.load(out, device)
    classes = load_arrays(out / "data.npz").classes
    pre = checkpoint.load(out / "pretrain.pt", what="pre-training output")
    sel = pre.get("selection", {})
    if "agreement" not in sel:
        raise StageError(f"{out / 'pretrain.pt'}: its selection has no per-example agreement q̂(ỹ) "
                         f"(written before label_issues existed); rerun pretrain@{name}")
    fine = checkpoint.load(out / "finetune.pt", what="fine-tuning output")
    t0 = time.perf_counter()
    model = make_model(cfg["model"], data.num_classes, device)
    model.load_state_dict(fine["model"])
    _, logits = embed(model, data.x, data.mean, data.std, crop=data.crop)     # un-augmented, eval mode
    prob = torch.softmax(logits.double(), 1).cpu().numpy()
    predict_s = time.perf_counter() - t0

    given = data.noisy.cpu().numpy()
    y_hat = sel["pseudo_labels"].numpy().astype(np.int64)
    in_T = pre["examples"].numpy().astype(bool)      # the T Sel-CL+ fine-tuned on
    score = 1.0 - sel["agreement"].numpy().astype(np.float64)
    plus = prob.argmax(1)
    prob_given = prob[np.arange(len(given)), given]
    cleaned = cleaned_labels(given, y_hat, in_T, plus)
    values = {"index": np.arange(len(given)), "file": train_files(cfg["data"], len(given)),
              "given_label": given, "given_class": class_names(classes, given),
              "selcl_label": y_hat, "selcl_class": class_names(classes, y_hat), "selcl_score": score,
              "in_T": in_T, "selcl_plus_label": plus, "selcl_plus_class": class_names(classes, plus),
              "selcl_plus_prob": prob.max(1), "selcl_plus_prob_given": prob_given, "cleaned_label": cleaned}
    write_table(out / "label_issues.csv", SELCL_COLUMNS, values, suspicion_order(score, prob_given))
    save_labels(out / "cleaned_labels.npy", cleaned)
    pre_s = _pretrain_seconds(out / "pretrain_timing.csv")
    ft_s = json.loads((out / "finetune.json").read_text()).get("seconds") if (out / "finetune.json").exists() else None
    checkpoint.write_json(out / "label_issues.json", {
        "n": int(len(given)), "not_in_T": int((~in_T).sum()), "selcl_plus_disagrees": int((plus != given).sum()),
        "relabelled": int((cleaned != given).sum()),
        "seconds": {"selcl": pre_s, "selcl_plus": None if pre_s is None or ft_s is None else pre_s + ft_s + predict_s}})
    print(f"[label_issues] {name}: {int((~in_T).sum())} of {len(given)} outside T, "
          f"{int((cleaned != given).sum())} relabelled → {out / 'label_issues.csv'}")


if __name__ == "__main__":
    main(run)
