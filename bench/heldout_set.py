"""The held-out test images as a second test set, scored every epoch.

`bench/heldout.py` scores a finished run's *final* networks on the test images that the
CPU presets were not chosen on (every test image after the first `data.subset_test` per
class). This writes those images, their JPEG bytes unchanged, as an image-folder archive
with only a test/ part, so that a run scores them after every fine-tuning and CE epoch
through `data.extra_test_path` (the second test set WebVision-50 uses for ILSVRC12):

    python bench/heldout_set.py data/cifar10-jpeg.tar.gz --subset-test 300 \\
        --out data/cifar10-heldout.tar.gz
    dvc exp run -S 'run=[cpu_cifar10_asym40]' \\
        -S params/cpu_cifar10_asym40.yaml:data.extra_test_path=data/cifar10-heldout.tar.gz

`runs/<setting>/{finetune,baseline}_history.csv` then carry `test2_acc` beside `test_acc`
for every epoch, and the stages' json the held-out mean of the last epochs
(`test2_acc_mean_last`) and best epoch (`test2_acc_best`). The second test set is only
evaluated (eval mode, no random draw), so training is the run without it, bit for bit.

Before writing, the archive is decoded the way the data stage will read it and checked
to be exactly the source's test images after the first K per class, in dataset order.
"""
import argparse
import io
import tarfile
from pathlib import Path

import numpy as np

from selcl.data import DataError, first_per_class, load_dataset, load_extra_test
# the data stage's own walk of an image folder or archive (hidden files and non-images skipped)
from selcl.data import _collect_dir, _collect_tar


def held_out_members(source: Path, k: int) -> list[tuple[str, bytes]]:
    """(member name, bytes) of every test image after the first k per class (file-name
    order within a class, as the data stage orders them), in the archive's layout."""
    entries = _collect_dir(source) if source.is_dir() else _collect_tar(source)
    by_class: dict = {}
    for split, c, name in entries:
        if split == "test":
            by_class.setdefault(c, []).append(name)
    if not by_class:
        raise SystemExit(f"{source}: no images under test/<class>/")
    out = []
    for c in sorted(by_class):
        names = sorted(by_class[c])[k:]
        if not names:
            raise SystemExit(f"--subset-test {k} keeps every test image of class {c!r}: none is held out")
        for name in names:
            src = entries[("test", c, name)][0]          # bytes (archive) or a file's path (folder)
            out.append((f"test/{c}/{name}", src if isinstance(src, bytes) else Path(src).read_bytes()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path, help="the image folder or archive (.tar / .tar.gz) the setting reads")
    ap.add_argument("--subset-test", type=int, required=True, help="the setting's data.subset_test")
    ap.add_argument("--out", type=Path, required=True, help="the .tar.gz to write")
    args = ap.parse_args()
    if args.subset_test < 1:
        raise SystemExit(f"--subset-test must be a positive number of images per class, got {args.subset_test}")
    if not args.source.exists():
        raise SystemExit(f"{args.source} does not exist")
    try:
        members = held_out_members(args.source, args.subset_test)
    except DataError as e:
        raise SystemExit(str(e)) from None

    tmp = args.out.with_name(args.out.name + ".part")
    with tarfile.open(tmp, "w:gz") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    full = load_dataset("imagefolder", path=args.source, subset=1, subset_test=None)
    held = np.setdiff1d(np.arange(len(full.y_test)), first_per_class(full.y_test, args.subset_test))
    x, y = load_extra_test(tmp, full.classes)
    if not (np.array_equal(x, full.x_test[held]) and np.array_equal(y, full.y_test[held])):
        tmp.unlink()
        raise SystemExit(f"{tmp}: does not decode to the held-out test images of {args.source}")
    tmp.replace(args.out)
    print(f"{args.out}: {len(y):,} test images of {len(full.classes)} classes, those after the first "
          f"{args.subset_test} per class of {args.source}")


if __name__ == "__main__":
    main()
