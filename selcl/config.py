"""params.yaml and params/: load, merge a setting over `defaults`, and validate before any work.

params.yaml holds `run` and `suites`; each setting is its own file, params/<name>.yaml,
which writes every key of every section (so `dvc exp run -S params/<name>.yaml:k=v`
needs no `++`, and `dvc params diff` shows values). `defaults` (selcl/defaults.yaml, the
paper's values) is the base a setting given inline in params.yaml is merged over (the
tests write small settings that way): a setting's config is `defaults.<section>` updated
by `settings.<name>.<section>` for each section (data, noise, model, warmup, pretrain, finetune, evaluate,
baseline); a section or key the setting does not write keeps its default. Validation is
strict: unknown keys are rejected with a "did you mean",
types follow the schema below, ranges (α, β, rates in [0, 1]; K ≥ 1; epochs ≥ 1)
and names (dataset, noise, arch, …) are checked. Every error is a `ConfigError`
whose message names the full key, e.g. `settings.demo_sym40.pretrain.alpha`.
"""
from __future__ import annotations

import copy
import difflib
import math
from pathlib import Path

import yaml

SECTIONS = ("data", "noise", "model", "warmup", "pretrain", "finetune", "evaluate", "baseline", "cleanlab")


from .errors import ConfigError  # noqa: F401 - raised here, defined with the other stage errors


# --- value checks -----------------------------------------------------------------
def _unit(v):
    return 0.0 <= v <= 1.0 or "must be in [0, 1]"


def _pos(v):
    return v >= 1 or "must be ≥ 1"


def _nonneg(v):
    return v >= 0 or "must be ≥ 0"


def _posf(v):
    return v > 0 or "must be > 0"


def _choice(*names):
    def check(v):
        return v in names or f"must be one of {', '.join(names)}"
    return check


def _int_list(v):
    return all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in v) \
        or "must be a list of non-negative integers"


def _scale_range(v):
    ok = (len(v) == 2 and all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in v)
          and 0 < v[0] <= v[1] <= 1)
    return ok or "must be [low, high] with 0 < low ≤ high ≤ 1"


OPT_STR = (str, type(None))
OPT_INT = (int, type(None))
OPT_FLOAT = (float, type(None))

