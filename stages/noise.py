"""Stage `noise@<setting>`: noisy labels (SPEC §1) → runs/<setting>/labels.npz + noise.json."""
import zipfile

import numpy as np
from common import load, main, require_device, run_dir

from selcl.checkpoint import atomic_path, write_json
from selcl.errors import CheckpointError, NoiseError
from selcl.data import load_arrays
from selcl.noise import labels_from_config, realised_noise_rate, transition_matrix


def run(name: str) -> None:
    cfg = load(name)
    require_device(cfg)
    nc, out = cfg["noise"], run_dir(name)
    try:
        data = load_arrays(out / "data.npz")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{out / 'data.npz'}: corrupt data-stage output ({type(exc).__name__}); "
                              f"delete it and rerun the data stage") from None
    C = len(data.classes)
    try:   # auto map and generator: from the dataset the data stage loaded
        noisy, generator = labels_from_config(data.y_train, C, nc, data.name)
    except NoiseError as exc:
        # Name the key to fix: the label file (kind=file) or the asymmetric map.
        key = {"file": "file", "asym": "asym_map"}.get(nc["kind"], "kind")
        raise NoiseError(f"settings.{name}.noise.{key} = {nc[key]!r}: {exc}") from None
    T = transition_matrix(data.y_train, noisy, C)
    with atomic_path(out / "labels.npz") as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, noisy=noisy, clean=data.y_train, num_classes=C, transition=T)
    rate = realised_noise_rate(data.y_train, noisy)
    write_json(out / "noise.json", {"kind": nc["kind"], "rate": nc["rate"],
                                    "generator": generator if nc["kind"] in ("sym", "asym") else None,
                                    "realised_noise_rate": rate})
    print(f"[noise] {name}: {nc['kind']} r={nc['rate']} → realised noise rate {rate:.4f}")


if __name__ == "__main__":
    main(run)
