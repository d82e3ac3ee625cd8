"""Which params each stage reads: the one table behind dvc.yaml's params dependencies.

DVC can track a key of params.yaml only if the key is written there, and a setting
writes only what differs from `defaults` (a missing key or section means "no
change"). So the `config@<setting>` stage resolves the setting and writes, for every
later stage, exactly the keys that stage reads to runs/<setting>/config/<stage>.json,
which is that stage's dependency: changing `evaluate.tsne_points` changes
config/evaluate.json only, and pre-training stays cached.

The stage itself gets the same view (`stage_view`): reading a key this table does
not list raises at once, so the table, and with it dvc.yaml, cannot silently go stale.
Imports nothing: the light `config` stage uses it.
"""
from __future__ import annotations

ALL = "*"

# stage -> section -> the keys it reads (ALL: the whole section). `model.arch` is read
# by every stage: the CUDA guard (stages/common.require_device) looks at it first.
READS: dict[str, dict[str, object]] = {
    "data": {"data": ALL, "model": ["arch"]},
    "noise": {"noise": ALL, "model": ["arch"]},
    # the warm-up is the first epoch(s) of the pre-training run (SPEC §10.3): pre-training's
    # loader, optimiser, lr schedule, memory size and switches (memory_start_epoch: a Sup-CL
    # warm-up reads the memory from it; sim_grad_clip: with the L_SIM switches it decides
    # whether the CUDA training forward can be graphed), but not α, β, K (a sweep of those
    # keeps the warm-up)
    "warmup": {"model": ALL, "warmup": ALL,
               "pretrain": ["batch_size", "drop_last", "lr", "lr_warmup_epochs", "lr_decay_epochs", "lr_decay",
                            "momentum", "weight_decay", "queue_per_class", "mixup", "temperature", "lambda_cls",
                            "classifier", "sim_loss", "lambda_sim", "sim_grad_clip", "memory",
                            "memory_start_epoch"]},
    # queue, memory, optimiser and epoch count carry over from the warm-up; k-NN accuracy
    # is logged per epoch
    "pretrain": {"model": ALL, "warmup": ["queue_size", "epochs", "temperature"], "pretrain": ALL,
                 "evaluate": ["k", "sigma"]},
    # pretrain.alpha: only named in the error for an empty final selection T
    "finetune": {"model": ALL, "finetune": ALL, "pretrain": ["alpha"]},
    "evaluate": {"model": ALL, "evaluate": ALL},
    "baseline": {"model": ALL, "baseline": ALL},
    # the CE baseline's recipe trained on K−1 folds (not its `enabled`, `eval_last` or
    # `mixup_alpha`: cleanlab's folds always run plain CE); data.*: the CSV's file column
    "cleanlab_baseline": {"model": ALL, "cleanlab": ALL, "data": ["dataset", "path", "subset"],
                          "baseline": ["epochs", "batch_size", "lr", "lr_decay_epochs", "lr_decay", "momentum",
                                       "weight_decay", "drop_last", "checkpoint_every"]},
    # Sel-CL+'s classifier is rebuilt (model) to predict every training image; data.*: file column
    "label_issues": {"model": ALL, "data": ["dataset", "path", "subset"]},
}
STAGES = tuple(READS)


class StageParams(dict):
    """A section of a stage's config: a dict that names the table to fix when the
    stage reads a key it has not declared."""

    stage = section = ""

    def __missing__(self, key):
        raise KeyError(f"stage {self.stage!r} reads {self.section}.{key}, which selcl/stage_params.py "
                       f"READS does not list for it: add it there (it becomes a dvc.yaml dependency)")


class StageConfig(StageParams):
    def __missing__(self, key):
        raise KeyError(f"stage {self.stage!r} reads the section {key!r}, which selcl/stage_params.py "
                       f"READS does not list for it: add it there (it becomes a dvc.yaml dependency)")


def stage_view(cfg: dict, stage: str) -> dict:
    """The part of a resolved setting (`selcl.config.resolve`) that `stage` reads."""
    if stage not in READS:
        raise KeyError(f"no params table for stage {stage!r} in selcl/stage_params.py")
    view = StageConfig(name=cfg["name"])
    view.stage = stage
    for section, keys in READS[stage].items():
        values = cfg[section] if keys == ALL else {k: cfg[section][k] for k in keys}
        part = StageParams(values)
        part.stage, part.section = stage, section
        view[section] = part
    return view


def plain(view: dict) -> dict:
    """A view as plain dicts (for JSON)."""
    return {k: (plain(v) if isinstance(v, dict) else v) for k, v in view.items()}