# section -> key -> (allowed types, check or None)
SCHEMA: dict[str, dict[str, tuple]] = {
    "data": {
        "dataset": (str, _choice("digits", "cifar10", "cifar100", "imagefolder")),
        "root": (str, None), "path": (OPT_STR, None), "extra_test_path": (OPT_STR, None),
        "subset": (OPT_INT, lambda v: v is None or _pos(v)),
        "subset_test": (OPT_INT, lambda v: v is None or _pos(v)),
        "seed": (int, _nonneg), "download": (bool, None),
        "image_size": (OPT_INT, lambda v: v is None or _pos(v)),
        "crop": (OPT_INT, lambda v: v is None or _pos(v)),
        "crop_scale": (list, _scale_range),
    },
    "noise": {
        "kind": (str, _choice("none", "sym", "asym", "file")), "rate": (float, _unit),
        "seed": (int, _nonneg), "include_true_class": (bool, None),
        "asym_map": (str, _choice("auto", "cifar10", "cifar100", "cyclic")),
        "generator": (str, _choice("auto", "authors", "pcg64")),
        "file": (OPT_STR, None), "file_key": (OPT_STR, None),
    },
    "model": {
        "arch": (str, _choice("preact_resnet18", "resnet18", "small")), "width": (int, _pos),
        "blocks": (list, _int_list), "proj_dim": (int, _pos), "seed": (int, _nonneg),
        "bn_replicas": (int, _pos),
    },
    "warmup": {
        "method": (str, _choice("uns_cl", "sup_cl")), "epochs": (int, _pos),
        "temperature": (float, _posf), "queue_size": (int, _pos), "ema": (float, _unit),
        "checkpoint_every": (int, _pos),
    },
    "pretrain": {
        "epochs": (int, _pos), "batch_size": (int, _pos), "lr": (float, _posf),
        "lr_warmup_epochs": (int, _nonneg), "lr_decay_epochs": (list, _int_list),
        "lr_decay": (float, _posf), "momentum": (float, _unit), "weight_decay": (float, _nonneg),
        "temperature": (float, _posf), "ema": (float, _unit), "queue_per_class": (int, _pos),
        "memory_start_epoch": (int, _pos), "lambda_cls": (float, _nonneg), "lambda_sim": (float, _nonneg),
        "alpha": (float, _unit), "beta": (float, _unit), "k": (int, _pos),
        "knn_weighting": (str, _choice("uniform", "exp")), "knn_index": (str, _choice("flat", "ivf")),
        "pseudo_labels": (bool, None), "selection_version": (str, _choice("v1", "v2")),
        "mixup": (bool, None), "memory": (bool, None), "selection": (bool, None),
        "classifier": (bool, None), "sim_loss": (bool, None),
        "sim_grad_clip": (OPT_FLOAT, lambda v: v is None or _posf(v)),
        "grad_clip": (OPT_FLOAT, lambda v: v is None or _posf(v)),
        "selected_sets": (str, _choice("all", "T_G1", "T_G1_G2", "clean_assoc", "clean_all_pairs",
                                       "clean_clean")),
        "drop_last": (bool, None), "checkpoint_every": (int, _pos),
    },
    "finetune": {
        "epochs": (int, _pos), "batch_size": (int, _pos), "lr": (float, _posf),
        "momentum": (float, _unit), "weight_decay": (float, _nonneg), "mixup_alpha": (float, _posf),
        "bootstrap": (float, _unit), "bootstrap_start": (int, _nonneg),
        "augment": (str, _choice("weak", "strong")), "reinit_classifier": (bool, None),
        "eval_last": (int, _pos), "drop_last": (bool, None), "checkpoint_every": (int, _pos),
    },
    "evaluate": {"k": (int, _pos), "sigma": (float, _posf), "tsne_points": (int, _nonneg)},
    "baseline": {
        "enabled": (bool, None), "epochs": (int, _pos), "batch_size": (int, _pos), "lr": (float, _posf),
        "lr_decay_epochs": (list, _int_list), "lr_decay": (float, _posf), "momentum": (float, _unit),
        "weight_decay": (float, _nonneg), "mixup_alpha": (OPT_FLOAT, lambda v: v is None or _posf(v)),
        "eval_last": (int, _pos), "drop_last": (bool, None), "checkpoint_every": (int, _pos),
    },
    # the cleanlab baseline of the label-issues report (stages/cleanlab_baseline.py)
    "cleanlab": {
        "enabled": (bool, None), "folds": (int, lambda v: v >= 2 or "must be at least 2"),
        "seed": (int, _nonneg),
        "filter_by": (str, _choice("prune_by_noise_rate", "prune_by_class", "both", "confident_learning",
                                   "predicted_neq_given", "low_normalized_margin", "low_self_confidence")),
    },
}
TOP_KEYS = ("run", "suites", "defaults", "settings")
DEFAULTS_FILE = Path(__file__).with_name("defaults.yaml")
SETTINGS_DIR = "params"       # beside params.yaml: one <name>.yaml per setting


