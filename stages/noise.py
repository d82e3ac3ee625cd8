"""Stage `noise@<setting>`: noisy labels (SPEC §1) → runs/<setting>/labels.npz + noise.json."""
import zipfile

import numpy as np
from common import load, main, require_device, run_dir

from selcl.checkpoint import atomic_path, write_json
from selcl.errors import CheckpointError, NoiseError
from selcl.data import load_arrays
from selcl.noise import make_noisy_labels, realised_noise_rate, resolve_generator, transition_matrix


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
    asym = nc["asym_map"] if nc["asym_map"] != "auto" else data.name
    generator = resolve_generator(nc["generator"], data.name)   # the dataset the data stage loaded
    try:
        noisy = make_noisy_labels(data.y_train, C, nc["kind"], nc["rate"], nc["seed"], dataset=asym,
                                  include_true_class=nc["include_true_class"], file=nc["file"],
                                  file_key=nc["file_key"], generator=generator)
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
