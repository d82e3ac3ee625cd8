"""The cleanlab baseline of the label-issues report: K-fold out-of-fold predicted
probabilities from the CE baseline's network, weak augmentation and recipe
(`selcl.train.baseline`, trained on K−1 folds at a time), then cleanlab's own
`cleanlab.filter.find_label_issues` and `cleanlab.rank.get_label_quality_scores` on them —
cleanlab's recommended use (Northcutt et al., JAIR 2021), with cleanlab as a library.

The folds are stratified by the given label (as cleanlab's own cross-validation,
`cleanlab.count.estimate_cross_validated_probabilities`), seeded by `cleanlab.seed`.
"""
from __future__ import annotations

import numpy as np
import torch

from .errors import ConfigError
from .evaluate import embed
from .train import TrainData, baseline, make_model

# the baseline section's keys the folds train with (mixup_alpha is forced to None: the
# issue's cleanlab baseline is plain cross-entropy; eval_last / enabled do not apply)
BASELINE_KEYS = ("epochs", "batch_size", "lr", "lr_decay_epochs", "lr_decay", "momentum", "weight_decay",
                 "drop_last", "checkpoint_every")


def folds_of(given: np.ndarray, folds: int, seed: int, name: str) -> np.ndarray:
    """Fold id [N] of every example, stratified by the given label."""
    from sklearn.model_selection import StratifiedKFold
    counts = np.bincount(given)
    present = counts[counts > 0]
    if present.max() < folds:
        raise ConfigError(f"settings.{name}.cleanlab.folds = {folds}: more folds than the {int(present.max())} "
                          f"examples of the largest class")
    fold = np.empty(len(given), dtype=np.int64)
    skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    for k, (_, held) in enumerate(skf.split(np.zeros(len(given)), given)):
        fold[held] = k
    return fold


def fold_config(cfg: dict) -> dict:
    """The config `selcl.train.baseline` reads, for one fold: the CE baseline's recipe."""
    return {"name": cfg["name"], "model": dict(cfg["model"]),
            "baseline": {**{k: cfg["baseline"][k] for k in BASELINE_KEYS}, "mixup_alpha": None}}


def train_fold(cfg: dict, data: TrainData, device, fold: np.ndarray, k: int, ckpt) -> np.ndarray:
    """Train the CE baseline on every fold but k; softmax of the un-augmented held-out
    images of fold k, float64 [|fold k|, C]."""
    train_idx = torch.as_tensor(np.flatnonzero(fold != k), device=device)
    held = torch.as_tensor(np.flatnonzero(fold == k), device=device)
    state = baseline(fold_config(cfg), data, device, ckpt, idx_pool=train_idx,
                     desc=f"cleanlab fold {k + 1}/{int(fold.max()) + 1}")
    model = make_model(cfg["model"], data.num_classes, device)
    model.load_state_dict(state["model"])
    _, logits = embed(model, data.x[held], data.mean, data.std, crop=data.crop)
    return torch.softmax(logits.double(), 1).cpu().numpy()


def find_issues(given: np.ndarray, pred_probs: np.ndarray, filter_by: str) -> tuple[np.ndarray, np.ndarray]:
    """cleanlab's flags (bool [N]) and label quality (self-confidence, [N], low = suspicious)."""
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores
    # n_jobs=1: the machines this runs on are shared; the call takes seconds either way
    flags = find_label_issues(labels=given, pred_probs=pred_probs, filter_by=filter_by, n_jobs=1)
    quality = get_label_quality_scores(labels=given, pred_probs=pred_probs, method="self_confidence")
    return np.asarray(flags, dtype=bool), np.asarray(quality, dtype=np.float64)
