"""Stage `data@<setting>`: decode the setting's dataset once into runs/<setting>/data.npz.

Later stages read the uint8 arrays and never decode again."""
import os

from common import load, main, require_device, run_dir

from selcl.checkpoint import write_json
from selcl.data import load_dataset, load_extra_test, save_arrays, sha256_file
from selcl.errors import DataError


def run(name: str) -> None:
    cfg = load(name)
    require_device(cfg)
    dc = cfg["data"]
    try:
        data = load_dataset(dc["dataset"], root=dc["root"], path=dc["path"], subset=dc["subset"],
                            subset_test=dc["subset_test"],
                            seed=dc["seed"], download=dc["download"], image_size=dc["image_size"])
    except DataError as exc:
        # Name the key to fix: the imagefolder archive is `data.path`, CIFAR lives under `data.root`.
        key = "path" if dc["dataset"] == "imagefolder" else "root"
        raise DataError(f"settings.{name}.data.{key} = {dc[key]!r}: {exc}") from None
    h, w = data.x_train.shape[2:]
    if dc["crop"] is not None and dc["crop"] > min(h, w):
        raise DataError(f"settings.{name}.data.crop = {dc['crop']}: larger than the stored "
                        f"{w}×{h} images (data.image_size)")
    data.crop, data.crop_scale = dc["crop"], tuple(dc["crop_scale"])   # the views' geometry
    if dc["extra_test_path"]:               # a second test set (WebVision-50: ILSVRC12 val)
        try:
            data.x_test2, data.y_test2 = load_extra_test(dc["extra_test_path"], data.classes, dc["image_size"])
        except DataError as exc:
            raise DataError(f"settings.{name}.data.extra_test_path = {dc['extra_test_path']!r}: {exc}") from None
        if data.x_test2.shape[1:] != data.x_test.shape[1:]:
            raise DataError(f"settings.{name}.data.extra_test_path = {dc['extra_test_path']!r}: images are "
                            f"{data.x_test2.shape[3]}×{data.x_test2.shape[2]}, the test set's "
                            f"{data.x_test.shape[3]}×{data.x_test.shape[2]} (set data.image_size)")
    out = run_dir(name)
    save_arrays(data, out / "data.npz")
    meta = {"dataset": dc["dataset"], "n_train": int(len(data.y_train)), "n_test": int(len(data.y_test)),
            "num_classes": len(data.classes), "classes": list(data.classes),
            "image_shape": list(data.x_train.shape[1:]), "mean": list(map(float, data.mean)),
            "std": list(map(float, data.std))}
    if data.crop is not None:
        meta.update(crop=int(data.crop), crop_scale=list(map(float, data.crop_scale)))
    if data.x_test2 is not None:
        meta["n_test2"] = int(len(data.y_test2))
    if dc["path"]:
        meta["source_sha256"] = "folder" if os.path.isdir(dc["path"]) else sha256_file(dc["path"])
    write_json(out / "data.json", meta)
    print(f"[data] {name}: {meta['n_train']} train / {meta['n_test']} test"
          f"{' / ' + str(meta['n_test2']) + ' second-test' if 'n_test2' in meta else ''} images, "
          f"{meta['num_classes']} classes, shape {meta['image_shape']}")


if __name__ == "__main__":
    main(run)