def _did_you_mean(key: str, options) -> str:
    close = difflib.get_close_matches(str(key), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _check_value(where: str, value, types, check) -> None:
    types = types if isinstance(types, tuple) else (types,)
    ok_type = isinstance(value, types)
    if float in types and isinstance(value, int) and not isinstance(value, bool):
        ok_type = True  # an int is a fine float (e.g. beta: 0)
    if int in types and isinstance(value, bool):
        ok_type = False  # yaml `true` is not a number
    if not ok_type:
        names = "/".join("null" if t is type(None) else t.__name__ for t in types)
        raise ConfigError(f"{where}: expected {names}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where} = {value!r}: must be a finite number")
    if check is not None and value is not None:
        verdict = check(value)
        if verdict is not True:
            raise ConfigError(f"{where} = {value!r}: {verdict}")


def _check_section(where: str, section: str, values: dict, *, complete: bool) -> None:
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping, got {values!r}")
    schema = SCHEMA[section]
    for key, value in values.items():
        if key not in schema:
            raise ConfigError(f"{where}.{key}: unknown key{_did_you_mean(key, schema)}")
        _check_value(f"{where}.{key}", value, *schema[key])
    if complete:
        missing = [k for k in schema if k not in values]
        if missing:
            raise ConfigError(f"{where}: missing key(s) {', '.join(missing)}")


def _read_yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        # PyYAML's message spans several lines; a stage reports exactly one.
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None


def load_params(path: str | Path = "params.yaml") -> dict:
    """params.yaml with `defaults` (selcl/defaults.yaml unless the file gives its own) and
    `settings`: those given inline plus one per params/<name>.yaml beside it."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: parameter file not found (run from the repository root)")
    params = _read_yaml(path)
    if not isinstance(params, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    if "defaults" not in params:
        params["defaults"] = _read_yaml(DEFAULTS_FILE)
    settings = params.get("settings")
    if settings is None:
        settings = params["settings"] = {}
    folder = path.parent / SETTINGS_DIR
    for file in sorted(folder.glob("*.yaml")) if isinstance(settings, dict) else []:
        if file.stem in settings:
            raise ConfigError(f"settings.{file.stem}: given both in {path} and in {file}: keep one")
        settings[file.stem] = _read_yaml(file)
    return params


def validate(params: dict) -> None:
    """Validate the whole file: top keys, `defaults`, every setting, `run`, `suites`."""
    _validate_structure(params)
    for name in params["settings"]:
        validate_setting(params, name)


def _validate_structure(params: dict) -> None:
    """Top-level keys, `defaults` (complete), and the setting names in `run` / `suites`:
    cheap checks every stage makes, so a typo anywhere in the file's frame stops it."""
    for key in params:
        if key not in TOP_KEYS:
            raise ConfigError(f"{key}: unknown top-level key{_did_you_mean(str(key), TOP_KEYS)}")
    for key in TOP_KEYS:
        if key not in params:
            raise ConfigError(f"{key}: missing top-level key")
    defaults = params["defaults"]
    if not isinstance(defaults, dict):
        raise ConfigError("defaults: expected a mapping of sections")
    for section in defaults:
        if section not in SCHEMA:
            raise ConfigError(f"defaults.{section}: unknown section{_did_you_mean(str(section), SCHEMA)}")
    for section in SECTIONS:
        if section not in defaults:
            raise ConfigError(f"defaults.{section}: missing section")
        _check_section(f"defaults.{section}", section, defaults[section], complete=True)
    settings = params["settings"]
    if not isinstance(settings, dict) or not settings:
        raise ConfigError("settings: expected a non-empty mapping of setting name -> sections")
    run = params["run"]
    if not isinstance(run, list) or not run:
        raise ConfigError("run: expected a non-empty list of setting names")
    for name in run:
        if not isinstance(name, str) or name not in settings:
            raise ConfigError(f"run: unknown setting '{name}'{_did_you_mean(str(name), settings)}")
    if len(set(run)) != len(run):
        raise ConfigError("run: a setting is listed twice")
    suites = params["suites"] or {}
    if not isinstance(suites, dict):
        raise ConfigError("suites: expected a mapping of suite name -> list of settings")
    for suite, names in suites.items():
        if not isinstance(names, (list, type(None))):
            raise ConfigError(f"suites.{suite}: expected a list of setting names, got {names!r}")
        for name in names or []:
            if not isinstance(name, str) or name not in settings:
                raise ConfigError(f"suites.{suite}: unknown setting '{name}'{_did_you_mean(str(name), settings)}")


def validate_setting(params: dict, name: str) -> None:
    settings = params.get("settings") or {}
    if not isinstance(settings, dict):
        raise ConfigError("settings: expected a mapping of setting name -> sections")
    if name not in settings:
        raise ConfigError(f"settings.{name}: no such setting{_did_you_mean(name, settings)}")
    setting = settings[name] if settings[name] is not None else {}
    if not isinstance(setting, dict):
        raise ConfigError(f"settings.{name}: expected a mapping of sections")
    for section in setting:
        if section not in SCHEMA:
            raise ConfigError(f"settings.{name}.{section}: unknown section{_did_you_mean(section, SCHEMA)}")
    # A setting writes only what differs from `defaults`: a missing section (or key)
    # means "no change". (DVC tracks the resolved values, runs/<name>/config/.)
    for section in setting:
        _check_section(f"settings.{name}.{section}", section, setting[section] or {}, complete=False)
    cfg = resolve(params, name, validated=True)
    _check_consistency(name, cfg)


def _check_consistency(name: str, cfg: dict) -> None:
    where = f"settings.{name}"
    data, noise, model = cfg["data"], cfg["noise"], cfg["model"]
    if data["dataset"] == "imagefolder" and not data["path"]:
        raise ConfigError(f"{where}.data.path: required for dataset imagefolder")
    if data["image_size"] is not None and data["dataset"] != "imagefolder":
        raise ConfigError(f"{where}.data.image_size = {data['image_size']}: applies to dataset "
                          f"imagefolder only ({data['dataset']!r} has a fixed size); set it to null")
    if data["crop"] is not None and data["image_size"] is not None and data["crop"] > data["image_size"]:
        raise ConfigError(f"{where}.data.crop = {data['crop']}: must be ≤ data.image_size "
                          f"({data['image_size']}), the size of the stored images")
    if noise["kind"] == "file" and not noise["file"]:
        raise ConfigError(f"{where}.noise.file: required for noise kind 'file'")
    if noise["kind"] in ("sym", "asym") and noise["rate"] == 0.0:
        pass  # allowed: a zero-rate control
    if model["arch"] == "small" and not model["blocks"]:
        raise ConfigError(f"{where}.model.blocks: needs at least one stage")
    if len(model["blocks"]) > 4:
        raise ConfigError(f"{where}.model.blocks: at most 4 stages")
    wc, pc = cfg["warmup"], cfg["pretrain"]
    if pc["epochs"] <= wc["epochs"]:
        raise ConfigError(f"{where}.pretrain.epochs = {pc['epochs']}: counts the warm-up's {wc['epochs']} "
                          f"epoch(s) too (SPEC §10.3), so it must be larger than warmup.epochs")
    ft = cfg["finetune"]
    if ft["eval_last"] > ft["epochs"]:
        raise ConfigError(f"{where}.finetune.eval_last = {ft['eval_last']}: "
                          f"must be ≤ finetune.epochs ({ft['epochs']})")
    bl = cfg["baseline"]
    if bl["eval_last"] > bl["epochs"]:
        raise ConfigError(f"{where}.baseline.eval_last = {bl['eval_last']}: "
                          f"must be ≤ baseline.epochs ({bl['epochs']})")


def resolve(params: dict, name: str, *, validated: bool = False) -> dict:
    """The effective config of one setting: defaults updated section by section."""
    if not validated:
        validate_setting(params, name)
    setting = params["settings"][name] or {}
    cfg = {}
    for section in SECTIONS:
        merged = copy.deepcopy(params["defaults"][section])
        merged.update(copy.deepcopy(setting.get(section) or {}))
        for key, (types, _) in SCHEMA[section].items():
            types = types if isinstance(types, tuple) else (types,)
            if float in types and isinstance(merged[key], int) and not isinstance(merged[key], bool):
                merged[key] = float(merged[key])
        cfg[section] = merged
    cfg["name"] = name
    return cfg


def load_setting(name: str, path: str | Path = "params.yaml", sections=None) -> dict:
    """Load params.yaml, validate the setting `name` (and only it) and return its config.

    Each stage calls this for its own setting, so a typo anywhere in that setting —
    or in `defaults`, or in the file's frame (top-level keys, `run`, `suites`) — stops
    the stage before any work. Other settings are not validated here (their own
    stages do that), so a typo in one setting never blocks another."""
    params = load_params(path)
    _validate_structure(params)
    validate_setting(params, name)
    return resolve(params, name, validated=True)


def differences(params: dict, name: str) -> list[str]:
    """`section.key = value` for each key where setting `name` differs from `defaults`."""
    cfg = resolve(params, name)
    return [f"{s}.{k} = {v!r}" for s in SECTIONS for k, v in cfg[s].items() if v != params["defaults"][s][k]]


if __name__ == "__main__":      # python -m selcl.config diff <setting>
    import sys
    if len(sys.argv) != 3 or sys.argv[1] != "diff":
        sys.exit("usage: python -m selcl.config diff <setting>")
    try:
        print("\n".join(differences(load_params(), sys.argv[2])) or "(the defaults)")
    except ConfigError as exc:
        sys.exit(f"error: {' '.join(str(exc).split())}")
