"""The errors a stage reports as one line (exit code 2), in one module that imports
nothing: stages/common.py catches them without importing the image loader, the
noise model or torch-heavy modules, so a stage's code deps (dvc.yaml) stay the modules
it really runs. The modules that raise them re-export them under their old names."""


class ConfigError(ValueError):
    """A bad value in params.yaml; the message names the key."""


class DataError(Exception):
    """A dataset cannot be found, read or decoded; the message says how to fix it."""


class NoiseError(ValueError):
    """Bad noise parameters or an unusable noisy-label file."""


class CheckpointError(RuntimeError):
    """A checkpoint or stage input that cannot be used; the message names the file."""


class DivergedError(FloatingPointError):
    """Training produced non-finite values (NaN / inf) that a later step cannot use, e.g.
    the embeddings the selection ranks; the message says where and what to lower."""
